//! Any member serves every request: what must happen on the leader is done there.
//!
//! On the leader these run locally. On a follower they go to the leader over the peer protocol
//! (`server/peer.rs` answers): a write is proposed by the leader with the header this member built
//! (requester and auth revision, so apply decides permissions exactly as for a local write) and this
//! member answers once it has applied that entry itself, so a client reads its own write here; a
//! linearizable read asks the leader for a read index confirmed by a quorum, then waits until this
//! member has applied it; lease keep-alives reach the leader's lease clock; membership changes run on
//! the leader. Without a known leader the answer is etcd's retryable "no leader".

use std::time::Duration;

use openraft::error::RaftError;
use tonic::transport::Channel;

use super::Node;
use crate::apply::Applied;
use crate::cluster::membership;
use crate::error::EtcdError;
use crate::proto::etcdserverpb::{
    InternalRaftRequest, LeaseKeepAliveRequest, LeaseTimeToLiveRequest, MemberAddRequest, MemberPromoteRequest,
    MemberRemoveRequest, MemberUpdateRequest,
};
use crate::proto::keywardpb::peer_client::PeerClient;
use crate::proto::keywardpb::{PublishRequest, ReadIndexRequest};
use crate::raft::NodeId;

/// How long a forwarded request may take at the leader (etcd's default request timeout is 5 s plus
/// an election; a write that waits longer gets "request timed out").
const FORWARD_TIMEOUT: Duration = Duration::from_secs(7);
/// How long this member waits to apply what the leader applied or confirmed.
const APPLY_WAIT: Duration = Duration::from_secs(5);

/// Where a request that needs the leader goes.
enum Route {
    Here,
    Leader(PeerClient<Channel>),
}

impl Node {
    fn route(&self) -> Result<Route, EtcdError> {
        let leader = self.leader().ok_or(EtcdError::NoLeader)?;
        if leader == self.member_id {
            return Ok(Route::Here);
        }
        let membership = membership::current(&self.raft);
        let url = membership.get_node(&leader).and_then(|n| n.peer_url()).ok_or(EtcdError::NoLeader)?;
        Ok(Route::Leader(self.peers.client(url).map_err(|_| EtcdError::NoLeader)?))
    }

    fn forwarded<T>(&self, message: T) -> tonic::Request<T> {
        self.peers.request(message, Some(FORWARD_TIMEOUT))
    }

    /// Proposes `req` (its header set) through the leader and returns what applying it produced.
    pub(super) async fn propose_on_leader(&self, req: InternalRaftRequest) -> Result<Applied, EtcdError> {
        match self.route()? {
            Route::Here => self.proposer.propose(req).await?.result,
            Route::Leader(mut leader) => {
                let answer = leader.propose(self.forwarded(req)).await?.into_inner();
                let result: Result<Applied, EtcdError> =
                    postcard::from_bytes(&answer.result).map_err(|_| EtcdError::Internal)?;
                // Answer once applied here too: a client that reads from this member next sees it.
                self.wait_applied(answer.index).await?;
                result
            }
        }
    }

    /// Serves a follower's forwarded write: proposes it as it is (the follower built its header).
    pub async fn propose_forwarded(
        &self,
        req: InternalRaftRequest,
    ) -> Result<(u64, Result<Applied, EtcdError>), EtcdError> {
        match self.route()? {
            Route::Here => self.proposer.propose(req).await.map(|p| (p.index, p.result)),
            // Leadership moved on meanwhile: the follower retries with the leader it learns of.
            Route::Leader(_) => Err(EtcdError::NotLeader),
        }
    }

    /// Waits until this member may serve a linearizable read: a read index confirmed by the leader
    /// with a quorum, and this member's applied state caught up with it.
    pub async fn read_index(&self) -> Result<(), EtcdError> {
        match self.route()? {
            Route::Here => self.raft.ensure_linearizable().await.map(|_| ()).map_err(raft_read_error),
            Route::Leader(mut leader) => {
                let index = leader.read_index(self.forwarded(ReadIndexRequest {})).await?.into_inner().index;
                self.wait_applied(index).await
            }
        }
    }

    /// The leader's read index for a follower's linearizable read (confirmed with a quorum; the
    /// follower waits for its own apply).
    pub async fn leader_read_index(&self) -> Result<u64, EtcdError> {
        let (read, _applied) = self.raft.get_read_log_id().await.map_err(raft_read_error)?;
        Ok(read.map_or(0, |id| id.index))
    }

    async fn wait_applied(&self, index: u64) -> Result<(), EtcdError> {
        match self.raft.wait(Some(APPLY_WAIT)).applied_index_at_least(Some(index), "forwarded request applied").await {
            Ok(_) => Ok(()),
            Err(openraft::metrics::WaitError::Timeout(..)) => Err(EtcdError::TimeoutWaitAppliedIndex),
            Err(openraft::metrics::WaitError::ShuttingDown) => Err(EtcdError::Stopped),
        }
    }

