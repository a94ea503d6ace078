//! `kv_index` of kv layout 4: which version of each key is where, in three regions of one table.
//!
//! ```text
//! history   00 01 ++ escape(key) ++ 00 00 ++ revision  →  tag
//! staging   00 02 ++ key                               →  tag ++ revision
//! newest    00 03 ++ key                               →  tag ++ revision
//! ```
//!
//! Each key that has any version has exactly one *current* entry, in newest or in staging: its newest
//! change (a put, or a tombstone until compaction removes it), overwritten in place when the key
//! changes. The versions a newer change superseded are in history, in (key, revision) order
//! (`revision.rs`'s escaping), which a compaction of every older revision empties. A key's first
//! change goes to staging; when staging holds more than `STAGING_LIMIT` keys, its smallest keys move
//! to newest in key order until half are left, appended when they go after every key (LMDB fills a
//! page it appends to, and splits one it inserts into in the middle): keys that arrive slightly out of
//! order still fill newest's pages (docs/performance.md, "An index for kv layout 4"). The number of
//! keys in staging is kept under the region's bare prefix `00 02`, so when to drain depends only on the
//! table's contents and every member writes the same table.
//!
//! Layout 3's entries (`escape(key) ++ revision`) start with `00 ff` (an escaped zero byte) or a byte
//! of 1 or more (`00 00` would be the empty key, which etcd refuses), so they sort after every entry
//! of layout 4 and are never mistaken for one (`upgrade.rs` converts them).

use std::cmp::Ordering;
use std::iter::Peekable;
use std::ops::Bound;

use heed::{RoTxn, RwTxn};

use super::revision::{history_key, history_prefix, split_history_key, Revision};
use super::store::{corrupt, KvStore};
use crate::error::EtcdError;
use crate::keyrange::KeyRange;
use crate::storage::table::Range;

/// The first bytes of a history entry.
pub(super) const HISTORY: [u8; 2] = [0, 1];
/// The first bytes of a staging entry; alone, the key of the staging region's count.
const STAGING: [u8; 2] = [0, 2];
/// The first bytes of a newest entry.
pub(super) const NEWEST: [u8; 2] = [0, 3];
/// The first bytes past every region: where layout 3's entries begin.
pub(super) const LAYOUT_3_FROM: [u8; 2] = [0, 4];
/// The most keys staging holds after a change; past it, the smallest move to newest.
const STAGING_LIMIT: u32 = 512;

/// A key's current entry: the revision and tag of its newest change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Current {
    pub at: Revision,
    pub tag: u8,
}

/// The history entry of `key` at `at`.
pub(super) fn history_entry(key: &[u8], at: Revision) -> Vec<u8> {
    [&HISTORY[..], &history_key(key, at)].concat()
}

/// The prefix every history entry of `key` starts with.
fn history_of(key: &[u8]) -> Vec<u8> {
    [&HISTORY[..], &history_prefix(key)].concat()
}

/// The user key and revision of a history entry.
pub(super) fn split_history_entry(raw: &[u8]) -> Option<(Vec<u8>, Revision)> {
    split_history_key(raw.strip_prefix(&HISTORY[..])?)
}

/// A current entry's key in `region`.
pub(super) fn current_entry(region: [u8; 2], key: &[u8]) -> Vec<u8> {
    [&region[..], key].concat()
}

/// A current entry's value: the tag, then the revision.
pub(super) fn current_value(tag: u8, at: Revision) -> Vec<u8> {
    [&[tag][..], &at.to_bytes()].concat()
}

fn decode_current(value: &[u8]) -> Result<Current, EtcdError> {
    let (&tag, at) = value.split_first().ok_or_else(|| corrupt("current entry"))?;
    Ok(Current { at: Revision::from_bytes(at).ok_or_else(|| corrupt("current entry"))?, tag })
}

/// A history entry's tag.
fn history_tag(value: &[u8]) -> Result<u8, EtcdError> {
    value.first().copied().ok_or_else(|| corrupt("history tag"))
}

impl KvStore {
    /// The current entry of `key` (in newest or staging), if it has any version.
    pub(super) fn current(&self, txn: &RoTxn, key: &[u8]) -> Result<Option<Current>, EtcdError> {
        Ok(self.current_in(txn, key)?.map(|(_, current)| current))
    }

    /// The current entry of `key` and the region it is in.
    pub(super) fn current_in(&self, txn: &RoTxn, key: &[u8]) -> Result<Option<([u8; 2], Current)>, EtcdError> {
        if key.is_empty() {
            return Ok(None); // etcd has no empty key (and `00 02` alone is staging's count)
        }
        for region in [NEWEST, STAGING] {
            if let Some(value) = self.index.get(txn, &current_entry(region, key))? {
                return Ok(Some((region, decode_current(value)?)));
            }
        }
        Ok(None)
    }

