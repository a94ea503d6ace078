//! The serving side of the peer protocol (`proto/keywardpb/peer.proto`), on `--listen-peer-urls`
//! (bound by `server/mod.rs` with the member's other listeners); `peers.rs` is the dialing side.
//!
//! Raft messages go to this member's raft core; the rest is what a follower asks of the leader
//! (`node/leader.rs`). Every request must come from this cluster: its `keyward-cluster-id` must be
//! this member's cluster id (a member started with another `--initial-cluster-token` or other peer
//! URLs has another one), except the membership query a joining member makes before it knows its
//! cluster. Only members get here: the TLS handshake verifies the caller's certificate
//! (`--peer-trusted-ca-file`, `--peer-crl-file`), and `peer_guard.rs` admits each request only from a
//! member (`admission.rs`) before any method below runs, so what a request carries (a
//! proposal's `member_internal` header, the user a follower vouches for) is a member's word.
//!
//! The service reaches this member through `LocalMember`, the list of what a peer may ask of it,
//! which the member implements (`node/for_peers.rs`): so `cluster/` holds both sides of the protocol
//! without importing `node`, which imports `cluster`.

use std::sync::Arc;
use std::time::Duration;

use openraft::raft::AppendEntriesResponse;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::{Request, Response, Status, Streaming};

use super::append_stream::{self, AppendAnswers};
use super::membership;
use super::peer_guard::StreamCaller;
use super::peers::{CLUSTER_ID_HEADER, MEMBER_ID_HEADER};
use super::propose_stream::{self, ProposeReplies};
use super::snapshot_receiver::{ChunkReceived, SnapshotReceiver};
use crate::apply::Applied;
use crate::error::EtcdError;
use crate::lease::lessor::Lessor;
use crate::proto::etcdserverpb::{
    InternalRaftRequest, LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseTimeToLiveRequest,
    LeaseTimeToLiveResponse, MemberAddRequest, MemberAddResponse, MemberPromoteRequest, MemberPromoteResponse,
    MemberRemoveRequest, MemberRemoveResponse, MemberUpdateRequest, MemberUpdateResponse, ResponseHeader,
};
use crate::proto::keywardpb::peer_server::Peer;
use crate::proto::keywardpb::{
    CampaignRequest, CampaignResponse, ElectionsRequest, ElectionsResponse, LoginAttemptReply, LoginAttemptRequest,
    MembershipRequest, MembershipResponse, ProposeResponse, ProposeStreamRequest, PublishRequest, PublishResponse,
    RaftMessage, ReadIndexRequest, ReadIndexResponse, RemovedRequest, RemovedResponse,
};
use crate::raft::election_timer::ElectionTimer;
use crate::raft::state_machine::SnapshotInbox;
use crate::raft::{NodeId, Raft};

pub(crate) type LoginAttemptReplies =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<LoginAttemptReply, Status>> + Send>>;

/// What a peer may ask of this member: the member's own operations the service below calls.
#[tonic::async_trait]
pub(crate) trait LocalMember: Send + Sync + 'static {
    fn cluster_id(&self) -> u64;
    fn member_id(&self) -> u64;
    fn raft(&self) -> &Raft;
    /// Where this member receives a snapshot (`cluster/snapshot_receiver.rs`).
    fn snapshot_inbox(&self) -> SnapshotInbox;
    fn lessor(&self) -> &Lessor;
    fn election_timer(&self) -> &ElectionTimer;
    fn is_leader(&self) -> bool;
    fn header(&self, revision: i64) -> Option<ResponseHeader>;
    async fn propose_forwarded(&self, req: InternalRaftRequest)
        -> Result<(u64, Result<Applied, EtcdError>), EtcdError>;
    async fn leader_read_index(&self) -> Result<u64, EtcdError>;
    async fn publish_member(&self, req: PublishRequest) -> Result<(), EtcdError>;
    async fn member_add(&self, req: MemberAddRequest) -> Result<NodeId, EtcdError>;
    async fn member_remove(&self, req: MemberRemoveRequest) -> Result<(), EtcdError>;
    async fn member_update(&self, req: MemberUpdateRequest) -> Result<(), EtcdError>;
    async fn member_promote(&self, req: MemberPromoteRequest) -> Result<(), EtcdError>;
    fn mark_removed(&self);
    /// A follower's login attempt, decided by this leader's throttle (`node/login_throttle.rs`).
    async fn login_attempt(&self, steps: Streaming<LoginAttemptRequest>) -> Result<LoginAttemptReplies, Status>;
}

