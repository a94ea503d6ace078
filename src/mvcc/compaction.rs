//! Compaction in two halves, as etcd does it: the Compact entry only *schedules* it (records the
//! compacted revision, from which on reads below it fail with `Compacted` on every member alike, and
//! that removal is pending up to it); the removal of the versions it made unreachable runs afterwards
//! in bounded steps, each its own short write transaction (`raft/state_machine/compaction.rs` runs
//! them between applies), so no apply ever holds the write path for long.
//!
//! What a finished compaction at `rev` keeps: every change above `rev`, and for each key its newest
//! change at or below `rev` when that is a put. A step walks `kv_revs` from a cursor (`compact_next`
//! in `kv_meta`, written in the same transaction as the step's deletions, so a crash never leaves half
//! a step): for each change at or below `rev` it removes the key's older versions, which that change
//! supersedes, and the change itself when it is a tombstone that nothing newer at or below `rev`
//! supersedes. A superseded change is removed when its successor is reached, so removal frees
//! `kv_revs` from its oldest pages on, from the first step. A new compaction
//! while one is pending only moves the target: what the cursor passed stays correct for the higher
//! target, since every change that supersedes an older one lies ahead of the cursor.
//!
//! No `compact_next` means nothing is pending; it is deleted when removal finishes, so a finished
//! store's tables are the same whichever way (and at whatever pace) it got there.
//!
//! Readers never depend on how far removal got: reads below the compacted revision fail, reads at or
//! above it look at each key's newest version at or below the read revision (never a superseded one),
//! and watch replay and `HashKV` skip what a finished removal would have removed
//! (`ReadView::kept_by_compaction`).

use std::ops::Bound;

use heed::{RoTxn, RwTxn};

use super::revision::{history_key, history_prefix, split_history_key, Revision};
use super::store::{corrupt, decode_change, KvStore, WriteTxn, COMPACT_REV, TAG_TOMBSTONE};
use super::ReadView;
use crate::error::EtcdError;

/// The `kv_meta` key of the next `kv_revs` revision removal examines; absent when nothing is pending.
pub(super) const COMPACT_NEXT: &[u8] = b"compact_next";

/// etcd's batch (`kvstore_compaction.go`: 1,000 keys per batch): at most this many changes examined and
/// this many versions removed by one background step.
pub(crate) const STEP_LIMIT: usize = 1_000;

/// What one removal step did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    /// Changes of `kv_revs` the step looked at.
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
        if next_to_examine(self.store, self.txn)?.is_none() {
            // Nothing pending: everything up to the previous compaction is already removed, and
            // removal starts after it (unless no change lies in between: then there is none to do).
            let (start, end) = (Revision::new(self.compact_rev + 1, 0), Revision::new(rev + 1, 0));
            let (from, to) = (start.to_bytes(), end.to_bytes());
            let bounds = (Bound::Included(&from[..]), Bound::Excluded(&to[..]));
            if self.store.revs.range(self.txn, &bounds)?.next().transpose()?.is_some() {
                self.store.meta.put(self.txn, COMPACT_NEXT, &from)?;
            }
        }
        self.store.meta.put(self.txn, COMPACT_REV, &rev.to_be_bytes())?;
        self.compact_rev = rev;
        Ok(())
    }
}

impl KvStore {
    /// The compacted revision whose removal is still pending, if any.
    pub(crate) fn removal_pending(&self, txn: &RoTxn) -> Result<Option<i64>, EtcdError> {
        Ok(match next_to_examine(self, txn)? {
            Some(_) => Some(self.view(txn)?.compact_rev),
            None => None,
        })
    }

