//! Compaction in two halves, as etcd does it: the Compact entry only *schedules* it (records the
//! compacted revision, from which on reads below it fail with `Compacted` on every member alike, and
//! that removal is pending up to it); the removal of the versions it made unreachable runs afterwards
//! in bounded steps, each its own short write transaction (`raft/state_machine/compaction.rs` runs
//! them between applies), so no apply ever holds the write path for long.
//!
//! What a finished compaction at `rev` keeps: every change above `rev`, and for each key its newest
//! change at or below `rev` when that is a put. A step walks the history region of `kv_index`
//! (`index.rs`) in key order from a cursor (`compact_from` in `kv_meta`: the next history entry to
//! examine, written in the same transaction as the step's deletions, so a crash never leaves half a
//! step), so it touches each page of the history once, in order, and never visits a key that has no
//! older version (a key's current entry is not in the history). For each history entry at or below
//! `rev` it removes the version (its `kv_revs` record and its entry) when the key's next version is at
//! or below `rev` too, or when it is a tombstone; a key whose current entry is a tombstone at or below
//! `rev` loses that entry too once its history is gone. A new compaction (pending or not) restarts the
//! walk from the history's start: the keys the cursor passed were examined against a lower target.

//! No `compact_from` means nothing is pending; it is deleted when removal finishes, so a finished
//! store's tables are the same whichever way (and at whatever pace) it got there.
//!
//! Readers never depend on how far removal got: reads below the compacted revision fail, reads at or
//! above it look at each key's newest version at or below the read revision (never a superseded one),
//! and watch replay and `HashKV` skip what a finished removal would have removed
//! (`ReadView::kept_by_compaction`).

use std::ops::Bound;

use heed::{RoTxn, RwTxn};

use super::index::{history_entry, split_history_entry, Current, HISTORY};
use super::revision::Revision;
use super::store::{corrupt, KvStore, WriteTxn, COMPACT_REV, TAG_TOMBSTONE};
use super::ReadView;
use crate::error::EtcdError;

/// The `kv_meta` key of the next history entry removal examines; absent when nothing is pending.
pub(super) const COMPACT_FROM: &[u8] = b"compact_from";

/// The `kv_meta` key of a key whose current entry, a tombstone removal must remove, the last step
/// had no budget left for (its history already removed).
const COMPACT_TOMBSTONE: &[u8] = b"compact_tombstone";
/// Where the history region ends.
const HISTORY_END: [u8; 2] = [HISTORY[0], HISTORY[1] + 1];

/// etcd's batch (`kvstore_compaction.go`: 1,000 keys per batch): at most this many history entries
/// examined and this many versions removed by one background step.
pub(crate) const STEP_LIMIT: usize = 1_000;

/// What one removal step did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    /// History entries the step looked at.
    pub examined: usize,
    /// Versions it removed (each a `kv_revs` record and its `kv_index` entry).
    pub removed: usize,
    /// The compacted revision removal works towards, if any is still pending after the step.
    pub pending: Option<i64>,
    /// The compacted revision (whose removal is complete when `pending` is `None`).
    pub compacted: i64,
}

impl WriteTxn<'_, '_> {
    /// Schedules compaction at `rev` (etcd's checks first: at or below the compacted revision is
    /// `Compacted`, above the current one `FutureRev`). Removes nothing: the background steps do.
    pub(crate) fn compact(&mut self, rev: i64) -> Result<(), EtcdError> {
        if rev <= self.compact_rev {
            return Err(EtcdError::Compacted);
        }
        if rev > self.rev() {
            return Err(EtcdError::FutureRev);
        }
        // Only a key with a history has anything to remove (a tombstone always follows a put).
        if first_history_entry(self.store, self.txn)?.is_some() {
            self.store.meta.put(self.txn, COMPACT_FROM, &HISTORY)?;
        }
        self.store.meta.put(self.txn, COMPACT_REV, &rev.to_be_bytes())?;
        self.compact_rev = rev;
        Ok(())
    }
}

/// One history entry a step examines: its key, its own bytes, revision and tag.
struct Examined {
    raw: Vec<u8>,
    key: Vec<u8>,
    at: Revision,
    tag: u8,
}

