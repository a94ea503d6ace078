//! The Lease service: grant and revoke go through raft; keep-alives renew the leader's lease clock.
//! Beyond granting, a lease is used only by those `lease/holders.rs` allows; a keep-alive stream
//! opened with a token ends when the token is voided (`stream_credential.rs`).

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use super::read_ahead::read_ahead;
use super::requester::requester;
use super::require_leader::{leader_lost, stream_requires_leader};
use super::stream_credential::StreamCredential;
use crate::apply::Applied;
use crate::auth::check::Authorizer;
use crate::auth::permissions::Access;
use crate::error::EtcdError;
use crate::keyrange::KeyRange;
use crate::lease::{holders, MAX_LEASE_TTL};
use crate::node::Node;
use crate::proto::etcdserverpb::lease_server::Lease;
use crate::proto::etcdserverpb::{
    InternalRaftRequest, LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseLeasesRequest, LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse, LeaseStatus,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse, ResponseHeader,
};

pub(crate) struct LeaseService {
    node: Arc<Node>,
}

impl LeaseService {
    pub(crate) fn new(node: Arc<Node>) -> Self {
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
        let credential = StreamCredential::of(&self.node, &request)?;
        let requires_leader = stream_requires_leader(request.metadata());
        let node = self.node.clone();
        let keeper = credential.clone();
        // Read ahead of their answers: a burst of keep-alives must not end the connection (`read_ahead.rs`).
        let requests = read_ahead(request.into_inner());
        let responses = requests.then(move |req| {
            let (node, credential) = (node.clone(), keeper.clone());
            async move {
                let req = req?;
                let id = req.id;
                // Keeping a lease alive needs an authenticated user when auth is on (CVE-2026-33413),
                // whose token still stands, and a lease the user may use.
                if !may_keep_alive(&node, credential, id).await? {
                    // Answered as an unknown lease: no renewal, nothing learned about another's lease.
                    return Ok(LeaseKeepAliveResponse { header: header(&node), id, ttl: 0 });
                }
                // On the leader's clock (a follower forwards); an unknown or expired lease is answered
                // with TTL 0, as etcd does.
                let ttl = node.lease_renew(id).await?;
                Ok(LeaseKeepAliveResponse { header: header(&node), id, ttl })
            }
        });
        // The stream ends with etcd's error at the apply that voids its token, whether or not the
        // client sends another keep-alive; opened with `WithRequireLeader`, also once the member has
        // lost its leader (`require_leader.rs`).
        let node = self.node.clone();
        let voided = Box::pin(async move {
            let voided = async { Status::from(credential.voided(&node, "lease_keep_alive").await) };
            if !requires_leader {
                return voided.await;
            }
            tokio::select! {
                status = voided => status,
                status = leader_lost(&node) => status,
            }
        });
        Ok(Response::new(Box::pin(until_voided(responses, voided))))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        let who = requester(&self.node, &request)?;
        let req = request.into_inner();
        self.node.require_user(who.clone(), "lease_time_to_live").await?;
        let (id, user) = (req.id, who.clone());
        // Only of a lease the user may use (`lease/holders.rs`); an unknown one is answered below.
        self.node
            .read_state_linearizable(move |state, txn| {
                let authz = Authorizer::new(&state.auth, txn)?;
                match state.leases.get(txn, id)? {
                    Some(record) if !holders::may_use(&authz, &state.leases, txn, &user, id, &record)? => {
                        Err(authz.refuse(&user, "lease_time_to_live"))
                    }
                    _ => Ok(()),
                }
            })
            .await?;
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
        // Listing leases needs an authenticated user when auth is on (CVE-2026-33413), and lists only
        // the leases the user may use (`lease/holders.rs`).
        let leases = self
            .node
            .read_state_linearizable(move |state, txn| {
                let authz = Authorizer::new(&state.auth, txn)?;
                authz.check_user(&who, "lease_leases")?;
                let mut usable = Vec::new();
                for (id, record) in state.leases.all(txn)? {
                    if holders::may_use(&authz, &state.leases, txn, &who, id, &record)? {
                        usable.push((id, record));
                    }
                }
                Ok(usable)
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

/// Whether a keep-alive of lease `id` on a stream opened with `credential` renews it: an error when
/// the requester may not keep leases alive at all (anonymous, a void token), false for a lease the
/// requester may not use. Decided on this member's applied state; a lease it does not know yet (just
/// granted through another member) is looked up again after the read index, so that its holder's
/// first keep-alive is not refused, nor another's let through.
async fn may_keep_alive(node: &Node, credential: StreamCredential, id: i64) -> Result<bool, EtcdError> {
    let decide = move |state: &crate::raft::state_machine::State, txn: &heed::RoTxn| {
        let authz = Authorizer::new(&state.auth, txn)?;
        let who = credential.requester();
        credential.stands(&authz, "lease_keep_alive")?;
        authz.check_user(who, "lease_keep_alive")?;
        match state.leases.get(txn, id)? {
            None => Ok(None),
            Some(record) if holders::may_use(&authz, &state.leases, txn, who, id, &record)? => Ok(Some(true)),
            Some(_) => {
                authz.refuse(who, "lease_keep_alive");
                Ok(Some(false))
            }
        }
    };
    if let Some(known) = node.read_state(decide.clone()).await? {
        return Ok(known);
    }
    // Unknown here and after the read index: the leader answers it as unknown (TTL 0) too.
    Ok(node.read_state_linearizable(decide).await?.unwrap_or(true))
}

/// The keep-alive answers until `voided` resolves; then its error, and the end of the stream. The
/// stream also ends when the client ends its side (as etcd's does).
fn until_voided<S>(
    responses: S,
    voided: Pin<Box<dyn std::future::Future<Output = Status> + Send>>,
) -> impl Stream<Item = Result<LeaseKeepAliveResponse, Status>> + Send
where
    S: Stream<Item = Result<LeaseKeepAliveResponse, Status>> + Send + 'static,
{
    futures::stream::unfold((Box::pin(responses), Some(voided)), |(mut responses, voided)| async move {
        let mut voided = voided?;
        tokio::select! {
            // Once the token is void, no keep-alive is answered (nor renewed) after it.
            biased;
            status = &mut voided => Some((Err(status), (responses, None))),
            answer = responses.next() => answer.map(|answer| (answer, (responses, Some(voided)))),
        }
    })
}
