//! Jobs on raft's own events: leader changes counted for `/metrics`, snapshots built when due and
//! the log purged behind them.

use tokio::sync::watch;

use super::apply_observer::SnapshotDue;
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
/// the last one, then purges the raft log behind it, keeping what `log_retention.rs` says.
pub(super) async fn snapshot_when_due(raft: Raft, mut due: watch::Receiver<SnapshotDue>) {
    let mut purging: Option<tokio::task::JoinHandle<()>> = None;
    while due.changed().await.is_ok() {
        let SnapshotDue { applied, purge_upto } = *due.borrow_and_update();
        if let Err(fatal) = raft.trigger().snapshot().await {
            tracing::debug!(error = %fatal, "raft stopped: no more snapshots");
            return;
        }
        if let Some(upto) = purge_upto {
            // A newer purge reaches at least as far; the one it replaces may be waiting for a snapshot
            // that openraft never builds (a trigger while a build runs is ignored).
            if let Some(waiting) = purging.replace(tokio::spawn(purge_once_built(raft.clone(), applied, upto))) {
                waiting.abort();
            }
        }
    }
}

/// Purges the log up to `upto` (inclusive) once openraft has a snapshot of the state applied up to
/// `applied` or later: openraft purges nothing a snapshot does not cover.
async fn purge_once_built(raft: Raft, applied: u64, upto: u64) {
    let covers = |m: &openraft::RaftMetrics<_, _>| m.snapshot.is_some_and(|s| s.index >= applied);
    if raft.wait(None).metrics(covers, "a snapshot covering the applied state").await.is_ok() {
        if let Err(fatal) = raft.trigger().purge_log(upto).await {
            tracing::debug!(error = %fatal, "raft stopped: no purge");
        }
    }
}
