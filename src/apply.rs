//! The single place that turns a committed raft entry into effects on the store.
//!
//! Plain and synchronous: it runs inside the state machine's LMDB write transaction, which also records
//! the applied log id, so an entry is applied whole or not at all. Every check that can refuse an entry
//! runs before its first write.

use std::collections::HashSet;

use heed::RwTxn;

use crate::error::EtcdError;
use crate::keyrange::KeyRange;
use crate::lease::store::{LeaseRecord, LeaseStore};
use crate::lease::{MAX_LEASE_TTL, MIN_LEASE_TTL};
use crate::mvcc::kv::{self, Leases};
use crate::mvcc::{self, KvStore, WriteTxn};
use crate::proto::etcdserverpb::request_op::Request;
use crate::proto::etcdserverpb::{
    CompactionResponse, InternalRaftRequest, LeaseCheckpointResponse, LeaseGrantResponse, LeaseRevokeResponse,
    RequestOp,
};
use crate::proto::mvccpb::event::EventType;
use crate::proto::mvccpb::Event;
use crate::raft::Applied;

/// The replicated tables an entry can change.
pub struct Stores<'a> {
    pub kv: &'a KvStore,
    pub leases: &'a LeaseStore,
}

/// What an applied entry changed, for the observers told after the transaction commits
/// (watchers, the lease clock).
#[derive(Debug, Default, Clone)]
pub struct Effects {
    pub events: Vec<Event>,
    pub granted: Vec<(i64, i64)>,
    pub revoked: Vec<i64>,
}

/// Applies one entry. `Err` is the etcd error to return to the proposer; the transaction then holds no
/// change from this entry. `EtcdError::Internal` means storage failed and the whole batch must abort.
pub fn apply(stores: &Stores, txn: &mut RwTxn, req: &InternalRaftRequest) -> Result<(Applied, Effects), EtcdError> {
    if let Some(put) = &req.put {
        write_kv(stores, txn, &[put.lease], |w, leases| {
            kv::check_put(&w.view(), put, leases)?;
            Ok(Applied::Put(kv::put(w, put)?))
        })
    } else if let Some(del) = &req.delete_range {
        write_kv(stores, txn, &[], |w, _| Ok(Applied::DeleteRange(kv::delete_range(w, del)?)))
    } else if let Some(t) = &req.txn {
        let mut lease_ids = Vec::new();
        txn_leases(&t.success, &mut lease_ids);
        txn_leases(&t.failure, &mut lease_ids);
        write_kv(stores, txn, &lease_ids, |w, leases| Ok(Applied::Txn(mvcc::txn::txn(w, t, leases)?)))
    } else if let Some(compaction) = &req.compaction {
        write_kv(stores, txn, &[], |w, _| {
            w.compact(compaction.revision)?;
            Ok(Applied::Compaction(CompactionResponse { header: kv::header(w.rev()) }))
        })
    } else if let Some(grant) = &req.lease_grant {
        if stores.leases.get(txn, grant.id)?.is_some() {
            return Err(EtcdError::LeaseExists);
        }
        if grant.ttl > MAX_LEASE_TTL {
            return Err(EtcdError::LeaseTtlTooLarge);
        }
        let ttl = grant.ttl.max(MIN_LEASE_TTL);
        stores.leases.put(txn, grant.id, LeaseRecord { ttl, remaining_ttl: 0 })?;
        let header = kv::header(stores.kv.view(txn)?.rev);
        let resp = LeaseGrantResponse { header, id: grant.id, ttl, error: String::new() };
        Ok((Applied::LeaseGrant(resp), Effects { granted: vec![(grant.id, ttl)], ..Default::default() }))
    } else if let Some(revoke) = &req.lease_revoke {
        if stores.leases.get(txn, revoke.id)?.is_none() {
            return Err(EtcdError::LeaseNotFound);
        }
        let keys = stores.leases.attached_keys(txn, revoke.id)?;
        let (_, mut effects) = write_kv(stores, txn, &[], |w, _| {
            for key in &keys {
                w.delete_range(&KeyRange::Single(key.clone()))?;
            }
            Ok(Applied::Nothing)
        })?;
        stores.leases.remove(txn, revoke.id)?;
        effects.revoked.push(revoke.id);
        let header = kv::header(stores.kv.view(txn)?.rev);
        Ok((Applied::LeaseRevoke(LeaseRevokeResponse { header }), effects))
    } else if let Some(checkpoint) = &req.lease_checkpoint {
        for cp in &checkpoint.checkpoints {
            if let Some(mut record) = stores.leases.get(txn, cp.id)? {
                record.remaining_ttl = cp.remaining_ttl;
                stores.leases.put(txn, cp.id, record)?;
            }
        }
        let header = kv::header(stores.kv.view(txn)?.rev);
        Ok((Applied::LeaseCheckpoint(LeaseCheckpointResponse { header }), Effects::default()))
    } else {
        Err(EtcdError::Unsupported("request not supported by this member".into()))
    }
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
fn write_kv(
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
