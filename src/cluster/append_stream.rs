//! The leader's AppendEntries (entries and heartbeats) to one follower on one long-lived
//! bidirectional gRPC stream (`Peer.AppendEntriesStream`), as etcd's rafthttp sends a peer's raft
//! messages on a stream of its own instead of a request each.
//!
//! Why: a unary call per AppendEntries costs, on each side, a new HTTP/2 stream (headers encoded and
//! decoded, metadata, a deadline timer, a server task spawned for it, the peer guard, the channel's
//! buffer task), and a 3-member put waits for one such round trip (docs/performance.md, issue 33).
//! On the stream each AppendEntries is one DATA frame each way.
//!
//! The leader's side (`PeerConnection::append_streamed`): openraft 0.9 keeps one AppendEntries in
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

use openraft::error::{NetworkError, RPCError, RaftError};
use openraft::network::RPCOption;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use super::network::{encode, PeerConnection, Rpc};
use super::peer_guard::StreamCaller;
use super::peer_service::{append_entries_answer, LocalMember};
use crate::proto::keywardpb::RaftMessage;
use crate::raft::member::MemberNode;
use crate::raft::{NodeId, TypeConfig};

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

type AppendResult = Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, MemberNode, RaftError<NodeId>>>;

impl PeerConnection {
    /// Sends `rpc` on the stream to this peer (opening it if need be) and waits for its answer,
    /// within `option`'s deadline as a call would.
    pub(super) async fn append_streamed(
        &mut self,
        rpc: &AppendEntriesRequest<TypeConfig>,
        option: &RPCOption,
    ) -> AppendResult {
        if matches!(self.append_stream.state, State::Unsupported) {
            return self.call(Rpc::AppendEntries, rpc, option).await;
        }
        let url = self.url()?.to_string();
        let payload = encode(rpc)?;
        let deadline = option.hard_ttl();
        // Taken out: put back only after an answer, so a failure leaves the stream closed.
        let state = std::mem::take(&mut self.append_stream.state);
        let exchanged = tokio::time::timeout(deadline, async {
            let mut open = match state {
                State::Open(open) => open,
                State::Closed | State::Unsupported => Box::new(Open::start(self, &url).await?),
            };
            let answer = open.exchange(payload).await?;
            Ok::<_, Status>((open, answer))
        })
        .await;
        match exchanged {
            Ok(Ok((open, answer))) => {
                self.append_stream.state = State::Open(open);
                self.answered(&url, &answer)
            }
            Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => {
                tracing::info!(
                    peer = format!("{:x}", self.target),
                    "the peer does not serve the AppendEntries stream (an older version): one call per AppendEntries"
                );
                self.append_stream.state = State::Unsupported;
                self.call(Rpc::AppendEntries, rpc, option).await
            }
            Ok(Err(status)) => Err(self.failed(&url, &status)),
            Err(_elapsed) => Err(timed_out(deadline)),
        }
    }
}

impl Open {
    /// Opens a stream to the peer at `url`: its answer's headers mean the peer admitted it.
    async fn start(connection: &PeerConnection, url: &str) -> Result<Self, Status> {
        let peers = connection.peers();
        let mut client = peers.client(url)?;
        // One message in flight (openraft's), so one slot is all the queue needs.
        let (requests, outgoing) = mpsc::channel(1);
        // No deadline on the stream itself: each message has its own (`append_streamed`).
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

/// No answer within the deadline: a network error, as a call's deadline is.
fn timed_out(deadline: Duration) -> RPCError<NodeId, MemberNode, RaftError<NodeId>> {
    let error = std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("no answer to AppendEntries on the stream within {deadline:?}"),
    );
    RPCError::Network(NetworkError::new(&error))
}

/// The follower's side: each AppendEntries on `inbound`, from `caller` (admitted again for each),
/// handed to this member's raft core in order; the answers, in the same order. The stream is
/// polled by the task that serves the call, so a message costs no task of its own.
pub(super) fn answer(
    member: std::sync::Arc<dyn LocalMember>,
    caller: StreamCaller,
    inbound: Streaming<RaftMessage>,
) -> AppendAnswers {
    let answers = futures::stream::unfold(Some((member, caller, inbound)), |open| async move {
        let (member, caller, mut inbound) = open?;
        // Ends when the leader ends the stream or the connection breaks.
        let message = inbound.message().await.ok()??;
        let answer = match caller.admit_again() {
            Ok(()) => append_entries_answer(&*member, &message.payload, "stream").await,
            Err(refused) => Err(refused),
        };
        match answer {
            Ok(payload) => Some((Ok(RaftMessage { payload }), Some((member, caller, inbound)))),
            // A refused or undecodable message ends the stream with its error.
            Err(status) => Some((Err(status), None)),
        }
    });
    Box::pin(answers)
}
