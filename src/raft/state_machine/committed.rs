//! What the state machine tells its observer (the node) after each commit: what a batch changed, or
//! that a snapshot install replaced the whole applied state.

use crate::apply::Effects;
use crate::lease::store::LeaseRecord;

/// What one applied batch changed, told to the observer after the batch's transaction commits.
#[derive(Debug, Default, Clone)]
pub(crate) struct Committed {
    /// The store's revision after the batch.
    pub revision: i64,
    /// The store's revision before it: a watcher that has delivered up to here misses nothing.
    pub previous_revision: i64,
    /// Whether auth is enabled, and the auth revision, after the batch.
    pub auth_enabled: bool,
    pub auth_revision: u64,
    pub effects: Effects,
    /// Requests applied in the batch (a blank or membership entry counts as one), for `--snapshot-count`.
    pub requests: u64,
    /// The log index of the batch's last entry (of an install: the snapshot's last entry).
    pub last_index: u64,
    /// Set when a snapshot install replaced the whole applied state instead of a batch: there are no
    /// events, the revision may have jumped, and whatever was derived from the old state must be
    /// derived again from the new one.
    pub installed: Option<Installed>,
    /// What the batch owes to writes this member forwarded and waits to see applied here
    /// (`raft/awaited.rs`).
    pub answers: crate::raft::awaited::Answers,
    /// `effects.events` encoded for watchers, once, by the first that sends them.
    pub encoded: crate::mvcc::encoded_events::EncodedEvents,
}

/// What a snapshot install tells the observer beyond the revision and the auth state.
#[derive(Debug, Default, Clone)]
pub(crate) struct Installed {
    /// Every lease of the installed state, for the lease clock.
    pub leases: Vec<(i64, LeaseRecord)>,
}

/// Called on the apply thread after each commit: must be quick and must not block.
pub(crate) type Observer = Box<dyn Fn(Committed) + Send + Sync>;
