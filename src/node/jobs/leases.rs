//! The leader's lease jobs: expired leases are revoked through raft (so their keys are deleted at an
//! ordered revision), remaining TTLs are checkpointed through raft, and a new leader extends every
//! lease. The clock itself is the lessor's (`lease/lessor.rs`).

use std::sync::Weak;
use std::time::Duration;

use crate::error::EtcdError;
use crate::identity::Requester;
use crate::node::Node;
use crate::proto::etcdserverpb::{InternalRaftRequest, LeaseRevokeRequest};

/// How often the leader looks for expired leases.
const LEASE_EXPIRY_TICK: Duration = Duration::from_millis(250);
/// How often remaining lease TTLs are checkpointed through raft (etcd's default interval).
const LEASE_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(300);

/// The leader revokes expired leases through raft, so their keys are deleted at an ordered revision.
pub(super) async fn expire(node: Weak<Node>) {
    let mut tick = tokio::time::interval(LEASE_EXPIRY_TICK);
    loop {
        tick.tick().await;
        let Some(node) = node.upgrade() else { return };
        if !node.is_leader() {
            continue;
        }
        for id in node.lessor.take_expired() {
            let node = node.clone();
            tokio::spawn(async move {
                let revoke = LeaseRevokeRequest { id };
                match node
                    .propose(
                        InternalRaftRequest { lease_revoke: Some(Box::new(revoke)), ..Default::default() },
                        &Requester::Member,
                    )
                    .await
                {
                    Ok(_) => tracing::debug!(lease = format!("{id:x}"), "lease expired and was revoked"),
                    // Revoked meanwhile by a client: nothing left to do.
                    Err(EtcdError::LeaseNotFound) => node.lessor.revoked(id),
                    Err(e) => {
                        tracing::warn!(lease = format!("{id:x}"), error = %e, "revoking an expired lease failed; will retry")
                    }
                }
            });
        }
    }
}

/// The leader proposes the remaining TTL of every lease every `LEASE_CHECKPOINT_INTERVAL`, so a
/// restart resumes them where they were.
pub(super) async fn checkpoint(node: Weak<Node>) {
    let mut tick = tokio::time::interval(LEASE_CHECKPOINT_INTERVAL);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(node) = node.upgrade() else { return };
        if node.is_leader() {
            if let Err(e) = propose_checkpoint(&node).await {
                tracing::warn!(error = %e, "lease checkpoint failed");
            }
        }
    }
}

async fn propose_checkpoint(node: &Node) -> Result<(), EtcdError> {
    let Some(req) = node.lessor.checkpoint() else { return Ok(()) };
    node.propose(
        InternalRaftRequest { lease_checkpoint: Some(Box::new(req)), ..Default::default() },
        &Requester::Member,
    )
    .await
    .map(|_| ())
}

/// When this member becomes leader, every lease gets its full TTL again plus an election timeout
/// (etcd's `Promote`): keep-alives went to the old leader, whose clock this member did not see.
pub(super) async fn extend_on_leadership(node: Weak<Node>) {
    let Some(mut metrics) = node.upgrade().map(|n| n.raft.server_metrics()) else { return };
    let mut led_term = None;
    loop {
        let (leader, term) = {
            let m = metrics.borrow_and_update();
            (m.current_leader, m.vote.leader_id().get_term())
        };
        let Some(node) = node.upgrade() else { return };
        if leader == Some(node.member_id) && led_term != Some(term) {
            led_term = Some(term);
            node.lessor.promote(node.election_timeout);
        }
        drop(node);
        if metrics.changed().await.is_err() {
            return;
        }
    }
}