    /// The newest change of `key` at or below revision `rev` (its main half), if any is left.
    pub(super) fn version_at(&self, txn: &RoTxn, key: &[u8], rev: i64) -> Result<Option<Current>, EtcdError> {
        let Some(current) = self.current(txn, key)? else { return Ok(None) };
        if current.at.main <= rev {
            return Ok(Some(current));
        }
        self.history_below(txn, key, Revision::new(rev.saturating_add(1), 0))
    }

    /// The newest history entry of `key` below `upto`.
    fn history_below(&self, txn: &RoTxn, key: &[u8], upto: Revision) -> Result<Option<Current>, EtcdError> {
        let Some((raw, tag)) = self.index.last_below(txn, &history_of(key), &history_entry(key, upto))? else {
            return Ok(None);
        };
        let (_, at) = split_history_entry(&raw).ok_or_else(|| corrupt("history key"))?;
        Ok(Some(Current { at, tag: history_tag(tag)? }))
    }

    /// Whether `key` has a history entry in `[from, upto)`.
    pub(super) fn has_history_between(
        &self,
        txn: &RoTxn,
        key: &[u8],
        from: Revision,
        upto: Revision,
    ) -> Result<bool, EtcdError> {
        let (from, upto) = (history_entry(key, from), history_entry(key, upto));
        Ok(self.index.range(txn, Bound::Included(&from), Bound::Excluded(&upto))?.next().transpose()?.is_some())
    }

    /// Records `key`'s change at `at` with `tag` (after every other change of the key): it becomes the
    /// key's current entry, and the one it supersedes goes to history.
    pub(super) fn index_change(&self, txn: &mut RwTxn, key: &[u8], at: Revision, tag: u8) -> Result<(), EtcdError> {
        let found = self.current_in(txn, key)?;
        self.index_change_over(txn, key, at, tag, found)
    }

    /// `index_change` for a key whose current entry the caller has just read (`current_in`, in this
    /// transaction, with no index change since): a put reads it anyway for the previous version, and
    /// a second search of the same key would cost the apply as much again.
    pub(super) fn index_change_over(
        &self,
        txn: &mut RwTxn,
        key: &[u8],
        at: Revision,
        tag: u8,
        found: Option<([u8; 2], Current)>,
    ) -> Result<(), EtcdError> {
        let value = current_value(tag, at);
        match found {
            Some((region, old)) => {
                if old.at >= at {
                    return Err(corrupt("a change older than the key's newest"));
                }
                self.index.put(txn, &history_entry(key, old.at), &[old.tag])?;
                self.index.put(txn, &current_entry(region, key), &value)?;
            }
            None => {
                self.index.put(txn, &current_entry(STAGING, key), &value)?;
                let staged = self.staged(txn)? + 1;
                self.set_staged(txn, staged)?;
                if staged > STAGING_LIMIT {
                    self.drain_staging(txn, staged - STAGING_LIMIT / 2)?;
                }
            }
        }
        Ok(())
    }

    /// Records changes with `tag` of keys that have a current entry (`changes`: each key's current
    /// entry as read, and the change's revision, newer; keys distinct, in key order) as `index_change`
    /// would: each key's current entry goes to history and its new one overwrites it where it is. In
    /// two passes of one cursor each, in key order (history, then the current entries region by
    /// region), so each page is searched for once and touched once (a big delete,
    /// `WriteTxn::delete_range`).
    pub(super) fn supersede_in_order(
        &self,
        txn: &mut RwTxn,
        changes: &[(InRegion, Revision)],
        tag: u8,
    ) -> Result<(), EtcdError> {
        let mut history = Vec::with_capacity(changes.len());
        for (entry, at) in changes {
            if entry.current.at >= *at {
                return Err(corrupt("a change older than the key's newest"));
            }
            history.push((history_entry(&entry.key, entry.current.at), vec![entry.current.tag]));
        }
        self.index.put_in_order(txn, &history)?;
        drop(history);
        let mut currents = Vec::with_capacity(changes.len());
        for region in [NEWEST, STAGING] {
            for (entry, at) in changes.iter().filter(|(entry, _)| entry.region == region) {
                currents.push((current_entry(region, &entry.key), current_value(tag, *at)));
            }
        }
        Ok(self.index.put_in_order(txn, &currents)?)
    }

