//! The conversion of the kv tables from older layouts, in bounded steps, each its own write
//! transaction (`raft/state_machine/layout.rs` runs them at open and after installing a snapshot):
//! from layout 2's encodings (16-byte revisions, protobuf records) to layout 3's short ones
//! (`revision.rs`, `record.rs`), then from layout 3's index to layout 4's regions (`index.rs`).
//!
//! What is left to convert is read from the data itself, so a crash between two steps resumes where
//! the last committed one stopped:
//! - `kv_revs`: a legacy key starts with `0x00`, a converted one with `0x80` or more, so every legacy
//!   record sorts before every converted one. A step converts the first `limit` records: it deletes
//!   them from the front and appends their converted form at the end, touching each page once, in
//!   order (LMDB's dirty-page spill is quadratic otherwise).
//! - `kv_index`, to layout 3: a legacy entry's revision starts with `0x00`, a converted one's with
//!   `0x80` or more, and both share the key's prefix, so a key's converted entries sort right after its
//!   legacy ones. Steps walk the index in key order from a cursor (`upgrade_next` in `kv_meta`, written
//!   with the step), converting entries in place.
//! - then the compaction cursor (`compact_next`, a revision), and the index cursor is removed.
//! - `kv_index`, to layout 4: layout 3's entries sort after every region of layout 4 (`index.rs`), so
//!   what is left is what lies past the regions. A step takes the first `limit` of them in key order
//!   (and one more, to know whether the last is its key's newest), deletes them, and puts each key's
//!   newest into the newest region and the others into the history; then layout 3's compaction cursor
//!   becomes a restart of removal from the history's start (`compaction.rs`).

use std::ops::Bound;

use heed::{PutFlags, RwTxn};

use super::compaction::COMPACT_FROM;
use super::index::{current_entry, current_value, HISTORY, LAYOUT_3_FROM, NEWEST};
use super::record::{decode_legacy_change, encode_change};
use super::revision::{history_key, prefix_len, split_history_key, split_legacy_history_key, Revision};
use super::store::{corrupt, KvStore};
use crate::error::EtcdError;

/// The `kv_meta` key of the last legacy index entry converted, while the index is being converted.
const UPGRADE_NEXT: &[u8] = b"upgrade_next";
/// The `kv_meta` key of layout 3's compaction cursor (the next `kv_revs` revision to examine).
const COMPACT_NEXT: &[u8] = b"compact_next";

impl KvStore {
    /// Converts at most `limit` legacy records (of `kv_revs`, or else of `kv_index`), in `txn`; true
    /// once nothing legacy is left (and the step converted nothing).
    pub(crate) fn upgrade_step(&self, txn: &mut RwTxn, limit: usize) -> Result<bool, EtcdError> {
        let limit = limit.max(1);
        if self.upgrade_revs(txn, limit)? > 0 {
            return Ok(false);
        }
        if self.upgrade_index(txn, limit)? > 0 {
            return Ok(false);
        }
        if let Some(legacy) = self.meta.get(txn, COMPACT_NEXT)?.and_then(Revision::from_legacy_bytes) {
            self.meta.put(txn, COMPACT_NEXT, &legacy.to_bytes())?;
        }
        self.meta.delete(txn, UPGRADE_NEXT)?;
        Ok(true)
    }

    /// Converts at most `limit` of layout 3's index entries to layout 4's regions, in `txn`; true once
    /// nothing of layout 3 is left (and the step converted nothing). Run after `upgrade_step` is done.
    pub(crate) fn regions_step(&self, txn: &mut RwTxn, limit: usize) -> Result<bool, EtcdError> {
        let limit = limit.max(1);
        let mut old: Vec<(Vec<u8>, Vec<u8>, Revision, u8)> = Vec::new();
        for entry in self.index.range(txn, Bound::Included(&LAYOUT_3_FROM[..]), Bound::Unbounded)?.take(limit + 1) {
            let (raw, tag) = entry?;
            let (key, at) = split_history_key(&raw).ok_or_else(|| corrupt("layout 3 history key"))?;
            let tag = *tag.first().ok_or_else(|| corrupt("history tag"))?;
            old.push((raw.into_owned(), key, at, tag));
        }
        if old.is_empty() {
            if self.meta.delete(txn, COMPACT_NEXT)? {
                // Removal was pending: it starts over in the history, which holds every version it
                // may remove (`compaction.rs`).
                self.meta.put(txn, COMPACT_FROM, &HISTORY)?;
            }
            return Ok(true);
        }
        // The one past `limit` only tells whether the last converted entry is its key's newest.
        let lookahead = if old.len() > limit { old.pop() } else { None };
        for (raw, ..) in &old {
            // Deleted first: the new entries then reuse the pages these leave.
            self.index.delete(txn, raw)?;
        }
        for (n, (raw, key, at, tag)) in old.iter().enumerate() {
            let next = old.get(n + 1).or(lookahead.as_ref());
            if next.is_some_and(|(_, next_key, ..)| next_key == key) {
                self.index.put(txn, &[&HISTORY[..], raw].concat(), &[*tag])?;
            } else {
                self.index.put(txn, &current_entry(NEWEST, key), &current_value(*tag, *at))?;
            }
        }
        Ok(false)
    }

