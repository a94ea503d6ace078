//! The KV service: validates requests at the edge, proposes writes, serves reads.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::error::EtcdError;
use crate::mvcc::{kv, txn};
use crate::node::Node;
use crate::proto::etcdserverpb::kv_server::Kv;
use crate::proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, InternalRaftRequest, PutRequest,
    PutResponse, RangeRequest, RangeResponse, TxnRequest, TxnResponse,
};
use crate::raft::Applied;

pub struct KvService {
    node: Arc<Node>,
}

impl KvService {
    pub fn new(node: Arc<Node>) -> Self {
        KvService { node }
    }

    async fn propose(&self, req: InternalRaftRequest) -> Result<Applied, Status> {
        Ok(self.node.propose(req).await?)
    }
}

/// An apply result of the wrong kind means the raft layer mixed up proposals: never expected.
fn mismatch(applied: Applied) -> Status {
    tracing::error!(?applied, "apply result does not match the proposal");
    EtcdError::Internal.into()
}

#[tonic::async_trait]
impl Kv for KvService {
    async fn range(&self, request: Request<RangeRequest>) -> Result<Response<RangeResponse>, Status> {
        let req = request.into_inner();
        if req.key.is_empty() {
            return Err(EtcdError::EmptyKey.into());
        }
        let mut resp = self.node.read(!req.serializable, move |view| kv::range(view, &req)).await?;
        self.node.fill(&mut resp.header);
        Ok(Response::new(resp))
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let req = request.into_inner();
        txn::validate_put(&req)?;
        match self.propose(InternalRaftRequest { put: Some(req), ..Default::default() }).await? {
            Applied::Put(mut resp) => {
                self.node.fill(&mut resp.header);
                Ok(Response::new(resp))
            }
            other => Err(mismatch(other)),
        }
    }

    async fn delete_range(
        &self,
        request: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        let req = request.into_inner();
        if req.key.is_empty() {
            return Err(EtcdError::EmptyKey.into());
        }
        match self.propose(InternalRaftRequest { delete_range: Some(req), ..Default::default() }).await? {
            Applied::DeleteRange(mut resp) => {
                self.node.fill(&mut resp.header);
                Ok(Response::new(resp))
            }
            other => Err(mismatch(other)),
        }
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let req = request.into_inner();
        txn::validate(&req, self.node.max_txn_ops)?;
        let mut resp = if txn::is_read_only(&req) {
            // Like etcd, a transaction that cannot write is served as a linearizable read.
            self.node.read(true, move |view| txn::txn_read_only(view, &req)).await?
        } else {
            match self.propose(InternalRaftRequest { txn: Some(req), ..Default::default() }).await? {
                Applied::Txn(resp) => resp,
                other => return Err(mismatch(other)),
            }
        };
        self.node.fill(&mut resp.header);
        Ok(Response::new(resp))
    }

    async fn compact(&self, request: Request<CompactionRequest>) -> Result<Response<CompactionResponse>, Status> {
        let req = request.into_inner();
        match self.propose(InternalRaftRequest { compaction: Some(req), ..Default::default() }).await? {
            Applied::Compaction(mut resp) => {
                self.node.fill(&mut resp.header);
                Ok(Response::new(resp))
            }
            other => Err(mismatch(other)),
        }
    }
}
