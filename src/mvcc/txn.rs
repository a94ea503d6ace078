//! etcd's Txn: compares evaluated against the state before the transaction, then one branch of
//! operations (possibly nested) applied at a single new revision.
//!
//! Like etcd 3.4, every compare of every nested transaction on the chosen path is evaluated first
//! ("the path"), then every operation on the path is checked, and only then is anything written, so a
//! transaction is applied whole or not at all.

use super::kv::{self, Leases};
use super::store::{ReadView, WriteTxn};
use crate::error::EtcdError;
use crate::keyrange::KeyRange;
use crate::proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use crate::proto::etcdserverpb::request_op::Request;
use crate::proto::etcdserverpb::response_op::Response;
use crate::proto::etcdserverpb::{Compare, RequestOp, ResponseOp, TxnRequest, TxnResponse};
use crate::proto::mvccpb::KeyValue;

/// True when no operation on any branch writes: such a transaction is served like a read.
pub(crate) fn is_read_only(req: &TxnRequest) -> bool {
    req.success.iter().chain(&req.failure).all(|op| match &op.request {
        Some(Request::RequestRange(_)) | None => true,
        Some(Request::RequestTxn(inner)) => is_read_only(inner),
        Some(Request::RequestPut(_)) | Some(Request::RequestDeleteRange(_)) => false,
    })
}

/// Which branch each transaction on the executed path takes, in pre-order.
fn path(view: &ReadView, req: &TxnRequest, out: &mut Vec<bool>) -> Result<(), EtcdError> {
    let mut succeeded = true;
    for compare in &req.compare {
        if !compare_holds(view, compare)? {
            succeeded = false;
            break;
        }
    }
    out.push(succeeded);
    for op in branch(req, succeeded) {
        if let Some(Request::RequestTxn(inner)) = &op.request {
            path(view, inner, out)?;
        }
    }
    Ok(())
}

fn branch(req: &TxnRequest, succeeded: bool) -> &[RequestOp] {
    if succeeded {
        &req.success
    } else {
        &req.failure
    }
}

fn compare_holds(view: &ReadView, c: &Compare) -> Result<bool, EtcdError> {
    // A compare on a revision that cannot be read simply fails, as in etcd.
    let kvs = match view.range(&KeyRange::new(&c.key, &c.range_end), 0, 0, false) {
        Ok(found) => found.kvs,
        Err(EtcdError::Internal) => return Err(EtcdError::Internal),
        Err(_) => return Ok(false),
    };
    let target = CompareTarget::try_from(c.target).ok();
    if kvs.is_empty() {
        // A missing key has no value to compare ("" would be ambiguous), but zero revisions/version/lease.
        return Ok(target != Some(CompareTarget::Value) && compare_kv(c, target, &KeyValue::default()));
    }
    Ok(kvs.iter().all(|kv| compare_kv(c, target, kv)))
}

fn compare_kv(c: &Compare, target: Option<CompareTarget>, kv: &KeyValue) -> bool {
    let number = |field: i64, wanted: Option<i64>| field.cmp(&wanted.unwrap_or(0));
    let ordering = match target {
        Some(CompareTarget::Value) => {
            let wanted = match &c.target_union {
                Some(TargetUnion::Value(v)) => v.as_slice(),
                _ => &[],
            };
            kv.value.as_slice().cmp(wanted)
        }
        Some(CompareTarget::Create) => number(
            kv.create_revision,
            match c.target_union {
                Some(TargetUnion::CreateRevision(r)) => Some(r),
                _ => None,
            },
        ),
        Some(CompareTarget::Mod) => number(
            kv.mod_revision,
            match c.target_union {
                Some(TargetUnion::ModRevision(r)) => Some(r),
                _ => None,
            },
        ),
        Some(CompareTarget::Version) => number(
            kv.version,
            match c.target_union {
                Some(TargetUnion::Version(v)) => Some(v),
                _ => None,
            },
        ),
        Some(CompareTarget::Lease) => number(
            kv.lease,
            match c.target_union {
                Some(TargetUnion::Lease(l)) => Some(l),
                _ => None,
            },
        ),
        None => return true,
    };
    match CompareResult::try_from(c.result) {
        Ok(CompareResult::Equal) => ordering.is_eq(),
        Ok(CompareResult::NotEqual) => ordering.is_ne(),
        Ok(CompareResult::Greater) => ordering.is_gt(),
        Ok(CompareResult::Less) => ordering.is_lt(),
        Err(_) => true,
    }
}

