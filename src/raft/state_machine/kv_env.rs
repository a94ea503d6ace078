//! `KvEnv`: the swappable kv environment, through which every holder reaches the applied state.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use super::state::State;

/// The kv environment as every holder reaches it (the node's read path, apply, snapshots): the one
/// indirection Defragment swaps (`defrag.rs`). A reader takes the current `State`, an `Arc`, so a read
/// in flight keeps its environment open until it ends; writers (apply, snapshot installs) also hold
/// `writing`, which Defragment takes to pause them.
pub(crate) struct KvEnv {
    /// `None` only while Defragment, holding the write lock, closes one environment and opens the
    /// next: no reader can see it.
    pub(super) current: RwLock<Option<Arc<State>>>,
    pub(super) writing: Mutex<()>,
    /// A defragment is running (etcd's `etcd_disk_defrag_inflight`).
    pub(super) defragmenting: AtomicBool,
}

impl KvEnv {
    /// The environment `state` is on, as the current one.
    pub(super) fn new(state: State) -> KvEnv {
        KvEnv {
            current: RwLock::new(Some(Arc::new(state))),
            writing: Mutex::new(()),
            defragmenting: AtomicBool::new(false),
        }
    }

    /// The applied state on the current environment.
    pub(crate) fn current(&self) -> Arc<State> {
        let current = self.current.read().unwrap_or_else(PoisonError::into_inner);
        // Invariant: `None` only under Defragment's write lock (see `current`).
        current.clone().expect("the kv environment is open outside a defragment's swap")
    }

    /// Runs `write` on the current state with writes paused for Defragment.
    pub(super) fn write<T>(&self, write: impl FnOnce(&State) -> T) -> T {
        let _writing = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        write(&self.current())
    }

    /// Like `write`, but `None` at once instead of waiting while a defragment pauses writes.
    pub(super) fn try_write<T>(&self, write: impl FnOnce(&State) -> T) -> Option<T> {
        let _writing = match self.writing.try_lock() {
            Ok(writing) => writing,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        Some(write(&self.current()))
    }

    /// Where this member receives snapshots from a leader (`snapshot/receiving.rs`).
    pub(crate) fn snapshot_inbox(&self) -> super::snapshot::receiving::Inbox {
        let state = self.current();
        super::snapshot::receiving::Inbox::new(state.snaps.path(), state.tables().len())
    }

    /// Whether a defragment is running.
    pub(crate) fn defragmenting(&self) -> bool {
        self.defragmenting.load(std::sync::atomic::Ordering::Relaxed)
    }
}
