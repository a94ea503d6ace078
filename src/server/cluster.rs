//! The Cluster service: membership as etcd clients see it.
//!
//! MemberList answers from this member's own view of the raft membership, with or without a leader
//! (as etcd's). Changes (add, remove, update, promote) need the root role when auth is on — checked
//! before anything else about the change, as etcd's `checkMembershipOperationPermission` — and run on
//! the leader (`node/leader.rs`, `cluster/membership.rs`).

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::requester::requester;
use crate::cluster::membership;
use crate::node::Node;
use crate::proto::etcdserverpb::cluster_server::Cluster;
use crate::proto::etcdserverpb::{
    Member, MemberAddRequest, MemberAddResponse, MemberListRequest, MemberListResponse, MemberPromoteRequest,
    MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse, MemberUpdateRequest, MemberUpdateResponse,
};

pub(crate) struct ClusterService {
    node: Arc<Node>,
}

impl ClusterService {
    pub(crate) fn new(node: Arc<Node>) -> Self {
        ClusterService { node }
    }

    fn members(&self) -> Vec<Member> {
        membership::members(&membership::current(&self.node.raft))
    }

    /// With auth enabled, membership changes are root's.
    async fn require_admin<T>(&self, request: &Request<T>, op: &'static str) -> Result<(), Status> {
        Ok(self.node.require_admin(requester(&self.node, request)?, op).await?)
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_add(&self, request: Request<MemberAddRequest>) -> Result<Response<MemberAddResponse>, Status> {
        self.require_admin(&request, "member_add").await?;
        let req = request.into_inner();
        let (peer_urls, is_learner) = (req.peer_ur_ls.clone(), req.is_learner);
        let id = self.node.member_add(req).await?;
        let member = Member { id, peer_ur_ls: peer_urls, is_learner, ..Default::default() };
        Ok(Response::new(MemberAddResponse {
            header: self.node.header(0),
            member: Some(member),
            members: self.members(),
        }))
    }

    async fn member_remove(
        &self,
        request: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        self.require_admin(&request, "member_remove").await?;
        self.node.member_remove(request.into_inner()).await?;
        Ok(Response::new(MemberRemoveResponse { header: self.node.header(0), members: self.members() }))
    }

    async fn member_update(
        &self,
        request: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        self.require_admin(&request, "member_update").await?;
        self.node.member_update(request.into_inner()).await?;
        Ok(Response::new(MemberUpdateResponse { header: self.node.header(0), members: self.members() }))
    }

    async fn member_list(&self, request: Request<MemberListRequest>) -> Result<Response<MemberListResponse>, Status> {
        // An authenticated user when auth is on (etcd 3.4 answers anyone).
        self.node.require_user(requester(&self.node, &request)?, "member_list").await?;
        // etcd leaves the revision at 0 in this header (so `member list -w json` prints none).
        Ok(Response::new(MemberListResponse { header: self.node.header(0), members: self.members() }))
    }

    async fn member_promote(
        &self,
        request: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        self.require_admin(&request, "member_promote").await?;
        self.node.member_promote(request.into_inner()).await?;
        Ok(Response::new(MemberPromoteResponse { header: self.node.header(0), members: self.members() }))
    }
}
