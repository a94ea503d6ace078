//! etcd's Range, Put and DeleteRange semantics on the revisioned store, as etcd 3.4's applier has them.

use std::cmp::Ordering;

use super::store::{ReadView, WriteTxn};
use crate::error::EtcdError;
use crate::keyrange::KeyRange;
use crate::proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use crate::proto::etcdserverpb::{
    DeleteRangeRequest, DeleteRangeResponse, PutRequest, PutResponse, RangeRequest, RangeResponse, ResponseHeader,
};
use crate::proto::mvccpb::KeyValue;

/// Answers whether a lease exists, for puts that attach one.
pub(crate) trait Leases {
    fn exists(&self, id: i64) -> bool;
}

pub(crate) fn header(revision: i64) -> Option<ResponseHeader> {
    Some(ResponseHeader { revision, ..Default::default() })
}

pub(crate) fn range(view: &ReadView, req: &RangeRequest) -> Result<RangeResponse, EtcdError> {
    let filtered = req.min_mod_revision != 0
        || req.max_mod_revision != 0
        || req.min_create_revision != 0
        || req.max_create_revision != 0;
    let order = SortOrder::try_from(req.sort_order).ok();
    // Sorting or filtering needs every key; otherwise fetch one more than the limit to learn `more`.
    let fetch = if order != Some(SortOrder::None) || filtered || req.limit <= 0 { 0 } else { req.limit as usize + 1 };
    let found = view.range(&KeyRange::new(&req.key, &req.range_end), req.revision, fetch, req.count_only)?;
    let mut kvs = found.kvs;
    if filtered {
        kvs.retain(|kv| {
            (req.max_mod_revision == 0 || kv.mod_revision <= req.max_mod_revision)
                && (req.min_mod_revision == 0 || kv.mod_revision >= req.min_mod_revision)
                && (req.max_create_revision == 0 || kv.create_revision <= req.max_create_revision)
                && (req.min_create_revision == 0 || kv.create_revision >= req.min_create_revision)
        });
    }
    sort(&mut kvs, req.sort_target, order);
    let mut more = false;
    if req.limit > 0 && kvs.len() > req.limit as usize {
        kvs.truncate(req.limit as usize);
        more = true;
    }
    if req.keys_only {
        kvs.iter_mut().for_each(|kv| kv.value.clear());
    }
    Ok(RangeResponse { header: header(found.rev), kvs, more, count: found.count as i64 })
}

/// etcd sorts ascending by default when a target other than the key is named; keys already come sorted.
fn sort(kvs: &mut [KeyValue], target: i32, order: Option<SortOrder>) {
    let target = SortTarget::try_from(target).ok();
    let order = match (order, target) {
        (Some(SortOrder::None), Some(t)) if t != SortTarget::Key => SortOrder::Ascend,
        (Some(order), _) => order,
        (None, _) => return,
    };
    let compare: fn(&KeyValue, &KeyValue) -> Ordering = match target {
        Some(SortTarget::Key) => |a, b| a.key.cmp(&b.key),
        Some(SortTarget::Version) => |a, b| a.version.cmp(&b.version),
        Some(SortTarget::Create) => |a, b| a.create_revision.cmp(&b.create_revision),
        Some(SortTarget::Mod) => |a, b| a.mod_revision.cmp(&b.mod_revision),
        Some(SortTarget::Value) => |a, b| a.value.cmp(&b.value),
        None => return,
    };
    match order {
        SortOrder::Ascend => kvs.sort_by(compare),
        SortOrder::Descend => kvs.sort_by(|a, b| compare(b, a)),
        SortOrder::None => {}
    }
}

/// The checks a put must pass before anything in its entry is written (etcd's `checkPut`).
pub(crate) fn check_put(view: &ReadView, req: &PutRequest, leases: &dyn Leases) -> Result<(), EtcdError> {
    if (req.ignore_value || req.ignore_lease)
        && view.range(&KeyRange::Single(req.key.clone()), 0, 1, false)?.kvs.is_empty()
    {
        return Err(EtcdError::KeyNotFound);
    }
    if req.lease != 0 && !leases.exists(req.lease) {
        return Err(EtcdError::LeaseNotFound);
    }
    Ok(())
}

/// Writes one put; `check_put` must have passed.
pub(crate) fn put(txn: &mut WriteTxn, req: &PutRequest) -> Result<PutResponse, EtcdError> {
    let prev = if req.ignore_value || req.ignore_lease || req.prev_kv {
        txn.view().range(&KeyRange::Single(req.key.clone()), 0, 1, false)?.kvs.pop()
    } else {
        None
    };
    let value = match (&prev, req.ignore_value) {
        (Some(prev), true) => prev.value.clone(),
        (None, true) => return Err(EtcdError::KeyNotFound),
        (_, false) => req.value.clone(),
    };
    let lease = match (&prev, req.ignore_lease) {
        (Some(prev), true) => prev.lease,
        (None, true) => return Err(EtcdError::KeyNotFound),
        (_, false) => req.lease,
    };
    let rev = txn.put(&req.key, value, lease)?;
    Ok(PutResponse { header: header(rev), prev_kv: prev.filter(|_| req.prev_kv) })
}

pub(crate) fn delete_range(txn: &mut WriteTxn, req: &DeleteRangeRequest) -> Result<DeleteRangeResponse, EtcdError> {
    let deleted = txn.delete_range(&KeyRange::new(&req.key, &req.range_end), req.prev_kv)?;
    Ok(DeleteRangeResponse { header: header(deleted.rev), deleted: deleted.count as i64, prev_kvs: deleted.prev_kvs })
}
