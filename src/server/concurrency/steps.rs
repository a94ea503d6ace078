//! The KV and Lease calls a lock or an election makes, each an in-process call of the listener's
//! own service as the caller (`caller.rs`), and the operations they are built from (etcd's
//! `clientv3` options: `WithFirstCreate`, `WithLastCreate`, `WithMaxCreateRev`, `CreateRevision`).

use tonic::service::Routes;
use tonic::Status;

use super::caller::Caller;
use super::keys::prefix_end;
use crate::proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use crate::proto::etcdserverpb::kv_client::KvClient;
use crate::proto::etcdserverpb::lease_client::LeaseClient;
use crate::proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use crate::proto::etcdserverpb::request_op::Request as Op;
use crate::proto::etcdserverpb::response_op::Response as OpResponse;
use crate::proto::etcdserverpb::{
    Compare, DeleteRangeRequest, DeleteRangeResponse, LeaseGrantRequest, PutRequest, RangeRequest, RangeResponse,
    RequestOp, TxnRequest, TxnResponse,
};
use crate::proto::mvccpb::KeyValue;

/// The TTL of the lease a Lock or Campaign without one is given (etcd's `defaultSessionTTL`).
const SESSION_TTL: i64 = 60;

/// One caller's calls of the listener's KV, Lease and Watch services (Watch: `waits.rs`).
#[derive(Clone)]
pub(crate) struct Steps {
    grpc: Routes,
    caller: Caller,
}

impl Steps {
    pub(crate) fn new(grpc: Routes, caller: Caller) -> Steps {
        Steps { grpc, caller }
    }

    pub(super) fn grpc(&self) -> Routes {
        self.grpc.clone()
    }

    pub(super) fn caller(&self) -> &Caller {
        &self.caller
    }

    fn kv(&self) -> KvClient<Routes> {
        KvClient::new(self.grpc()).max_decoding_message_size(usize::MAX)
    }

    pub(crate) async fn txn(&self, txn: TxnRequest) -> Result<TxnResponse, Status> {
        Ok(self.kv().txn(self.caller.request(txn)).await.map_err(untranslated)?.into_inner())
    }

    pub(crate) async fn range(&self, range: RangeRequest) -> Result<RangeResponse, Status> {
        Ok(self.kv().range(self.caller.request(range)).await.map_err(untranslated)?.into_inner())
    }

    pub(crate) async fn delete(&self, key: Vec<u8>) -> Result<DeleteRangeResponse, Status> {
        let delete = DeleteRangeRequest { key, ..Default::default() };
        Ok(self.kv().delete_range(self.caller.request(delete)).await.map_err(untranslated)?.into_inner())
    }

    /// The lease a session runs with (etcd's `NewSession`): the caller's, or, for 0, a new one of
    /// `SESSION_TTL` granted to the caller. The lease is not kept alive here: its holder does that.
    pub(crate) async fn session_lease(&self, lease: i64) -> Result<i64, Status> {
        if lease != 0 {
            return Ok(lease);
        }
        let grant = LeaseGrantRequest { ttl: SESSION_TTL, id: 0 };
        let lease = LeaseClient::new(self.grpc()).lease_grant(self.caller.request(grant)).await;
        Ok(lease.map_err(untranslated)?.into_inner().id)
    }
}

/// A step's error as etcd's Lock and Election answer it: etcd makes its steps with its Go client,
/// which turns every etcd error into a plain error value, so the services answer it with code
/// Unknown and the same text (`etcdserver: permission denied`, code 2); clients match on the text.
/// Any other failure (the member is shutting down, ...) keeps its status.
pub(super) fn untranslated(status: Status) -> Status {
    if status.message().starts_with("etcdserver: ") {
        Status::unknown(status.message())
    } else {
        status
    }
}

/// `create_revision(key) == revision`: the key was created at `revision` (0: it does not exist).
pub(crate) fn created_at(key: &[u8], revision: i64) -> Compare {
    Compare {
        result: CompareResult::Equal.into(),
        target: CompareTarget::Create.into(),
        key: key.to_vec(),
        target_union: Some(TargetUnion::CreateRevision(revision)),
        ..Default::default()
    }
}

pub(crate) fn put(key: &[u8], value: &[u8], lease: i64) -> RequestOp {
    let put = PutRequest { key: key.to_vec(), value: value.to_vec(), lease, ..Default::default() };
    RequestOp { request: Some(Op::RequestPut(put)) }
}

pub(crate) fn get(key: &[u8]) -> RequestOp {
    read(RangeRequest { key: key.to_vec(), ..Default::default() })
}

pub(crate) fn read(range: RangeRequest) -> RequestOp {
    RequestOp { request: Some(Op::RequestRange(range)) }
}

pub(crate) fn delete(key: &[u8]) -> RequestOp {
    RequestOp { request: Some(Op::RequestDeleteRange(DeleteRangeRequest { key: key.to_vec(), ..Default::default() })) }
}

/// The key under `prefix` created first (etcd's `WithFirstCreate`): who holds the lock, who leads.
pub(crate) fn first_created(prefix: &[u8]) -> RangeRequest {
    newest_or_oldest(prefix, SortOrder::Ascend)
}

/// The key under `prefix` created last at or before `max_create_revision` (etcd's `WithLastCreate`
/// and `WithMaxCreateRev`): the one just ahead in line.
pub(crate) fn last_created_by(prefix: &[u8], max_create_revision: i64) -> RangeRequest {
    RangeRequest { max_create_revision, ..newest_or_oldest(prefix, SortOrder::Descend) }
}

fn newest_or_oldest(prefix: &[u8], order: SortOrder) -> RangeRequest {
    RangeRequest {
        key: prefix.to_vec(),
        range_end: prefix_end(prefix),
        limit: 1,
        sort_order: order.into(),
        sort_target: SortTarget::Create.into(),
        ..Default::default()
    }
}

/// The key-values the `index`th operation of a transaction read (none for one that did not range).
pub(crate) fn ranged(txn: &TxnResponse, index: usize) -> &[KeyValue] {
    match txn.responses.get(index).and_then(|r| r.response.as_ref()) {
        Some(OpResponse::ResponseRange(range)) => &range.kvs,
        _ => &[],
    }
}
