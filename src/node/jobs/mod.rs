//! Everything a member runs in the background, each job named by what it does. A job holds the
//! node weakly (or only raft's handle) and ends when the node is dropped or the raft core stops.
//!
//! - `apply_observer.rs`: after each applied batch (on the apply thread): the latest revision and
//!   auth state, the lease clock, the snapshot count, the applied batches to the watch hub.
//! - `leases.rs`: the leader revokes expired leases, checkpoints remaining TTLs, and extends every
//!   lease when it takes over.
//! - `space.rs`: NOSPACE raised when storage fills up; the disk-full ballast put back.
//! - `raft.rs`: leader changes counted; snapshots built every `--snapshot-count` requests, and the
//!   raft log purged behind them up to where `log_retention.rs` says (etcd's 5,000 requests kept).
//! - `publish.rs`: this member's name and client URLs published once it has started.
//! - `compaction.rs`: the removal of what compactions made unreachable, in bounded steps between
//!   applies; `compaction_pacing.rs` sizes and spaces the steps by what the last one cost.
//! - `compactor.rs`: auto compaction (`--auto-compaction-*`), started by the member's run
//!   (`server/run.rs`) when configured.

use std::sync::Arc;

use super::Node;

pub(super) mod apply_observer;
mod compaction;
mod compaction_pacing;
pub(crate) mod compactor;
mod leases;
mod log_retention;
mod publish;
mod raft;
mod space;

/// Starts the jobs of a member that has just started (`Node::start`).
pub(super) fn spawn(
    node: &Arc<Node>,
    snapshot_due: tokio::sync::watch::Receiver<apply_observer::SnapshotDue>,
    removal_due: Arc<tokio::sync::Notify>,
) {
    tokio::spawn(raft::count_leader_changes(node.raft.clone()));
    tokio::spawn(publish::publish_attributes(Arc::downgrade(node)));
    tokio::spawn(leases::extend_on_leadership(Arc::downgrade(node)));
    tokio::spawn(space::raise_nospace_when_storage_full(Arc::downgrade(node)));
    tokio::spawn(space::restore_ballast(Arc::downgrade(node)));
    tokio::spawn(raft::snapshot_when_due(node.raft.clone(), snapshot_due));
    tokio::spawn(leases::expire(Arc::downgrade(node)));
    tokio::spawn(leases::checkpoint(Arc::downgrade(node)));
    tokio::spawn(compaction::remove_compacted(Arc::downgrade(node), removal_due));
}
