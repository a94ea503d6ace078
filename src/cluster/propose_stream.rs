//! A follower's forwarded writes to the leader on one long-lived bidirectional gRPC stream
//! (`Peer.ProposeStream`), as etcd's followers send their proposals to the leader among their raft
//! messages instead of a request each.
//!
//! Why: a unary `Propose` per write costs, on each side, a new HTTP/2 stream (headers encoded and
//! decoded, metadata, a deadline timer, the channel's buffer task on the follower; a server task,
//! the router and the peer guard on the leader). With clients spread over three members, two writes
//! in three are forwarded, and a 3-member cluster spent about a third more CPU per write than when
//! every client wrote to the leader (docs/performance.md, issue 33). On the stream a write is one
//! message each way, and a busy stream carries many in one frame and one system call.
//!
//! The follower's side (`ProposeStreams::propose`): one stream per leader URL, opened on first use by
//! a task that reads the answers and hands each to its waiter by id. A write the follower waits to
//! see applied here (`raft/awaited.rs`, as etcd's followers do) is answered by the leader only if it
//! fails: the follower's own apply gives its result. Any other write is answered once the leader
//! applied it, in whatever order writes apply. When the stream fails, every write waiting on
//! it gets the failure: a write the stream never took is told so (`NeverSent`), and may go again; one
//! that may have reached the leader is a transport failure, which the caller reports as etcd's
//! "leader changed" (it may or may not be committed, as with a unary call whose answer was lost). The
//! next write opens a new stream. A leader that does not serve the stream (an older version during a
//! rolling upgrade: `Unimplemented`) gets unary calls from this member from then on; the writes that
//! found out were never proposed, and are sent again that way.
//!
//! The leader's side (`serve`): the stream is admitted by the peer guard when it opens, its cluster
//! checked once (`peer_service.rs`), and every write admitted again against the membership of its
//! time (`peer_guard.rs`, `StreamCaller`). A refused or undecodable message ends the stream with its
//! error. At most `IN_FLIGHT` writes of one stream are proposed at once; past that the stream is
//! not read until one is answered (HTTP/2 flow control then holds the follower back).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Status, Streaming};

use super::peer_guard::StreamCaller;
use super::peers::Peers;
use crate::proto::etcdserverpb::InternalRaftRequest;
use crate::proto::keywardpb::{ProposeResponse, ProposeStreamReply, ProposeStreamRequest};
use crate::raft::awaited::Awaiting;
use crate::raft::ApplyResult;

/// Writes of one stream the leader proposes at once, at most.
const IN_FLIGHT: usize = 4096;
/// Writes queued on the follower for a stream, at most, before a writer waits for room.
const QUEUED: usize = 1024;

/// The leader's answers on a propose stream.
pub(crate) type ProposeReplies =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<ProposeStreamReply, Status>> + Send>>;

/// The source of a status for a write the stream never took.
#[derive(Debug)]
pub(crate) struct NeverSent;

impl std::fmt::Display for NeverSent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the write was never sent to the leader")
    }
}

impl std::error::Error for NeverSent {}

/// A status for a write the stream never took: it carries `NeverSent` as its source, so the write
/// may be sent again (here or to the next leader; `node/leader.rs`).
fn unsent(message: &str) -> Status {
    let mut status = Status::unavailable(message);
    status.set_source(Arc::new(NeverSent));
    status
}

/// How a forwarded write was answered.
pub(crate) enum Forwarded {
    /// By this member's own apply of it.
    AppliedHere(ApplyResult),
    /// By the leader (a leader that answers every write).
    Answered(ProposeResponse),
}

/// What a forwarded write met first while it waited.
enum First {
    /// Its apply here (an error: its place was dropped unanswered).
    AppliedHere(Result<ApplyResult, oneshot::error::RecvError>),
    /// The stream's answer (an error: the stream's task was dropped).
    Answer(Result<Result<ProposeStreamReply, Status>, oneshot::error::RecvError>),
}

/// The follower's streams, one per leader URL.
#[derive(Default)]
pub(crate) struct ProposeStreams {
    links: Mutex<HashMap<String, Arc<Link>>>,
    /// Leader URLs found not to serve the stream.
    unsupported: Mutex<Vec<String>>,
}

/// One open (or opening) stream to a leader.
struct Link {
    queue: mpsc::Sender<ProposeStreamRequest>,
    next_id: AtomicU64,
    /// Writes sent and not answered yet, by id. Closed once the stream ended: nothing new is added.
    waiting: Mutex<Waiting>,
    ended: AtomicBool,
}

