//! etcd's mvcc operation counters (`etcd_mvcc_{range,put,delete,txn}_total`, their
//! `etcd_debugging_mvcc_*` twins and `etcd_debugging_mvcc_total_put_size_in_bytes`): for each request
//! the store executed, its ranges, puts and deletes, as etcd's `metricsTxnWrite` counts them per mvcc
//! transaction, a transaction with more than one operation being a txn. A Txn's compares are ranges:
//! etcd 3.4's applier evaluates them (nested ones on the path taken included) in a read transaction of
//! their own, then executes the branch that ran in a write transaction — or, for a read-only Txn, in
//! that same read transaction. (etcd stops at the first false compare; keyward counts them all.)
//!
//! Writes are counted once their batch has committed (`raft/state_machine/batch.rs`: on every member, as
//! etcd counts at apply, and never twice when a batch is applied again after a full disk); reads
//! where they are served (`server/kv.rs`).

use crate::metrics;
use crate::proto::etcdserverpb::request_op::Request;
use crate::proto::etcdserverpb::response_op::Response;
use crate::proto::etcdserverpb::{PutRequest, TxnRequest, TxnResponse};

/// What one request executed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ops {
    pub ranges: u64,
    pub puts: u64,
    pub deletes: u64,
    /// Key plus value bytes of the puts.
    pub put_bytes: u64,
}

impl Ops {
    pub(crate) fn range() -> Ops {
        Ops { ranges: 1, ..Ops::default() }
    }

    pub(crate) fn put(put: &PutRequest) -> Ops {
        Ops { puts: 1, put_bytes: (put.key.len() + put.value.len()) as u64, ..Ops::default() }
    }

    pub(crate) fn delete() -> Ops {
        Ops { deletes: 1, ..Ops::default() }
    }

    /// A Txn's compares on the path that ran, and the operations of the branches that ran, nested
    /// txns included.
    pub(crate) fn txn(req: &TxnRequest, resp: &TxnResponse) -> (Ops, Ops) {
        let mut compares = Ops { ranges: req.compare.len() as u64, ..Ops::default() };
        let mut executed = Ops::default();
        let branch = if resp.succeeded { &req.success } else { &req.failure };
        for (op, done) in branch.iter().zip(&resp.responses) {
            match (&op.request, &done.response) {
                (Some(Request::RequestRange(_)), _) => executed = executed.plus(Ops::range()),
                (Some(Request::RequestPut(put)), _) => executed = executed.plus(Ops::put(put)),
                (Some(Request::RequestDeleteRange(_)), _) => executed = executed.plus(Ops::delete()),
                (Some(Request::RequestTxn(nested)), Some(Response::ResponseTxn(nested_resp))) => {
                    let (c, e) = Ops::txn(nested, nested_resp);
                    (compares, executed) = (compares.plus(c), executed.plus(e));
                }
                _ => {}
            }
        }
        (compares, executed)
    }

    /// Records a Txn as etcd's applier runs it: a write Txn's compares and operations are two mvcc
    /// transactions, a read-only Txn's one.
    pub(crate) fn record_txn((compares, executed): (Ops, Ops), read_only: bool) {
        if read_only {
            compares.plus(executed).record();
        } else {
            compares.record();
            executed.record();
        }
    }

    fn plus(self, other: Ops) -> Ops {
        Ops {
            ranges: self.ranges + other.ranges,
            puts: self.puts + other.puts,
            deletes: self.deletes + other.deletes,
            put_bytes: self.put_bytes + other.put_bytes,
        }
    }

    /// Adds this request's operations to the counters.
    pub(crate) fn record(self) {
        if self.ranges + self.puts + self.deletes > 1 {
            metrics::MVCC_TXNS.iter().for_each(|c| c.inc());
        }
        metrics::MVCC_RANGES.iter().for_each(|c| c.inc_by(self.ranges));
        metrics::MVCC_PUTS.iter().for_each(|c| c.inc_by(self.puts));
        metrics::MVCC_DELETES.iter().for_each(|c| c.inc_by(self.deletes));
        metrics::MVCC_PUT_BYTES.add(self.put_bytes as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::etcdserverpb::{Compare, DeleteRangeRequest, RangeRequest, RangeResponse, RequestOp, ResponseOp};

    fn op(request: Request) -> RequestOp {
        RequestOp { request: Some(request) }
    }

    #[test]
    fn a_txn_counts_its_compares_and_the_branch_that_ran() {
        let put = PutRequest { key: b"k".to_vec(), value: b"vvv".to_vec(), ..Default::default() };
        let nested = TxnRequest {
            compare: vec![Compare::default()],
            success: vec![op(Request::RequestDeleteRange(DeleteRangeRequest::default()))],
            ..Default::default()
        };
        let req = TxnRequest {
            compare: vec![Compare::default(), Compare::default()],
            success: vec![op(Request::RequestPut(put.clone())), op(Request::RequestTxn(nested))],
            failure: vec![op(Request::RequestRange(RangeRequest::default()))],
        };
        let nested_resp = TxnResponse { succeeded: true, responses: vec![ResponseOp::default()], ..Default::default() };
        let succeeded = TxnResponse {
            succeeded: true,
            responses: vec![ResponseOp::default(), ResponseOp { response: Some(Response::ResponseTxn(nested_resp)) }],
            ..Default::default()
        };
        let compares = Ops { ranges: 3, ..Ops::default() };
        assert_eq!(Ops::txn(&req, &succeeded), (compares, Ops { puts: 1, deletes: 1, put_bytes: 4, ..Ops::default() }));
        let failed = TxnResponse {
            succeeded: false,
            responses: vec![ResponseOp { response: Some(Response::ResponseRange(RangeResponse::default())) }],
            ..Default::default()
        };
        let compares = Ops { ranges: 2, ..Ops::default() };
        assert_eq!(Ops::txn(&req, &failed), (compares, Ops::range()));
    }
}