    /// Removes `key`'s current entry (compaction of its last version, a tombstone).
    pub(super) fn remove_current(&self, txn: &mut RwTxn, key: &[u8]) -> Result<(), EtcdError> {
        if self.index.delete(txn, &current_entry(NEWEST, key))? {
            return Ok(());
        }
        if self.index.delete(txn, &current_entry(STAGING, key))? {
            let staged = self.staged(txn)?.checked_sub(1).ok_or_else(|| corrupt("staging count"))?;
            self.set_staged(txn, staged)?;
            return Ok(());
        }
        Err(corrupt("missing current entry"))
    }

    /// How many keys staging holds.
    fn staged(&self, txn: &RoTxn) -> Result<u32, EtcdError> {
        match self.index.get(txn, &STAGING)? {
            None => Ok(0),
            Some(bytes) => Ok(u32::from_be_bytes(bytes.try_into().map_err(|_| corrupt("staging count"))?)),
        }
    }

    fn set_staged(&self, txn: &mut RwTxn, staged: u32) -> Result<(), EtcdError> {
        if staged == 0 {
            self.index.delete(txn, &STAGING)?;
        } else {
            self.index.put(txn, &STAGING, &staged.to_be_bytes())?;
        }
        Ok(())
    }

    /// Moves staging's `count` smallest keys to newest, in key order.
    fn drain_staging(&self, txn: &mut RwTxn, count: u32) -> Result<(), EtcdError> {
        let mut moved = Vec::with_capacity(count as usize);
        let from = current_entry(STAGING, &[]);
        let to = current_entry(NEWEST, &[]);
        // The count itself (`00 02`) is excluded: the walk starts past it.
        for entry in self.index.range(txn, Bound::Excluded(&from), Bound::Excluded(&to))?.take(count as usize) {
            let (raw, value) = entry?;
            moved.push((raw[STAGING.len()..].to_vec(), value.to_vec()));
        }
        for (key, value) in &moved {
            self.index.delete(txn, &current_entry(STAGING, key))?;
            self.index.put_appending(txn, &current_entry(NEWEST, key), value)?;
        }
        let staged = self.staged(txn)?.checked_sub(moved.len() as u32).ok_or_else(|| corrupt("staging count"))?;
        self.set_staged(txn, staged)
    }

    /// The current entries of the keys in `range` (after `after`, a key, when given), in key order:
    /// newest and staging merged.
    pub(super) fn currents<'t>(
        &self,
        txn: &'t RoTxn,
        range: &KeyRange,
        after: Option<&[u8]>,
    ) -> Result<Currents<'t>, EtcdError> {
        let region = |region: [u8; 2]| -> Result<Range<'t>, EtcdError> {
            let start = current_entry(region, after.unwrap_or(range.start()));
            let start = if after.is_some() { Bound::Excluded(&start[..]) } else { Bound::Included(&start[..]) };
            let end = match range.end() {
                Some(end) => current_entry(region, &end),
                None => vec![region[0], region[1] + 1],
            };
            // Staging's count (`00 02`) is below every staged key: a start at the empty key skips it.
            let start = match start {
                Bound::Included(s) if s.len() == region.len() => Bound::Excluded(s),
                start => start,
            };
            Ok(self.index.range(txn, start, Bound::Excluded(&end))?)
        };
        Ok(Currents { newest: region(NEWEST)?.peekable(), staging: region(STAGING)?.peekable() })
    }

    /// Every index entry as (key, revision, tag), in (key, revision) order, the regions merged (as
    /// layout 3 held them in one run: what `Hash` hashes and what tests compare).
    pub(super) fn each_index_entry(
        &self,
        txn: &RoTxn,
        mut visit: impl FnMut(&[u8], Revision, u8) -> Result<(), EtcdError>,
    ) -> Result<(), EtcdError> {
        let all = KeyRange::From(Vec::new());
        let mut currents = self.currents(txn, &all, None)?.peekable();
        let end = current_entry(STAGING, &[]);
        for entry in self.index.range(txn, Bound::Included(&HISTORY[..]), Bound::Excluded(&end))? {
            let (raw, tag) = entry?;
            let (key, at) = split_history_entry(&raw).ok_or_else(|| corrupt("history key"))?;
            // The current entries of smaller keys go first; this key's own comes after its history
            // (it is newer than every version there).
            while let Some(Ok((next, _))) = currents.peek() {
                if next.as_slice().cmp(&key) != Ordering::Less {
                    break;
                }
                let (next, current) = currents.next().ok_or_else(|| corrupt("current entry"))??;
                visit(&next, current.at, current.tag)?;
            }
            if let Some(Err(_)) = currents.peek() {
                currents.next().transpose()?;
            }
            visit(&key, at, history_tag(tag)?)?;
        }
        for entry in currents {
            let (key, current) = entry?;
            visit(&key, current.at, current.tag)?;
        }
        Ok(())
    }
}