    /// One removal step in `txn`: examines at most `limit` changes and removes at most `limit`
    /// versions, and records how far it got. The caller commits (or aborts: then nothing happened).
    pub(crate) fn compaction_step(&self, txn: &mut RwTxn, limit: usize) -> Result<Step, EtcdError> {
        let limit = limit.max(1);
        let target = self.view(txn)?.compact_rev;
        let mut step = Step { compacted: target, ..Step::default() };
        let Some(mut next) = next_to_examine(self, txn)? else {
            return Ok(step);
        };
        let end = Revision::new(target.saturating_add(1), 0);
        // The changes this step may examine, collected first: removal deletes from `kv_revs`.
        let mut batch = Vec::new();
        {
            let (from, to) = (next.to_bytes(), end.to_bytes());
            for entry in self.revs.range(txn, &(Bound::Included(&from[..]), Bound::Excluded(&to[..])))? {
                if batch.len() == limit {
                    break;
                }
                let (at, bytes) = entry?;
                let at = Revision::from_bytes(at).ok_or_else(|| corrupt("revision key"))?;
                let (tag, kv) = decode_change(at, bytes)?;
                batch.push((at, kv.key, tag));
            }
        }
        let exhausted = batch.len() < limit;
        let mut stopped_early = false;
        for (at, key, tag) in batch {
            if step.removed == limit {
                stopped_early = true;
                break;
            }
            step.examined += 1;
            // The key's versions older than this one, which it supersedes (walking in revision order,
            // so removal frees `kv_revs` from its oldest pages on, from the first step); and this one
            // too when it is a deletion nothing newer at or below the target supersedes. A superseded
            // change goes when its successor is examined.
            let last_deletion = tag == TAG_TOMBSTONE && !superseded(self, txn, &key, at, target)?;
            let upto = if last_deletion { Revision::new(at.main, at.sub + 1) } else { at };
            let budget = limit - step.removed;
            let doomed = older_versions(self, txn, &key, upto, budget + 1)?;
            let finished_key = doomed.len() <= budget;
            for raw in doomed.into_iter().take(budget) {
                let (_, old) = split_history_key(&raw).ok_or_else(|| corrupt("history key"))?;
                self.index.delete(txn, &raw)?;
                self.revs.delete(txn, &old.to_bytes())?;
                step.removed += 1;
            }
            if !finished_key {
                // More of this key's versions than the budget: the next step examines it again.
                next = at;
                stopped_early = true;
                break;
            }
            next = Revision::new(at.main, at.sub + 1);
        }
        if exhausted && !stopped_early {
            self.meta.delete(txn, COMPACT_NEXT)?;
        } else {
            self.meta.put(txn, COMPACT_NEXT, &next.to_bytes())?;
            step.pending = Some(target);
        }
        Ok(step)
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

fn next_to_examine(store: &KvStore, txn: &RoTxn) -> Result<Option<Revision>, EtcdError> {
    match store.meta.get(txn, COMPACT_NEXT)? {
        None => Ok(None),
        Some(bytes) => Ok(Some(Revision::from_bytes(bytes).ok_or_else(|| corrupt("compaction cursor"))?)),
    }
}

/// Whether `key` has a change newer than `at` at or below `target`.
fn superseded(store: &KvStore, txn: &RoTxn, key: &[u8], at: Revision, target: i64) -> Result<bool, EtcdError> {
    let after = history_key(key, Revision::new(at.main, at.sub + 1));
    let limit = history_key(key, Revision::new(target.saturating_add(1), 0));
    Ok(store.index.range(txn, Bound::Included(&after), Bound::Excluded(&limit))?.next().transpose()?.is_some())
}

/// The history keys of `key`'s versions below `upto`, oldest first, at most `max` of them.
fn older_versions(
    store: &KvStore,
    txn: &RoTxn,
    key: &[u8],
    upto: Revision,
    max: usize,
) -> Result<Vec<Vec<u8>>, EtcdError> {
    let (prefix, upto) = (history_prefix(key), history_key(key, upto));
    let mut out = Vec::new();
    for entry in store.index.range(txn, Bound::Included(&prefix), Bound::Excluded(&upto))?.take(max) {
        out.push(entry?.0.into_owned());
    }
    Ok(out)
}
