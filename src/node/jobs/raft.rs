//! Jobs on raft's own events: leader changes counted for `/metrics`, snapshots built when due.

use std::sync::Arc;

use crate::raft::Raft;

/// etcd's `etcd_server_leader_changes_seen_total`: each time this member sees a leader where it saw
/// another or none before (the first election included, as etcd counts it).
pub(super) async fn count_leader_changes(raft: Raft) {
    // Not `metrics()`: those change with every entry, and each change would wake this task.
    let mut metrics = raft.server_metrics();
    let mut last = None;
    loop {
        let leader = metrics.borrow_and_update().current_leader;
        if leader.is_some() && leader != last {
            crate::metrics::LEADER_CHANGES.inc();
        }
        last = leader;
        if metrics.changed().await.is_err() {
            return; // the raft core is gone
        }
    }
}

/// Builds a snapshot each time the apply observer says `--snapshot-count` requests were applied since
/// the last one; openraft then purges the log behind it.
pub(super) async fn snapshot_when_due(raft: Raft, due: Arc<tokio::sync::Notify>) {
    loop {
        due.notified().await;
        if let Err(fatal) = raft.trigger().snapshot().await {
            tracing::debug!(error = %fatal, "raft stopped: no more snapshots");
            return;
        }
    }
}
