//! The KV service: validates requests at the edge, proposes writes, serves reads.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::requester::requester;
use crate::apply::Applied;
use crate::auth::check::Authorizer;
use crate::auth::permissions::Access;
use crate::error::EtcdError;
use crate::identity::Requester;
use crate::keyrange::KeyRange;
use crate::mvcc::counts::Ops;
use crate::mvcc::{kv, txn};
use crate::node::Node;
use crate::proto::etcdserverpb::kv_server::Kv;
use crate::proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, InternalRaftRequest, PutRequest,
    PutResponse, RangeRequest, RangeResponse, TxnRequest, TxnResponse,
};

pub(crate) struct KvService {
    node: Arc<Node>,
}

impl KvService {
    pub(crate) fn new(node: Arc<Node>) -> Self {
        KvService { node }
    }

    async fn propose(&self, req: InternalRaftRequest, who: &Requester) -> Result<Applied, Status> {
        Ok(self.node.propose(req, who).await?)
    }
}

/// A read-only txn needs read permission on every compare and range, on both branches, recursively
/// (the same walk apply makes for a txn that writes).
fn read_only_txn(
    view: &crate::mvcc::ReadView,
    authz: &Authorizer,
    who: &Requester,
    req: &TxnRequest,
) -> Result<TxnResponse, EtcdError> {
    // `txn::is_read_only` let no put through to this path; were one here, it is refused, not assumed.
    authz.check_txn(who, req, &mut |_put| Err(EtcdError::PermissionDenied))?;
    let resp = txn::txn_read_only(view, req)?;
    Ops::record_txn(Ops::txn(req, &resp), true);
    Ok(resp)
}

#[tonic::async_trait]
impl Kv for KvService {
    async fn range(&self, request: Request<RangeRequest>) -> Result<Response<RangeResponse>, Status> {
        let who = requester(&self.node, &request)?;
        let req = request.into_inner();
        if req.key.is_empty() {
            return Err(EtcdError::EmptyKey.into());
        }
        // Checked after the read index, against the auth state of the same read transaction.
        let mut resp = self
            .node
            .read(!req.serializable, move |view, authz| {
                authz.check(&who, "range", Access::Read, &KeyRange::new(&req.key, &req.range_end))?;
                let resp = kv::range(view, &req)?;
                Ops::range().record();
                Ok(resp)
            })
            .await?;
        self.node.fill(&mut resp.header);
        Ok(Response::new(resp))
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let who = requester(&self.node, &request)?;
        let req = request.into_inner();
        txn::validate_put(&req)?;
        match self.propose(InternalRaftRequest { put: Some(Box::new(req)), ..Default::default() }, &who).await? {
            Applied::Put(resp) => Ok(Response::new(resp)),
            other => Err(other.mismatch().into()),
        }
    }

    async fn delete_range(
        &self,
        request: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        let who = requester(&self.node, &request)?;
        let req = request.into_inner();
        if req.key.is_empty() {
            return Err(EtcdError::EmptyKey.into());
        }
        match self
            .propose(InternalRaftRequest { delete_range: Some(Box::new(req)), ..Default::default() }, &who)
            .await?
        {
            Applied::DeleteRange(resp) => Ok(Response::new(resp)),
            other => Err(other.mismatch().into()),
        }
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let who = requester(&self.node, &request)?;
        let req = request.into_inner();
        txn::validate(&req, self.node.max_txn_ops)?;
        let mut resp = if txn::is_read_only(&req) {
            // Like etcd, a transaction that cannot write is served as a linearizable read.
            self.node.read(true, move |view, authz| read_only_txn(view, authz, &who, &req)).await?
        } else {
            match self.propose(InternalRaftRequest { txn: Some(Box::new(req)), ..Default::default() }, &who).await? {
                Applied::Txn(resp) => resp,
                other => return Err(other.mismatch().into()),
            }
        };
        self.node.fill(&mut resp.header);
        Ok(Response::new(resp))
    }

    async fn compact(&self, request: Request<CompactionRequest>) -> Result<Response<CompactionResponse>, Status> {
        let who = requester(&self.node, &request)?;
        let req = request.into_inner();
        let (revision, physical) = (req.revision, req.physical);
        match self.propose(InternalRaftRequest { compaction: Some(Box::new(req)), ..Default::default() }, &who).await? {
            Applied::Compaction(resp) => {
                // As etcd: a physical compaction answers once this member removed what it made unreachable.
                if physical {
                    self.node.removed_through(revision).await;
                }
                Ok(Response::new(resp))
            }
            other => Err(other.mismatch().into()),
        }
    }
}
