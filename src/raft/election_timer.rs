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
//!
//! A leader whose process died is noticed sooner than that. Its death breaks every AppendEntries
//! stream it had open (`cluster/append_stream.rs` tells the timer), and a follower then asks whether
//! the leader's peer port refuses connections (`leader_probe.rs`: a definite answer, where silence
//! is none). If it does, once half an election timeout has passed since it last heard from that
//! leader, the follower stops honouring the leader's lease (`Trigger::forget_leader`, a keyward
//! patch of openraft), and it campaigns a random fraction of a heartbeat interval later, so that
//! the two followers of a 3-member cluster, which both noticed, rarely split the vote. A voter that
//! did not notice refuses the vote while the lease lasts, which leaves the election to the timeout
//! as before. A leader that is paused, partitioned or on a host that went down refuses nothing, and
//! is waited for as etcd waits.
//!
//! Why half an election timeout: a leader's read lease (`node/read_lease.rs`) is a tenth less than
//! that after a majority last accepted its AppendEntries. A voter that forgets the lease no sooner
//! lets no other leader be elected while this one still reads under its lease, even if the leader
//! lives on and only its port refused (a wrong advertised URL, say).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::sync::Notify;
use tokio::time::MissedTickBehavior;

use super::{leader_probe, NodeId, Raft};

/// What the raft core publishes about its server state (leader, membership).
type ServerMetricsReceiver =
    tokio::sync::watch::Receiver<openraft::metrics::RaftServerMetrics<NodeId, crate::raft::member::MemberNode>>;

/// What the peer service tells the timer, and whether a leader transfer paused it.
#[derive(Default)]
pub(crate) struct ElectionTimer {
    /// Counts what resets the timer: a leader's message accepted, a vote granted.
    heard: AtomicU64,
    /// When the timer was last reset, in nanoseconds since `EPOCH`.
    heard_at: AtomicU64,
    paused: AtomicBool,
    /// Messages of the leader being handled now (`hearing`).
    handling: AtomicUsize,
    /// Until when a snapshot transfer under way counts as hearing from the leader (`hold`).
    held_until: Mutex<Option<Instant>>,
    /// An AppendEntries stream from a leader ended (`leader_stream_ended`).
    stream_ended: Notify,
}

/// The origin of `heard_at`.
static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// What the timer does when it wakes.
enum Wake {
    Tick,
    StreamEnded,
    /// The next step after a leader was found gone is due.
    Gone,
}

/// Campaigns after the leader was found gone, the first included: two followers that campaign at
/// about the same time split the vote, and each tries again after another random delay.
const GONE_LEADER_CAMPAIGNS: u32 = 3;

/// The steps after the leader was found gone, each taken at its time if nothing was heard since
/// the probe (`heard` is the count then).
#[derive(Clone, Copy)]
enum GoneLeader {
    Forget { leader: NodeId, at: Instant, heard: u64 },
    Campaign { at: Instant, heard: u64, left: u32 },
}

impl GoneLeader {
    fn at(&self) -> Instant {
        match self {
            GoneLeader::Forget { at, .. } | GoneLeader::Campaign { at, .. } => *at,
        }
    }
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
        let since_epoch = EPOCH.elapsed().as_nanos() as u64;
        self.heard_at.store(since_epoch, Ordering::Relaxed);
        self.heard.fetch_add(1, Ordering::Release);
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

    /// An AppendEntries stream from a leader ended: the timer asks whether the leader's process is
    /// gone (see the module documentation).
    pub(crate) fn leader_stream_ended(&self) {
        self.stream_ended.notify_one();
    }

    /// Pauses (or resumes) campaigning: a leader transfer to another member is under way.
    pub(crate) fn pause(&self, paused: bool) {
        self.paused.store(paused, Ordering::Relaxed);
    }

