//! When this member's AppendEntries were last accepted by each peer: the evidence a leader's read
//! lease rests on (`node/read_lease.rs`).
//!
//! A follower that accepts an AppendEntries of leader `L` (any answer but "higher vote") has touched
//! its vote for `L` no earlier than the request was sent; openraft then refuses every vote request
//! for its leader lease after that. So the send time of the newest accepted request per peer, with
//! the leader it was sent for, is what a lease needs. Times are read on the boot clock
//! (`CLOCK_BOOTTIME`): monotonic (wall-clock jumps do not move it) and, unlike `CLOCK_MONOTONIC`, it
//! keeps counting while the machine is suspended, so a leader that wakes from a suspend sees its
//! lease as old as it is.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use openraft::LeaderId;

use crate::raft::NodeId;

/// A point on the boot clock: how long since the machine booted.
pub(crate) type BootTime = Duration;

/// The boot clock now.
#[cfg(target_os = "linux")]
pub(crate) fn boot_clock() -> BootTime {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    Duration::new(now.tv_sec.unsigned_abs(), now.tv_nsec.unsigned_abs() as u32)
}

/// The boot clock now: elsewhere, the process's monotonic clock (which may stop while suspended).
#[cfg(not(target_os = "linux"))]
pub(crate) fn boot_clock() -> BootTime {
    static START: std::sync::LazyLock<std::time::Instant> = std::sync::LazyLock::new(std::time::Instant::now);
    START.elapsed()
}

/// Per peer: the leader and the send time of the newest AppendEntries the peer accepted.
#[derive(Default)]
pub(crate) struct QuorumAcks {
    accepted: Mutex<HashMap<NodeId, (LeaderId<NodeId>, BootTime)>>,
}

impl QuorumAcks {
    /// `peer` accepted an AppendEntries of `leader` sent at `sent`.
    pub(crate) fn accepted(&self, peer: NodeId, leader: LeaderId<NodeId>, sent: BootTime) {
        let mut accepted = self.accepted.lock().unwrap_or_else(|e| e.into_inner());
        let newest = accepted.entry(peer).or_insert((leader, sent));
        // Replies may come back out of order: keep the newest send for the newest leader.
        if (leader, sent) > *newest {
            *newest = (leader, sent);
        }
    }

    /// The latest time by which a majority of `voters` had accepted `leader` (this member, `me`,
    /// counting at `now`), or `None` if no majority has yet.
    pub(crate) fn majority_since(
        &self,
        voters: &[NodeId],
        me: NodeId,
        leader: LeaderId<NodeId>,
        now: BootTime,
    ) -> Option<BootTime> {
        let accepted = self.accepted.lock().unwrap_or_else(|e| e.into_inner());
        let mut times: Vec<BootTime> = voters
            .iter()
            .filter_map(|&voter| match accepted.get(&voter) {
                _ if voter == me => Some(now),
                Some(&(of, sent)) if of == leader => Some(sent),
                _ => None,
            })
            .collect();
        times.sort_unstable_by(|a, b| b.cmp(a));
        let majority = voters.len() / 2 + 1;
        times.get(majority - 1).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> BootTime {
        Duration::from_millis(ms)
    }

    #[test]
    fn a_majority_counts_the_leader_itself_at_now() {
        let acks = QuorumAcks::default();
        let leader = LeaderId::new(3, 1);
        assert_eq!(acks.majority_since(&[1, 2, 3], 1, leader, at(100)), None, "no follower yet");
        acks.accepted(2, leader, at(40));
        assert_eq!(acks.majority_since(&[1, 2, 3], 1, leader, at(100)), Some(at(40)));
        acks.accepted(3, leader, at(70));
        assert_eq!(acks.majority_since(&[1, 2, 3], 1, leader, at(100)), Some(at(70)), "the second newest of three");
    }

    #[test]
    fn acceptances_of_another_leader_do_not_count() {
        let acks = QuorumAcks::default();
        acks.accepted(2, LeaderId::new(2, 1), at(90));
        assert_eq!(acks.majority_since(&[1, 2, 3], 1, LeaderId::new(3, 1), at(100)), None);
        // A newer leader's acceptance replaces the older one; an older one arriving late does not.
        acks.accepted(2, LeaderId::new(3, 1), at(95));
        acks.accepted(2, LeaderId::new(2, 1), at(99));
        assert_eq!(acks.majority_since(&[1, 2, 3], 1, LeaderId::new(3, 1), at(100)), Some(at(95)));
    }

    #[test]
    fn a_late_reply_does_not_move_the_time_back() {
        let acks = QuorumAcks::default();
        let leader = LeaderId::new(1, 1);
        acks.accepted(2, leader, at(80));
        acks.accepted(2, leader, at(50));
        assert_eq!(acks.majority_since(&[1, 2, 3], 1, leader, at(100)), Some(at(80)));
    }

    #[test]
    fn five_voters_need_two_followers_and_non_voters_do_not_count() {
        let acks = QuorumAcks::default();
        let leader = LeaderId::new(1, 1);
        acks.accepted(2, leader, at(60));
        acks.accepted(9, leader, at(99)); // a learner: not among the voters
        assert_eq!(acks.majority_since(&[1, 2, 3, 4, 5], 1, leader, at(100)), None);
        acks.accepted(4, leader, at(30));
        assert_eq!(acks.majority_since(&[1, 2, 3, 4, 5], 1, leader, at(100)), Some(at(30)));
    }

    #[test]
    fn the_boot_clock_does_not_go_back() {
        let a = boot_clock();
        let b = boot_clock();
        assert!(b >= a);
    }
}
