//! Linearizable reads share their quorum round, as etcd's read loop does.
//!
//! A read index costs a round trip to a quorum (openraft's `get_read_log_id` sends one heartbeat to
//! every voter per call) or, on a follower, one request to the leader. Reads that arrive while a
//! round is in flight wait for the next round and then share it: one round serves all of them. They
//! must not join the round in flight: its read index was fixed before they arrived, and a write
//! acknowledged in between would be missing from what they read.
//!
//! On the leader a round may also be confirmed by its read lease (`read_lease.rs`,
//! `--leader-lease-reads`) instead of a heartbeat round. `/metrics` counts the rounds, the reads they
//! served and their durations (`keyward_read_index_*`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt};

use openraft::error::{CheckIsLeaderError, RaftError};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::read_lease::ReadLease;
use crate::error::EtcdError;
use crate::frontend::answers::{Handed, ANSWERS};
use crate::metrics;
use crate::raft::Raft;

/// One round: the read index the leader confirmed (by its read lease or a quorum round).
pub(super) type Fetch = Box<dyn Fn() -> BoxFuture<'static, Result<u64, EtcdError>> + Send + Sync>;

/// Shares rounds of `fetch` among the reads that wait for them; cloning shares the rounds.
#[derive(Clone)]
pub(super) struct ReadRounds {
    inner: Arc<Inner>,
}

struct Inner {
    /// The rounds' label in `/metrics`.
    kind: &'static str,
    fetch: Fetch,
    pending: Mutex<Pending>,
}

#[derive(Default)]
struct Pending {
    /// Reads waiting for the next round.
    /// Each read's index is counted as an answer on its way (`frontend/answers.rs`) until the read takes it.
    waiting: Vec<oneshot::Sender<(Result<u64, EtcdError>, Handed)>>,
    /// A task runs rounds until no read waits.
    running: bool,
}

impl ReadRounds {
    pub(super) fn new(kind: &'static str, fetch: Fetch) -> Self {
        Self { inner: Arc::new(Inner { kind, fetch, pending: Mutex::new(Pending::default()) }) }
    }

    /// The read index of the first round that starts after this call.
    pub(super) async fn read_index(&self) -> Result<u64, EtcdError> {
        let (answer, answered) = oneshot::channel();
        let start = {
            let mut pending = self.inner.pending.lock().unwrap_or_else(|e| e.into_inner());
            pending.waiting.push(answer);
            !std::mem::replace(&mut pending.running, true)
        };
        if start {
            // A task of its own: a reader that gives up (its client went away) must not stop the
            // round the others wait for.
            tokio::spawn(self.clone().run());
        }
        match answered.await {
            Ok((index, _taken)) => index,
            Err(_dropped) => Err(EtcdError::Stopped),
        }
    }

    async fn run(self) {
        loop {
            let round = {
                let mut pending = self.inner.pending.lock().unwrap_or_else(|e| e.into_inner());
                if pending.waiting.is_empty() {
                    pending.running = false;
                    return;
                }
                std::mem::take(&mut pending.waiting)
            };
            let started = std::time::Instant::now();
            let index = (self.inner.fetch)().await;
            let kind = [self.inner.kind];
            metrics::READ_INDEX_ROUND_SECONDS.with_label_values(&kind).observe(started.elapsed().as_secs_f64());
            metrics::READ_INDEX_ROUNDS.with_label_values(&kind).inc();
            metrics::READ_INDEX_READS.with_label_values(&kind).inc_by(round.len() as u64);
            for reader in round {
                let _ = reader.send((index.clone(), ANSWERS.hand()));
            }
        }
    }
}

