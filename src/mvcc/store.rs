//! The multi-version key-value store on LMDB: what each revision of each key was.
//!
//! Tables (all in the `kv` environment):
//! - `kv_revs`:  revision → the change's record (`record.rs`: every change, in order, the one place a
//!   value is stored)
//! - `kv_index`: where each key's versions are (`index.rs`): since layout 4 each key's newest change
//!   (its current entry: the key as it is now, absent if that change is a tombstone) apart from the
//!   history of the versions it superseded, so that the current entries fill their pages
//! - `kv_meta`:  current and compacted revision, and how far the removal of compacted versions got
//!   (`compaction.rs`)
//!
//! A read at the current revision is a read of each key's current entry, then of that revision
//! in `kv_revs`: a single key is one get in the index and one in `kv_revs`, a range one walk of the
//! current entries. A read at an older revision looks in the history only for the keys whose current
//! entry is newer than it. Until layout 2 a third table, `kv_live` (key → current `KeyValue`), held every current
//! value a second time; `raft/state_machine/layout.rs` empties it in data dirs of that layout.
//!
//! `kv_index` is keyed by etcd keys, which may be as long as a request: it is a [`Table`], which keeps
//! LMDB's byte order for keys of any length (`storage/table.rs`). `kv_revs` is keyed by revision
//! (5 bytes for a store of a million changes, `revision.rs`) and holds the key in its value, where
//! LMDB has no size limit.
//!
//! All writes of one raft entry happen in one LMDB write transaction (`WriteTxn`), which the state machine
//! commits together with the applied log id.

use std::ops::Bound;

use heed::{PutFlags, RoTxn, RwTxn};

pub(super) use super::record::decode_change;
use super::record::encode_change;
use super::revision::Revision;
use crate::error::EtcdError;
use crate::keyrange::KeyRange;
use crate::proto::mvccpb::{event::EventType, Event, KeyValue};
use crate::storage::table::{LongKeys, Table};
use crate::storage::Db;

pub(super) const CURRENT_REV: &[u8] = b"current_rev";
pub(super) const COMPACT_REV: &[u8] = b"compact_rev";
pub(super) const TAG_TOMBSTONE: u8 = 0;
pub(super) const TAG_PUT: u8 = 1;

pub(crate) struct KvStore {
    pub(super) revs: Db,
    pub(super) index: Table,
    pub(super) meta: Db,
}

/// The keys a range found, plus how many matched in total (etcd reports the total even with a limit).
#[derive(Debug, Default)]
pub(crate) struct RangeResult {
    pub kvs: Vec<KeyValue>,
    pub count: usize,
    /// The store's revision the read saw (not the requested historical one), as etcd reports it.
    pub rev: i64,
}

