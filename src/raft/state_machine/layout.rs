//! The layout of the kv tables in a data dir, and the migration from the older one, run once as the
//! state opens.
//!
//! - Layout 1 (no version recorded in `sm_meta`): `kv_live` held each existing key's current
//!   `KeyValue`, a second copy of its newest record in `kv_revs`.
//! - Layout 2: each value is stored once, in `kv_revs`; current reads go through `kv_index`
//!   (`mvcc/store.rs`). `kv_live` is empty: its database stays in data dirs that had it (LMDB frees
//!   its pages; removing the name itself would take heed's `unsafe` `remove`).
//!
//! - Layout 3: revisions and `kv_revs` records in short encodings (`mvcc/revision.rs`,
//!   `mvcc/record.rs`): 5 bytes instead of 16 per revision, varints instead of protobuf fields, about
//!   a fifth less space per key and version. `Hash` and `HashKV` hash layout 2's forms, so their values
//!   are the same for the same data in either layout.
//!
//! - Layout 4: `kv_index` in three regions (`mvcc/index.rs`): each key's newest change apart from the
//!   history of the versions it superseded, so that the newest entries fill their pages (about half
//!   of layout 3's index per key, fresh and after a compaction). `Hash` merges the regions back into
//!   layout 3's order, so its value is the same for the same data.
//!
//! The migration from 1 empties `kv_live` (with the groups its long keys had in `long_keys`) and records
//! layout 2, in one write transaction: a crash before the commit leaves layout 1 whole, to be migrated
//! at the next open; after it, layout 2. Snapshots of layout 1 carry `kv_live`'s records: installing
//! one skips them (`snapshot/format.rs`) and removes the groups they named (`skip_legacy_live`).
//!
//! The migration from 2 converts the kv tables in steps of `UPGRADE_STEP` records, each its own
//! write transaction (bounded memory and dirty pages, whatever the store's size), then records layout
//! 3; what is left to convert is read from the data (`mvcc/upgrade.rs`), so a crash in between
//! resumes. The migration from 3 converts the index in steps of `UPGRADE_STEP` entries the same way,
//! then records layout 4. The environment is synced once at the end, when anything was converted. An
//! installed snapshot is recorded as layout 2 and converted right after its commit: a snapshot of a
//! member of layout 3, 2 (or 1) installs on this version, and one of layout 4 has nothing to convert.

use super::state::{BoxError, State};
use crate::error::EtcdError;
use crate::mvcc::KvStore;
use crate::storage::table::LongKeys;

/// The `sm_meta` key of the layout's version.
const LAYOUT: &[u8] = b"layout";
/// The layout this version writes.
const CURRENT: u32 = 4;
/// The layout whose encodings `mvcc/upgrade.rs` converts.
const SHORT_ENCODINGS: u32 = 3;
/// The layout with each value stored once.
const VALUES_ONCE: u32 = 2;
/// Legacy records (or index entries) converted per write transaction of the migrations to layouts 3
/// and 4.
const UPGRADE_STEP: usize = 10_000;

impl State {
    /// Brings the tables to the current layout if they are of an older one; refuses a newer one.
    pub(in crate::raft::state_machine) fn migrate_layout(&self) -> Result<(), BoxError> {
        let recorded = {
            let txn = self.read_txn()?;
            self.read_meta::<u32>(&txn, LAYOUT)?
        };
        match recorded {
            Some(CURRENT) => return Ok(()),
            Some(newer) if newer > CURRENT => {
                return Err(format!("the kv tables have layout {newer}; this keyward reads layout {CURRENT}").into())
            }
            _ => {}
        }
        let started = std::time::Instant::now();
        let mut live = 0;
        if recorded.is_none_or(|layout| layout < VALUES_ONCE) {
            let mut txn = self.env.write_txn()?;
            live = self.legacy_live.main_db().len(&txn)?;
            self.legacy_live.clear(&mut txn)?;
            self.meta.put(&mut txn, LAYOUT, &postcard::to_allocvec(&VALUES_ONCE)?)?;
            txn.commit()?;
        }
        let mut steps = 0u64;
        if recorded.is_none_or(|layout| layout < SHORT_ENCODINGS) {
            steps += self.migrate_in_steps(SHORT_ENCODINGS, KvStore::upgrade_step)?;
        }
        steps += self.migrate_in_steps(CURRENT, KvStore::regions_step)?;
        if live > 0 || steps > 0 {
            // Synced once, so that no later crash can bring an older layout's records back under the
            // new version (each step is also safe on its own: what is left is read from the data).
            // A fresh data dir (nothing dropped) is not synced: losing its version record only
            // means recording it again, and a member's kv environment is never synced while it
            // runs (`raft/unsynced.rs`).
            self.sync()?;
            tracing::info!(
                from = recorded.unwrap_or(1),
                to = CURRENT,
                dropped = live,
                converted_steps = steps,
                elapsed = ?started.elapsed(),
                "kv tables migrated: each value stored once, in short encodings, newest versions apart"
            );
        }
        Ok(())
    }