impl KvStore {
    /// The compacted revision whose removal is still pending, if any.
    pub(crate) fn removal_pending(&self, txn: &RoTxn) -> Result<Option<i64>, EtcdError> {
        Ok(match next_to_examine(self, txn)? {
            Some(_) => Some(self.view(txn)?.compact_rev),
            None => None,
        })
    }

    /// One removal step in `txn`: examines at most `limit` history entries and removes at most
    /// `limit` versions, and records how far it got. The caller commits (or aborts: then nothing
    /// happened).
    pub(crate) fn compaction_step(&self, txn: &mut RwTxn, limit: usize) -> Result<Step, EtcdError> {
        let limit = limit.max(1);
        let target = self.view(txn)?.compact_rev;
        let mut step = Step { compacted: target, ..Step::default() };
        let Some(from) = next_to_examine(self, txn)? else {
            return Ok(step);
        };
        // Before the batch is collected: the tombstone may be in the history the batch walks.
        if let Some(key) = self.meta.get(txn, COMPACT_TOMBSTONE)?.map(<[u8]>::to_vec) {
            // The previous step removed `key`'s history but had no budget left for its tombstone.
            // Its current entry is that tombstone unless the key changed since, which moved the
            // tombstone into the history: a newer tombstone, even one at or below a new compaction's
            // target, is not this one while older versions of the key remain (found by the model
            // test: its removal left them without a current entry).
            let tombstone = |c: &Current| c.tag == TAG_TOMBSTONE && c.at.main <= target;
            let has_history = self.has_history_between(txn, &key, Revision::new(0, 0), Revision::new(i64::MAX, 0))?;
            if let Some(current) = self.current(txn, &key)?.filter(tombstone).filter(|_| !has_history) {
                self.remove_current(txn, &key)?;
                self.revs.delete(txn, &current.at.to_bytes())?;
                step.removed += 1;
            } else if let Some((raw, at)) = self.oldest_history_tombstone(txn, &key, target)? {
                // A change since then made the tombstone the key's oldest history entry, behind the
                // cursor, where the walk would not come back to it (found by the model test).
                self.index.delete(txn, &raw)?;
                self.revs.delete(txn, &at.to_bytes())?;
                step.removed += 1;
            }
            self.meta.delete(txn, COMPACT_TOMBSTONE)?;
        }
        // The entries this step examines and the one after them, collected first: removal deletes
        // from the index.
        let mut batch = Vec::new();
        let mut after = None;
        {
            for entry in self.index.range(txn, Bound::Included(&from), Bound::Excluded(&HISTORY_END))?.take(limit + 1) {
                let (raw, tag) = entry?;
                let (key, at) = split_history_entry(&raw).ok_or_else(|| corrupt("history key"))?;
                let tag = *tag.first().ok_or_else(|| corrupt("history tag"))?;
                let examined = Examined { raw: raw.into_owned(), key, at, tag };
                if batch.len() == limit {
                    after = Some(examined);
                } else {
                    batch.push(examined);
                }
            }
        }
        let mut stopped_at = None;
        for (n, entry) in batch.iter().enumerate() {
            if step.removed == limit {
                stopped_at = Some(entry.raw.clone());
                break;
            }
            step.examined += 1;
            if entry.at.main > target {
                continue;
            }
            // The key's next version: the next history entry of the key, or its current entry.
            let next_of_key = batch.get(n + 1).or(after.as_ref()).filter(|next| next.key == entry.key);
            let current = match next_of_key {
                Some(_) => None,
                None => Some(self.current(txn, &entry.key)?.ok_or_else(|| corrupt("history without a current entry"))?),
            };
            let next_main = next_of_key.map_or_else(|| current.map_or(i64::MAX, |c| c.at.main), |next| next.at.main);
            if next_main <= target || entry.tag == TAG_TOMBSTONE {
                self.index.delete(txn, &entry.raw)?;
                self.revs.delete(txn, &entry.at.to_bytes())?;
                step.removed += 1;
            }
            // The key's last history entry examined: its current entry goes too when it is a
            // tombstone at or below the target (the history below it is gone by now).
            if let Some(current) = current.filter(|c| c.at.main <= target && c.tag == TAG_TOMBSTONE) {
                if step.removed == limit {
                    // No history left before it: the next step removes it first, wherever a new
                    // compaction moves the cursor.
                    self.meta.put(txn, COMPACT_TOMBSTONE, &entry.key)?;
                    let next = batch.get(n + 1).or(after.as_ref()).map(|next| next.raw.clone());
                    stopped_at = Some(next.unwrap_or_else(|| HISTORY_END.to_vec()));
                    break;
                }
                self.remove_current(txn, &entry.key)?;
                self.revs.delete(txn, &current.at.to_bytes())?;
                step.removed += 1;
            }
        }
        match stopped_at.or(after.map(|next| next.raw)) {
            Some(next) => {
                self.meta.put(txn, COMPACT_FROM, &next)?;
                step.pending = Some(target);
            }
            None => {
                self.meta.delete(txn, COMPACT_FROM)?;
            }
        }
        Ok(step)
    }

