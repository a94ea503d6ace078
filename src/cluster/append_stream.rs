//! The leader's AppendEntries (entries and heartbeats) to one follower on one long-lived
//! bidirectional gRPC stream (`Peer.AppendEntriesStream`), as etcd's rafthttp sends a peer's raft
//! messages on a stream of its own instead of a request each.
//!
//! Why: a unary call per AppendEntries costs, on each side, a new HTTP/2 stream (headers encoded and
//! decoded, metadata, a deadline timer, a server task spawned for it, the peer guard, the channel's
//! buffer task), and a 3-member put waits for one such round trip (docs/performance.md, issue 33).
//! On the stream each AppendEntries is one DATA frame each way.
//!
//! The leader's side (`AppendStream::exchange`, called by `network.rs`): openraft 0.9 keeps one AppendEntries in
//! flight per follower, so a message's answer is the next message on the stream. The stream is
//! opened on first use; any failure (an error, an answer not in time) drops it, fails that
//! AppendEntries as a call would have failed, and the next one opens a new stream, so a late answer
//! is never taken for another message's. A member that does not serve the stream (an older version
//! during a rolling upgrade: `Unimplemented`) gets unary calls from this connection on.
//!
//! The follower's side (`answer`): the stream is admitted by the peer guard when it opens, its
//! cluster checked once (`peer_service.rs`), and every message admitted again against the membership
//! of its time (`peer_guard.rs`, `StreamCaller`): a member removed while its stream is open is refused
//! from its next message on, as a call would be. A refused or undecodable message ends the stream
//! with its error.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use super::peer_guard::StreamCaller;
use super::peers::Peers;
use crate::proto::keywardpb::RaftMessage;

/// The follower's answers on a stream, one per AppendEntries, in order.
pub(crate) type AppendAnswers = std::pin::Pin<Box<dyn futures::Stream<Item = Result<RaftMessage, Status>> + Send>>;

/// The leader's stream to one peer, as `PeerConnection` keeps it between AppendEntries.
#[derive(Default)]
pub(crate) struct AppendStream {
    state: State,
}

#[derive(Default)]
enum State {
    /// Not opened yet, or dropped after a failure: the next AppendEntries opens one.
    #[default]
    Closed,
    Open(Box<Open>),
    /// The peer does not serve the stream: unary calls.
    Unsupported,
}

struct Open {
    requests: mpsc::Sender<RaftMessage>,
    answers: Streaming<RaftMessage>,
}

/// How one AppendEntries on the stream ended, if not with an answer.
pub(super) enum Unanswered {
    /// The peer does not serve the stream: send this AppendEntries, and the next ones, as calls.
    Unsupported,
    /// A transport failure, classified as a call's would be.
    Failed(Status),
    /// No answer within the deadline.
    TimedOut,
}

impl AppendStream {
    /// Whether the peer was found not to serve the stream (it gets calls from now on).
    pub(super) fn unsupported(&self) -> bool {
        matches!(self.state, State::Unsupported)
    }

    /// Sends `payload` (an encoded AppendEntries) on the stream to the peer at `url`, opening the
    /// stream if need be, and waits up to `deadline` for its answer.
    pub(super) async fn exchange(
        &mut self,
        peers: &Peers,
        url: &str,
        payload: Vec<u8>,
        deadline: Duration,
    ) -> Result<Vec<u8>, Unanswered> {
        // Taken out: put back only after an answer, so a failure leaves the stream closed.
        let state = std::mem::take(&mut self.state);
        let exchanged = tokio::time::timeout(deadline, async {
            let mut open = match state {
                State::Open(open) => open,
                State::Closed | State::Unsupported => Box::new(Open::start(peers, url).await?),
            };
            let answer = open.exchange(payload).await?;
            Ok::<_, Status>((open, answer))
        })
        .await;
        match exchanged {
            Ok(Ok((open, answer))) => {
                self.state = State::Open(open);
                Ok(answer)
            }
            Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => {
                self.state = State::Unsupported;
                Err(Unanswered::Unsupported)
            }
            Ok(Err(status)) => Err(Unanswered::Failed(status)),
            Err(_elapsed) => Err(Unanswered::TimedOut),
        }
    }
}

impl Open {
    /// Opens a stream to the peer at `url`: its answer's headers mean the peer admitted it.
    async fn start(peers: &Peers, url: &str) -> Result<Self, Status> {
        let mut client = peers.client(url)?;
        // One message in flight (openraft's), so one slot is all the queue needs.
        let (requests, outgoing) = mpsc::channel(1);
        // No deadline on the stream itself: each message has its own (`exchange`).
        let request = peers.request(ReceiverStream::new(outgoing), None);
        let answers = client.append_entries_stream(request).await?.into_inner();
        Ok(Open { requests, answers })
    }

    /// Sends one AppendEntries and waits for its answer, the stream's next message.
    async fn exchange(&mut self, payload: Vec<u8>) -> Result<Vec<u8>, Status> {
        if self.requests.send(RaftMessage { payload }).await.is_err() {
            return Err(Status::unavailable("the AppendEntries stream to the peer has ended"));
        }
        match self.answers.message().await? {
            Some(answer) => Ok(answer.payload),
            None => Err(Status::unavailable("the peer ended the AppendEntries stream")),
        }
    }
}

/// The follower's side: each AppendEntries on `inbound`, from `caller` (admitted again for each),
/// handed to `handle` (this member's raft core, `peer_service.rs`) in order; the answers, in the
/// same order. The stream is polled by the task that serves the call, so a message costs no task of
/// its own. When the stream ends, whether the leader ended it or its connection broke (then the
/// server drops the stream unfinished), `ended` is called: a leader whose process died ends every
/// stream it had at once (`raft/election_timer.rs`).
pub(super) fn answer<Handle, Handled>(
    caller: StreamCaller,
    inbound: Streaming<RaftMessage>,
    handle: Handle,
    ended: impl FnOnce() + Send + 'static,
) -> AppendAnswers
where
    Handle: Fn(Vec<u8>) -> Handled + Send + 'static,
    Handled: std::future::Future<Output = Result<Vec<u8>, Status>> + Send,
{
    let ended = OnDrop(Some(ended));
    let answers = futures::stream::unfold(Some((caller, inbound, handle, ended)), |open| async move {
        let (caller, mut inbound, handle, ended) = open?;
        // Ends when the leader ends the stream or the connection breaks.
        let message = inbound.message().await.ok()??;
        let answer = match caller.admit_again() {
            Ok(()) => handle(message.payload).await,
            Err(refused) => Err(refused),
        };
        match answer {
            Ok(payload) => Some((Ok(RaftMessage { payload }), Some((caller, inbound, handle, ended)))),
            // A refused or undecodable message ends the stream with its error.
            Err(status) => Some((Err(status), None)),
        }
    });
    Box::pin(answers)
}

/// Calls its function when dropped.
struct OnDrop<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}