/// Which operations a checking pass looks at. etcd checks every put on the path first, then every
/// range, so when both would fail the put's error is the one reported.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    Puts,
    Ranges,
}

/// Checks the operations of one kind on the path against the state before the transaction
/// (etcd's `checkRequests` with `checkPut` or `checkRange`).
fn check(
    view: &ReadView,
    req: &TxnRequest,
    path: &mut std::slice::Iter<bool>,
    leases: &dyn Leases,
    pass: Pass,
) -> Result<(), EtcdError> {
    let succeeded = *path.next().ok_or(EtcdError::Internal)?;
    for op in branch(req, succeeded) {
        match &op.request {
            Some(Request::RequestPut(put)) if pass == Pass::Puts => kv::check_put(view, put, leases)?,
            Some(Request::RequestRange(range)) if pass == Pass::Ranges && range.revision != 0 => {
                if range.revision > view.rev {
                    return Err(EtcdError::FutureRev);
                }
                if range.revision < view.compact_rev {
                    return Err(EtcdError::Compacted);
                }
            }
            Some(Request::RequestTxn(inner)) => check(view, inner, path, leases, pass)?,
            _ => {}
        }
    }
    Ok(())
}

/// Evaluates, checks and applies a transaction that may write.
pub(crate) fn txn(wtxn: &mut WriteTxn, req: &TxnRequest, leases: &dyn Leases) -> Result<TxnResponse, EtcdError> {
    let mut taken = Vec::new();
    {
        let view = wtxn.view();
        path(&view, req, &mut taken)?;
        check(&view, req, &mut taken.iter(), leases, Pass::Puts)?;
        check(&view, req, &mut taken.iter(), leases, Pass::Ranges)?;
    }
    let mut resp = execute(wtxn, req, &mut taken.iter())?;
    resp.header = kv::header(wtxn.rev());
    Ok(resp)
}

/// Evaluates a transaction without writes against a read view.
pub(crate) fn txn_read_only(view: &ReadView, req: &TxnRequest) -> Result<TxnResponse, EtcdError> {
    let mut taken = Vec::new();
    path(view, req, &mut taken)?;
    struct NoLeases;
    impl Leases for NoLeases {
        fn exists(&self, _: i64) -> bool {
            false
        }
    }
    check(view, req, &mut taken.iter(), &NoLeases, Pass::Ranges)?;
    let mut resp = read_branch(view, req, &mut taken.iter())?;
    resp.header = kv::header(view.rev);
    Ok(resp)
}

fn read_branch(view: &ReadView, req: &TxnRequest, path: &mut std::slice::Iter<bool>) -> Result<TxnResponse, EtcdError> {
    let succeeded = *path.next().ok_or(EtcdError::Internal)?;
    let mut responses = Vec::new();
    for op in branch(req, succeeded) {
        let response = match &op.request {
            Some(Request::RequestRange(r)) => Some(Response::ResponseRange(kv::range(view, r)?)),
            Some(Request::RequestTxn(inner)) => Some(Response::ResponseTxn(read_branch(view, inner, path)?)),
            Some(Request::RequestPut(_)) | Some(Request::RequestDeleteRange(_)) => return Err(EtcdError::Internal),
            None => None,
        };
        responses.push(ResponseOp { response });
    }
    Ok(TxnResponse { header: kv::header(0).map(|_| Default::default()), succeeded, responses })
}

