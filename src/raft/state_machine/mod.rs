//! The raft state machine on LMDB (`<data-dir>/member/kv`): applies committed entries to the MVCC store
//! and records the applied log id and membership in the same transaction. This file is what openraft
//! sees: `StateMachine` and its `RaftStateMachine` and `RaftSnapshotBuilder` impls.
//!
//! - `kv_env.rs`: `KvEnv`, the swappable environment every holder reaches the applied state through
//!   (Defragment, `defrag.rs`, replaces it while the member runs);
//! - `state.rs`: `State`, the applied state on one environment, shared with the read path;
//!   `layout.rs`: the kv tables' layout version, and the migration of an older data dir at open;
//! - `batch.rs`: one batch of entries applied in one write transaction; `committed.rs`: what the
//!   observer is told after each commit;
//! - `compaction.rs`: one step of the background removal of compacted versions, in its own short
//!   write transaction through the same write gate (`mvcc/compaction.rs` says what a step removes);
//! - `full_retry.rs`: a batch that finds storage full (the disk, or LMDB's map) is aborted and
//!   applied again, unchanged, until it fits (`space/mod.rs`): what an entry does never depends on
//!   one member's disk; the map grows here;
//! - `snapshot/`: snapshots are a dump of every kv table, streamed from a read transaction into a
//!   file (`format.rs`) and kept in the snap dir (`dir.rs`); installing one streams its records into
//!   a fresh environment that replaces the current one as Defragment's copy does (`install.rs`), then
//!   rebuilds everything derived from the applied state and tells the observer (`Committed::installed`).

use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{RaftSnapshotBuilder, StorageIOError};

use self::full_retry::ApplyFailure;
use self::snapshot::data::SnapshotData;
use self::snapshot::dir::SnapDir;
use self::snapshot::format::Meta;
use self::state::{BoxError, Carried};
use super::{any_error, blocking, BatchResults, Entry, LogId, StorageError, StoredMembership, TypeConfig};
use crate::space::Space;
use crate::storage::{self, Writes};

#[cfg(test)]
mod apply_fuzz;
mod batch;
mod committed;
pub(crate) mod compaction;
#[cfg(test)]
mod compaction_tests;
pub(crate) mod defrag;
mod full_retry;
#[cfg(test)]
mod install_tests;
mod kv_env;
mod layout;
#[cfg(test)]
mod mapping_tests;
mod room_ahead;
pub(super) mod snapshot;
#[cfg(test)]
pub(crate) mod snapshot_tests;
#[cfg(test)]
mod space_tests;
mod state;
#[cfg(test)]
mod testing;
#[cfg(test)]
mod writeback_tests;

pub(crate) use self::committed::Committed;
pub(crate) use self::kv_env::KvEnv;
pub(crate) use self::snapshot::receiving::Inbox as SnapshotInbox;
pub(crate) use self::state::State;
#[cfg(test)]
pub(crate) use self::testing::TableRecords;

/// openraft's state machine: the swappable kv environment, and how far apply has got.
#[derive(Clone)]
pub struct StateMachine {
    kv: Arc<KvEnv>,
    /// The index of the last entry applied (`applied_index`).
    applied: Arc<AtomicU64>,
}

impl StateMachine {
    /// Opens the state machine with etcd's default quota and no disk-full ballast.
    pub fn open(kv_dir: &Path, snap_dir: &Path) -> Result<Self, heed::Error> {
        StateMachine::open_with(kv_dir, snap_dir, Arc::new(Space::without_ballast()))
    }

    /// Opens the state machine for an offline tool (`keyward snapshot`, `migrate`): written with
    /// copied writes, so its map never has to grow (`storage::mapping`).
    pub(crate) fn open_offline(kv_dir: &Path, snap_dir: &Path) -> Result<Self, heed::Error> {
        StateMachine::open_writing(kv_dir, snap_dir, Arc::new(Space::without_ballast()), Some(Writes::Copied))
    }

    /// Opens the state machine; `space` sets the quota (and with it the map size) and the ballast.
    pub(crate) fn open_with(kv_dir: &Path, snap_dir: &Path, space: Arc<Space>) -> Result<Self, heed::Error> {
        StateMachine::open_writing(kv_dir, snap_dir, space, None)
    }