/// A key's current entry, with the key and the region the entry is in.
pub(super) struct InRegion {
    pub region: [u8; 2],
    pub key: Vec<u8>,
    pub current: Current,
}

/// The current entries of a range of keys, newest's and staging's merged in key order.
pub(super) struct Currents<'t> {
    newest: Peekable<Range<'t>>,
    staging: Peekable<Range<'t>>,
}

impl Currents<'_> {
    /// The next key's current entry, with the region it is in.
    pub(super) fn next_with_region(&mut self) -> Option<Result<InRegion, EtcdError>> {
        let take_staging = match (self.newest.peek(), self.staging.peek()) {
            (None, None) => return None,
            (Some(Ok((n, _))), Some(Ok((s, _)))) => s[STAGING.len()..] < n[NEWEST.len()..],
            (Some(Err(_)), _) | (Some(_), None) => false,
            (None, Some(_)) | (Some(Ok(_)), Some(Err(_))) => true,
        };
        let (region, entry) = if take_staging { (STAGING, self.staging.next()) } else { (NEWEST, self.newest.next()) };
        Some(entry?.map_err(EtcdError::from).and_then(|(raw, value)| {
            let key = raw.get(NEWEST.len()..).ok_or_else(|| corrupt("current key"))?.to_vec();
            Ok(InRegion { region, key, current: decode_current(value)? })
        }))
    }
}

impl Iterator for Currents<'_> {
    type Item = Result<(Vec<u8>, Current), EtcdError>;

    fn next(&mut self) -> Option<Self::Item> {
        Some(self.next_with_region()?.map(|entry| (entry.key, entry.current)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::store::TAG_PUT;

    /// 2,000 keys arriving out of order (more than staging holds, so it drains several times), every
    /// third then deleted and every key's history compacted away: at every step reads find each key
    /// where it is (staging or newest), staging never holds more than its limit, and the count kept
    /// under `00 02` is the number of keys it holds. Fails if a drain lost or duplicated a key, or if
    /// reads looked in only one region.
    #[test]
    fn keys_move_from_staging_to_newest_in_key_order_and_stay_readable() {
        let dir = tempfile::tempdir().unwrap();
        let (env, store) = KvStore::open_for_tests(dir.path(), crate::storage::table::CHUNK).unwrap();
        // A fixed permutation: 7 and 2,000 are coprime.
        let order: Vec<usize> = (0..2000).map(|i| i * 7 % 2000).collect();
        let key = |i: usize| format!("k{i:05}").into_bytes();
        for chunk in order.chunks(37) {
            let mut txn = env.write_txn().unwrap();
            let mut w = store.begin(&mut txn).unwrap();
            for &i in chunk {
                w.put(&key(i), i.to_string().into_bytes(), 0).unwrap();
            }
            w.finish().unwrap();
            txn.commit().unwrap();
            let txn = env.read_txn().unwrap();
            let staged = store.staged(&txn).unwrap();
            assert!(staged <= STAGING_LIMIT, "{staged} keys staged");
            let mut in_staging = 0;
            let from = current_entry(STAGING, &[]);
            let to = current_entry(NEWEST, &[]);
            for entry in store.index.range(&txn, Bound::Excluded(&from), Bound::Excluded(&to)).unwrap() {
                entry.unwrap();
                in_staging += 1;
            }
            assert_eq!(in_staging, staged);
        }
        let mut txn = env.write_txn().unwrap();
        let mut w = store.begin(&mut txn).unwrap();
        for i in (0..2000).step_by(3) {
            w.delete_range(&KeyRange::Single(key(i)), false).unwrap();
        }
        let rev = w.rev();
        w.compact(rev).unwrap();
        w.finish().unwrap();
        store.finish_compaction(&mut txn).unwrap();
        txn.commit().unwrap();
        let txn = env.read_txn().unwrap();
        let view = store.view(&txn).unwrap();
        let all = view.range(&KeyRange::From(Vec::new()), 0, 0, false).unwrap().kvs;
        let want: Vec<Vec<u8>> = (0..2000).filter(|i| i % 3 != 0).map(key).collect();
        assert_eq!(all.iter().map(|kv| kv.key.clone()).collect::<Vec<_>>(), want);
        for i in 0..2000 {
            let current = store.current(&txn, &key(i)).unwrap();
            assert_eq!(current.map(|c| c.tag), (i % 3 != 0).then_some(TAG_PUT), "key {i}");
        }
        let mut entries = 0;
        store
            .each_index_entry(&txn, |_, _, _| {
                entries += 1;
                Ok(())
            })
            .unwrap();
        assert_eq!(entries, want.len(), "nothing but the kept versions");
    }
}