impl KvStore {
    /// The table of every change: its name is also the first thing `HashKV` hashes.
    pub(crate) const REVS: &'static str = "kv_revs";
    pub(crate) const TABLES: [&'static str; 3] = [Self::REVS, "kv_index", "kv_meta"];
    /// The table of current values that layouts before 2 kept beside `kv_revs` (see the module doc).
    pub(crate) const LEGACY_LIVE: &'static str = "kv_live";

    pub(crate) fn new([revs, index, meta]: [Db; 3], long: LongKeys) -> Self {
        KvStore { revs, index: Table::new(index, long), meta }
    }

    /// A consistent view at the revision committed in `txn`.
    pub(crate) fn view<'a>(&'a self, txn: &'a RoTxn<'a>) -> Result<ReadView<'a>, EtcdError> {
        let rev = self.read_meta(txn, CURRENT_REV)?.unwrap_or(1);
        Ok(ReadView {
            store: self,
            txn,
            rev,
            // etcd starts at -1, so compacting revision 0 of a fresh store succeeds once.
            compact_rev: self.read_meta(txn, COMPACT_REV)?.unwrap_or(-1),
        })
    }

    pub(crate) fn begin<'a, 'e>(&'a self, txn: &'a mut RwTxn<'e>) -> Result<WriteTxn<'a, 'e>, EtcdError> {
        let (begin_rev, compact_rev) = {
            let view = self.view(txn)?;
            (view.rev, view.compact_rev)
        };
        Ok(WriteTxn { store: self, txn, begin_rev, compact_rev, changes: 0, events: Vec::new() })
    }

    /// Every table's own database, for snapshots and `Hash` (the remainders of long keys are in the
    /// environment's `long_keys` database, which the state machine adds once for all stores).
    pub(crate) fn tables(&self) -> [Db; 3] {
        [self.revs, self.index.main_db(), self.meta]
    }

    /// A store in its own environment at `dir`, with long keys split into `chunk`-byte pieces (a tiny
    /// chunk makes short test keys exercise the long-key layout).
    #[cfg(test)]
    pub(crate) fn open_for_tests(dir: &std::path::Path, chunk: usize) -> heed::Result<(crate::storage::LmdbEnv, Self)> {
        use crate::storage::{self, Durability};
        let [revs, index, meta] = Self::TABLES;
        let (env, [revs, index, meta, long]) =
            storage::open(dir, [revs, index, meta, LongKeys::TABLE], Durability::Full)?;
        Ok((env, KvStore::new([revs, index, meta], LongKeys::with_chunk(long, chunk))))
    }

    fn read_meta(&self, txn: &RoTxn, name: &[u8]) -> Result<Option<i64>, EtcdError> {
        match self.meta.get(txn, name)? {
            None => Ok(None),
            Some(bytes) => Ok(Some(i64::from_be_bytes(bytes.try_into().map_err(|_| corrupt("meta revision"))?))),
        }
    }
}

pub(super) fn corrupt(what: &str) -> EtcdError {
    tracing::error!(what, "corrupt record in the kv store");
    EtcdError::Internal
}

/// Reads at one revision of the store: either a read transaction or a write transaction in progress.
pub(crate) struct ReadView<'a> {
    pub(super) store: &'a KvStore,
    pub(super) txn: &'a RoTxn<'a>,
    /// The newest revision visible in this view.
    pub rev: i64,
    pub compact_rev: i64,
}

