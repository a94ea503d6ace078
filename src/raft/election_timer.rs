//! When a voter campaigns: etcd's election timer, counted in heartbeat ticks on the raft thread.
//!
//! openraft 0.9's own timer (off here: `enable_elect: false`, `node/start.rs`) measures wall-clock
//! time since the vote was last touched, and adds a leader lease of `election_timeout_max` before a
//! randomized timeout drawn once per process: a follower campaigned 3–4 election timeouts after its
//! leader died, where etcd's campaign after 1–2. It also counts the time the raft thread did not run:
//! a follower whose thread stalled (both cores busy, a slow `fdatasync`) finds its timeout passed when
//! it runs again, and openraft's loop takes that timer tick before the heartbeats that queued
//! meanwhile, so it campaigns against a live leader. etcd counts ticks of its raft loop instead: a
//! stalled loop misses ticks, and a follower never campaigns because it was itself slow.
//!
//! This timer does as etcd's: one tick per heartbeat interval on the raft thread (a tick missed
//! while the thread was busy is not made up); a voter that does not lead campaigns
//! (`Trigger::elect`) once it has heard nothing from a leader (an AppendEntries or snapshot chunk it
//! accepted, `cluster/peer_service.rs`) and granted no vote for a timeout drawn from
//! [E, 2E) in ticks, drawn again after every reset (etcd's `randomizedElectionTimeout`). openraft
//! still refuses a vote while it heard from a leader within its lease, `election_timeout_max`, set
//! to E: etcd's check-quorum (`inLease`). A leader transfer pauses it (`node/transfer.rs`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::time::MissedTickBehavior;

use super::{NodeId, Raft};

/// What the peer service tells the timer, and whether a leader transfer paused it.
#[derive(Default)]
pub(crate) struct ElectionTimer {
    /// Counts what resets the timer: a leader's message accepted, a vote granted.
    heard: AtomicU64,
    paused: AtomicBool,
}

impl ElectionTimer {
    /// A leader's AppendEntries or snapshot chunk was accepted, or a vote was granted.
    pub(crate) fn reset(&self) {
        self.heard.fetch_add(1, Ordering::Relaxed);
    }

    /// Pauses (or resumes) campaigning: a leader transfer to another member is under way.
    pub(crate) fn pause(&self, paused: bool) {
        self.paused.store(paused, Ordering::Relaxed);
    }

    /// Ticks on the current runtime (the raft thread's) until raft stops.
    pub(crate) async fn run(self: Arc<Self>, raft: Raft, me: NodeId, heartbeat: Duration, election: Duration) {
        let mut ticks = tokio::time::interval(heartbeat);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let base = ticks_in(election, heartbeat);
        let mut timeout = randomized(base);
        let (mut seen, mut elapsed) = (self.heard.load(Ordering::Relaxed), 0u64);
        let metrics = raft.server_metrics();
        loop {
            ticks.tick().await;
            let may_campaign = {
                let m = metrics.borrow();
                !m.state.is_leader() && m.membership_config.membership().voter_ids().any(|v| v == me)
            };
            let heard = self.heard.load(Ordering::Relaxed);
            if !may_campaign || heard != seen || self.paused.load(Ordering::Relaxed) {
                (seen, elapsed, timeout) = (heard, 0, randomized(base));
                continue;
            }
            elapsed += 1;
            if elapsed >= timeout {
                tracing::info!(ticks = elapsed, "no leader heard within the election timeout: campaigning");
                (elapsed, timeout) = (0, randomized(base));
                if raft.trigger().elect().await.is_err() {
                    return; // raft stopped
                }
            }
        }
    }
}

/// How many ticks of `heartbeat` make `election` (at least one).
fn ticks_in(election: Duration, heartbeat: Duration) -> u64 {
    (election.as_millis() / heartbeat.as_millis().max(1)).max(1) as u64
}

/// etcd's randomized election timeout: `base` ticks plus up to `base - 1` more.
fn randomized(base: u64) -> u64 {
    base + rand::rng().random_range(0..base)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_etcds_range_in_ticks() {
        let base = ticks_in(Duration::from_millis(1000), Duration::from_millis(100));
        assert_eq!(base, 10);
        let drawn: Vec<u64> = (0..2000).map(|_| randomized(base)).collect();
        assert!(drawn.iter().all(|t| (10..20).contains(t)), "{drawn:?}");
        assert!(drawn.contains(&10) && drawn.contains(&19), "the whole range is drawn");
        assert_eq!(ticks_in(Duration::from_millis(50), Duration::from_millis(100)), 1);
    }
}