    /// Renews lease `id` on the leader's clock: its TTL, or 0 for an unknown or expired lease.
    pub async fn lease_renew(&self, id: i64) -> Result<i64, EtcdError> {
        match self.route()? {
            Route::Here => Ok(self.lessor.renew(id).unwrap_or(0)),
            Route::Leader(mut leader) => {
                let req = LeaseKeepAliveRequest { id };
                Ok(leader.lease_keep_alive(self.forwarded(req)).await?.into_inner().ttl)
            }
        }
    }

    /// `(granted TTL, remaining seconds)` of lease `id` on the leader's clock.
    pub async fn lease_time_to_live(&self, id: i64) -> Result<Option<(i64, i64)>, EtcdError> {
        match self.route()? {
            Route::Here => Ok(self.lessor.time_to_live(id)),
            Route::Leader(mut leader) => {
                let req = LeaseTimeToLiveRequest { id, keys: false };
                let answer = leader.lease_time_to_live(self.forwarded(req)).await?.into_inner();
                Ok((answer.ttl >= 0).then_some((answer.granted_ttl, answer.ttl)))
            }
        }
    }

    /// Adds a member (MemberAdd) and returns its id.
    pub async fn member_add(&self, req: MemberAddRequest) -> Result<NodeId, EtcdError> {
        match self.route()? {
            Route::Here => {
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                let id = crate::cluster::ids::added_member_id(&req.peer_ur_ls, &self.cluster_token, now.as_nanos());
                membership::add(&self.raft, id, req.peer_ur_ls, req.is_learner).await
            }
            Route::Leader(mut leader) => {
                let answer = leader.member_add(self.forwarded(req)).await?.into_inner();
                let id = answer.member.map_or(0, |m| m.id);
                // Answer with the membership that includes the new member, as the leader did.
                let _ = self
                    .raft
                    .wait(Some(APPLY_WAIT))
                    .metrics(|m| m.membership_config.membership().get_node(&id).is_some(), "member added")
                    .await;
                Ok(id)
            }
        }
    }

    pub async fn member_remove(&self, req: MemberRemoveRequest) -> Result<(), EtcdError> {
        match self.route()? {
            Route::Here => {
                let url =
                    membership::current(&self.raft).get_node(&req.id).and_then(|n| n.peer_url()).map(str::to_string);
                membership::remove(&self.raft, req.id).await?;
                // Best effort: a member that is down when it is removed is not told; its peers no
                // longer replicate to it, and it stays outside the cluster until it is stopped.
                if let Some(Ok(mut peer)) = url.map(|u| self.peers.client(&u)) {
                    let _ = peer
                        .removed(self.peers.request(crate::proto::keywardpb::RemovedRequest {}, Some(APPLY_WAIT)))
                        .await;
                }
                Ok(())
            }
            Route::Leader(mut leader) => {
                let id = req.id;
                leader.member_remove(self.forwarded(req)).await?;
                let _ = self
                    .raft
                    .wait(Some(APPLY_WAIT))
                    .metrics(|m| m.membership_config.membership().get_node(&id).is_none(), "member removed")
                    .await;
                Ok(())
            }
        }
    }

    pub async fn member_update(&self, req: MemberUpdateRequest) -> Result<(), EtcdError> {
        match self.route()? {
            Route::Here => membership::update(&self.raft, req.id, req.peer_ur_ls).await,
            Route::Leader(mut leader) => {
                leader.member_update(self.forwarded(req)).await.map(|_| ()).map_err(Into::into)
            }
        }
    }

    pub async fn member_promote(&self, req: MemberPromoteRequest) -> Result<(), EtcdError> {
        match self.route()? {
            Route::Here => membership::promote(&self.raft, req.id).await,
            Route::Leader(mut leader) => {
                leader.member_promote(self.forwarded(req)).await.map(|_| ()).map_err(Into::into)
            }
        }
    }

    /// Publishes this member's name and client URLs (on the leader, through raft).
    pub async fn publish(&self) -> Result<(), EtcdError> {
        self.publish_member(PublishRequest {
            member_id: self.member_id,
            name: self.name.clone(),
            client_urls: self.client_urls.clone(),
        })
        .await
    }

    /// Records a member's published attributes (on the leader; a follower forwards).
    pub async fn publish_member(&self, req: PublishRequest) -> Result<(), EtcdError> {
        match self.route()? {
            Route::Here => membership::publish(&self.raft, req.member_id, req.name, req.client_urls).await,
            Route::Leader(mut leader) => leader.publish(self.forwarded(req)).await.map(|_| ()).map_err(Into::into),
        }
    }
}

fn raft_read_error<E>(e: RaftError<NodeId, E>) -> EtcdError {
    match e {
        RaftError::APIError(_) => EtcdError::NoLeader,
        RaftError::Fatal(_) => EtcdError::Stopped,
    }
}
