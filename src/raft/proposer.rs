//! Group commit: requests that arrive while earlier ones are being committed are proposed together,
//! as one raft entry.
//!
//! openraft 0.9 appends, fsyncs and applies each client write on its own. Under load that costs one
//! log fsync, one LMDB commit and several task switches per request. The proposer keeps at most
//! `MAX_IN_FLIGHT` entries in flight; whatever queued up meanwhile becomes the next entry. A lone
//! request waits for nothing, and a busy member pays per entry rather than per request. etcd's raft
//! gets the same effect by appending all the entries of one `Ready` at once.
//!
//! Batching does not weaken ordering or auth: each request keeps its own header (requester and auth
//! revision), and apply takes the requests in order, each exactly as it would take an entry of its own.

use std::sync::Arc;

use futures::stream::FuturesOrdered;
use futures::StreamExt;
use openraft::error::ClientWriteError;
use prost::Message;
use tokio::sync::{mpsc, oneshot};

use super::relay::Relay;
use super::{BatchResults, NodeId, Raft, RaftBatch};
use crate::apply::Applied;
use crate::error::EtcdError;
use crate::frontend::answers::{Handed, ANSWERS};
use crate::proto::etcdserverpb::{InternalRaftBatch, InternalRaftRequest};

/// Entries proposed but not yet applied. Two lets the next entry's log append overlap the previous
/// entry's apply; more only splits the queue into smaller entries.
const MAX_IN_FLIGHT: usize = 2;

/// Requests per entry, so one entry's apply transaction stays short.
const MAX_REQUESTS_PER_ENTRY: usize = 1024;

/// Requests waiting for a place in an entry. Callers wait here when the member is saturated.
const QUEUE_DEPTH: usize = 4096;

/// The outcome, counted as an answer on its way (`frontend/answers.rs`) until the proposer's caller takes it.
type Outcome = (Result<Proposed, EtcdError>, Handed);
type Reply = oneshot::Sender<Outcome>;

/// A committed and applied proposal: the log index of its entry, and what applying it produced (an
/// apply result, even a refusal such as permission denied, is not a failed proposal).
#[derive(Debug)]
pub(crate) struct Proposed {
    pub index: u64,
    pub result: Result<Applied, EtcdError>,
}

struct Proposal {
    req: InternalRaftRequest,
    reply: Reply,
}

/// The write path's entrance to raft; see the module documentation.
pub(crate) struct Proposer {
    queue: mpsc::Sender<Proposal>,
}

impl Proposer {
    /// Starts the batching task on `runtime` (the raft thread's, where the core it feeds runs). An
    /// entry holds at most `max_entry_bytes` of encoded requests, unless a single request is larger
    /// by itself. The answers go through `relay`, to the runtime of the callers of `propose`.
    pub(crate) fn start(
        runtime: &tokio::runtime::Handle,
        raft: Raft,
        relay: Arc<Relay>,
        max_entry_bytes: usize,
    ) -> Self {
        let (queue, pending) = mpsc::channel(QUEUE_DEPTH);
        runtime.spawn(batch_and_propose(raft, pending, relay, max_entry_bytes));
        Proposer { queue }
    }

    /// Proposes `req` (its header already set) and returns what applying it produced; an error when it
    /// was not committed and applied.
    pub(crate) async fn propose(&self, req: InternalRaftRequest) -> Result<Proposed, EtcdError> {
        // A place in the queue first, then the proposal: `send` would hold the request in its future
        // as well (see `Node::propose`'s size test).
        let Ok(place) = self.queue.reserve().await else {
            crate::metrics::PROPOSALS_FAILED.inc();
            return Err(EtcdError::Stopped);
        };
        let (reply, applied) = oneshot::channel();
        place.send(Proposal { req, reply });
        match applied.await {
            Ok((outcome, _taken)) => outcome,
            Err(_dropped) => {
                crate::metrics::PROPOSALS_FAILED.inc();
                Err(EtcdError::Stopped)
            }
        }
    }
}

