//! What a batch will write, estimated before its transaction begins, for the requests whose size
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

/// The writes of a batch whose size depends on the store: the ranges it deletes and the leases it
/// revokes. Gathered from the requests alone, so a batch with none (every put, every txn without a
/// range delete) costs no read of the store.
#[derive(Default)]
pub(crate) struct UnboundedWrites {
    ranges: Vec<KeyRange>,
    revoked: Vec<i64>,
}

impl UnboundedWrites {
    /// Adds what `req` may write in proportion to the store. A delete of one key, a put and the
    /// rest are bounded by their own size, which the map's usual headroom covers. Permissions are
    /// not checked: a refused request is counted as applied.
    pub(crate) fn add(&mut self, req: &InternalRaftRequest) {
        if let Some(del) = &req.delete_range {
            self.add_range(&del.key, &del.range_end);
        }
        if let Some(txn) = &req.txn {
            self.add_ops(txn.success.iter().chain(&txn.failure));
        }
        if let Some(revoke) = &req.lease_revoke {
            self.revoked.push(revoke.id);
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ranges.is_empty() && self.revoked.is_empty()
    }

    /// About how many bytes of new pages these writes take, as the store stands in `txn`.
    pub(crate) fn bytes(&self, kv: &KvStore, leases: &LeaseStore, txn: &RoTxn) -> Result<u64, EtcdError> {
        let mut bytes = 0u64;
        for range in &self.ranges {
            bytes = bytes.saturating_add(kv.view(txn)?.delete_footprint(range)?);
        }
        for &id in &self.revoked {
            let (keys, key_bytes) = leases.attached_footprint(txn, id)?;
            bytes = bytes.saturating_add(deletion_footprint(keys, key_bytes));
        }
        Ok(bytes)
    }

    /// Both branches of a txn: which one runs is only known inside the transaction.
    fn add_ops<'r>(&mut self, ops: impl Iterator<Item = &'r RequestOp>) {
        for op in ops {
            match &op.request {
                Some(Request::RequestDeleteRange(del)) => self.add_range(&del.key, &del.range_end),
                Some(Request::RequestTxn(txn)) => self.add_ops(txn.success.iter().chain(&txn.failure)),
                _ => {}
            }
        }
    }

    fn add_range(&mut self, key: &[u8], range_end: &[u8]) {
        let range = KeyRange::new(key, range_end);
        if !matches!(range, KeyRange::Single(_)) {
            self.ranges.push(range);
        }
    }
}
