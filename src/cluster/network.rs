//! Raft's transport: openraft's `RaftNetwork` over the peer gRPC protocol.
//!
//! Each raft message is openraft's own type, postcard-encoded in a `RaftMessage`; the receiving member
//! hands it to its raft core and returns the core's answer, or the core's error, the same way
//! (`peer_service.rs`). AppendEntries, heartbeats included, go on one long-lived stream per peer
//! (`append_stream.rs`); votes and snapshot chunks are calls of their own. A peer that cannot be dialed is reported `Unreachable`, on which openraft
//! backs off (`backoff`) before retrying, and logged once per interval with the reason. Snapshots go
//! in chunks of `snapshot_max_chunk_size`, one call per chunk and several calls in flight, by
//! keyward's own sender (`snapshot_sender.rs`: deadlines that cover the install, resumed transfers,
//! none to a follower that already holds what the snapshot covers) and receiver
//! (`snapshot_receiver.rs`, which takes the chunks in order).

// openraft's `RaftNetwork` fixes `RPCError` (large) as the error type; boxing it in the helpers below
// would only move the allocation to every call.
#![allow(clippy::result_large_err)]

use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    Fatal, InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, ReplicationClosed, StreamingError,
    Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, SnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{OptionalSend, Snapshot, Vote};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::append_stream::{AppendStream, Unanswered};
use super::peers::Peers;
use super::quorum_acks::{boot_clock, QuorumAcks};
use crate::proto::keywardpb::RaftMessage;
use crate::raft::member::MemberNode;
use crate::raft::{NodeId, TypeConfig};

/// The longest openraft waits before it tries an unreachable peer again (`PeerConnection::backoff`).
const MAX_BACKOFF_MS: u64 = 200;

#[derive(Clone)]
pub(crate) struct PeerNetwork {
    peers: Arc<Peers>,
    acks: Arc<QuorumAcks>,
}

impl PeerNetwork {
    /// `acks` learns of every AppendEntries a peer accepts.
    pub(crate) fn new(peers: Arc<Peers>, acks: Arc<QuorumAcks>) -> Self {
        PeerNetwork { peers, acks }
    }
}

/// The connection to one peer, as openraft uses it.
pub(crate) struct PeerConnection {
    peers: Arc<Peers>,
    /// What the peer accepted of this member's leadership: AppendEntries here, snapshot chunks in
    /// `snapshot_sender.rs`.
    pub(super) acks: Arc<QuorumAcks>,
    pub(super) target: NodeId,
    url: Option<String>,
    /// How far the last snapshot transfer to this peer got (`snapshot_sender.rs`): the next attempt
    /// at the same snapshot starts there.
    pub(super) resume: Option<(openraft::SnapshotId, u64)>,
    /// The stream this member's AppendEntries to the peer go on (`append_stream.rs`).
    append_stream: AppendStream,
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: NodeId, node: &MemberNode) -> PeerConnection {
        PeerConnection {
            peers: self.peers.clone(),
            acks: self.acks.clone(),
            target,
            url: node.peer_url().map(str::to_string),
            resume: None,
            append_stream: AppendStream::default(),
        }
    }
}

/// Which peer RPC carries a raft message.
#[derive(Clone, Copy)]
pub(super) enum Rpc {
    AppendEntries,
    Vote,
    InstallSnapshot,
}