    /// Runs `step` (of at most `UPGRADE_STEP` records, each its own committed transaction) until it
    /// reports done, and records `layout` in the transaction of the last one. Returns the steps
    /// before the last.
    fn migrate_in_steps(
        &self,
        layout: u32,
        step: impl Fn(&KvStore, &mut heed::RwTxn, usize) -> Result<bool, EtcdError>,
    ) -> Result<u64, BoxError> {
        let mut steps = 0;
        loop {
            let mut txn = self.env.write_txn()?;
            let done = step(&self.kv, &mut txn, UPGRADE_STEP)?;
            if done {
                self.meta.put(&mut txn, LAYOUT, &postcard::to_allocvec(&layout)?)?;
            }
            txn.commit()?;
            if done {
                return Ok(steps);
            }
            steps += 1;
        }
    }
}

/// The groups in `long_keys` that a layout-1 snapshot's `kv_live` records open, collected while its
/// records are skipped, to be removed once `long_keys` is loaded.
#[derive(Default)]
pub(super) struct SkippedLive {
    groups: Vec<u64>,
}

impl SkippedLive {
    /// Notes one skipped `kv_live` record.
    pub(super) fn skip(&mut self, long: &LongKeys, key: &[u8], value: &[u8]) -> heed::Result<()> {
        if let Some(id) = long.marker_group(key, value)? {
            self.groups.push(id);
        }
        Ok(())
    }

