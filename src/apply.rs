//! The single place that turns a committed raft entry into effects on the store.
//!
//! Plain and synchronous: it runs inside the state machine's LMDB write transaction, which also records
//! the applied log id, so an entry is applied whole or not at all. Every check that can refuse an entry
//! runs before its first write.

use heed::RwTxn;

use crate::error::EtcdError;
use crate::mvcc::kv::{self, Leases};
use crate::mvcc::{self, KvStore};
use crate::proto::etcdserverpb::{CompactionResponse, InternalRaftRequest};
use crate::proto::mvccpb::Event;
use crate::raft::Applied;

/// Leases do not exist yet in this node, so an entry naming one is refused as etcd refuses an unknown
/// lease. (Lease support replaces this with the lease table.)
pub struct NoLeases;

impl Leases for NoLeases {
    fn exists(&self, _id: i64) -> bool {
        false
    }
}

/// Applies one entry. `Err` is the etcd error to return to the proposer; the transaction then holds no
/// change from this entry. `EtcdError::Internal` means storage failed and the whole batch must abort.
pub fn apply(
    kv: &KvStore,
    txn: &mut RwTxn,
    req: &InternalRaftRequest,
) -> Result<(Applied, Vec<Event>), EtcdError> {
    let leases = NoLeases;
    let mut w = kv.begin(txn)?;
    let applied = if let Some(put) = &req.put {
        kv::check_put(&w.view(), put, &leases)?;
        Applied::Put(kv::put(&mut w, put)?)
    } else if let Some(del) = &req.delete_range {
        Applied::DeleteRange(kv::delete_range(&mut w, del)?)
    } else if let Some(txn) = &req.txn {
        Applied::Txn(mvcc::txn::txn(&mut w, txn, &leases)?)
    } else if let Some(compaction) = &req.compaction {
        w.compact(compaction.revision)?;
        Applied::Compaction(CompactionResponse {
            header: kv::header(w.rev()),
        })
    } else {
        return Err(EtcdError::Unsupported(
            "request not supported by this member".into(),
        ));
    };
    let (_, events) = w.finish()?;
    Ok((applied, events))
}
