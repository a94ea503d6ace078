//! How much of the raft log a snapshot leaves behind it: as etcd, `--snapshot-count` requests or
//! 5,000, whichever is fewer, so that a follower slightly behind catches up from the log rather than
//! by a snapshot of the whole store.
//!
//! etcd keeps 5,000 *entries*, and each of its entries is one request. keyward's entries carry a
//! batch of requests each (`raft/proposer.rs`: up to 1,024), so openraft's own setting, which counts
//! entries, kept far more: at 100 clients about 26 requests per entry, so 5,000 entries were 130,000
//! requests, more than a whole `--snapshot-count` of 100,000 and 135 MB of log at 1 KiB values (the
//! raft log was 201 MB of a member's 2.8 GB data dir). So openraft purges nothing by itself
//! (`node/start.rs`), and the snapshot job purges up to the index this module finds.

use std::collections::VecDeque;

/// The requests applied since the oldest one that may still have to be kept, by batch.
#[derive(Debug)]
pub(in crate::node) struct RequestsBehind {
    /// Requests to keep behind a snapshot.
    keep: u64,
    /// `(last log index of a batch, requests applied up to and including it)`, oldest first; the
    /// front is the newest batch with at least `keep` requests after it, if there is one.
    batches: VecDeque<(u64, u64)>,
    /// Requests applied in all.
    total: u64,
}

impl RequestsBehind {
    pub(in crate::node) fn new(snapshot_count: u64) -> Self {
        RequestsBehind { keep: snapshot_count.min(5_000), batches: VecDeque::new(), total: 0 }
    }

    /// Counts a batch of `requests` whose last entry is at `last_index`.
    pub(in crate::node) fn applied(&mut self, last_index: u64, requests: u64) {
        self.total += requests;
        self.batches.push_back((last_index, self.total));
        // Bounded: at most `keep` + 1 batches stay.
        while self.batches.get(1).is_some_and(|&(_, counted)| self.total - counted >= self.keep) {
            self.batches.pop_front();
        }
    }

    /// A snapshot installed at `index` replaced the log before it: nothing older is counted.
    pub(in crate::node) fn installed(&mut self, index: u64) {
        self.batches.clear();
        self.batches.push_back((index, self.total));
    }

    /// The newest log index with at least `keep` requests applied after it: a snapshot of the
    /// state as it is now, or later, may purge the log up to it (inclusive).
    pub(in crate::node) fn purge_upto(&self) -> Option<u64> {
        let &(index, counted) = self.batches.front()?;
        (self.total - counted >= self.keep).then_some(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// etcd's 5,000 requests, whatever the batching: one request per entry keeps 5,000 entries, 50
    /// per entry 100; fewer requests than that since the start purge nothing. Fails if entries are
    /// counted instead of requests.
    #[test]
    fn a_snapshot_keeps_five_thousand_requests_behind_it_however_they_were_batched() {
        let mut single = RequestsBehind::new(100_000);
        for index in 1..=4_999 {
            single.applied(index, 1);
        }
        assert_eq!(single.purge_upto(), None, "4,999 requests in all");
        for index in 5_000..=12_000 {
            single.applied(index, 1);
        }
        assert_eq!(single.purge_upto(), Some(7_000), "5,000 entries of one request after 7,000");

        let mut batched = RequestsBehind::new(100_000);
        for index in 1..=1_000 {
            batched.applied(index, 50);
        }
        assert_eq!(batched.purge_upto(), Some(900), "100 entries of 50 requests after 900");
        assert!(batched.batches.len() <= 101, "{} batches kept", batched.batches.len());

        // A batch of several entries (index 1,001 to 1,010): counted at its last one.
        batched.applied(1_010, 500);
        assert_eq!(batched.purge_upto(), Some(910));
    }

    /// A small `--snapshot-count` keeps that many requests instead; after an install nothing before
    /// the installed index is counted, and the log up to it is already gone.
    #[test]
    fn a_small_count_keeps_fewer_and_an_install_starts_over() {
        let mut behind = RequestsBehind::new(100);
        for index in 1..=350 {
            behind.applied(index, 1);
        }
        assert_eq!(behind.purge_upto(), Some(250));
        behind.installed(9_000);
        assert_eq!(behind.purge_upto(), None, "nothing applied since the install");
        for index in 9_001..=9_100 {
            behind.applied(index, 1);
        }
        assert_eq!(behind.purge_upto(), Some(9_000), "100 requests after the installed index");
    }
}
