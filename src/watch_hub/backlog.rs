//! The recent committed batches, kept in memory for watchers that fell a little behind: they catch
//! up from here, shared by all of them, rather than each reading the store.
//!
//! Bounded in count and in bytes (counted at three times the events' size: the events, and their two
//! encodings made for watchers), whatever the value sizes; the newest batch is kept even when it alone
//! is larger. A watcher that needs what was dropped replays it from the store.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::raft::state_machine::Committed;

/// Batches kept at most.
pub(crate) const BACKLOG_BATCHES: usize = 1024;
/// Bytes kept at most (beyond the newest batch).
pub(crate) const BACKLOG_BYTES: usize = 16 << 20;

#[derive(Default)]
pub(crate) struct Backlog {
    batches: VecDeque<(Arc<Committed>, usize)>,
    bytes: usize,
}

impl Backlog {
    pub(crate) fn push(&mut self, batch: Arc<Committed>) {
        let size = held_bytes(&batch);
        self.batches.push_back((batch, size));
        self.bytes += size;
        while self.batches.len() > 1 && (self.batches.len() > BACKLOG_BATCHES || self.bytes > BACKLOG_BYTES) {
            if let Some((_, size)) = self.batches.pop_front() {
                self.bytes -= size;
            }
        }
    }

    pub(crate) fn clear(&mut self) {
        self.batches.clear();
        self.bytes = 0;
    }

    /// The batch that ends at `revision`, if still kept.
    pub(crate) fn at(&self, revision: i64) -> Option<Arc<Committed>> {
        let i = self.batches.partition_point(|(b, _)| b.revision < revision);
        self.batches.get(i).filter(|(b, _)| b.revision == revision).map(|(b, _)| b.clone())
    }

    /// Up to `max` batches in order, from the first that ends at or after `revision`.
    pub(crate) fn from(&self, revision: i64, max: usize) -> Vec<Arc<Committed>> {
        let i = self.batches.partition_point(|(b, _)| b.revision < revision);
        self.batches.range(i..).take(max).map(|(b, _)| b.clone()).collect()
    }
}

/// What a batch holds in memory while kept, roughly: its events, and the two encodings watchers may
/// make of them (`mvcc/encoded_events.rs`).
fn held_bytes(batch: &Committed) -> usize {
    let kv_bytes =
        |kv: &Option<crate::proto::mvccpb::KeyValue>| kv.as_ref().map_or(0, |kv| kv.key.len() + kv.value.len());
    let events: usize = batch.effects.events.iter().map(|e| 64 + kv_bytes(&e.kv) + kv_bytes(&e.prev_kv)).sum();
    256 + 3 * events
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::mvccpb::{Event, KeyValue};

    fn batch(revision: i64, value_len: usize) -> Arc<Committed> {
        let kv =
            KeyValue { key: b"k".to_vec(), value: vec![b'.'; value_len], mod_revision: revision, ..Default::default() };
        let mut batch = Committed { revision, previous_revision: revision - 1, ..Default::default() };
        batch.effects.events.push(Event { kv: Some(kv), ..Default::default() });
        Arc::new(batch)
    }

    #[test]
    fn bounded_by_bytes_and_count_keeping_the_newest() {
        let mut backlog = Backlog::default();
        for revision in 1..=100 {
            backlog.push(batch(revision, 1 << 20));
        }
        assert!(backlog.bytes <= BACKLOG_BYTES, "{} bytes kept", backlog.bytes);
        assert!(backlog.at(100).is_some() && backlog.at(1).is_none());
        let kept = backlog.from(0, usize::MAX);
        assert_eq!(kept.len(), BACKLOG_BYTES / (3 << 20), "whole megabyte batches at three times their size");
        assert_eq!(backlog.from(99, 10).iter().map(|b| b.revision).collect::<Vec<_>>(), [99, 100]);

        backlog.push(batch(101, 64 << 20));
        assert_eq!(backlog.from(0, usize::MAX).len(), 1, "a batch larger than the bound is kept alone");

        let mut small = Backlog::default();
        for revision in 1..=3000 {
            small.push(batch(revision, 8));
        }
        assert_eq!(small.from(0, usize::MAX).len(), BACKLOG_BATCHES);
    }
}
