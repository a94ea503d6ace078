//! What a request will write, estimated before its transaction begins, for the requests whose size
//! depends on the store rather than on the request: a delete of a range (also inside a txn) and a
//! lease revoke, which deletes every key attached to the lease.
//!
//! The state machine grows the kv map ahead of such a batch (`raft/state_machine/room_ahead.rs`): a
//! batch that meets a full map is aborted and applied again after a growth of a sixth, so a delete of
//! most of the store ran two or three times over (found measuring `del --prefix` of 400,000 keys).

use heed::RoTxn;

use crate::error::EtcdError;
use crate::keyrange::KeyRange;
use crate::lease::store::LeaseStore;
use crate::mvcc::store::deletion_footprint;
use crate::mvcc::KvStore;
use crate::proto::etcdserverpb::request_op::Request;
use crate::proto::etcdserverpb::{InternalRaftRequest, RequestOp};

/// About how many bytes of new pages `req` writes where that depends on the store; 0 for requests
/// whose writes are bounded by their own size (a put, a delete of one key, ...), which the map's
/// usual headroom covers. Permissions are not checked: a refused request is counted as applied.
pub(crate) fn unbounded_writes(
    kv: &KvStore,
    leases: &LeaseStore,
    txn: &RoTxn,
    req: &InternalRaftRequest,
) -> Result<u64, EtcdError> {
    if let Some(del) = &req.delete_range {
        return range_deletion(kv, txn, &del.key, &del.range_end);
    }
    if let Some(t) = &req.txn {
        // Both branches: which one runs is only known inside the transaction.
        return t.success.iter().chain(&t.failure).try_fold(0, |sum, op| Ok(sum + op_deletion(kv, txn, op)?));
    }
    if let Some(revoke) = &req.lease_revoke {
        let (keys, key_bytes) = leases.attached_footprint(txn, revoke.id)?;
        return Ok(deletion_footprint(keys, key_bytes));
    }
    Ok(0)
}

fn op_deletion(kv: &KvStore, txn: &RoTxn, op: &RequestOp) -> Result<u64, EtcdError> {
    match &op.request {
        Some(Request::RequestDeleteRange(del)) => range_deletion(kv, txn, &del.key, &del.range_end),
        Some(Request::RequestTxn(t)) => {
            t.success.iter().chain(&t.failure).try_fold(0, |sum, op| Ok(sum + op_deletion(kv, txn, op)?))
        }
        _ => Ok(0),
    }
}

/// A delete of one key is bounded; of a range, counted.
fn range_deletion(kv: &KvStore, txn: &RoTxn, key: &[u8], range_end: &[u8]) -> Result<u64, EtcdError> {
    let range = KeyRange::new(key, range_end);
    if matches!(range, KeyRange::Single(_)) {
        return Ok(0);
    }
    kv.view(txn)?.delete_footprint(&range)
}
