//! What the latest applied batch left, readable without a read transaction: the store's revision,
//! whether auth is enabled and the auth revision, how many requests were applied, and the applied
//! log index (with its waiters, `node/applied_index.rs`). The apply observer
//! (`node/jobs/apply_observer.rs`) records each batch; the node's readers load it.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use super::applied_index::{AppliedIndex, Reached};
use crate::raft::state_machine::Committed;

pub(super) struct LatestApplied {
    /// The store's revision after the latest applied batch.
    revision: AtomicI64,
    /// Whether auth is enabled, and the auth revision, as of the latest applied batch.
    auth_enabled: AtomicBool,
    auth_revision: AtomicU64,
    /// `(auth revision, enabled)`, changed at the apply that changes either: long-lived streams
    /// re-judge their credentials then (`server/stream_credential.rs`).
    auth_changes: tokio::sync::watch::Sender<(u64, bool)>,
    /// Requests applied since the process started (a blank or membership entry counts as one).
    requests: AtomicU64,
    /// The last applied log index.
    pub(super) index: AppliedIndex,
}

impl LatestApplied {
    /// As the store was opened: `revision` and the auth state from its tables, `index` its last
    /// applied log index, no request applied yet.
    pub(super) fn new(revision: i64, auth_enabled: bool, auth_revision: u64, index: u64) -> LatestApplied {
        LatestApplied {
            revision: AtomicI64::new(revision),
            auth_enabled: AtomicBool::new(auth_enabled),
            auth_revision: AtomicU64::new(auth_revision),
            auth_changes: tokio::sync::watch::Sender::new((auth_revision, auth_enabled)),
            requests: AtomicU64::new(0),
            index: AppliedIndex::new(index),
        }
    }

    /// A batch was applied (called on the apply thread only). Returns the requests that waited for
    /// its index, for the caller to wake.
    pub(super) fn record(&self, batch: &Committed) -> Reached {
        self.revision.store(batch.revision, Ordering::Release);
        self.requests.fetch_add(batch.requests, Ordering::Relaxed);
        self.auth_enabled.store(batch.auth_enabled, Ordering::Release);
        self.auth_revision.store(batch.auth_revision, Ordering::Release);
        let auth_now = (batch.auth_revision, batch.auth_enabled);
        self.auth_changes.send_if_modified(|auth| std::mem::replace(auth, auth_now) != auth_now);
        // Last: a woken waiter reads the revision and auth state above.
        self.index.advance(batch.last_index)
    }

    pub(super) fn revision(&self) -> i64 {
        self.revision.load(Ordering::Acquire)
    }

    pub(super) fn auth_enabled(&self) -> bool {
        self.auth_enabled.load(Ordering::Acquire)
    }

    pub(super) fn auth_revision(&self) -> u64 {
        self.auth_revision.load(Ordering::Acquire)
    }

    pub(super) fn auth_changes(&self) -> tokio::sync::watch::Receiver<(u64, bool)> {
        self.auth_changes.subscribe()
    }

    pub(super) fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}
