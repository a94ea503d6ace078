//! A leader that has not heard from a quorum for an election timeout steps down: etcd's check-quorum
//! (on in etcd 3.4), which openraft 0.9 does not have.
//!
//! Without it a leader cut off from its followers (a partition, or both followers stopped) kept
//! saying it led: `endpoint status` named it, `etcd_server_has_leader` was 1, and a write to it waited
//! out its whole deadline to fail with "request timed out". etcd's leader checks every election
//! timeout that each of a quorum of voters answered since the last check, and becomes a follower if
//! not: its clients then get "no leader" at once (and a watch opened with `WithRequireLeader`, as
//! kube-apiserver opens them, is cancelled), and move to another endpoint.
//!
//! The evidence is what `cluster/quorum_acks.rs` records: the send time of the newest AppendEntries
//! (heartbeats included) or snapshot chunk each peer accepted of this leader. Every E (in ticks of
//! the heartbeat interval, on the raft thread, as the election timer counts: a tick missed while the
//! thread did not run is not made up, so a leader never steps down because it was itself stalled)
//! a quorum of each voter configuration must have accepted something sent since the previous check.
//! If not, the leader steps down (`Trigger::step_down`, `vendor/openraft/PATCH.md`): openraft cannot
//! make it a follower at its own term, so it campaigns at the next one, which the voters that still
//! follow a leader refuse (their leader lease) while it stays cut off.

use std::sync::Arc;
use std::time::Duration;

use openraft::LeaderId;
use tokio::time::MissedTickBehavior;

use crate::cluster::quorum_acks::{boot_clock, BootTime, QuorumAcks};
use crate::raft::{NodeId, Raft};

/// Checks this member's leadership every election timeout while it leads; returns when raft stops.
pub(super) async fn step_down_without_quorum(
    raft: Raft,
    acks: Arc<QuorumAcks>,
    me: NodeId,
    heartbeat: Duration,
    election: Duration,
) {
    let mut ticks = tokio::time::interval(heartbeat);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let period = crate::raft::election_timer::ticks_in(election, heartbeat);
    let metrics = raft.server_metrics();
    // The leadership being checked, since when (the last check), and the ticks since.
    let mut window: Option<(LeaderId<NodeId>, BootTime, u64)> = None;
    loop {
        ticks.tick().await;
        let (leader, configs) = {
            let m = metrics.borrow();
            if !m.state.is_leader() {
                window = None;
                continue;
            }
            (*m.vote.leader_id(), m.membership_config.membership().get_joint_config().clone())
        };
        let now = boot_clock();
        let (since, elapsed) = match window {
            Some((of, since, elapsed)) if of == leader => (since, elapsed + 1),
            // Newly leading: the first window starts now.
            _ => (now, 0),
        };
        if elapsed < period {
            window = Some((leader, since, elapsed));
            continue;
        }
        let heard = configs.iter().all(|voters| {
            let voters: Vec<NodeId> = voters.iter().copied().collect();
            acks.majority_since(&voters, me, leader, now).is_some_and(|accepted| accepted >= since)
        });
        if heard {
            window = Some((leader, now, 0));
            continue;
        }
        tracing::warn!(
            leader = %leader,
            election_timeout = ?election,
            "no quorum of voters heard from within the election timeout: stepping down"
        );
        crate::metrics::LEADER_STEP_DOWNS.inc();
        window = None;
        if raft.trigger().step_down().await.is_err() {
            return; // raft stopped
        }
    }
}