    /// Ticks on the current runtime (the raft thread's) until raft stops; a leader whose stream
    /// ended is probed (see the module documentation).
    pub(crate) async fn run(self: Arc<Self>, raft: Raft, me: NodeId, heartbeat: Duration, election: Duration) {
        let mut ticks = tokio::time::interval(heartbeat);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let base = ticks_in(election, heartbeat);
        let mut timeout = randomized(base);
        let (mut seen, mut elapsed) = (self.heard.load(Ordering::Relaxed), 0u64);
        let metrics = raft.server_metrics();
        // A probe at most once a heartbeat interval, however often streams end; one due meanwhile
        // waits for the next tick.
        let (mut last_probe, mut probe_due) = (None::<Instant>, false);
        let mut gone: Option<GoneLeader> = None;
        loop {
            let gone_at = gone.map(|g| tokio::time::Instant::from_std(g.at()));
            let wake = tokio::select! {
                _ = ticks.tick() => Wake::Tick,
                () = self.stream_ended.notified() => Wake::StreamEnded,
                () = tokio::time::sleep_until(gone_at.unwrap_or_else(tokio::time::Instant::now)), if gone_at.is_some() => Wake::Gone,
            };
            let may_campaign = {
                let m = metrics.borrow();
                !m.state.is_leader() && m.membership_config.membership().voter_ids().any(|v| v == me)
            };
            let heard = self.heard.load(Ordering::Acquire);
            let quiet = !self.paused.load(Ordering::Relaxed) && !self.held();
            match wake {
                Wake::Tick => {}
                Wake::StreamEnded => {
                    probe_due = true;
                    if last_probe.is_some_and(|at| at.elapsed() < heartbeat) {
                        continue;
                    }
                }
                Wake::Gone => {
                    gone = match gone.take() {
                        Some(GoneLeader::Forget { leader, at, heard: then }) if heard == then && quiet => {
                            if raft.trigger().forget_leader(leader).await.is_err() {
                                return; // raft stopped
                            }
                            let left = GONE_LEADER_CAMPAIGNS;
                            Some(GoneLeader::Campaign { at: at + random_below(heartbeat), heard: then, left })
                        }
                        Some(GoneLeader::Campaign { heard: then, left, .. })
                            if heard == then && quiet && may_campaign =>
                        {
                            tracing::info!("the leader's process is gone: campaigning");
                            (elapsed, timeout) = (0, randomized(base));
                            if raft.trigger().elect().await.is_err() {
                                return; // raft stopped
                            }
                            // Once more if this campaign wins no vote: another member's message
                            // (an AppendEntries of the next leader, a vote granted) stops it.
                            let again = Instant::now() + heartbeat + random_below(heartbeat);
                            (left > 1).then_some(GoneLeader::Campaign { at: again, heard: then, left: left - 1 })
                        }
                        // A leader was heard, or a vote granted, since the probe: nothing to do.
                        _ => None,
                    };
                    continue;
                }
            }
            if probe_due {
                probe_due = false;
                last_probe = Some(Instant::now());
                if let Some(leader) = gone_leader(&metrics, heartbeat).await {
                    // Past the leader's read lease, however recently it was heard (module documentation).
                    let heard_at = *EPOCH + Duration::from_nanos(self.heard_at.load(Ordering::Relaxed));
                    gone = Some(GoneLeader::Forget { leader, at: heard_at + election / 2, heard });
                }
                if !matches!(wake, Wake::Tick) {
                    continue;
                }
            }
            if !may_campaign || heard != seen || !quiet {
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

/// The leader this member follows (by its server `metrics`), if its process is gone
/// (`leader_probe.rs`), waiting `patience` at most for each of its peer URLs.
async fn gone_leader(metrics: &ServerMetricsReceiver, patience: Duration) -> Option<NodeId> {
    let (leader, urls) = {
        let m = metrics.borrow();
        if m.state.is_leader() {
            return None;
        }
        let leader = m.current_leader?;
        let node = m.membership_config.membership().get_node(&leader)?;
        (leader, node.peer_urls.clone())
    };
    if !leader_probe::is_gone(&urls, patience).await {
        return None;
    }
    tracing::info!(leader = format!("{leader:x}"), "the leader's peer port refuses connections");
    Some(leader)
}

/// How many ticks of `heartbeat` make `election` (at least one).
pub(crate) fn ticks_in(election: Duration, heartbeat: Duration) -> u64 {
    (election.as_millis() / heartbeat.as_millis().max(1)).max(1) as u64
}

/// A random duration in [0, `limit`).
fn random_below(limit: Duration) -> Duration {
    limit.mul_f64(rand::rng().random_range(0.0..1.0))
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