    /// Converts the first `limit` legacy records of `kv_revs`; returns how many.
    fn upgrade_revs(&self, txn: &mut RwTxn, limit: usize) -> Result<usize, EtcdError> {
        let mut batch = Vec::new();
        for entry in self.revs.iter(txn)? {
            let (key, record) = entry?;
            let Some(at) = Revision::from_legacy_bytes(key) else { break };
            if batch.len() == limit {
                break;
            }
            let (tag, kv) = decode_legacy_change(record)?;
            batch.push((at, encode_change(at, tag, &kv)));
        }
        for (at, _) in &batch {
            self.revs.delete(txn, &at.legacy_bytes())?;
        }
        for (at, record) in &batch {
            // After every converted record (legacy keys sort first, and go in revision order).
            self.revs.put_with_flags(txn, PutFlags::APPEND, &at.to_bytes(), record)?;
        }
        Ok(batch.len())
    }

    /// Converts the next `limit` legacy entries of `kv_index` in key order; returns how many.
    fn upgrade_index(&self, txn: &mut RwTxn, limit: usize) -> Result<usize, EtcdError> {
        let cursor = self.meta.get(txn, UPGRADE_NEXT)?.map(<[u8]>::to_vec);
        if cursor.is_none() && !self.index_starts_legacy(txn)? {
            return Ok(0);
        }
        let from = cursor.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        let mut batch = Vec::new();
        for entry in self.index.range(txn, from, Bound::Unbounded)? {
            let (raw, tag) = entry?;
            let Some((key, at)) = split_legacy_history_key(&raw) else {
                continue; // converted already
            };
            batch.push((raw.into_owned(), history_key(&key, at), tag.to_vec()));
            if batch.len() == limit {
                break;
            }
        }
        for (legacy, converted, tag) in &batch {
            self.index.delete(txn, legacy)?;
            self.index.put(txn, converted, tag)?;
        }
        match batch.last() {
            Some((legacy, _, _)) => self.meta.put(txn, UPGRADE_NEXT, legacy)?,
            None => self.meta.delete(txn, UPGRADE_NEXT).map(drop)?,
        }
        Ok(batch.len())
    }

    /// Whether the index's first entry is of layout 2 (a store whose index conversion did not start).
    fn index_starts_legacy(&self, txn: &RwTxn) -> Result<bool, EtcdError> {
        let Some(entry) = self.index.iter(txn)?.next() else { return Ok(false) };
        let (raw, _) = entry?;
        if raw.first() == Some(&0) && raw.get(1).is_some_and(|&b| (1..LAYOUT_3_FROM[1]).contains(&b)) {
            return Ok(false); // layout 4's (an installed snapshot of it is recorded as layout 2)
        }
        let split = prefix_len(&raw).ok_or_else(|| corrupt("history key"))?;
        Ok(raw.get(split).is_some_and(|&first| first < 0x80))
    }
}

#[cfg(test)]
impl KvStore {
    /// Every record of `kv_revs`, every entry of `kv_index` as layout 3 held it (`escape(key) ++
    /// revision → tag`, the regions merged: where layout 4 keeps an entry depends on how it got there)
    /// and every record of `kv_meta`.
    pub(crate) fn records_for_tests(&self, txn: &heed::RoTxn) -> [Vec<(Vec<u8>, Vec<u8>)>; 3] {
        let own = |entry: heed::Result<(&[u8], &[u8])>| entry.map(|(k, v)| (k.to_vec(), v.to_vec())).unwrap();
        let mut index = Vec::new();
        self.each_index_entry(txn, |key, at, tag| {
            index.push((history_key(key, at), vec![tag]));
            Ok(())
        })
        .unwrap();
        [self.revs.iter(txn).unwrap().map(own).collect(), index, self.meta.iter(txn).unwrap().map(own).collect()]
    }

