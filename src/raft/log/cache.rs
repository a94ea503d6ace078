//! The newest raft log entries, kept in memory as they are appended.
//!
//! openraft reads every committed entry back from the log before applying it, on the raft core task.
//! Served from disk, that read costs a trip to the blocking pool and a decode (for the legacy LMDB
//! log, also the log's pages mapped into the process). Entries are applied moments after they are
//! appended, so a short window of the newest entries answers almost every read; anything older is
//! read from the log's files. Both logs (`wal/`, `legacy.rs`) keep one.

use std::collections::VecDeque;
use std::ops::{Bound, RangeBounds};

use crate::raft::Entry;

/// Entries kept: enough to cover what is appended but not yet applied (a few group-committed entries).
pub(crate) const CAPACITY: usize = 64;

/// Consecutive entries, oldest first.
#[derive(Default)]
pub(crate) struct LogCache {
    entries: VecDeque<Entry>,
}

impl LogCache {
    /// Records appended entries; a gap in the indices (which openraft never makes) restarts the window.
    pub(crate) fn append(&mut self, appended: impl IntoIterator<Item = Entry>) {
        for entry in appended {
            if self.entries.back().is_some_and(|last| last.log_id.index + 1 != entry.log_id.index) {
                self.entries.clear();
            }
            self.entries.push_back(entry);
            if self.entries.len() > CAPACITY {
                self.entries.pop_front();
            }
        }
    }

    /// Forgets entries from `index` on (the log was truncated there).
    pub(crate) fn truncate(&mut self, index: u64) {
        while self.entries.back().is_some_and(|last| last.log_id.index >= index) {
            self.entries.pop_back();
        }
    }

    /// Forgets entries up to and including `index` (the log was purged there).
    pub(crate) fn purge(&mut self, index: u64) {
        while self.entries.front().is_some_and(|first| first.log_id.index <= index) {
            self.entries.pop_front();
        }
    }

    /// The entries in `range` if the window holds all of them, else `None` (read the log instead).
    pub(crate) fn get(&self, range: &impl RangeBounds<u64>) -> Option<Vec<Entry>> {
        let first = self.entries.front()?.log_id.index;
        let last = self.entries.back()?.log_id.index;
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i.checked_add(1)?,
            Bound::Unbounded => return None,
        };
        let end = match range.end_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i.checked_sub(1)?,
            Bound::Unbounded => return None,
        };
        if start > end {
            return Some(Vec::new());
        }
        if start < first || end > last {
            return None;
        }
        let from = (start - first) as usize;
        Some(self.entries.range(from..=from + (end - start) as usize).cloned().collect())
    }

    /// The entries from `start` up to `end` that the window holds, if it holds `start` (so they
    /// continue what ends before `start`); else none.
    pub(crate) fn tail(&self, start: u64, end: Bound<u64>) -> Vec<Entry> {
        let Some(first) = self.entries.front().map(|e| e.log_id.index) else { return Vec::new() };
        if start < first {
            return Vec::new();
        }
        let within = |index: u64| match end {
            Bound::Included(end) => index <= end,
            Bound::Excluded(end) => index < end,
            Bound::Unbounded => true,
        };
        let from = (start - first) as usize;
        self.entries.iter().skip(from).take_while(|e| within(e.log_id.index)).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, EntryPayload, LogId};

    use super::*;

    fn entry(index: u64) -> Entry {
        Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), index), payload: EntryPayload::Blank }
    }

    fn indices(entries: Option<Vec<Entry>>) -> Option<Vec<u64>> {
        entries.map(|e| e.iter().map(|e| e.log_id.index).collect())
    }

    #[test]
    fn serves_only_ranges_it_holds_entirely() {
        let mut cache = LogCache::default();
        cache.append((1..=10).map(entry));
        assert_eq!(indices(cache.get(&(3..6))), Some(vec![3, 4, 5]));
        assert_eq!(indices(cache.get(&(8..=10))), Some(vec![8, 9, 10]));
        assert_eq!(indices(cache.get(&(5..5))), Some(vec![]));
        assert_eq!(cache.get(&(0..3)), None, "index 0 is not held");
        assert_eq!(cache.get(&(8..12)), None, "index 11 is not held");
        assert_eq!(cache.get(&(5..)), None, "open ranges go to the log");
    }

    #[test]
    fn tail_continues_from_a_held_index_only() {
        let mut cache = LogCache::default();
        cache.append((5..=10).map(entry));
        assert_eq!(indices(Some(cache.tail(8, Bound::Excluded(10)))), Some(vec![8, 9]));
        assert_eq!(indices(Some(cache.tail(9, Bound::Unbounded))), Some(vec![9, 10]));
        assert_eq!(indices(Some(cache.tail(10, Bound::Included(20)))), Some(vec![10]));
        assert!(cache.tail(4, Bound::Unbounded).is_empty(), "4 is not held: nothing would continue 3");
        assert!(cache.tail(11, Bound::Unbounded).is_empty());
    }

    #[test]
    fn keeps_a_bounded_window_of_the_newest() {
        let mut cache = LogCache::default();
        cache.append((1..=CAPACITY as u64 + 10).map(entry));
        assert_eq!(cache.get(&(1..=1)), None);
        assert_eq!(indices(cache.get(&(11..=11))), Some(vec![11]));
        let last = CAPACITY as u64 + 10;
        assert_eq!(indices(cache.get(&(last..=last))), Some(vec![last]));
    }

    #[test]
    fn follows_truncation_purge_and_gaps() {
        let mut cache = LogCache::default();
        cache.append((1..=10).map(entry));
        cache.truncate(8);
        assert_eq!(cache.get(&(7..=8)), None, "8 was truncated");
        cache.append([entry(8)]);
        assert_eq!(indices(cache.get(&(7..=8))), Some(vec![7, 8]));
        cache.purge(4);
        assert_eq!(cache.get(&(4..=5)), None, "4 was purged");
        assert_eq!(indices(cache.get(&(5..=5))), Some(vec![5]));
        cache.append([entry(20)]);
        assert_eq!(cache.get(&(8..=8)), None, "a gap restarts the window");
        assert_eq!(indices(cache.get(&(20..=20))), Some(vec![20]));
    }
}