impl PeerConnection {
    pub(super) async fn call<Req: Serialize, Resp: DeserializeOwned, E: std::error::Error + DeserializeOwned>(
        &self,
        rpc: Rpc,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, MemberNode, E>> {
        self.call_announcing(rpc, req, option, None).await
    }

    /// `call`, with a snapshot chunk's call announcing the size of its snapshot
    /// (`identity::metadata::SNAPSHOT_SIZE`).
    pub(super) async fn call_announcing<
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    >(
        &self,
        rpc: Rpc,
        req: &Req,
        option: &RPCOption,
        snapshot_size: Option<u64>,
    ) -> Result<Resp, RPCError<NodeId, MemberNode, E>> {
        let url = self.url()?;
        let payload = encode(req)?;
        let client = match rpc {
            Rpc::InstallSnapshot => self.peers.snapshot_client(url),
            Rpc::AppendEntries | Rpc::Vote => self.peers.client(url),
        };
        let mut client = client.map_err(|s| unreachable(s.message().to_string()))?;
        let mut request = self.peers.request(RaftMessage { payload }, Some(option.hard_ttl()));
        if let Some(size) = snapshot_size {
            request.metadata_mut().insert(crate::identity::metadata::SNAPSHOT_SIZE, size.into());
        }
        let answer = match rpc {
            Rpc::AppendEntries => client.append_entries(request).await,
            Rpc::Vote => client.vote(request).await,
            Rpc::InstallSnapshot => client.install_snapshot(request).await,
        };
        let answer = answer.map_err(|status| self.failed(url, &status))?;
        self.answered(url, &answer.into_inner().payload)
    }

    /// The peer's URL, or `Unreachable` for a member that has none.
    fn url<E: std::error::Error>(&self) -> Result<&str, RPCError<NodeId, MemberNode, E>> {
        match &self.url {
            Some(url) => Ok(url),
            None => Err(unreachable(format!("member {:x} has no peer URL", self.target))),
        }
    }

    /// A call that failed in transport: `Unreachable` (openraft backs off) when the peer could not
    /// be reached or refused the connection, a network error otherwise.
    fn failed<E: std::error::Error>(&self, url: &str, status: &tonic::Status) -> RPCError<NodeId, MemberNode, E> {
        let reason = describe(status);
        if status.code() == tonic::Code::Unavailable || status.code() == tonic::Code::FailedPrecondition {
            self.peers.report_unreachable(self.target, url, &reason);
            return unreachable(reason);
        }
        RPCError::Network(NetworkError::new(&std::io::Error::other(reason)))
    }

    /// The peer's answer, decoded: its raft core's answer or its raft core's error.
    fn answered<Resp: DeserializeOwned, E: std::error::Error + DeserializeOwned>(
        &self,
        url: &str,
        payload: &[u8],
    ) -> Result<Resp, RPCError<NodeId, MemberNode, E>> {
        self.peers.report_reachable(self.target, url);
        let answer: Result<Resp, E> =
            postcard::from_bytes(payload).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        answer.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

/// A raft message in the peer protocol's encoding.
fn encode<Req: Serialize, E: std::error::Error>(req: &Req) -> Result<Vec<u8>, RPCError<NodeId, MemberNode, E>> {
    postcard::to_allocvec(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))
}

impl PeerConnection {
    /// Sends `rpc` on the stream to this peer (`append_stream.rs`) and waits for its answer, within
    /// `option`'s deadline as a call would; as a call to a peer that does not serve the stream.
    async fn append_streamed(
        &mut self,
        rpc: &AppendEntriesRequest<TypeConfig>,
        option: &RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, MemberNode, RaftError<NodeId>>> {
        if self.append_stream.unsupported() {
            return self.call(Rpc::AppendEntries, rpc, option).await;
        }
        let url = self.url()?.to_string();
        let payload = encode(rpc)?;
        let deadline = option.hard_ttl();
        match self.append_stream.exchange(&self.peers, &url, payload, deadline).await {
            Ok(answer) => self.answered(&url, &answer),
            Err(Unanswered::Unsupported) => {
                tracing::info!(
                    peer = format!("{:x}", self.target),
                    "the peer does not serve the AppendEntries stream (an older version): one call per AppendEntries"
                );
                self.call(Rpc::AppendEntries, rpc, option).await
            }
            Err(Unanswered::Failed(status)) => Err(self.failed(&url, &status)),
            Err(Unanswered::TimedOut) => {
                let reason = format!("no answer to AppendEntries on the stream within {deadline:?}");
                Err(RPCError::Network(NetworkError::new(&std::io::Error::new(std::io::ErrorKind::TimedOut, reason))))
            }
        }
    }
}

fn unreachable<E: std::error::Error>(reason: String) -> RPCError<NodeId, MemberNode, E> {
    RPCError::Unreachable(Unreachable::new(&std::io::Error::other(reason)))
}

/// A transport failure, with its source chain (e.g. "connection refused").
fn describe(status: &tonic::Status) -> String {
    let mut out = status.message().to_string();
    let mut source = std::error::Error::source(status);
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

impl RaftNetwork<TypeConfig> for PeerConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, MemberNode, RaftError<NodeId>>> {
        let kind = if rpc.entries.is_empty() { "heartbeat" } else { "entries" };
        let sent = boot_clock();
        let answer = self.append_streamed(&rpc, &option).await;
        crate::metrics::PEER_APPEND_ROUND_TRIP_SECONDS
            .with_label_values(&[kind])
            .observe(boot_clock().saturating_sub(sent).as_secs_f64());
        let answer = answer?;
        // Any answer but a higher vote: the peer took `rpc.vote` as its leader's (`quorum_acks.rs`).
        if rpc.vote.is_committed() && !matches!(answer, AppendEntriesResponse::HigherVote(_)) {
            self.acks.accepted(self.target, *rpc.vote.leader_id(), sent);
        }
        Ok(answer)
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RPCError<NodeId, MemberNode, RaftError<NodeId, InstallSnapshotError>>>
    {
        self.call(Rpc::InstallSnapshot, &rpc, &option).await
    }

    /// keyward's sender (`snapshot_sender.rs`), not openraft's default.
    async fn full_snapshot(
        &mut self,
        vote: Vote<NodeId>,
        snapshot: Snapshot<TypeConfig>,
        cancel: impl std::future::Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<NodeId>, StreamingError<TypeConfig, Fatal<NodeId>>> {
        self.send_snapshot(vote, snapshot, cancel, option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, MemberNode, RaftError<NodeId>>> {
        self.call(Rpc::Vote, &rpc, &option).await
    }

    /// Retries an unreachable peer after 100 ms, then every 200 ms (openraft's default is a flat
    /// 500 ms). openraft sends nothing to the peer meanwhile, heartbeats included, so the wait must
    /// end well within an election timeout (etcd's default, 1 s) of the peer coming back: with up
    /// to 2 s, as before, a restarted member heard no leader, campaigned at a higher term and
    /// deposed a healthy leader (seen in `snapshot_transfer::` runs; test:
    /// `failover::a_follower_restarted_after_a_kill_does_not_depose_the_leader`). A dead peer costs
    /// a refused connection every 200 ms.
    fn backoff(&self) -> Backoff {
        let (first, then) = (Duration::from_millis(100), Duration::from_millis(MAX_BACKOFF_MS));
        Backoff::new(std::iter::once(first).chain(std::iter::repeat(then)))
    }
}