    /// `open_with`, with the environment written as `writes` says instead of as its file system
    /// allows (for tests of each way).
    pub(crate) fn open_writing(
        kv_dir: &Path,
        snap_dir: &Path,
        space: Arc<Space>,
        writes: Option<Writes>,
    ) -> Result<Self, heed::Error> {
        let snaps = SnapDir::open(snap_dir).map_err(|e| heed::Error::Io(std::io::Error::other(e)))?;
        if kv_dir.exists() {
            storage::compacted::remove_leftovers(kv_dir).map_err(heed::Error::Io)?;
        }
        storage::compacted::remove_fresh(kv_dir).map_err(heed::Error::Io)?;
        let carried = Carried {
            space,
            tokens: Default::default(),
            snaps: Arc::new(snaps),
            observer: Default::default(),
            awaited: Default::default(),
            audit: None,
            writes,
        };
        let state = State::open(kv_dir, carried)?;
        Ok(StateMachine { kv: Arc::new(KvEnv::new(state)), applied: Default::default() })
    }

    /// The applied state on the current kv environment.
    pub(crate) fn state(&self) -> Arc<State> {
        self.kv.current()
    }

    /// The index of the last entry applied since this process started (0 before the first apply),
    /// for the log: an append may overlap a pending apply (`raft/log/wal/mod.rs`).
    pub(crate) fn applied_index(&self) -> Arc<AtomicU64> {
        self.applied.clone()
    }

    /// The swappable kv environment, for the node to hold.
    pub(crate) fn kv_env(&self) -> Arc<KvEnv> {
        self.kv.clone()
    }
}

fn to_snapshot((meta, file): (Meta, File)) -> Snapshot<TypeConfig> {
    Snapshot { meta, snapshot: Box::new(SnapshotData::reading(file)) }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let kv = self.kv.clone();
        blocking(move || {
            kv.current().build_snapshot().map_err(|e| StorageIOError::write_snapshot(None, any_error(e)).into())
        })
        .await
        .map(to_snapshot)
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let kv = self.kv.clone();
        blocking(move || {
            kv.current().applied_state().map_err(|e| StorageIOError::read_state_machine(any_error(e)).into())
        })
        .await
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<BatchResults>, StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let last = entries.last().map_or(0, |entry| entry.log_id.index);
        let applied = self.applied.clone();
        let done = move |results| {
            applied.fetch_max(last, Ordering::Release);
            Ok(results)
        };
        // Inline on the raft thread (`raft/thread.rs`) unless that could block it for long: when a
        // defragment holds writes, or the disk is full, the blocking pool waits instead, so the raft
        // thread goes on heartbeating and appending.
        let inline = self.kv.try_write(|state| state.apply_once(&entries));
        let failed = |e: BoxError| StorageIOError::write_state_machine(any_error(e)).into();
        let map_full = match inline {
            Some(Ok(results)) => return done(results),
            Some(Err(ApplyFailure::Storage(e))) => return Err(failed(e)),
            // Grown first, the batch is not run once more for nothing on the blocking pool.
            Some(Err(ApplyFailure::Full(kind))) => u32::from(kind == crate::space::Full::Map),
            None => 0,
        };
        let kv = self.kv.clone();
        let waiting = std::time::Instant::now();
        blocking(move || {
            kv.write(|state| {
                let waited = waiting.elapsed();
                if crate::logging::slow::worth_logging(waited) {
                    let ms = crate::logging::slow::ms(waited);
                    tracing::debug!(target: crate::logging::slow::TARGET, waited_ms = ms, "apply waited for the write gate");
                }
                state.apply_after_map_full(&entries, map_full)
            })
            .map_err(failed)
            .and_then(done)
        })
        .await
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapshotData>, StorageError> {
        let kv = self.kv.clone();
        blocking(move || {
            let (temp, file) =
                kv.current().snaps.temp("receive").map_err(|e| StorageIOError::write_snapshot(None, any_error(e)))?;
            Ok(Box::new(SnapshotData::receiving(temp, file)))
        })
        .await
    }

    async fn install_snapshot(&mut self, meta: &Meta, snapshot: Box<SnapshotData>) -> Result<(), StorageError> {
        fn failed(meta: &Meta, e: impl std::fmt::Display) -> StorageError {
            StorageIOError::write_snapshot(Some(meta.signature()), any_error(e)).into()
        }
        let syncing = std::time::Instant::now();
        let (file, received) = snapshot.finish().await.map_err(|e| failed(meta, e))?;
        let synced_ms = syncing.elapsed().as_millis() as u64;
        tracing::info!(snapshot = %meta.snapshot_id, synced_ms, "snapshot file flushed and synced for install");
        let (kv, meta) = (self.kv.clone(), meta.clone());
        blocking(move || kv.install_snapshot(&meta, file, received).map_err(|e| failed(&meta, e))).await
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let kv = self.kv.clone();
        blocking(move || {
            kv.current().snaps.current().map_err(|e| StorageIOError::read_snapshot(None, any_error(e)).into())
        })
        .await
        .map(|current| current.map(to_snapshot))
    }
}
