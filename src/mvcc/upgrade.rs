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
