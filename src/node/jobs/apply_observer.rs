//! The apply loop's observer: called on the apply thread after each applied batch (or snapshot
//! install), it keeps what the node derives from the applied state current — the latest revision and
//! auth state, the lease clock, the count towards the next snapshot, the wake-up of compaction's
//! removal — and hands the batch to the commit broadcast, whose one subscriber is the watch hub
//! (`watch_hub/`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::lease::lessor::Lessor;
use crate::node::latest_applied::LatestApplied;
use crate::raft::state_machine::{Committed, State};
use crate::watch_hub::WatchHub;

/// Committed batches the broadcast holds for a subscriber that falls behind (the watch hub, which
/// keeps its own backlog bounded in bytes; behind by more, its watchers replay from LMDB).
const COMMITTED_BACKLOG: usize = 1024;

/// What observing the applied state starts.
pub(in crate::node) struct Observed {
    /// The watchers' side of the commit broadcast.
    pub(in crate::node) watch_hub: Arc<WatchHub>,
    /// Notified each time `--snapshot-count` requests were applied since the last snapshot.
    pub(in crate::node) snapshot_due: Arc<tokio::sync::Notify>,
    /// Notified when a batch scheduled a compaction or a snapshot replaced the applied state: removal
    /// may be pending (`compaction.rs`).
    pub(in crate::node) removal_due: Arc<tokio::sync::Notify>,
}

/// Installs the observer on `state` and starts the watch hub, before anything is applied.
pub(in crate::node) fn observe(
    state: &State,
    lessor: Arc<Lessor>,
    latest: Arc<LatestApplied>,
    snapshot_count: u64,
) -> Observed {
    let (committed, _) = tokio::sync::broadcast::channel(COMMITTED_BACKLOG);
    // Subscribed before anything is applied: the hub sees every batch from the store's revision on.
    let watch_hub = WatchHub::start(committed.subscribe(), latest.revision());
    let snapshot_due = Arc::new(tokio::sync::Notify::new());
    let due = snapshot_due.clone();
    let since_snapshot = AtomicU64::new(0);
    let removal_due = Arc::new(tokio::sync::Notify::new());
    let removal = removal_due.clone();
    state.observe(Box::new(move |mut batch: Committed| {
        // Only the apply thread calls this: load and store need not be one atomic step.
        // An installed snapshot is the newest one: the count starts again from it (etcd's `snapi`).
        let before = if batch.installed.is_some() { 0 } else { since_snapshot.load(Ordering::Relaxed) };
        let applied = before + batch.requests;
        if applied >= snapshot_count {
            due.notify_one();
        }
        since_snapshot.store(if applied >= snapshot_count { 0 } else { applied }, Ordering::Relaxed);
        latest.record(&batch);
        if batch.effects.compacted || batch.installed.is_some() {
            removal.notify_one();
        }
        for &(id, ttl) in &batch.effects.granted {
            lessor.granted(id, ttl);
        }
        for &id in &batch.effects.revoked {
            lessor.revoked(id);
        }
        if let Some(installed) = &mut batch.installed {
            // A snapshot install: the lease clock follows the installed lease table. Taken out: the
            // broadcast keeps the last batches.
            lessor.follow_installed(std::mem::take(&mut installed.leases));
        }
        // No subscriber is fine: nobody is watching.
        let _ = committed.send(Arc::new(batch));
    }));
    Observed { watch_hub, snapshot_due, removal_due }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::raft::state_machine::snapshot_tests::put;
    use crate::raft::state_machine::StateMachine;

    /// Whether a snapshot is due now (a permit is waiting), taking it.
    async fn due_now(due: &tokio::sync::Notify) -> bool {
        tokio::time::timeout(Duration::from_millis(20), due.notified()).await.is_ok()
    }

    /// The count towards the next snapshot starts again at an installed snapshot, as etcd's does from
    /// the snapshot it applied: a member that caught up by a snapshot does not build one of the same
    /// state (1 GB for a 1 GB store) a few entries later. Fails if the install does not reset it.
    #[tokio::test]
    async fn an_installed_snapshot_starts_the_count_towards_the_next_one_again() {
        let (dir, source_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let sm = StateMachine::open(&dir.path().join("kv"), &dir.path().join("snap")).unwrap();
        let source = StateMachine::open(&source_dir.path().join("kv"), &source_dir.path().join("snap")).unwrap();
        let observed = observe(&sm.state(), Arc::new(Lessor::default()), Arc::new(LatestApplied::new(1, false, 0)), 10);
        let puts = |prefix: &str, n: usize| (0..n).map(|i| put(format!("{prefix}{i}").as_bytes(), b"v", 0)).collect();

        sm.state().apply_requests(1, puts("a", 6));
        assert!(!due_now(&observed.snapshot_due).await, "6 of 10");
        source.state().apply_requests(5, puts("s", 3));
        sm.kv_env().install_snapshot_of(&source.state()).unwrap();
        sm.state().apply_requests(6, puts("b", 6));
        assert!(!due_now(&observed.snapshot_due).await, "6 of 10 since the install");
        sm.state().apply_requests(7, puts("c", 4));
        assert!(due_now(&observed.snapshot_due).await, "10 since the install");
    }
}
