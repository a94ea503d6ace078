//! The node's side of the write path (`node/propose.rs`): the proposer that batches writes into raft
//! entries, the request ids, and whether a NOSPACE alarm is already being raised.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::raft::proposer::Proposer;

/// The node's side of the write path.
pub(super) struct Writes {
    proposer: Proposer,
    next_request_id: AtomicU64,
    /// A NOSPACE alarm proposal is on its way: concurrent writes at the quota propose only one.
    raising_nospace: AtomicBool,
}

impl Writes {
    pub(super) fn new(proposer: Proposer, member_id: u64) -> Writes {
        let seed =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        Writes {
            proposer,
            // Unique across restarts: member bits, then time, then a counter (as etcd's idutil).
            next_request_id: AtomicU64::new(((member_id & 0xffff) << 48) | ((seed & 0xff_ffff_ffff) << 8)),
            raising_nospace: AtomicBool::default(),
        }
    }

    pub(super) fn proposer(&self) -> &Proposer {
        &self.proposer
    }

    /// A fresh id for a request or a server-chosen lease (positive, as etcd's lease ids are).
    pub(super) fn next_id(&self) -> i64 {
        (self.next_request_id.fetch_add(1, Ordering::Relaxed) & (i64::MAX as u64)) as i64
    }

    /// Whether this caller is the one to propose a NOSPACE alarm: none is on its way already. The
    /// caller calls `end_raising_nospace` once its proposal is done.
    pub(super) fn begin_raising_nospace(&self) -> bool {
        !self.raising_nospace.swap(true, Ordering::AcqRel)
    }

    pub(super) fn end_raising_nospace(&self) {
        self.raising_nospace.store(false, Ordering::Release);
    }
}
