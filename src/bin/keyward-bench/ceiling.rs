//! `keyward-bench ceiling-server`: the front end's ceiling, for reading the put benchmarks.
//!
//! It serves etcd's `KV.Put` on keyward's own connection stack (tonic, `TCP_NODELAY`, admission and
//! coalesced writes, as `server/mod.rs` sets them up) and answers every Put at once with an empty
//! response: no raft, no log, no storage, no fsync. Whatever rate a load generator reaches against it
//! is the most any server built on this stack can reach on the same machine; `benches/compare.sh`
//! users divide by etcd's rate to see how much of a target is left for raft and storage to spend.
//! The other KV methods answer `Unimplemented`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, Ordering};

use anyhow::Context;
use keyward::proto::etcdserverpb::kv_server::{Kv, KvServer};
use keyward::proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest, PutResponse,
    RangeRequest, RangeResponse, ResponseHeader, TxnRequest, TxnResponse,
};
use keyward::{admitted_tcp, Admission};
use tonic::{Request, Response, Status};

/// Answers Put with the next "revision" and nothing else.
#[derive(Default)]
struct InstantPut {
    revision: AtomicI64,
}

#[tonic::async_trait]
impl Kv for InstantPut {
    async fn put(&self, _request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let revision = self.revision.fetch_add(1, Ordering::Relaxed) + 2;
        let header = ResponseHeader { cluster_id: 1, member_id: 1, revision, raft_term: 1 };
        Ok(Response::new(PutResponse { header: Some(header), prev_kv: None }))
    }

    async fn range(&self, _request: Request<RangeRequest>) -> Result<Response<RangeResponse>, Status> {
        Err(Status::unimplemented("the ceiling server answers Put only"))
    }

    async fn delete_range(
        &self,
        _request: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        Err(Status::unimplemented("the ceiling server answers Put only"))
    }

    async fn txn(&self, _request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        Err(Status::unimplemented("the ceiling server answers Put only"))
    }

    async fn compact(&self, _request: Request<CompactionRequest>) -> Result<Response<CompactionResponse>, Status> {
        Err(Status::unimplemented("the ceiling server answers Put only"))
    }
}

/// Serves until the process is killed.
pub(crate) async fn serve(listen: SocketAddr) -> anyhow::Result<()> {
    let socket = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("cannot listen on {listen}"))?;
    eprintln!("keyward-bench: ceiling server on {}", socket.local_addr()?);
    let incoming = admitted_tcp(socket, Admission::unbounded());
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .add_service(KvServer::new(InstantPut::default()))
        .serve_with_incoming(incoming)
        .await?;
    Ok(())
}