/// The rounds of a leader: its read lease names the read index while it holds (with `lease`), else
/// openraft confirms leadership with a quorum and names it. A member that does not lead answers "no
/// leader".
///
/// openraft gives each voter's answer one heartbeat interval and fails the round when a quorum did
/// not answer within it ("quorum not enough"); on a busy machine a live follower answers later than
/// that. etcd's read index waits for the quorum's answers within its request timeout instead, so a
/// round that missed its quorum is tried again, up to etcd's request timeout (5 s + 2 election
/// timeouts), before the read fails.
pub(super) fn confirmed_by_leader(raft: Raft, lease: Option<ReadLease>) -> Fetch {
    Box::new(move || {
        let (raft, lease) = (raft.clone(), lease.clone());
        async move {
            if let Some(index) = match &lease {
                Some(lease) => lease.read_index(&raft).await,
                None => None,
            } {
                metrics::READ_INDEX_CONFIRMATIONS.with_label_values(&["lease"]).inc();
                return Ok(index);
            }
            let election = Duration::from_millis(raft.config().election_timeout_max);
            let patience = Instant::now() + Duration::from_secs(5) + 2 * election;
            loop {
                match raft.get_read_log_id().await {
                    Ok((read, _applied)) => {
                        metrics::READ_INDEX_CONFIRMATIONS.with_label_values(&["quorum"]).inc();
                        return Ok(read.map_or(0, |id| id.index));
                    }
                    Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(e))) if Instant::now() < patience => {
                        tracing::debug!(error = %e, "a read round missed its quorum; trying again");
                    }
                    Err(RaftError::APIError(_)) => return Err(EtcdError::NoLeader),
                    Err(RaftError::Fatal(_)) => return Err(EtcdError::Stopped),
                }
            }
        }
        .boxed()
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use tokio::sync::Semaphore;

    use super::*;

    /// Rounds that each return their own number and wait for a permit before returning.
    fn counted(rounds: Arc<AtomicU64>, gate: Arc<Semaphore>) -> ReadRounds {
        ReadRounds::new(
            "test",
            Box::new(move || {
                let number = rounds.fetch_add(1, Ordering::SeqCst) + 1;
                let gate = gate.clone();
                async move {
                    gate.acquire().await.expect("gate open").forget();
                    Ok(number)
                }
                .boxed()
            }),
        )
    }

    #[tokio::test]
    async fn reads_during_a_round_share_the_next_one() {
        let started = Arc::new(AtomicU64::new(0));
        let gate = Arc::new(Semaphore::new(0));
        let rounds = counted(started.clone(), gate.clone());

        let first = tokio::spawn({
            let rounds = rounds.clone();
            async move { rounds.read_index().await }
        });
        while started.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        // Round 1 is in flight: these ten arrive after its index was fixed.
        let later: Vec<_> = (0..10)
            .map(|_| {
                let rounds = rounds.clone();
                tokio::spawn(async move { rounds.read_index().await })
            })
            .collect();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(started.load(Ordering::SeqCst), 1, "no second round while the first is in flight");
        gate.add_permits(2);
        assert_eq!(first.await.unwrap(), Ok(1));
        for read in later {
            assert_eq!(read.await.unwrap(), Ok(2), "every later read waits for the round after it arrived");
        }
        assert_eq!(started.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_reader_that_gives_up_does_not_stop_the_rounds() {
        let started = Arc::new(AtomicU64::new(0));
        let gate = Arc::new(Semaphore::new(0));
        let rounds = counted(started.clone(), gate.clone());

        // The reader whose call started the rounds goes away while its round is in flight.
        let quitter = tokio::spawn({
            let rounds = rounds.clone();
            async move { rounds.read_index().await }
        });
        while started.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        let next = tokio::spawn({
            let rounds = rounds.clone();
            async move { rounds.read_index().await }
        });
        tokio::task::yield_now().await;
        quitter.abort();
        gate.add_permits(2);
        // Bounded only so that a broken runner fails instead of hanging the suite.
        let answer = tokio::time::timeout(std::time::Duration::from_secs(30), next).await;
        assert_eq!(answer.expect("the next round ran").unwrap(), Ok(2));
    }

    #[tokio::test]
    async fn errors_reach_every_reader_of_the_round() {
        let rounds = ReadRounds::new("test", Box::new(|| async { Err(EtcdError::NoLeader) }.boxed()));
        let (a, b) = tokio::join!(rounds.read_index(), rounds.read_index());
        assert_eq!((a, b), (Err(EtcdError::NoLeader), Err(EtcdError::NoLeader)));
    }
}
