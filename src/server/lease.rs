//! The Lease service: grant and revoke go through raft; keep-alives renew the leader's lease clock.

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use super::requester::requester;
use crate::apply::Applied;
use crate::auth::check::Authorizer;
use crate::auth::permissions::Access;
use crate::error::EtcdError;
use crate::keyrange::KeyRange;
use crate::lease::MAX_LEASE_TTL;
use crate::node::Node;
use crate::proto::etcdserverpb::lease_server::Lease;
use crate::proto::etcdserverpb::{
    InternalRaftRequest, LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseLeasesRequest, LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse, LeaseStatus,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse, ResponseHeader,
};

pub struct LeaseService {
    node: Arc<Node>,
}

impl LeaseService {
    pub fn new(node: Arc<Node>) -> Self {
        LeaseService { node }
    }
}

/// A header carrying the current revision, as etcd fills headers of responses that are not reads.
fn header(node: &Node) -> Option<ResponseHeader> {
    node.header(node.revision())
}

type KeepAliveStream = Pin<Box<dyn Stream<Item = Result<LeaseKeepAliveResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Lease for LeaseService {
    async fn lease_grant(&self, request: Request<LeaseGrantRequest>) -> Result<Response<LeaseGrantResponse>, Status> {
        let who = requester(&self.node, &request)?;
        let mut req = request.into_inner();
        if req.ttl > MAX_LEASE_TTL {
            return Err(EtcdError::LeaseTtlTooLarge.into());
        }
        if req.id == 0 {
            req.id = self.node.next_id();
        }
        match self
            .node
            .propose(InternalRaftRequest { lease_grant: Some(Box::new(req)), ..Default::default() }, &who)
            .await?
        {
            Applied::LeaseGrant(resp) => Ok(Response::new(resp)),
            other => Err(other.mismatch().into()),
        }
    }

    async fn lease_revoke(
        &self,
        request: Request<LeaseRevokeRequest>,
    ) -> Result<Response<LeaseRevokeResponse>, Status> {
        let who = requester(&self.node, &request)?;
        let req = request.into_inner();
        match self
            .node
            .propose(InternalRaftRequest { lease_revoke: Some(Box::new(req)), ..Default::default() }, &who)
            .await?
        {
            Applied::LeaseRevoke(resp) => Ok(Response::new(resp)),
            other => Err(other.mismatch().into()),
        }
    }

    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<KeepAliveStream>, Status> {
        let who = requester(&self.node, &request)?;
        let node = self.node.clone();
        let responses = request.into_inner().then(move |req| {
            let (node, who) = (node.clone(), who.clone());
            async move {
                let req = req?;
                // Keeping a lease alive needs an authenticated user when auth is on (CVE-2026-33413).
                node.require_user(who.clone(), "lease_keep_alive").await?;
                // On the leader's clock (a follower forwards); an unknown or expired lease is answered
                // with TTL 0, as etcd does.
                let ttl = node.lease_renew(req.id).await?;
                Ok(LeaseKeepAliveResponse { header: header(&node), id: req.id, ttl })
            }
        });
        Ok(Response::new(Box::pin(responses)))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        let who = requester(&self.node, &request)?;
        let req = request.into_inner();
        self.node.require_user(who.clone(), "lease_time_to_live").await?;
        let Some((granted_ttl, ttl)) = self.node.lease_time_to_live(req.id).await? else {
            // etcd answers an unknown lease with TTL -1 rather than an error.
            return Ok(Response::new(LeaseTimeToLiveResponse {
                header: header(&self.node),
                id: req.id,
                ttl: -1,
                ..Default::default()
            }));
        };
        let keys = if req.keys {
            let id = req.id;
            // Listing the keys reveals them: the user must be allowed to read every one (CVE-2023-32082).
            self.node
                .read_state_linearizable(move |state, txn| {
                    let authz = Authorizer::new(&state.auth, txn)?;
                    let keys = state.leases.attached_keys(txn, id)?;
                    for key in &keys {
                        authz.check(&who, "lease_time_to_live", Access::Read, &KeyRange::Single(key.clone()))?;
                    }
                    Ok(keys)
                })
                .await?
        } else {
            Vec::new()
        };
        Ok(Response::new(LeaseTimeToLiveResponse { header: header(&self.node), id: req.id, ttl, granted_ttl, keys }))
    }

    async fn lease_leases(
        &self,
        request: Request<LeaseLeasesRequest>,
    ) -> Result<Response<LeaseLeasesResponse>, Status> {
        let who = requester(&self.node, &request)?;
        // Listing leases needs an authenticated user when auth is on (CVE-2026-33413).
        let leases = self
            .node
            .read_state_linearizable(move |state, txn| {
                Authorizer::new(&state.auth, txn)?.check_user(&who, "lease_leases")?;
                state.leases.all(txn)
            })
            .await?;
        // etcd lists leases by expiry, soonest first.
        let mut leases: Vec<_> = leases
            .into_iter()
            .map(|(id, _)| (self.node.lessor.time_to_live(id).map_or(i64::MAX, |(_, left)| left), id))
            .collect();
        leases.sort();
        let leases = leases.into_iter().map(|(_, id)| LeaseStatus { id }).collect();
        Ok(Response::new(LeaseLeasesResponse { header: header(&self.node), leases }))
    }
}
