//! Key-value entries (put, delete, txn, compaction) as writes to the mvcc store, each at one new
//! revision, with the lease attachments kept in step with the keys they changed.

use std::collections::HashSet;

use heed::RwTxn;

use super::outcome::{Applied, Effects};
use super::stores::Stores;
use crate::error::EtcdError;
use crate::mvcc::kv::{self, Leases};
use crate::mvcc::{self, WriteTxn};
use crate::proto::etcdserverpb::request_op::Request;
use crate::proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, PutRequest, RequestOp, TxnRequest,
};
use crate::proto::mvccpb::event::EventType;

/// A put, once permitted.
pub(super) fn put(stores: &Stores, txn: &mut RwTxn, put: &PutRequest) -> Result<(Applied, Effects), EtcdError> {
    write_kv(stores, txn, &[put.lease], |w, leases| {
        // Outside a txn etcd looks the lease up before anything else.
        if put.lease != 0 && !leases.exists(put.lease) {
            return Err(EtcdError::LeaseNotFound);
        }
        kv::check_put(&w.view(), put, leases)?;
        Ok(Applied::Put(kv::put(w, put)?))
    })
}

/// A delete range, once permitted.
pub(super) fn delete_range(
    stores: &Stores,
    txn: &mut RwTxn,
    del: &DeleteRangeRequest,
) -> Result<(Applied, Effects), EtcdError> {
    write_kv(stores, txn, &[], |w, _| Ok(Applied::DeleteRange(kv::delete_range(w, del)?)))
}

/// A txn, once permitted: the leases its puts name are looked up before it runs.
pub(super) fn txn(stores: &Stores, txn: &mut RwTxn, t: &TxnRequest) -> Result<(Applied, Effects), EtcdError> {
    let mut lease_ids = Vec::new();
    txn_leases(&t.success, &mut lease_ids);
    txn_leases(&t.failure, &mut lease_ids);
    write_kv(stores, txn, &lease_ids, |w, leases| Ok(Applied::Txn(mvcc::txn::txn(w, t, leases)?)))
}

/// A compaction, once permitted: scheduled only, the versions it made unreachable are removed in the
/// background (`mvcc/compaction.rs`).
pub(super) fn compact(
    stores: &Stores,
    txn: &mut RwTxn,
    compaction: &CompactionRequest,
) -> Result<(Applied, Effects), EtcdError> {
    let (applied, effects) = write_kv(stores, txn, &[], |w, _| {
        w.compact(compaction.revision)?;
        Ok(Applied::Compaction(CompactionResponse { header: kv::header(w.rev()) }))
    })?;
    Ok((applied, Effects { compacted: true, ..effects }))
}

/// The leases named by puts anywhere in a transaction.
fn txn_leases(ops: &[RequestOp], out: &mut Vec<i64>) {
    for op in ops {
        match &op.request {
            Some(Request::RequestPut(p)) if p.lease != 0 => out.push(p.lease),
            Some(Request::RequestTxn(t)) => {
                txn_leases(&t.success, out);
                txn_leases(&t.failure, out);
            }
            _ => {}
        }
    }
}

/// Leases known to exist, looked up before the kv write transaction begins.
struct KnownLeases(HashSet<i64>);

impl Leases for KnownLeases {
    fn exists(&self, id: i64) -> bool {
        self.0.contains(&id)
    }
}

/// Runs a kv change at one new revision, then keeps lease attachments in step with what it changed.
pub(super) fn write_kv(
    stores: &Stores,
    txn: &mut RwTxn,
    lease_ids: &[i64],
    op: impl FnOnce(&mut WriteTxn, &dyn Leases) -> Result<Applied, EtcdError>,
) -> Result<(Applied, Effects), EtcdError> {
    let mut known = HashSet::new();
    for &id in lease_ids.iter().filter(|&&id| id != 0) {
        if stores.leases.get(txn, id)?.is_some() {
            known.insert(id);
        }
    }
    let mut w = stores.kv.begin(txn)?;
    let applied = op(&mut w, &KnownLeases(known))?;
    let (_, events) = w.finish()?;
    for event in &events {
        let before = event.prev_kv.as_ref().map_or(0, |p| p.lease);
        let after = match (EventType::try_from(event.r#type), &event.kv) {
            (Ok(EventType::Put), Some(kv)) => kv.lease,
            _ => 0,
        };
        if before != after {
            let key = event.kv.as_ref().map_or(&[][..], |kv| &kv.key[..]);
            if before != 0 {
                stores.leases.detach(txn, before, key)?;
            }
            if after != 0 {
                stores.leases.attach(txn, after, key)?;
            }
        }
    }
    Ok((applied, Effects { events, ..Default::default() }))
}