#[derive(Default)]
struct Waiting {
    closed: bool,
    by_id: HashMap<u64, oneshot::Sender<Result<ProposeStreamReply, Status>>>,
}

impl ProposeStreams {
    /// Whether the leader at `url` serves the stream, as far as this member knows (until it answers
    /// `Unimplemented`): if not, forwarded writes go to it as unary `Propose` calls.
    pub(crate) fn served_by(&self, url: &str) -> bool {
        !self.unsupported.lock().unwrap_or_else(PoisonError::into_inner).iter().any(|u| u == url)
    }

    /// Forwards `req` to the leader at `url` on its stream, and waits up to `deadline` for the answer:
    /// its apply here (with `awaiting`, its place among the writes waiting for that), the leader's
    /// answer, its failure as its unary call would have carried it, or the stream's.
    pub(crate) async fn propose(
        &self,
        peers: &Peers,
        url: &str,
        req: InternalRaftRequest,
        deadline: Duration,
        awaiting: Option<Awaiting>,
    ) -> Result<Forwarded, Status> {
        let link = self.link(peers, url)?;
        let id = link.next_id.fetch_add(1, Ordering::Relaxed);
        let (answer, answered) = oneshot::channel();
        {
            let mut waiting = link.waiting.lock().unwrap_or_else(PoisonError::into_inner);
            if waiting.closed {
                return Err(unsent("the propose stream to the leader has ended"));
            }
            waiting.by_id.insert(id, answer);
        }
        let message = ProposeStreamRequest { id, request: Some(req), applied_here: awaiting.is_some() };
        let sent = match link.queue.try_send(message) {
            Ok(()) => Ok(Ok(())),
            Err(mpsc::error::TrySendError::Closed(_)) => Ok(Err(())),
            // The queue is full: wait for room, up to the deadline.
            Err(mpsc::error::TrySendError::Full(message)) => {
                tokio::time::timeout(deadline, link.queue.send(message)).await.map(|sent| sent.map_err(|_| ()))
            }
        };
        match sent {
            Ok(Ok(())) => {}
            // The stream was gone before it took the write, or its queue stayed full: never sent.
            Ok(Err(_)) | Err(_) => {
                link.forget(id);
                return Err(unsent("the propose stream to the leader has ended"));
            }
        }
        // Whichever comes first: the write's apply here (if it waits for that), or the stream's answer.
        let first = async move {
            let Some(mut awaiting) = awaiting else { return First::Answer(answered.await) };
            tokio::select! {
                biased;
                applied = &mut awaiting.applied => First::AppliedHere(applied),
                answer = answered => First::Answer(answer),
            }
        };
        let reply = match tokio::time::timeout(deadline, first).await {
            // Applied here: the leader sends nothing more for this write.
            Ok(First::AppliedHere(applied)) => {
                link.forget(id);
                return match applied {
                    Ok(result) => Ok(Forwarded::AppliedHere(result)),
                    // Its place was dropped without an answer: the state machine is gone.
                    Err(_) => Err(Status::unavailable("the member stopped")),
                };
            }
            Ok(First::Answer(Ok(reply))) => reply,
            // The stream's task ended without failing the waiters: it was dropped with the runtime.
            Ok(First::Answer(Err(_))) => return Err(Status::unavailable("the propose stream was dropped")),
            Err(_) => {
                link.forget(id);
                return Err(Status::deadline_exceeded("the leader did not answer in time"));
            }
        };
        match reply {
            Ok(ProposeStreamReply { response: Some(response), .. }) => Ok(Forwarded::Answered(response)),
            // The leader's answer, as its unary call's status would have been.
            Ok(ProposeStreamReply { code, message, .. }) => Err(Status::new(Code::from(code), message)),
            // The leader does not serve the stream: nothing on it was proposed. The write goes again,
            // as a call (`served_by`).
            Err(status) if status.code() == Code::Unimplemented => {
                self.unsupported.lock().unwrap_or_else(PoisonError::into_inner).push(url.to_string());
                Err(unsent("the leader does not serve the propose stream"))
            }
            Err(status) => Err(status),
        }
    }