pub(crate) struct PeerService {
    member: Arc<dyn LocalMember>,
    /// The snapshot the leader is sending this member, between its chunks.
    snapshots: SnapshotReceiver,
}

impl PeerService {
    pub(crate) fn new(member: Arc<dyn LocalMember>) -> Self {
        let chunk_size = member.raft().config().snapshot_max_chunk_size;
        let snapshots = SnapshotReceiver::new(member.snapshot_inbox(), chunk_size);
        PeerService { member, snapshots }
    }

    /// Refuses a request from another cluster (`unknown_ok`: a joining member that does not know
    /// its cluster yet sends 0).
    fn check_cluster<T>(&self, request: &Request<T>, unknown_ok: bool) -> Result<(), Status> {
        let header = |name| request.metadata().get(name).and_then(|v| v.to_str().ok()).unwrap_or("");
        let theirs = u64::from_str_radix(header(CLUSTER_ID_HEADER), 16).unwrap_or(0);
        if theirs == self.member.cluster_id() || (unknown_ok && theirs == 0) {
            return Ok(());
        }
        let from = header(MEMBER_ID_HEADER).to_string();
        tracing::warn!(
            local = format!("{:x}", self.member.cluster_id()),
            remote = format!("{theirs:x}"),
            from_member = from,
            "request from a member of another cluster refused (cluster ID mismatch)"
        );
        Err(Status::failed_precondition(format!(
            "cluster ID mismatch: member {:x} is in cluster {:x}, the request comes from cluster {theirs:x} \
             (another --initial-cluster-token or --initial-cluster?)",
            self.member.member_id(),
            self.member.cluster_id()
        )))
    }

    /// This member must lead to serve a follower's request (the follower retries with the leader
    /// it learns of next).
    fn require_leader(&self) -> Result<(), Status> {
        if self.member.is_leader() {
            Ok(())
        } else {
            Err(EtcdError::NotLeader.into())
        }
    }
}

/// Decodes an openraft request, hands it to the raft core, and encodes the core's answer.
async fn raft_call<Req: DeserializeOwned, Resp: Serialize, E: Serialize>(
    request: Request<RaftMessage>,
    call: impl AsyncFnOnce(Req) -> Result<Resp, E>,
) -> Result<Response<RaftMessage>, Status> {
    let payload = raft_answer(&request.into_inner().payload, call).await?;
    Ok(Response::new(RaftMessage { payload }))
}

async fn raft_answer<Req: DeserializeOwned, Resp: Serialize, E: Serialize>(
    payload: &[u8],
    call: impl AsyncFnOnce(Req) -> Result<Resp, E>,
) -> Result<Vec<u8>, Status> {
    let req: Req = postcard::from_bytes(payload)
        .map_err(|e| Status::invalid_argument(format!("undecodable raft message: {e}")))?;
    let answer = call(req).await;
    postcard::to_allocvec(&answer).map_err(|e| Status::internal(e.to_string()))
}

/// An AppendEntries (entries or a heartbeat) from the leader, however it came (`transport`: a call
/// or the stream, `append_stream.rs`), handed to the raft core; the core's answer, encoded.
async fn append_entries_answer(member: &dyn LocalMember, payload: &[u8], transport: &str) -> Result<Vec<u8>, Status> {
    crate::metrics::PEER_APPEND_RECEIVED.with_label_values(&[transport]).inc();
    raft_answer(payload, async |req: openraft::raft::AppendEntriesRequest<crate::raft::TypeConfig>| {
        let kind = if req.entries.is_empty() { "heartbeat" } else { "entries" };
        let received = std::time::Instant::now();
        let answer = member.raft().append_entries(req).await;
        crate::metrics::PEER_APPEND_HANDLING_SECONDS
            .with_label_values(&[kind])
            .observe(received.elapsed().as_secs_f64());
        // Accepted from a leader of this term or a newer one: the election timer starts over.
        if matches!(&answer, Ok(a) if !matches!(a, AppendEntriesResponse::HigherVote(_))) {
            member.election_timer().reset();
        }
        answer
    })
    .await
}

