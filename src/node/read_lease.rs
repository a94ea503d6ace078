//! Leader lease reads (`--leader-lease-reads`): the leader names a read index without a quorum round
//! while a majority's recent acceptance of its AppendEntries rules out any other leader.
//!
//! A read index is safe when, at one instant during the read, no other leader can have committed
//! an entry that this leader's commit index lacks. The usual proof is a quorum round per read index
//! (`read_rounds.rs`). The lease proves it from what the heartbeats already carry:
//!
//! 1. A follower that accepts an AppendEntries of this leader (term `T`) records its vote for it,
//!    committed, and touches the vote's time no earlier than the request was sent
//!    (`cluster/quorum_acks.rs` keeps the send times). openraft 0.9's follower then refuses every
//!    vote request until its leader lease (`election_timeout_max`, `--election-timeout`) has passed
//!    since that touch (`Engine::handle_vote_req`), and does not campaign itself before an election
//!    timeout of its raft thread's ticks has passed since it last heard from the leader
//!    (`raft/election_timer.rs`: ticks missed while the thread is busy are not made up, so never
//!    sooner in wall time). One exception shortens both, never below `election_timeout_min`: a
//!    follower that finds the leader's peer port refusing connections forgets its lease
//!    (`Trigger::forget_leader`) and campaigns, but only once `election_timeout_min` has passed on
//!    its monotonic clock since it last heard from the leader (which a suspend only lengthens).
//!    A restarted follower sets the time of its persisted committed vote to its start, so a crash
//!    and restart do not shorten the window.
//! 2. A new leader needs the votes of a majority, which shares a member with the majority that
//!    accepted this leader at `s`: none of those votes before `s` + the follower lease (at least
//!    `election_timeout_min`, longer than this lease). If the
//!    shared member is this leader itself, it has stepped down when it granted the vote; the check
//!    below runs inside openraft's core (`Raft::with_raft_state`), which at that instant says
//!    whether this member still leads, so a vote granted before it is seen.
//! 3. So at the instant of the check, if `now - s < lease`, no other leader exists, and entries of
//!    earlier terms are all in this leader's log; once it has committed an entry of its own term its
//!    commit index is the cluster's, and that is the read index. What happens after the check (a
//!    pause of this process by SIGSTOP, a slow read) does not matter: the read waits for the apply
//!    of that index and reads a state at least that new, which was current after the check.
//!
//! The lease is `election_timeout_min` (half of `--election-timeout`, `node/start.rs`) less a
//! tenth, shorter than the followers' refusal (`election_timeout_max`): the tenth covers clock rate error (NTP slews at most 500 ppm; the tenth
//! is 200 times that) and the send time is taken before the request goes, the follower's touch
//! after it arrives. Clocks are the boot clock on both sides of the comparison here (monotonic, counts
//! suspended time: a leader that wakes from a suspend sees its lease as old as it is); wall-clock
//! jumps move neither side. A joint membership (a change in progress) takes the quorum round.
//!
//! etcd 3.4 has no lease reads (its raft's `ReadOnlyLeaseBased` is not reachable from a flag), so
//! this is keyward's flag; all members of a cluster must share it and `--election-timeout`.

use std::sync::Arc;
use std::time::Duration;

use openraft::{RaftState, ServerState};

use crate::cluster::quorum_acks::{boot_clock, QuorumAcks};
use crate::raft::{NodeId, Raft};

/// A leader's read lease: how long a majority's acceptance vouches for its leadership.
#[derive(Clone)]
pub(super) struct ReadLease {
    acks: Arc<QuorumAcks>,
    me: NodeId,
    length: Duration,
}

impl ReadLease {
    /// The lease of member `me`, whose peers' acceptances `acks` records, with openraft's `config`.
    pub(super) fn new(acks: Arc<QuorumAcks>, me: NodeId, config: &openraft::Config) -> Self {
        Self { acks, me, length: lease_length(config) }
    }

    /// The read index the lease vouches for now, or `None` when a quorum round must (this member
    /// does not lead, the lease ran out, no entry of this term is committed yet, a joint membership).
    pub(super) async fn read_index(&self, raft: &Raft) -> Option<u64> {
        let lease = self.clone();
        raft.with_raft_state(move |state| lease.vouches_for(state)).await.ok().flatten()
    }

    fn vouches_for(
        &self,
        state: &RaftState<NodeId, crate::raft::member::MemberNode, openraft::TokioInstant>,
    ) -> Option<u64> {
        if state.server_state != ServerState::Leader {
            return None;
        }
        let vote = state.vote_ref();
        if !vote.is_committed() || vote.leader_id().voted_for() != Some(self.me) {
            return None;
        }
        let leader = *vote.leader_id();
        // An entry of this term committed: the commit index covers every earlier leader's.
        let committed = state.committed.filter(|c| c.leader_id == leader)?;
        let membership = state.membership_state.effective().membership();
        if membership.get_joint_config().len() != 1 {
            return None;
        }
        let voters: Vec<NodeId> = membership.voter_ids().collect();
        let now = boot_clock();
        let since = self.acks.majority_since(&voters, self.me, leader, now)?;
        (now.saturating_sub(since) < self.length).then_some(committed.index)
    }
}

/// `election_timeout_min` less a tenth (see the module docs).
fn lease_length(config: &openraft::Config) -> Duration {
    let shortest = Duration::from_millis(config.election_timeout_min.min(config.election_timeout_max));
    shortest - shortest / 10
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_is_shorter_than_any_election_timeout() {
        let config = openraft::Config { election_timeout_min: 1000, election_timeout_max: 2000, ..Default::default() };
        assert_eq!(lease_length(&config), Duration::from_millis(900));
        let config = openraft::Config { election_timeout_min: 300, election_timeout_max: 301, ..Default::default() };
        assert_eq!(lease_length(&config), Duration::from_millis(270));
    }
}
