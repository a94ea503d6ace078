//! The Cluster service: membership as etcd clients see it.
//!
//! keyward runs single-member clusters, so the membership is this member alone. `MemberList` reports it
//! as etcd does; requests that would change the membership are refused with `Unsupported`, except where
//! etcd's answer does not depend on membership changes being possible: removing or updating a member
//! that does not exist is etcd's "member not found", and so is promoting one. With auth enabled, every
//! membership change first requires the root role, as in etcd.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::requester::requester;
use crate::error::EtcdError;
use crate::node::Node;
use crate::proto::etcdserverpb::cluster_server::Cluster;
use crate::proto::etcdserverpb::{
    Member, MemberAddRequest, MemberAddResponse, MemberListRequest, MemberListResponse, MemberPromoteRequest,
    MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse, MemberUpdateRequest, MemberUpdateResponse,
};

pub struct ClusterService {
    node: Arc<Node>,
}

impl ClusterService {
    pub fn new(node: Arc<Node>) -> Self {
        ClusterService { node }
    }

    /// This member as etcd describes a started one.
    fn members(&self) -> Vec<Member> {
        vec![Member {
            id: self.node.member_id,
            name: self.node.name.clone(),
            peer_ur_ls: self.node.peer_urls.clone(),
            client_ur_ls: self.node.client_urls.clone(),
            is_learner: false,
        }]
    }

    /// The answer to changing member `id` (after the admin check): etcd's "member not found" for any id
    /// but this member's, as etcd answers without membership changes being involved; for this member,
    /// unsupported.
    fn refuse_change(&self, id: u64) -> Status {
        if id == self.node.member_id {
            unsupported()
        } else {
            EtcdError::MemberNotFound.into()
        }
    }

    /// With auth enabled, membership changes are root's; etcd checks this before anything else about
    /// the change (`checkMembershipOperationPermission`).
    async fn require_admin<T>(&self, request: &Request<T>, op: &'static str) -> Result<(), Status> {
        Ok(self.node.require_admin(requester(&self.node, request)?, op).await?)
    }
}

fn unsupported() -> Status {
    EtcdError::Unsupported("membership changes are not supported yet: keyward runs single-member clusters".into())
        .into()
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_add(&self, request: Request<MemberAddRequest>) -> Result<Response<MemberAddResponse>, Status> {
        self.require_admin(&request, "member_add").await?;
        Err(unsupported())
    }

    async fn member_remove(
        &self,
        request: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        self.require_admin(&request, "member_remove").await?;
        // etcd itself refuses to remove the only member of a cluster ("re-configuration failed due to
        // not enough started members"); keyward has no error for that yet and refuses as unsupported.
        Err(self.refuse_change(request.get_ref().id))
    }

    async fn member_update(
        &self,
        request: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        self.require_admin(&request, "member_update").await?;
        Err(self.refuse_change(request.get_ref().id))
    }

    async fn member_list(&self, _request: Request<MemberListRequest>) -> Result<Response<MemberListResponse>, Status> {
        // etcd leaves the revision at 0 in this header (so `member list -w json` prints none).
        Ok(Response::new(MemberListResponse { header: self.node.header(0), members: self.members() }))
    }

    async fn member_promote(
        &self,
        request: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        self.require_admin(&request, "member_promote").await?;
        // etcd answers "etcdserver: can only promote a learner member" (FailedPrecondition) for a voter;
        // keyward has no error for that yet and refuses as unsupported.
        Err(self.refuse_change(request.get_ref().id))
    }
}