    /// Removes the groups the skipped records opened, and records layout 2 in `txn`: the installed
    /// tables may be of layout 2's encodings, which `migrate_layout`, called after the commit,
    /// converts (it finds nothing to convert in a snapshot of layout 3).
    pub(super) fn finish(self, state: &State, txn: &mut heed::RwTxn) -> Result<(), BoxError> {
        for id in self.groups {
            state.long.remove_group(txn, id)?;
        }
        state.meta.put(txn, LAYOUT, &postcard::to_allocvec(&VALUES_ONCE)?)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::keyrange::KeyRange;
    use crate::proto::mvccpb::KeyValue;
    use crate::raft::state_machine::snapshot::format;
    use crate::raft::state_machine::snapshot_tests::{delete, put};
    use crate::raft::state_machine::testing::TableRecords;
    use crate::raft::state_machine::StateMachine;

    fn open(dir: &std::path::Path) -> StateMachine {
        StateMachine::open(&dir.join("kv"), &dir.join("snap")).expect("open")
    }

    /// Short keys, and keys past LMDB's 511 bytes (one and two levels of groups in `long_keys`), one
    /// of each deleted again.
    fn fill(state: &State) {
        let keys: Vec<Vec<u8>> = vec![b"a".to_vec(), b"b".to_vec(), vec![b'l'; 600], vec![b'm'; 1500], vec![b'n'; 700]];
        for (i, key) in keys.iter().enumerate() {
            let results = state.apply_requests(2 + i as u64, vec![put(key, format!("value {i}").as_bytes(), 0)]);
            assert!(results.iter().all(Result::is_ok), "{results:?}");
        }
        for (i, key) in [b"b".to_vec(), vec![b'n'; 700]].iter().enumerate() {
            let results = state.apply_requests(10 + i as u64, vec![delete(key)]);
            assert!(results.iter().all(Result::is_ok), "{results:?}");
        }
    }

    fn current(state: &State) -> Vec<KeyValue> {
        let txn = state.read_txn().unwrap();
        state.kv.view(&txn).unwrap().range(&KeyRange::new(b"\0", b"\0"), 0, 0, false).unwrap().kvs
    }

    /// Every table's records, but the group counter of `long_keys` (the last table), which counts the
    /// groups ever allocated, those of `kv_live` included.
    fn records_but_the_group_counter(state: &State) -> TableRecords {
        let mut records = state.table_records();
        if let Some(long) = records.last_mut() {
            long.retain(|(key, _)| !key.starts_with(&[0; 8]));
        }
        records
    }

    /// Makes the tables what layout 1 held for the same entries: `kv_live` holding each current
    /// key-value (long keys in groups, as `Table` stores them), and no layout recorded.
    fn downgrade(state: &State) {
        let kvs = current(state);
        let mut txn = state.env.write_txn().unwrap();
        for kv in &kvs {
            state.legacy_live.put(&mut txn, &kv.key, &kv.encode_to_vec()).unwrap();
        }
        state.meta.delete(&mut txn, LAYOUT).unwrap();
        txn.commit().unwrap();
        let txn = state.read_txn().unwrap();
        assert_eq!(state.legacy_live.main_db().len(&txn).unwrap(), 3, "a, the 600- and the 1500-byte key");
    }

    /// The kv tables' part of `Hash` (the whole `Hash` also covers `long_keys`, whose group counter
    /// counts `kv_live`'s groups too), and `HashKV`.
    fn kv_hashes(state: &State) -> (u32, crate::mvcc::hash::KvHash) {
        let txn = state.read_txn().unwrap();
        let view = state.kv.view(&txn).unwrap();
        (view.hash_all().unwrap(), view.hash_kv(0).unwrap())
    }

    fn layout(state: &State) -> Option<u32> {
        let txn = state.read_txn().unwrap();
        state.read_meta(&txn, LAYOUT).unwrap()
    }

    /// Fails without the migration: `kv_live` keeps its records and `long_keys` the groups of them.
    #[test]
    fn a_data_dir_of_layout_1_opens_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let (records, kvs, hash) = {
            let sm = open(dir.path());
            let state = sm.state();
            assert_eq!(layout(&state), Some(CURRENT), "a new data dir is of the current layout");
            fill(&state);
            let hash = kv_hashes(&state);
            let before = (records_but_the_group_counter(&state), current(&state), hash);
            downgrade(&state);
            assert_ne!(records_but_the_group_counter(&state), before.0, "kv_live's long keys are in long_keys");
            before
        };
        let sm = open(dir.path());
        let state = sm.state();
        assert_eq!(layout(&state), Some(CURRENT));
        assert_eq!(state.legacy_live.main_db().len(&state.read_txn().unwrap()).unwrap(), 0, "kv_live emptied");
        assert_eq!(records_but_the_group_counter(&state), records, "nothing of kv_live is left in long_keys");
        assert_eq!(current(&state), kvs);
        assert_eq!(kv_hashes(&state), hash, "Hash of the kv tables and HashKV unchanged");
        // A layout newer than this version's is refused, not misread.
        let mut txn = state.env.write_txn().unwrap();
        state.meta.put(&mut txn, LAYOUT, &postcard::to_allocvec(&(CURRENT + 1)).unwrap()).unwrap();
        txn.commit().unwrap();
        drop((state, sm));
        let refused = StateMachine::open(&dir.path().join("kv"), &dir.path().join("snap")).err().map(|e| e.to_string());
        assert!(refused.as_deref().is_some_and(|e| e.contains(&format!("layout {CURRENT}"))), "{refused:?}");
    }