    /// The oldest history entry of `key` (its raw bytes and revision) if it is a tombstone at or below
    /// `target`.
    fn oldest_history_tombstone(
        &self,
        txn: &RoTxn,
        key: &[u8],
        target: i64,
    ) -> Result<Option<(Vec<u8>, Revision)>, EtcdError> {
        let (from, upto) = (history_entry(key, Revision::new(0, 0)), history_entry(key, Revision::new(target + 1, 0)));
        let Some(entry) = self.index.range(txn, Bound::Included(&from), Bound::Excluded(&upto))?.next() else {
            return Ok(None);
        };
        let (raw, tag) = entry?;
        let (_, at) = split_history_entry(&raw).ok_or_else(|| corrupt("history key"))?;
        Ok((tag.first() == Some(&TAG_TOMBSTONE)).then(|| (raw.into_owned(), at)))
    }

    /// Runs removal steps in `txn` until none is pending (offline tools, which hold the store alone).
    pub(crate) fn finish_compaction(&self, txn: &mut RwTxn) -> Result<(), EtcdError> {
        while self.compaction_step(txn, STEP_LIMIT)?.pending.is_some() {}
        Ok(())
    }
}

impl ReadView<'_> {
    /// Whether the change at `at` (of `key`, with `tag`) is one a finished removal keeps: every
    /// change above the compacted revision, and at or below it only a put no newer change of its key
    /// at or below it supersedes. Only pending removal can leave others in the tables.
    pub(super) fn kept_by_compaction(&self, at: Revision, key: &[u8], tag: u8) -> Result<bool, EtcdError> {
        if at.main > self.compact_rev {
            return Ok(true);
        }
        Ok(tag != TAG_TOMBSTONE && !superseded(self.store, self.txn, key, at, self.compact_rev)?)
    }

    /// Whether removal is pending, so that the tables may hold changes `kept_by_compaction` rejects.
    pub(super) fn removal_pending(&self) -> Result<bool, EtcdError> {
        Ok(next_to_examine(self.store, self.txn)?.is_some())
    }
}

/// The history entry removal examines next (inclusive), while removal is pending.
fn next_to_examine(store: &KvStore, txn: &RoTxn) -> Result<Option<Vec<u8>>, EtcdError> {
    Ok(store.meta.get(txn, COMPACT_FROM)?.map(<[u8]>::to_vec))
}

/// The first entry of the history region, if it holds any.
fn first_history_entry(store: &KvStore, txn: &RoTxn) -> Result<Option<Vec<u8>>, EtcdError> {
    let first = store.index.range(txn, Bound::Included(&HISTORY[..]), Bound::Excluded(&HISTORY_END[..]))?.next();
    Ok(first.transpose()?.map(|(raw, _)| raw.into_owned()))
}

/// Whether `key` has a change newer than `at` at or below `target`.
fn superseded(store: &KvStore, txn: &RoTxn, key: &[u8], at: Revision, target: i64) -> Result<bool, EtcdError> {
    let Some(current) = store.current(txn, key)? else { return Ok(false) };
    if current.at <= at {
        return Ok(false);
    }
    if current.at.main <= target {
        return Ok(true);
    }
    let upto = Revision::new(target.saturating_add(1), 0);
    store.has_history_between(txn, key, Revision::new(at.main, at.sub + 1), upto)
}