impl ReadView<'_> {
    /// Checks a requested revision (0 = current) the way etcd does and returns the one to read at.
    pub(crate) fn resolve(&self, requested: i64) -> Result<i64, EtcdError> {
        if requested > self.rev {
            return Err(EtcdError::FutureRev);
        }
        let rev = if requested <= 0 { self.rev } else { requested };
        if rev < self.compact_rev {
            return Err(EtcdError::Compacted);
        }
        Ok(rev)
    }

    /// Keys in `range` as of `requested` (0 = current). `limit` 0 means no limit; the count is always the
    /// total number of keys in the range.
    pub(crate) fn range(
        &self,
        range: &KeyRange,
        requested: i64,
        limit: usize,
        count_only: bool,
    ) -> Result<RangeResult, EtcdError> {
        let rev = self.resolve(requested)?;
        let mut result = RangeResult { rev: self.rev, ..Default::default() };
        if range.is_empty() {
            return Ok(result);
        }
        let wants = |result: &RangeResult| !count_only && (limit == 0 || result.kvs.len() < limit);
        if let (true, KeyRange::Single(key)) = (rev == self.rev, range) {
            // The current value of one key: its newest index entry, then that revision's record.
            if let Some((at, TAG_PUT)) = self.newest(key)? {
                result.count = 1;
                if wants(&result) {
                    result.kvs.push(self.kv_at(at)?);
                }
            }
            return Ok(result);
        }
        self.each_key(range, rev, None, |_, at| {
            result.count += 1;
            if wants(&result) {
                result.kvs.push(self.kv_at(at)?);
            }
            Ok(true)
        })?;
        Ok(result)
    }

    /// About how many bytes of new pages a delete of `range` now writes (`WriteTxn::delete_range`):
    /// for each key there, its tombstone's record, its history entry and its rewritten current entry,
    /// each with LMDB's node overhead, the history at half-full pages (its inserts split them in the
    /// middle); values are not read. What apply reserves ahead (`apply::footprint`).
    pub(crate) fn delete_footprint(&self, range: &KeyRange) -> Result<u64, EtcdError> {
        let (mut keys, mut key_bytes) = (0, 0);
        for entry in self.store.currents(self.txn, range, None)? {
            let (key, current) = entry?;
            if current.tag == TAG_PUT {
                keys += 1;
                key_bytes += key.len() as u64;
            }
        }
        Ok(deletion_footprint(keys, key_bytes))
    }

    /// The newest change of `key` (at any revision this view sees): its revision and tag.
    pub(super) fn newest(&self, key: &[u8]) -> Result<Option<(Revision, u8)>, EtcdError> {
        Ok(self.store.current(self.txn, key)?.map(|current| (current.at, current.tag)))
    }

    /// The key-value a put recorded at revision `at`.
    pub(super) fn kv_at(&self, at: Revision) -> Result<KeyValue, EtcdError> {
        let bytes = self.store.revs.get(self.txn, &at.to_bytes())?.ok_or_else(|| corrupt("missing revision"))?;
        Ok(decode_change(at, bytes)?.1)
    }

    /// The key-values puts recorded at `revisions` (distinct), in the order given. They are read in
    /// revision order, walking `kv_revs` from one to the next while few records lie between them (as
    /// for a range of keys written in order) and seeking afresh past `WALK_SLACK` others, so a batch
    /// costs about one tree search, not one per revision, and a walk never reads much it does not return.
    pub(super) fn kvs_at(&self, revisions: &[Revision]) -> Result<Vec<KeyValue>, EtcdError> {
        let mut order: Vec<usize> = (0..revisions.len()).collect();
        order.sort_unstable_by_key(|&i| revisions[i]);
        let mut found: Vec<Option<KeyValue>> = vec![None; revisions.len()];
        let mut next = 0;
        while let Some(&first) = order.get(next) {
            let from = revisions[first].to_bytes();
            let mut passed = 0;
            let mut progressed = false;
            for entry in self.store.revs.range(self.txn, &(Bound::Included(&from[..]), Bound::Unbounded))? {
                let (at, bytes) = entry?;
                let at = Revision::from_bytes(at).ok_or_else(|| corrupt("revision key"))?;
                let wanted = order.get(next).map(|&i| (i, revisions[i]));
                let Some((slot, wanted)) = wanted else { break };
                if at < wanted {
                    passed += 1;
                    if passed > WALK_SLACK {
                        break;
                    }
                    continue;
                }
                if at > wanted {
                    return Err(corrupt("missing revision"));
                }
                found[slot] = Some(decode_change(at, bytes)?.1);
                next += 1;
                passed = 0;
                progressed = true;
            }
            if !progressed {
                return Err(corrupt("missing revision"));
            }
        }
        found.into_iter().map(|kv| kv.ok_or_else(|| corrupt("missing revision"))).collect()
    }

    /// Calls `visit` with each key in `range` that exists as of `rev` and the revision of its version
    /// then, in key order, walking the current entries once from past `after` (a key) or the range's
    /// start, and looking in the history only for a key changed after `rev`; stops early when `visit`
    /// returns false.
    pub(super) fn each_key(
        &self,
        range: &KeyRange,
        rev: i64,
        after: Option<&[u8]>,
        mut visit: impl FnMut(Vec<u8>, Revision) -> Result<bool, EtcdError>,
    ) -> Result<(), EtcdError> {
        for entry in self.store.currents(self.txn, range, after)? {
            let (key, current) = entry?;
            let then =
                if current.at.main <= rev { Some(current) } else { self.store.version_at(self.txn, &key, rev)? };
            if let Some(then) = then.filter(|then| then.tag == TAG_PUT) {
                if !visit(key, then.at)? {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    #[cfg(test)]
    /// The changes with revision `>= from` to keys in `range`, in revision order (watch replay), and
    /// the revision to continue from. `max_revisions` (0 = no limit) bounds how many distinct revisions
    /// are scanned; a revision's changes are never split.
    pub(crate) fn changes_since(
        &self,
        from: i64,
        range: &KeyRange,
        max_revisions: usize,
    ) -> Result<(Vec<Event>, i64), EtcdError> {
        self.changes_since_within(from, range, max_revisions, usize::MAX)
    }

    /// `changes_since`, stopping also at the first revision boundary past `max_bytes` of keys and
    /// values in range (at least one revision is read): a watcher replaying large values holds a
    /// bounded amount of them at a time.
    pub(crate) fn changes_since_within(
        &self,
        from: i64,
        range: &KeyRange,
        max_revisions: usize,
        max_bytes: usize,
    ) -> Result<(Vec<Event>, i64), EtcdError> {
        let start = Revision::new(from.max(0), 0).to_bytes();
        let bounds = (Bound::Included(&start[..]), Bound::Unbounded);
        let mut events = Vec::new();
        let mut revisions = 0;
        let mut read_bytes = 0;
        let mut last_main = None;
        for entry in self.store.revs.range(self.txn, &bounds)? {
            let (at, bytes) = entry?;
            let at = Revision::from_bytes(at).ok_or_else(|| corrupt("revision key"))?;
            if at.main > self.rev {
                break;
            }
            let (tag, kv) = decode_change(at, bytes)?;
            // Replay from the compacted revision itself meets what pending removal has not removed yet:
            // skipped as if removed, so replay never depends on how far removal got.
            if at.main <= self.compact_rev && !self.kept_by_compaction(at, &kv.key, tag)? {
                continue;
            }
            if last_main != Some(at.main) {
                if (max_revisions != 0 && revisions == max_revisions) || read_bytes >= max_bytes {
                    return Ok((events, at.main));
                }
                last_main = Some(at.main);
                revisions += 1;
            }
            if !range.contains(&kv.key) {
                continue;
            }
            let kind = if tag == TAG_PUT { EventType::Put } else { EventType::Delete };
            read_bytes += kv.key.len() + kv.value.len();
            events.push(Event { r#type: kind as i32, kv: Some(kv), prev_kv: None });
        }
        Ok((events, self.rev + 1))
    }
}

/// What `WriteTxn::delete_range` deleted.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Deleted {
    pub count: usize,
    /// The deleted key-values, when asked for.
    pub prev_kvs: Vec<KeyValue>,
    /// The store's revision after the delete.
    pub rev: i64,
}

/// How many keys `delete_range` finds in one walk of the index.
const DELETE_BATCH: usize = 1024;

/// New page bytes one deletion writes beyond four times its key (`ReadView::delete_footprint`): a
/// tombstone record (about 15 bytes and a 5-byte revision key), a history entry (about 10 bytes),
/// counted twice for half-full pages, a current entry (about 10 bytes), LMDB's 8-byte node header and
/// 2-byte pointer on each, and a share of the branch pages.
const DELETION_BYTES: u64 = 128;

/// How many records of `kv_revs` `ReadView::kvs_at` walks past, between two it wants, before it
/// seeks instead: about what one search of the tree costs.
const WALK_SLACK: usize = 16;

/// About how many bytes of new pages deleting `keys` keys of `key_bytes` bytes in all writes
/// (`ReadView::delete_footprint`).
pub(crate) fn deletion_footprint(keys: u64, key_bytes: u64) -> u64 {
    keys.saturating_mul(DELETION_BYTES).saturating_add(key_bytes.saturating_mul(4))
}

/// The changes of one raft entry, applied at one new revision.
pub(crate) struct WriteTxn<'a, 'e> {
    pub(super) store: &'a KvStore,
    pub(super) txn: &'a mut RwTxn<'e>,
    begin_rev: i64,
    /// The compacted revision (`compaction.rs` schedules a new one).
    pub(super) compact_rev: i64,
    /// Changes made so far; also the sub-revision of the next one.
    changes: i64,
    /// What happened, in order, for watchers.
    pub events: Vec<Event>,
}

impl<'e> WriteTxn<'_, 'e> {
    /// What this transaction sees: the store before it plus its own changes.
    pub(crate) fn view(&self) -> ReadView<'_> {
        ReadView { store: self.store, txn: self.txn, rev: self.rev(), compact_rev: self.compact_rev }
    }

    /// The revision reads in this transaction see: the new one once anything changed.
    pub(crate) fn rev(&self) -> i64 {
        if self.changes > 0 {
            self.begin_rev + 1
        } else {
            self.begin_rev
        }
    }

    /// A change recorded one key at a time, with its own index search: the reference the batched
    /// paths (`put`'s single search, `delete_range`'s ordered passes) are tested against.
    #[cfg(test)]
    fn record(&mut self, kv: &KeyValue, tag: u8) -> Result<(), EtcdError> {
        let at = self.append_change(kv, tag)?;
        self.store.index_change(self.txn, &kv.key, at, tag)
    }

    /// Appends the record of the next change to `kv_revs` (not to the index) and returns its revision.
    fn append_change(&mut self, kv: &KeyValue, tag: u8) -> Result<Revision, EtcdError> {
        let at = Revision::new(self.begin_rev + 1, self.changes);
        let change = encode_change(at, tag, kv);
        // Revisions only grow, so the record goes after every other: appending skips the search and
        // fills pages (LMDB splits a page it appends to at the end, not in the middle). A record out of
        // order would be refused (MDB_KEYEXIST), never written over.
        self.store.revs.put_with_flags(self.txn, PutFlags::APPEND, &at.to_bytes(), &change)?;
        self.changes += 1;
        Ok(at)
    }

    /// Writes `key = value` at the new revision and returns that revision.
    pub(crate) fn put(&mut self, key: &[u8], value: Vec<u8>, lease: i64) -> Result<i64, EtcdError> {
        let rev = self.begin_rev + 1;
        // The key's current entry, read once: for the previous version here, and for the index below.
        let found = self.store.current_in(self.txn, key)?;
        let prev = match found {
            Some((_, current)) if current.tag == TAG_PUT => Some(self.view().kv_at(current.at)?),
            _ => None,
        };
        let kv = KeyValue {
            key: key.to_vec(),
            create_revision: prev.as_ref().map_or(rev, |p| p.create_revision),
            mod_revision: rev,
            version: prev.as_ref().map_or(0, |p| p.version) + 1,
            value,
            lease,
        };
        let at = self.append_change(&kv, TAG_PUT)?;
        self.store.index_change_over(self.txn, &kv.key, at, TAG_PUT, found)?;
        self.events.push(Event { r#type: EventType::Put as i32, kv: Some(kv), prev_kv: prev });
        Ok(rev)
    }

    /// Deletes every existing key in `range`. Each deleted key-value is held once, in its event (which
    /// watchers and the lease attachments read); `keep` also returns them, for a request that asked
    /// for them (`prev_kv`). The keys are found `DELETE_BATCH` at a time, so no list of every key in
    /// the range is held beside the events.
    pub(crate) fn delete_range(&mut self, range: &KeyRange, keep: bool) -> Result<Deleted, EtcdError> {
        let mut deleted = Deleted::default();
        // The key the next batch starts after: the last key deleted.
        let mut after: Option<Vec<u8>> = None;
        loop {
            // The next keys that exist, from their current entries (a key whose newest change is a
            // tombstone is not there), with where each entry is.
            let mut batch = Vec::new();
            let mut currents = self.store.currents(self.txn, range, after.as_deref())?;
            let (mut walked, mut ended) = (None, false);
            while batch.len() < DELETE_BATCH {
                let Some(entry) = currents.next_with_region() else {
                    ended = true;
                    break;
                };
                let entry = entry?;
                walked = Some(entry.key.clone());
                if entry.current.tag == TAG_PUT {
                    // The tombstone's revision is set when its record is appended, below.
                    batch.push((entry, Revision::new(0, 0)));
                }
            }
            drop(currents);
            let Some(last) = walked else { break };
            after = Some(last);
            // The previous values in one walk of `kv_revs`, then the tombstones in key order: their
            // records appended, then the index in one ordered pass (`KvStore::supersede_in_order`).
            let revisions: Vec<Revision> = batch.iter().map(|(entry, _)| entry.current.at).collect();
            let prevs = self.view().kvs_at(&revisions)?;
            for ((entry, at), prev) in batch.iter_mut().zip(prevs) {
                let tombstone =
                    KeyValue { key: entry.key.clone(), mod_revision: self.begin_rev + 1, ..Default::default() };
                *at = self.append_change(&tombstone, TAG_TOMBSTONE)?;
                deleted.count += 1;
                if keep {
                    deleted.prev_kvs.push(prev.clone());
                }
                self.events.push(Event { r#type: EventType::Delete as i32, kv: Some(tombstone), prev_kv: Some(prev) });
            }
            self.store.supersede_in_order(self.txn, &batch, TAG_TOMBSTONE)?;
            if ended {
                break;
            }
        }
        deleted.rev = self.rev();
        Ok(deleted)
    }

    /// Records the new current revision (if anything changed) and hands back what happened.
    pub(crate) fn finish(self) -> Result<(i64, Vec<Event>), EtcdError> {
        let rev = self.rev();
        if self.changes > 0 {
            self.store.meta.put(self.txn, CURRENT_REV, &rev.to_be_bytes())?;
        }
        Ok((rev, self.events))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, crate::storage::LmdbEnv, KvStore) {
        let dir = tempfile::tempdir().unwrap();
        let (env, kv) = KvStore::open_for_tests(dir.path(), crate::storage::table::CHUNK).unwrap();
        (dir, env, kv)
    }

    fn write<T>(env: &crate::storage::LmdbEnv, kv: &KvStore, f: impl FnOnce(&mut WriteTxn) -> T) -> T {
        let mut txn = env.write_txn().unwrap();
        let out = {
            let mut w = kv.begin(&mut txn).unwrap();
            let out = f(&mut w);
            w.finish().unwrap();
            out
        };
        txn.commit().unwrap();
        out
    }

    /// Keys written in reverse order, each `gap` revisions after the one before (other keys changing
    /// in between): `kvs_at` must both walk (gap 1) and seek (a gap past `WALK_SLACK`), and hand the
    /// values back in the order asked, not the order read.
    #[test]
    fn previous_values_come_back_in_the_order_asked_however_far_apart() {
        for gap in [1, WALK_SLACK + 2] {
            let (_dir, env, kv) = store();
            let keys: Vec<Vec<u8>> = (0..300).rev().map(|i| format!("k{i:03}").into_bytes()).collect();
            for key in &keys {
                write(&env, &kv, |w| w.put(key, key.repeat(2), 0).unwrap());
                for _ in 1..gap {
                    write(&env, &kv, |w| w.put(b"other", b"x".to_vec(), 0).unwrap());
                }
            }
            let txn = env.read_txn().unwrap();
            let view = kv.view(&txn).unwrap();
            let mut revisions = Vec::new();
            view.each_key(&KeyRange::new(b"k", b"l"), view.rev, None, |_, at| {
                revisions.push(at);
                Ok(true)
            })
            .unwrap();
            let got: Vec<Vec<u8>> = view.kvs_at(&revisions).unwrap().into_iter().map(|kv| kv.key).collect();
            let mut in_key_order = keys.clone();
            in_key_order.sort();
            assert_eq!(got, in_key_order, "gap {gap}");
            let missing = Revision::new(view.rev + 1, 0);
            assert_eq!(view.kvs_at(&[revisions[0], missing]).unwrap_err(), EtcdError::Internal);
        }
    }

    /// A delete of more keys than one batch whose revisions run against key order: every key goes,
    /// in key order, each event carrying the value the key had.
    #[test]
    fn a_delete_of_many_batches_reports_each_previous_value_in_key_order() {
        let (_dir, env, kv) = store();
        let total = DELETE_BATCH * 2 + 7;
        write(&env, &kv, |w| {
            for i in (0..total).rev() {
                w.put(format!("k{i:05}").as_bytes(), format!("v{i}").into_bytes(), 0).unwrap();
            }
        });
        let (deleted, events) = write(&env, &kv, |w| {
            let deleted = w.delete_range(&KeyRange::new(b"k", b"l"), false).unwrap();
            (deleted, std::mem::take(&mut w.events))
        });
        assert_eq!((deleted.count, deleted.prev_kvs.len()), (total, 0));
        for (i, event) in events.iter().enumerate() {
            let prev = event.prev_kv.as_ref().unwrap();
            assert_eq!(
                (prev.key.clone(), prev.value.clone()),
                (format!("k{i:05}").into_bytes(), format!("v{i}").into_bytes())
            );
            assert_eq!(event.kv.as_ref().unwrap().key, prev.key);
        }
        let txn = env.read_txn().unwrap();
        assert_eq!(kv.view(&txn).unwrap().range(&KeyRange::new(b"k", b"l"), 0, 0, true).unwrap().count, 0);
    }

    /// A delete through the batched path (`supersede_in_order`: history first, then the current
    /// entries region by region, long entries through the groups) leaves exactly the tables that
    /// recording each deletion alone (`record`, as every other change is) leaves: over several batches,
    /// keys in staging and in newest, keys already deleted, a key put earlier in the same transaction,
    /// and keys whose history or current entry is longer than a chunk (a 16-byte chunk).
    #[test]
    fn a_batched_delete_writes_the_tables_one_change_at_a_time_would() {
        let chunk = 16;
        let open = || {
            let dir = tempfile::tempdir().unwrap();
            let (env, kv) = KvStore::open_for_tests(dir.path(), chunk).unwrap();
            (dir, env, kv)
        };
        let ((_a, env_a, kv_a), (_b, env_b, kv_b)) = (open(), open());
        // Short keys (every entry whole), 10-byte keys (their history entry in groups), 20-byte keys
        // (both entries in groups); written twice, so most have a history; the last ones still staged.
        let key = |i: usize| match i % 7 {
            0 => format!("k{i:08}-long-key-{i:03}").into_bytes()[..20].to_vec(),
            1 => format!("k{i:09}").into_bytes(),
            _ => format!("k{i:04}").into_bytes(),
        };
        let total = DELETE_BATCH * 2 + 300;
        let range = KeyRange::new(b"k", b"l");
        for (env, kv) in [(&env_a, &kv_a), (&env_b, &kv_b)] {
            for round in 0..2 {
                write(env, kv, |w| {
                    for i in (0..total).filter(|i| round == 0 || i % 3 != 0) {
                        w.put(&key(i), format!("{round}-{i}").into_bytes(), 0).unwrap();
                    }
                });
            }
            write(env, kv, |w| {
                for i in (0..total).step_by(11) {
                    w.delete_range(&KeyRange::Single(key(i)), false).unwrap();
                }
            });
        }
        let batched = write(&env_a, &kv_a, |w| {
            w.put(&key(5), b"same revision".to_vec(), 0).unwrap();
            w.delete_range(&range, true).unwrap()
        });
        let one_by_one = write(&env_b, &kv_b, |w| {
            w.put(&key(5), b"same revision".to_vec(), 0).unwrap();
            let mut deleted = Deleted::default();
            let existing = w.view().range(&range, 0, 0, false).unwrap().kvs;
            for prev in existing {
                let tombstone = KeyValue { key: prev.key.clone(), mod_revision: w.begin_rev + 1, ..Default::default() };
                w.record(&tombstone, TAG_TOMBSTONE).unwrap();
                deleted.count += 1;
                deleted.prev_kvs.push(prev);
            }
            deleted.rev = w.rev();
            deleted
        });
        assert_eq!(batched, one_by_one);
        assert!(batched.count > DELETE_BATCH * 2, "{} keys deleted", batched.count);
        let (txn_a, txn_b) = (env_a.read_txn().unwrap(), env_b.read_txn().unwrap());
        assert_eq!(kv_a.records_for_tests(&txn_a), kv_b.records_for_tests(&txn_b));
        // Every entry whole, in its region (the group ids of long entries are allocated in another
        // order, which no reader sees).
        let entries = |kv: &KvStore, txn: &heed::RoTxn| -> Vec<(Vec<u8>, Vec<u8>)> {
            kv.index.iter(txn).unwrap().map(|e| e.map(|(k, v)| (k.into_owned(), v.to_vec())).unwrap()).collect()
        };
        assert_eq!(entries(&kv_a, &txn_a), entries(&kv_b, &txn_b), "the index's entries, region by region");
    }

    /// Keys whose history entries (key, terminator, a 5- to 6-byte revision) end just below, at and
    /// just past the longest key `Table` stores whole, and past LMDB's 511 bytes: each written twice,
    /// every other one deleted, compacted, then read now and as of before the deletions.
    #[test]
    fn keys_around_lmdbs_limit_keep_their_history_through_compaction() {
        let (_dir, env, kv) = store();
        let chunk = crate::storage::table::CHUNK;
        let lengths: Vec<usize> = (chunk - 10..chunk + 4).chain([511, 512, 4096]).collect();
        let key = |len: usize| vec![b'k'; len - 1].into_iter().chain([b'0' + (len % 10) as u8]).collect::<Vec<u8>>();
        for round in 0..2 {
            for &len in &lengths {
                write(&env, &kv, |w| w.put(&key(len), format!("{round}-{len}").into_bytes(), 0).unwrap());
            }
        }
        let before_deletes = write(&env, &kv, |w| w.rev());
        for &len in lengths.iter().step_by(2) {
            write(&env, &kv, |w| w.delete_range(&KeyRange::Single(key(len)), false).unwrap());
        }
        write(&env, &kv, |w| w.compact(before_deletes).unwrap());
        loop {
            let mut txn = env.write_txn().unwrap();
            let step = kv.compaction_step(&mut txn, 3).unwrap();
            txn.commit().unwrap();
            if step.pending.is_none() {
                break;
            }
        }
        let txn = env.read_txn().unwrap();
        let view = kv.view(&txn).unwrap();
        let all = KeyRange::new(b"\0", b"\0");
        let read = |rev| -> Vec<(usize, Vec<u8>)> {
            view.range(&all, rev, 0, false).unwrap().kvs.into_iter().map(|kv| (kv.key.len(), kv.value)).collect()
        };
        let mut then: Vec<(usize, Vec<u8>)> =
            lengths.iter().map(|&len| (len, format!("1-{len}").into_bytes())).collect();
        then.sort_by_key(|(len, _)| key(*len));
        assert_eq!(read(before_deletes), then);
        let now: Vec<_> =
            then.iter().filter(|(len, _)| lengths.iter().position(|l| l == len).unwrap() % 2 == 1).cloned().collect();
        assert_eq!(read(0), now);
        for &len in &lengths {
            let found = view.range(&KeyRange::Single(key(len)), 0, 0, false).unwrap().kvs;
            assert_eq!(found.len(), now.iter().filter(|(l, _)| *l == len).count(), "key of {len} bytes");
        }
        // What the compaction keeps: each key's second put, and the deletions above it.
        let records = kv.records_for_tests(&txn);
        let kept = lengths.len() + (lengths.len() - now.len());
        assert_eq!((records[0].len(), records[1].len()), (kept, kept));
    }
}