    /// Rewrites the index as layout 3 held it (one run of `escape(key) ++ revision → tag`), and a
    /// pending removal's cursor as layout 3's (a revision: removal examines every change again).
    pub(crate) fn downgrade_to_3_for_tests(&self, txn: &mut RwTxn) {
        let entries = self.records_for_tests(txn)[1].clone();
        self.index.clear(txn).unwrap();
        for (raw, tag) in entries {
            self.index.put(txn, &raw, &tag).unwrap();
        }
        if self.meta.delete(txn, COMPACT_FROM).unwrap() {
            self.meta.put(txn, COMPACT_NEXT, &Revision::new(0, 0).to_bytes()).unwrap();
        }
    }

    /// Rewrites the tables in layout 2's encodings, as a member of that layout left them (tests of the
    /// migration): every record, every index entry and the compaction cursor.
    pub(crate) fn downgrade_for_tests(&self, txn: &mut RwTxn) {
        use super::record::{decode_change, legacy_change};
        use super::revision::legacy_history_key;
        self.downgrade_to_3_for_tests(txn);
        let records: Vec<(Revision, Vec<u8>)> = self
            .revs
            .iter(txn)
            .unwrap()
            .map(|entry| {
                let (key, record) = entry.unwrap();
                let at = Revision::from_bytes(key).unwrap();
                let (tag, kv) = decode_change(at, record).unwrap();
                (at, legacy_change(tag, &kv))
            })
            .collect();
        self.revs.clear(txn).unwrap();
        for (at, record) in records {
            self.revs.put(txn, &at.legacy_bytes(), &record).unwrap();
        }
        let entries: Vec<(Vec<u8>, Vec<u8>)> = self
            .index
            .iter(txn)
            .unwrap()
            .map(|entry| entry.map(|(k, v)| (k.into_owned(), v.to_vec())).unwrap())
            .collect();
        for (raw, tag) in entries {
            let (key, at) = split_history_key(&raw).unwrap();
            self.index.delete(txn, &raw).unwrap();
            self.index.put(txn, &legacy_history_key(&key, at), &tag).unwrap();
        }
        if let Some(next) = self.meta.get(txn, COMPACT_NEXT).unwrap().and_then(Revision::from_bytes) {
            self.meta.put(txn, COMPACT_NEXT, &next.legacy_bytes()).unwrap();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyrange::KeyRange;
    use crate::storage::LmdbEnv;

    type Records = [Vec<(Vec<u8>, Vec<u8>)>; 3];

    /// Keys with zero bytes, keys through one and two levels of long-key groups (a 4-byte chunk), each
    /// written `rounds` times, one deleted and written again, then compacted at `compact` with
    /// one removal step of 2 committed (so removal is pending).
    fn filled(dir: &std::path::Path, rounds: usize, compact: i64) -> (LmdbEnv, KvStore) {
        let (env, store) = KvStore::open_for_tests(dir, 4).unwrap();
        let keys: Vec<Vec<u8>> =
            vec![b"a".to_vec(), b"a\0b".to_vec(), b"key-of-ten".to_vec(), b"\0\0\0\0\0\0".to_vec(), b"zz".to_vec()];
        for round in 0..rounds {
            for (i, key) in keys.iter().enumerate() {
                let mut txn = env.write_txn().unwrap();
                let mut w = store.begin(&mut txn).unwrap();
                w.put(key, format!("{round}-{i}").into_bytes(), i as i64).unwrap();
                if round == 1 && i == 1 {
                    w.delete_range(&KeyRange::new(b"zz", b"zzz"), false).unwrap();
                }
                w.finish().unwrap();
                txn.commit().unwrap();
            }
        }
        let mut txn = env.write_txn().unwrap();
        let mut w = store.begin(&mut txn).unwrap();
        w.compact(compact).unwrap();
        w.finish().unwrap();
        store.compaction_step(&mut txn, 2).unwrap();
        txn.commit().unwrap();
        (env, store)
    }

    /// The records but the removal's cursor (where it stands depends on the steps taken).
    fn records_but_the_cursor(env: &LmdbEnv, store: &KvStore) -> Records {
        let mut records = store.records_for_tests(&env.read_txn().unwrap());
        records[2].retain(|(k, _)| k != COMPACT_FROM);
        records
    }

    /// What reads see at every revision from the compacted one on.
    fn reads(env: &LmdbEnv, store: &KvStore) -> Vec<Vec<crate::proto::mvccpb::KeyValue>> {
        let txn = env.read_txn().unwrap();
        let view = store.view(&txn).unwrap();
        let all = KeyRange::From(Vec::new());
        (view.compact_rev..=view.rev).map(|rev| view.range(&all, rev, 0, false).unwrap().kvs).collect()
    }

    fn hashes(env: &LmdbEnv, store: &KvStore) -> (u32, crate::mvcc::hash::KvHash) {
        let txn = env.read_txn().unwrap();
        let view = store.view(&txn).unwrap();
        (view.hash_all().unwrap(), view.hash_kv(0).unwrap())
    }

    fn finish_removal(env: &LmdbEnv, store: &KvStore) {
        let mut txn = env.write_txn().unwrap();
        store.finish_compaction(&mut txn).unwrap();
        txn.commit().unwrap();
    }

    /// Steps of `step` committed one by one until it says done; returns how many converted anything.
    fn run(env: &LmdbEnv, step: impl Fn(&mut RwTxn) -> bool) -> usize {
        let mut steps = 0;
        loop {
            let mut txn = env.write_txn().unwrap();
            let done = step(&mut txn);
            txn.commit().unwrap();
            if done {
                return steps;
            }
            steps += 1;
            assert!(steps < 1000, "the conversion ends");
        }
    }

    /// Compares a migrated store with one that always had layout 4 and the same changes: the same
    /// versions, reads at every revision and `HashKV` while removal is pending, and the same tables
    /// and `Hash` once both finished it.
    fn assert_same(migrated: (&LmdbEnv, &KvStore), reference: (&LmdbEnv, &KvStore)) {
        assert_eq!(records_but_the_cursor(migrated.0, migrated.1), records_but_the_cursor(reference.0, reference.1));
        assert_eq!(reads(migrated.0, migrated.1), reads(reference.0, reference.1));
        assert_eq!(hashes(migrated.0, migrated.1).1, hashes(reference.0, reference.1).1, "HashKV");
        finish_removal(migrated.0, migrated.1);
        finish_removal(reference.0, reference.1);
        assert_eq!(
            migrated.1.records_for_tests(&migrated.0.read_txn().unwrap()),
            reference.1.records_for_tests(&reference.0.read_txn().unwrap())
        );
        assert_eq!(hashes(migrated.0, migrated.1), hashes(reference.0, reference.1), "Hash and HashKV");
    }

    /// A store of layout 2 converted a few records per step, each step committed, to layout 3 and
    /// then to layout 4: the same data as a store that always had layout 4. Fails without any part of
    /// the conversion (a table, a region, the cursor).
    #[test]
    fn a_store_of_layout_2_converts_in_small_steps_to_the_same_tables() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (env, store) = filled(a.path(), 3, 12);
        let reference = filled(b.path(), 3, 12);
        let before = records_but_the_cursor(&env, &store);
        let mut txn = env.write_txn().unwrap();
        store.downgrade_for_tests(&mut txn);
        txn.commit().unwrap();
        assert_ne!(records_but_the_cursor(&env, &store)[0], before[0]);
        let steps = run(&env, |txn| store.upgrade_step(txn, 3).unwrap());
        assert!(steps >= 6, "{steps} steps: each converts at most 3 records");
        let steps = run(&env, |txn| store.regions_step(txn, 3).unwrap());
        assert!(steps >= 5, "{steps} steps to layout 4: each converts at most 3 entries");
        assert!(store.removal_pending(&env.read_txn().unwrap()).unwrap().is_some(), "the cursor is converted too");
        assert_same((&env, &store), (&reference.0, &reference.1));
        // Converted tables have nothing left to convert.
        let mut txn = env.write_txn().unwrap();
        assert!(store.upgrade_step(&mut txn, 3).unwrap());
        assert!(store.regions_step(&mut txn, 3).unwrap());
    }

    /// A store of layout 3 (more versions than a step converts, on a key of two levels of long-key
    /// groups too) converted to layout 4 with a crash in the middle: a step aborted half-way, the
    /// environment closed and opened again, and the conversion resumed from what the data says is
    /// left. Fails if a step's entries were taken for converted before their commit, or if the
    /// conversion wrote a key's newest version into the history.
    #[test]
    fn a_migration_from_layout_3_resumes_after_a_crash() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let reference = filled(b.path(), 9, 20);
        {
            let (env, store) = filled(a.path(), 9, 20);
            let mut txn = env.write_txn().unwrap();
            store.downgrade_to_3_for_tests(&mut txn);
            txn.commit().unwrap();
            for _ in 0..3 {
                let mut txn = env.write_txn().unwrap();
                assert!(!store.regions_step(&mut txn, 4).unwrap());
                txn.commit().unwrap();
            }
            let mut txn = env.write_txn().unwrap();
            assert!(!store.regions_step(&mut txn, 4).unwrap());
            drop(txn); // the crash: this step never committed
        }
        let (env, store) = KvStore::open_for_tests(a.path(), 4).unwrap();
        let steps = run(&env, |txn| store.regions_step(txn, 4).unwrap());
        assert!(steps >= 5, "{steps} steps after the crash");
        assert_same((&env, &store), (&reference.0, &reference.1));
    }
}