/// A follower's forwarded write, proposed here as the follower built it; the answer Propose and the
/// propose stream carry back: what applying it produced (encoded only if `answered`: a write the
/// follower takes from its own apply, `applied_here`, gets no answer) and the entry's log index.
async fn propose_forwarded(
    member: &dyn LocalMember,
    req: InternalRaftRequest,
    answered: bool,
) -> Result<ProposeResponse, Status> {
    let (index, result) = member.propose_forwarded(req).await?;
    let result = match answered {
        true => postcard::to_allocvec(&result).map_err(|e| Status::internal(e.to_string()))?,
        false => Vec::new(),
    };
    Ok(ProposeResponse { result, index })
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn append_entries(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        self.check_cluster(&request, false)?;
        let payload = append_entries_answer(&*self.member, &request.into_inner().payload, "call").await?;
        Ok(Response::new(RaftMessage { payload }))
    }

    /// The leader's stream of AppendEntries (`append_stream.rs`): its cluster checked once, its
    /// caller admitted again for each message.
    async fn append_entries_stream(
        &self,
        request: Request<Streaming<RaftMessage>>,
    ) -> Result<Response<AppendAnswers>, Status> {
        self.check_cluster(&request, false)?;
        let caller = StreamCaller::of(&request)?;
        let member = self.member.clone();
        let handle = move |payload: Vec<u8>| {
            let member = member.clone();
            async move { append_entries_answer(&*member, &payload, "stream").await }
        };
        let member = self.member.clone();
        let ended = move || member.election_timer().leader_stream_ended();
        Ok(Response::new(append_stream::answer(caller, request.into_inner(), handle, ended)))
    }

    async fn vote(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        self.check_cluster(&request, false)?;
        raft_call(request, async |req| {
            let answer = self.member.raft().vote(req).await;
            // As etcd's: a voter that granted its vote waits a whole timeout before campaigning.
            if matches!(&answer, Ok(a) if a.vote_granted) {
                self.member.election_timer().reset();
            }
            answer
        })
        .await
    }

    async fn install_snapshot(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        self.check_cluster(&request, false)?;
        let announced = request
            .metadata()
            .get(crate::identity::metadata::SNAPSHOT_SIZE)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        raft_call(request, async |chunk: ChunkReceived| {
            let timer = self.member.election_timer();
            let hearing = timer.hearing();
            let answer = self.snapshots.receive(self.member.raft(), chunk.into(), announced).await;
            drop(hearing);
            if answer.is_ok() {
                // No heartbeat comes while the snapshot streams: wait for the next chunk as long as
                // the leader would before campaigning (`raft/election_timer.rs`).
                let config = self.member.raft().config();
                timer.hold(super::snapshot_sender::next_chunk_patience(
                    config.snapshot_max_chunk_size as usize,
                    Duration::from_millis(config.election_timeout_max),
                ));
            }
            answer
        })
        .await
    }

    async fn propose(&self, request: Request<InternalRaftRequest>) -> Result<Response<ProposeResponse>, Status> {
        self.check_cluster(&request, false)?;
        Ok(Response::new(propose_forwarded(&*self.member, request.into_inner(), true).await?))
    }

    /// A follower's forwarded writes on one stream (`propose_stream.rs`): its cluster checked once,
    /// its caller admitted again for each write, each proposed as `propose` would.
    async fn propose_stream(
        &self,
        request: Request<Streaming<ProposeStreamRequest>>,
    ) -> Result<Response<ProposeReplies>, Status> {
        self.check_cluster(&request, false)?;
        let caller = StreamCaller::of(&request)?;
        let member = self.member.clone();
        let propose = move |req: InternalRaftRequest, answered: bool| {
            let member = member.clone();
            async move { propose_forwarded(&*member, req, answered).await }
        };
        Ok(Response::new(propose_stream::serve(caller, request.into_inner(), propose)))
    }

    async fn read_index(&self, request: Request<ReadIndexRequest>) -> Result<Response<ReadIndexResponse>, Status> {
        self.check_cluster(&request, false)?;
        self.require_leader()?;
        Ok(Response::new(ReadIndexResponse { index: self.member.leader_read_index().await? }))
    }

    async fn lease_keep_alive(
        &self,
        request: Request<LeaseKeepAliveRequest>,
    ) -> Result<Response<LeaseKeepAliveResponse>, Status> {
        self.check_cluster(&request, false)?;
        self.require_leader()?;
        let id = request.into_inner().id;
        let ttl = self.member.lessor().renew(id).unwrap_or(0);
        Ok(Response::new(LeaseKeepAliveResponse { header: self.member.header(0), id, ttl }))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        self.check_cluster(&request, false)?;
        self.require_leader()?;
        let id = request.into_inner().id;
        let (granted_ttl, ttl) = self.member.lessor().time_to_live(id).unwrap_or((0, -1));
        Ok(Response::new(LeaseTimeToLiveResponse { header: self.member.header(0), id, ttl, granted_ttl, keys: vec![] }))
    }

    async fn membership(&self, request: Request<MembershipRequest>) -> Result<Response<MembershipResponse>, Status> {
        self.check_cluster(&request, true)?;
        let members = membership::members(&membership::current(self.member.raft()));
        Ok(Response::new(MembershipResponse { cluster_id: self.member.cluster_id(), members }))
    }

    async fn publish(&self, request: Request<PublishRequest>) -> Result<Response<PublishResponse>, Status> {
        self.check_cluster(&request, false)?;
        self.require_leader()?;
        self.member.publish_member(request.into_inner()).await?;
        Ok(Response::new(PublishResponse {}))
    }

    async fn member_add(&self, request: Request<MemberAddRequest>) -> Result<Response<MemberAddResponse>, Status> {
        self.check_cluster(&request, false)?;
        self.require_leader()?;
        let req = request.into_inner();
        let (peer_urls, is_learner) = (req.peer_ur_ls.clone(), req.is_learner);
        let id = self.member.member_add(req).await?;
        let member = crate::proto::etcdserverpb::Member { id, peer_ur_ls: peer_urls, is_learner, ..Default::default() };
        let members = membership::members(&membership::current(self.member.raft()));
        Ok(Response::new(MemberAddResponse { header: self.member.header(0), member: Some(member), members }))
    }

    async fn member_remove(
        &self,
        request: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        self.check_cluster(&request, false)?;
        self.require_leader()?;
        self.member.member_remove(request.into_inner()).await?;
        let members = membership::members(&membership::current(self.member.raft()));
        Ok(Response::new(MemberRemoveResponse { header: self.member.header(0), members }))
    }

    async fn member_update(
        &self,
        request: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        self.check_cluster(&request, false)?;
        self.require_leader()?;
        self.member.member_update(request.into_inner()).await?;
        let members = membership::members(&membership::current(self.member.raft()));
        Ok(Response::new(MemberUpdateResponse { header: self.member.header(0), members }))
    }

    async fn member_promote(
        &self,
        request: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        self.check_cluster(&request, false)?;
        self.require_leader()?;
        self.member.member_promote(request.into_inner()).await?;
        let members = membership::members(&membership::current(self.member.raft()));
        Ok(Response::new(MemberPromoteResponse { header: self.member.header(0), members }))
    }

    async fn elections(&self, request: Request<ElectionsRequest>) -> Result<Response<ElectionsResponse>, Status> {
        self.check_cluster(&request, false)?;
        let enabled = request.into_inner().enabled;
        self.member.election_timer().pause(!enabled);
        tracing::info!(enabled, "elections paused or resumed by the leader for a leadership transfer");
        Ok(Response::new(ElectionsResponse {}))
    }

    async fn campaign(&self, request: Request<CampaignRequest>) -> Result<Response<CampaignResponse>, Status> {
        self.check_cluster(&request, false)?;
        tracing::info!("campaigning for leadership: the leader transfers it here");
        self.member.raft().trigger().elect().await.map_err(|_| Status::from(EtcdError::Stopped))?;
        Ok(Response::new(CampaignResponse {}))
    }

    /// A follower's login attempt, decided by this leader's throttle (`node/login_throttle.rs`).
    async fn login_attempt(
        &self,
        request: Request<Streaming<LoginAttemptRequest>>,
    ) -> Result<Response<LoginAttemptReplies>, Status> {
        self.check_cluster(&request, false)?;
        self.require_leader()?;
        Ok(Response::new(self.member.login_attempt(request.into_inner()).await?))
    }

    async fn removed(&self, request: Request<RemovedRequest>) -> Result<Response<RemovedResponse>, Status> {
        self.check_cluster(&request, false)?;
        self.member.mark_removed();
        Ok(Response::new(RemovedResponse {}))
    }
}