async fn batch_and_propose(
    raft: Raft,
    mut pending: mpsc::Receiver<Proposal>,
    relay: Arc<Relay>,
    max_entry_bytes: usize,
) {
    // Entries in flight, completing in log order; the same task delivers their results, so no task is
    // spawned per entry.
    let mut in_flight = FuturesOrdered::new();
    let mut next: Option<Proposal> = None;
    let mut accepting = true;
    loop {
        tokio::select! {
            biased;
            Some((outcome, replies)) = in_flight.next(), if !in_flight.is_empty() => deliver(&relay, outcome, replies),
            first = take_or_recv(&mut next, &mut pending), if accepting && in_flight.len() < MAX_IN_FLIGHT => {
                let Some(first) = first else {
                    accepting = false; // the node is gone: finish what is in flight
                    continue;
                };
                // Everything that queued while the slot was taken joins this entry.
                let mut bytes = first.req.encoded_len();
                let mut batch = vec![first];
                while batch.len() < MAX_REQUESTS_PER_ENTRY {
                    let Ok(proposal) = pending.try_recv() else { break };
                    let len = proposal.req.encoded_len();
                    if bytes + len > max_entry_bytes {
                        next = Some(proposal);
                        break;
                    }
                    bytes += len;
                    batch.push(proposal);
                }
                let (requests, replies): (Vec<_>, Vec<_>) = batch.into_iter().map(|p| (p.req, p.reply)).unzip();
                match raft.client_write_ff(RaftBatch::new(InternalRaftBatch { requests })).await {
                    Ok(written) => in_flight.push_back(async move {
                        let outcome = match written.await {
                            Ok(Ok(response)) => Ok((response.log_id.index, response.data)),
                            Ok(Err(refused)) => Err(write_error(refused)),
                            Err(_dropped) => Err(EtcdError::Stopped),
                        };
                        (outcome, replies)
                    }),
                    Err(fatal) => {
                        tracing::error!(error = %fatal, "raft stopped");
                        deliver(&relay, Err(EtcdError::Stopped), replies);
                        accepting = false;
                    }
                }
            }
            else => return,
        }
    }
}

/// The request held back from the previous entry (it did not fit), else the next queued one.
async fn take_or_recv(next: &mut Option<Proposal>, pending: &mut mpsc::Receiver<Proposal>) -> Option<Proposal> {
    match next.take() {
        Some(held) => Some(held),
        None => pending.recv().await,
    }
}

/// Hands each request its own result, or the entry's error to all of them.
fn deliver(relay: &Relay, outcome: Result<(u64, BatchResults), EtcdError>, replies: Vec<Reply>) {
    match outcome {
        Ok((index, results)) => {
            debug_assert_eq!(results.len(), replies.len(), "one result per request");
            let mut results = results.into_iter();
            relay.send(replies.into_iter().map(|reply| {
                let proposed = Proposed { index, result: results.next().unwrap_or(Err(EtcdError::Internal)) };
                (reply, (Ok(proposed), ANSWERS.hand()))
            }));
        }
        Err(e) => {
            // Not committed or not applied: every request of the entry failed as a proposal (an apply
            // result, even a refusal, is not a failed proposal, as in etcd).
            crate::metrics::PROPOSALS_FAILED.inc_by(replies.len() as u64);
            relay.send(replies.into_iter().map(|reply| (reply, (Err(e.clone()), ANSWERS.hand()))));
        }
    }
}

fn write_error(e: ClientWriteError<NodeId, super::member::MemberNode>) -> EtcdError {
    match e {
        // This member stopped leading before the entry was committed (a retryable error for clients:
        // the node forwards to the leader it knows, and a client retries elsewhere).
        ClientWriteError::ForwardToLeader(to) => {
            if to.leader_id.is_some() {
                EtcdError::LeaderChanged
            } else {
                EtcdError::NoLeader
            }
        }
        ClientWriteError::ChangeMembershipError(e) => {
            tracing::error!(error = %e, "unexpected membership error on a client write");
            EtcdError::Internal
        }
    }
}