fn execute(wtxn: &mut WriteTxn, req: &TxnRequest, path: &mut std::slice::Iter<bool>) -> Result<TxnResponse, EtcdError> {
    let succeeded = *path.next().ok_or(EtcdError::Internal)?;
    let mut responses = Vec::new();
    for op in branch(req, succeeded) {
        let response = match &op.request {
            Some(Request::RequestRange(r)) => Some(Response::ResponseRange(kv::range(&wtxn.view(), r)?)),
            Some(Request::RequestPut(p)) => Some(Response::ResponsePut(kv::put(wtxn, p)?)),
            Some(Request::RequestDeleteRange(d)) => Some(Response::ResponseDeleteRange(kv::delete_range(wtxn, d)?)),
            Some(Request::RequestTxn(inner)) => Some(Response::ResponseTxn(execute(wtxn, inner, path)?)),
            None => None,
        };
        responses.push(ResponseOp { response });
    }
    // Nested transactions report an empty header, as etcd's do.
    Ok(TxnResponse { header: Some(Default::default()), succeeded, responses })
}

/// Request-shape checks done before proposing (etcd's `checkTxnRequest` + `checkIntervals`).
pub(crate) fn validate(req: &TxnRequest, max_ops: usize) -> Result<(), EtcdError> {
    validate_shape(req, max_ops)?;
    overlaps(&req.success)?;
    overlaps(&req.failure)?;
    Ok(())
}

fn validate_shape(req: &TxnRequest, max_ops: usize) -> Result<(), EtcdError> {
    let ops = req.compare.len().max(req.success.len()).max(req.failure.len());
    if ops > max_ops {
        return Err(EtcdError::TooManyOps);
    }
    if req.compare.iter().any(|c| c.key.is_empty()) {
        return Err(EtcdError::EmptyKey);
    }
    for op in req.success.iter().chain(&req.failure) {
        match &op.request {
            Some(Request::RequestRange(r)) if r.key.is_empty() => return Err(EtcdError::EmptyKey),
            Some(Request::RequestPut(p)) => validate_put(p)?,
            Some(Request::RequestDeleteRange(d)) if d.key.is_empty() => return Err(EtcdError::EmptyKey),
            Some(Request::RequestTxn(inner)) => validate_shape(inner, max_ops - ops)?,
            None => return Err(EtcdError::KeyNotFound),
            _ => {}
        }
    }
    Ok(())
}

pub(crate) fn validate_put(p: &crate::proto::etcdserverpb::PutRequest) -> Result<(), EtcdError> {
    if p.key.is_empty() {
        return Err(EtcdError::EmptyKey);
    }
    if p.ignore_value && !p.value.is_empty() {
        return Err(EtcdError::ValueProvided);
    }
    if p.ignore_lease && p.lease != 0 {
        return Err(EtcdError::LeaseProvided);
    }
    Ok(())
}

/// The keys a list of operations puts and the ranges it deletes, including nested transactions; fails
/// when one key would be written twice (etcd's `checkIntervals`). Then/else branches of a nested
/// transaction may put the same key, since only one of them runs.
fn overlaps(ops: &[RequestOp]) -> Result<(Vec<Vec<u8>>, Vec<KeyRange>), EtcdError> {
    let mut dels: Vec<KeyRange> = ops
        .iter()
        .filter_map(|op| match &op.request {
            Some(Request::RequestDeleteRange(d)) => Some(KeyRange::new(&d.key, &d.range_end)),
            _ => None,
        })
        .collect();
    let deleted = |dels: &[KeyRange], key: &[u8]| dels.iter().any(|d| d.contains(key));
    let mut puts: Vec<Vec<u8>> = Vec::new();
    for op in ops {
        let Some(Request::RequestTxn(inner)) = &op.request else {
            continue;
        };
        let (puts_then, dels_then) = overlaps(&inner.success)?;
        let (puts_else, dels_else) = overlaps(&inner.failure)?;
        for key in &puts_then {
            if puts.contains(key) || deleted(&dels, key) {
                return Err(EtcdError::DuplicateKey);
            }
        }
        puts.extend(puts_then.iter().cloned());
        for key in puts_else {
            if (puts.contains(&key) && !puts_then.contains(&key)) || deleted(&dels, &key) {
                return Err(EtcdError::DuplicateKey);
            }
            puts.push(key);
        }
        dels.extend(dels_then);
        dels.extend(dels_else);
    }
    for op in ops {
        let Some(Request::RequestPut(p)) = &op.request else {
            continue;
        };
        if puts.contains(&p.key) || deleted(&dels, &p.key) {
            return Err(EtcdError::DuplicateKey);
        }
        puts.push(p.key.clone());
    }
    Ok((puts, dels))
}
