//! The conversion of the kv tables from layout 2's encodings (16-byte revisions, protobuf records) to
//! layout 3's short ones (`revision.rs`, `record.rs`), in bounded steps, each its own write transaction
//! (`raft/state_machine/layout.rs` runs them at open and after installing a snapshot).
//!
//! What is left to convert is read from the data itself, so a crash between two steps resumes where
//! the last committed one stopped:
//! - `kv_revs`: a legacy key starts with `0x00`, a converted one with `0x80` or more, so every legacy
//!   record sorts before every converted one. A step converts the first `limit` records: it deletes
//!   them from the front and appends their converted form at the end, touching each page once, in
//!   order (LMDB's dirty-page spill is quadratic otherwise).
//! - `kv_index`: a legacy entry's revision starts with `0x00`, a converted one's with `0x80` or more,
//!   and both share the key's prefix, so a key's converted entries sort right after its legacy ones.
//!   Steps walk the index in key order from a cursor (`upgrade_next` in `kv_meta`, written with the
//!   step), converting entries in place.
//! - then the compaction cursor (`compact_next`), and the index cursor is removed.

use std::ops::Bound;

use heed::{PutFlags, RwTxn};

use super::compaction::COMPACT_NEXT;
use super::record::{decode_legacy_change, encode_change};
use super::revision::{history_key, prefix_len, split_legacy_history_key, Revision};
use super::store::{corrupt, KvStore};
use crate::error::EtcdError;

/// The `kv_meta` key of the last legacy index entry converted, while the index is being converted.
const UPGRADE_NEXT: &[u8] = b"upgrade_next";

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
        let split = prefix_len(&raw).ok_or_else(|| corrupt("history key"))?;
        Ok(raw.get(split).is_some_and(|&first| first < 0x80))
    }
}

#[cfg(test)]
impl KvStore {
    /// Every record of `kv_revs`, `kv_index` (keys whole, as its `Table` reads them) and `kv_meta`.
    pub(crate) fn records_for_tests(&self, txn: &heed::RoTxn) -> [Vec<(Vec<u8>, Vec<u8>)>; 3] {
        let own = |entry: heed::Result<(&[u8], &[u8])>| entry.map(|(k, v)| (k.to_vec(), v.to_vec())).unwrap();
        [
            self.revs.iter(txn).unwrap().map(own).collect(),
            self.index.iter(txn).unwrap().map(|e| e.map(|(k, v)| (k.into_owned(), v.to_vec())).unwrap()).collect(),
            self.meta.iter(txn).unwrap().map(own).collect(),
        ]
    }

    /// Rewrites the tables in layout 2's encodings, as a member of that layout left them (tests of the
    /// migration): every record, every index entry and the compaction cursor.
    pub(crate) fn downgrade_for_tests(&self, txn: &mut RwTxn) {
        use super::record::{decode_change, legacy_change};
        use super::revision::{legacy_history_key, split_history_key};
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

    fn records(store: &KvStore, txn: &heed::RoTxn) -> [Vec<(Vec<u8>, Vec<u8>)>; 3] {
        store.records_for_tests(txn)
    }

    /// A store of layout 2 (short keys, keys with zero bytes, keys through two levels of long-key
    /// groups, deletions, a compaction whose removal is still pending) converted a few records per step,
    /// each step committed: the tables end exactly as layout 3 writes them, with the same `Hash` and
    /// `HashKV` as before the downgrade. Fails without any part of the conversion (a table, the cursor).
    #[test]
    fn a_store_of_layout_2_converts_in_small_steps_to_the_same_tables() {
        let dir = tempfile::tempdir().unwrap();
        // A 4-byte chunk: keys past 4 and 8 bytes go through one and two levels of groups.
        let (env, store) = KvStore::open_for_tests(dir.path(), 4).unwrap();
        let keys: Vec<Vec<u8>> =
            vec![b"a".to_vec(), b"a\0b".to_vec(), b"key-of-ten".to_vec(), b"\0\0\0\0\0\0".to_vec(), b"zz".to_vec()];
        for round in 0..3 {
            for (i, key) in keys.iter().enumerate() {
                let mut txn = env.write_txn().unwrap();
                let mut w = store.begin(&mut txn).unwrap();
                w.put(key, format!("{round}-{i}").into_bytes(), i as i64).unwrap();
                if round == 2 && i == 1 {
                    w.delete_range(&KeyRange::new(b"zz", b"zzz"), false).unwrap();
                }
                w.finish().unwrap();
                txn.commit().unwrap();
            }
        }
        let mut txn = env.write_txn().unwrap();
        let mut w = store.begin(&mut txn).unwrap();
        w.compact(12).unwrap();
        w.finish().unwrap();
        store.compaction_step(&mut txn, 2).unwrap();
        txn.commit().unwrap();
        let (before, hashes) = {
            let txn = env.read_txn().unwrap();
            let view = store.view(&txn).unwrap();
            assert!(view.removal_pending().unwrap(), "the cursor is converted too");
            (records(&store, &txn), (view.hash_all().unwrap(), view.hash_kv(0).unwrap()))
        };
        let mut txn = env.write_txn().unwrap();
        store.downgrade_for_tests(&mut txn);
        txn.commit().unwrap();
        assert_ne!(records(&store, &env.read_txn().unwrap())[0], before[0]);
        let mut steps = 0;
        loop {
            let mut txn = env.write_txn().unwrap();
            let done = store.upgrade_step(&mut txn, 3).unwrap();
            txn.commit().unwrap();
            if done {
                break;
            }
            steps += 1;
            assert!(steps < 100, "the conversion ends");
        }
        assert!(steps >= 6, "{steps} steps: each converts at most 3 records");
        let txn = env.read_txn().unwrap();
        assert_eq!(records(&store, &txn), before);
        let view = store.view(&txn).unwrap();
        assert_eq!((view.hash_all().unwrap(), view.hash_kv(0).unwrap()), hashes);
        drop(txn);
        // Converted tables have nothing left to convert.
        let mut txn = env.write_txn().unwrap();
        assert!(store.upgrade_step(&mut txn, 3).unwrap());
    }
}
