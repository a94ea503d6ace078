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
//!
//! A snapshot streaming from the leader holds it too: openraft's leader sends a follower no
//! heartbeat while it sends it a snapshot, and one chunk (4 MiB) or the install after the last one
//! can take longer than an election timeout on a busy machine. Campaigning then would depose the
//! leader mid-transfer, again and again (seen: a follower that campaigned 174 times while two
//! leaders in turn restarted their transfers to it). So while a chunk is being handled, and after
//! one was accepted for as long as the leader waits for the next to cross (`hold`), the timer
//! counts as having heard from the leader.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::time::MissedTickBehavior;

use super::{NodeId, Raft};

/// What the peer service tells the timer, and whether a leader transfer paused it.
#[derive(Default)]
pub(crate) struct ElectionTimer {
    /// Counts what resets the timer: a leader's message accepted, a vote granted.
    heard: AtomicU64,
    paused: AtomicBool,
    /// Messages of the leader being handled now (`hearing`).
    handling: AtomicUsize,
    /// Until when a snapshot transfer under way counts as hearing from the leader (`hold`).
    held_until: Mutex<Option<Instant>>,
}

/// A message of the leader being handled: the timer counts as hearing from it until dropped.
pub(crate) struct Hearing<'a>(&'a ElectionTimer);

impl Drop for Hearing<'_> {
    fn drop(&mut self) {
        self.0.handling.fetch_sub(1, Ordering::Relaxed);
        self.0.reset();
    }
}

impl ElectionTimer {
    /// A leader's AppendEntries or snapshot chunk was accepted, or a vote was granted.
    pub(crate) fn reset(&self) {
        self.heard.fetch_add(1, Ordering::Relaxed);
    }

    /// A message of the leader (a snapshot chunk, whose install may take long) is being handled.
    pub(crate) fn hearing(&self) -> Hearing<'_> {
        self.handling.fetch_add(1, Ordering::Relaxed);
        self.reset();
        Hearing(self)
    }

    /// A snapshot transfer is under way: no campaign for `patience` (the leader's wait for the next
    /// chunk), then the election timeout as usual.
    pub(crate) fn hold(&self, patience: Duration) {
        *self.held_until.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now() + patience);
        self.reset();
    }

    /// Whether a message of the leader is being handled or a snapshot transfer holds the timer.
    fn held(&self) -> bool {
        self.handling.load(Ordering::Relaxed) > 0
            || self
                .held_until
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_some_and(|until| Instant::now() < until)
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
            if !may_campaign || heard != seen || self.paused.load(Ordering::Relaxed) || self.held() {
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
pub(crate) fn ticks_in(election: Duration, heartbeat: Duration) -> u64 {
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