    /// The stream to `url`, opened if there is none or the last one ended.
    fn link(&self, peers: &Peers, url: &str) -> Result<Arc<Link>, Status> {
        let mut links = self.links.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(link) = links.get(url).filter(|link| !link.ended.load(Ordering::Acquire)) {
            return Ok(link.clone());
        }
        let mut client = peers.client(url)?;
        let (queue, outgoing) = mpsc::channel(QUEUED);
        let link = Arc::new(Link {
            queue,
            next_id: AtomicU64::new(0),
            waiting: Mutex::default(),
            ended: AtomicBool::new(false),
        });
        // No deadline on the stream itself: each write has its own.
        let request = peers.request(ReceiverStream::new(outgoing), None);
        let reader = link.clone();
        tokio::spawn(async move {
            let failure = match client.propose_stream(request).await {
                Ok(answers) => reader.read(answers.into_inner()).await,
                Err(status) => status,
            };
            reader.end(failure);
        });
        links.insert(url.to_string(), link.clone());
        Ok(link)
    }
}

impl Link {
    /// Hands each answer to its waiter until the stream ends; returns why it ended.
    async fn read(&self, mut answers: Streaming<ProposeStreamReply>) -> Status {
        loop {
            match answers.message().await {
                Ok(Some(reply)) => {
                    let waiter = self.waiting.lock().unwrap_or_else(PoisonError::into_inner).by_id.remove(&reply.id);
                    // None: the write's waiter gave up (its deadline passed).
                    if let Some(waiter) = waiter {
                        let _ = waiter.send(Ok(reply));
                    }
                }
                Ok(None) => return Status::unavailable("the leader ended the propose stream"),
                Err(status) => return status,
            }
        }
    }

    /// The stream ended with `failure`: every write still waiting gets it, and new ones go to a new
    /// stream.
    fn end(&self, failure: Status) {
        self.ended.store(true, Ordering::Release);
        let waiting = {
            let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
            waiting.closed = true;
            std::mem::take(&mut waiting.by_id)
        };
        for waiter in waiting.into_values() {
            let _ = waiter.send(Err(failure.clone()));
        }
    }

    fn forget(&self, id: u64) {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner).by_id.remove(&id);
    }
}

/// The leader's side: each write on `inbound`, from `caller` (admitted again for each), proposed with
/// `propose` (this member's proposer, `peer_service.rs`; told whether the write is answered) as it
/// arrives, at most `IN_FLIGHT` at once; the answers as they come.
pub(super) fn serve<Propose, Proposed>(
    caller: StreamCaller,
    mut inbound: Streaming<ProposeStreamRequest>,
    propose: Propose,
) -> ProposeReplies
where
    Propose: Fn(InternalRaftRequest, bool) -> Proposed + Send + 'static,
    Proposed: Future<Output = Result<ProposeResponse, Status>> + Send + 'static,
{
    let (replies, outgoing) = mpsc::channel(QUEUED);
    tokio::spawn(async move {
        let mut proposing = FuturesUnordered::new();
        let mut reading = true;
        while reading || !proposing.is_empty() {
            tokio::select! {
                message = inbound.message(), if reading && proposing.len() < IN_FLIGHT => {
                    let request = match message {
                        Ok(Some(request)) => request,
                        // The follower closed its side (or the connection broke): answer what is
                        // in flight, then end.
                        Ok(None) | Err(_) => { reading = false; continue; }
                    };
                    let refused = caller.admit_again().err().or_else(|| {
                        request.request.is_none().then(|| Status::invalid_argument("a propose message without a request"))
                    });
                    if let Some(refused) = refused {
                        let _ = replies.send(Err(refused)).await;
                        return;
                    }
                    let (id, quiet) = (request.id, request.applied_here);
                    let proposed = propose(request.request.unwrap_or_default(), !quiet);
                    proposing.push(async move { (id, quiet, proposed.await) });
                }
                Some((id, quiet, answer)) = proposing.next(), if !proposing.is_empty() => {
                    let reply = match answer {
                        // The follower takes the result from its own apply.
                        Ok(_) if quiet => continue,
                        Ok(response) => ProposeStreamReply { id, response: Some(response), ..Default::default() },
                        Err(status) => ProposeStreamReply {
                            id,
                            response: None,
                            code: status.code() as i32,
                            message: status.message().to_string(),
                        },
                    };
                    if replies.send(Ok(reply)).await.is_err() {
                        // Nobody reads the answers any more: the follower is gone.
                        return;
                    }
                }
            }
        }
    });
    Box::pin(ReceiverStream::new(outgoing))
}