    /// A backup of a layout-1 member (`etcdctl snapshot save`: a copy of its environment) opens as
    /// `keyward snapshot restore` opens it (`open_offline`) at layout 2, with the same keys.
    #[test]
    fn a_backup_of_layout_1_restores_as_layout_2() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (records, kvs) = {
            let source = open(a.path());
            let source = source.state();
            fill(&source);
            let before = (records_but_the_group_counter(&source), current(&source));
            downgrade(&source);
            std::fs::create_dir_all(b.path().join("kv")).unwrap();
            let mut backup = std::fs::File::create(b.path().join("kv").join("data.mdb")).unwrap();
            source.copy_to_file(&mut backup, heed::CompactionOption::Disabled).unwrap();
            before
        };
        let restored = StateMachine::open_offline(&b.path().join("kv"), &b.path().join("snap")).unwrap().state();
        assert_eq!(layout(&restored), Some(CURRENT));
        assert_eq!(restored.legacy_live.main_db().len(&restored.read_txn().unwrap()).unwrap(), 0);
        assert_eq!(records_but_the_group_counter(&restored), records);
        assert_eq!(current(&restored), kvs);
    }

    /// A snapshot a member of layout 1 built (its tables, `kv_live` first) installs on a member of
    /// layout 2 as the same state: fails without the skip (one table too many) and without removing
    /// the groups (`long_keys` would differ).
    #[test]
    fn a_snapshot_of_layout_1_installs_as_layout_2() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (source, target) = (open(a.path()), open(b.path()));
        let source = source.state();
        fill(&source);
        let (records, kvs) = (records_but_the_group_counter(&source), current(&source));
        downgrade(&source);
        let (meta, _) = source.build_snapshot().unwrap();
        let legacy = a.path().join("layout-1.snap");
        {
            let txn = source.read_txn().unwrap();
            let tables: Vec<_> = [source.legacy_live.main_db()].into_iter().chain(source.tables()).collect();
            format::write(std::fs::File::create(&legacy).unwrap(), &meta, &tables, &txn, &|| false).unwrap();
        }
        target.kv.install_snapshot(&meta, std::fs::File::open(&legacy).unwrap(), None).unwrap();
        let target = target.state();
        assert_eq!(records_but_the_group_counter(&target), records);
        assert_eq!(current(&target), kvs);
        assert_eq!(target.legacy_live.main_db().len(&target.read_txn().unwrap()).unwrap(), 0);
        assert_eq!(layout(&target), Some(CURRENT));
    }

    /// `kv_revs` as stored and `kv_index` as its `Table` reads (long keys whole: the conversion
    /// moves them to new groups of `long_keys`).
    fn kv_records(state: &State) -> Vec<(Vec<u8>, Vec<u8>)> {
        state.kv.records_for_tests(&state.read_txn().unwrap()).concat()
    }

    /// Makes the tables what layout 2 held for the same entries (`KvStore::downgrade_for_tests`).
    fn downgrade_to_2(state: &State) {
        let mut txn = state.env.write_txn().unwrap();
        state.kv.downgrade_for_tests(&mut txn);
        state.meta.put(&mut txn, LAYOUT, &postcard::to_allocvec(&VALUES_ONCE).unwrap()).unwrap();
        txn.commit().unwrap();
    }

    /// Fails without the conversion at open: the tables keep layout 2's encodings, which layout 3's
    /// reads refuse as corrupt.
    #[test]
    fn a_data_dir_of_layout_2_opens_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let (records, kvs, hash) = {
            let sm = open(dir.path());
            let state = sm.state();
            fill(&state);
            let before = (kv_records(&state), current(&state), kv_hashes(&state));
            downgrade_to_2(&state);
            assert_ne!(kv_records(&state), before.0);
            before
        };
        let sm = open(dir.path());
        let state = sm.state();
        assert_eq!(layout(&state), Some(CURRENT));
        assert_eq!(kv_records(&state), records);
        assert_eq!(current(&state), kvs);
        assert_eq!(kv_hashes(&state), hash, "Hash of the kv tables and HashKV unchanged");
    }

    /// A snapshot a member of layout 2 built installs on a member of layout 3 as the same state.
    #[test]
    fn a_snapshot_of_layout_2_installs_as_layout_3() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (source, target) = (open(a.path()), open(b.path()));
        let source = source.state();
        fill(&source);
        let (records, kvs) = (kv_records(&source), current(&source));
        downgrade_to_2(&source);
        let (meta, _) = source.build_snapshot().unwrap();
        let legacy = a.path().join("layout-2.snap");
        {
            let txn = source.read_txn().unwrap();
            format::write(std::fs::File::create(&legacy).unwrap(), &meta, &source.tables(), &txn, &|| false).unwrap();
        }
        target.kv.install_snapshot(&meta, std::fs::File::open(&legacy).unwrap(), None).unwrap();
        let target = target.state();
        assert_eq!(kv_records(&target), records);
        assert_eq!(current(&target), kvs);
        assert_eq!(layout(&target), Some(CURRENT));
    }
}
