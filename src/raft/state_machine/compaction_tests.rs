//! Removal of compacted versions on the state machine (`compaction.rs`, `mvcc/compaction.rs`): the
//! Compact entry removes nothing, steps are bounded and whole, a restart or a snapshot install in the
//! middle resumes, and `HashKV` does not move while removal runs.

use std::sync::atomic::Ordering;

use super::compaction::StepFailure;
use super::snapshot_tests::put;
use super::*;
use crate::error::EtcdError;
use crate::keyrange::KeyRange;
use crate::proto::etcdserverpb::{CompactionRequest, InternalRaftRequest};

fn open(dir: &Path) -> StateMachine {
    StateMachine::open(&dir.join("kv"), &dir.join("snap")).expect("open")
}

fn compaction(revision: i64) -> InternalRaftRequest {
    InternalRaftRequest {
        compaction: Some(Box::new(CompactionRequest { revision, physical: false })),
        ..Default::default()
    }
}

/// Ten keys written three times each (entries 1–30, revisions 2–31), then compacted at 31 (entry 31).
fn overwritten_and_compacted(state: &State) {
    for round in 0..3 {
        for key in 0..10u64 {
            let index = round * 10 + key + 1;
            let results = state.apply_requests(index, vec![put(format!("k{key}").as_bytes(), b"v", 0)]);
            assert!(results.iter().all(Result::is_ok), "{results:?}");
        }
    }
    let results = state.apply_requests(31, vec![compaction(31)]);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
}

/// The versions held: records of `kv_revs` (the first of the store's tables).
fn versions(state: &State) -> u64 {
    let txn = state.read_txn().expect("read txn");
    let [revs, ..] = state.kv.tables();
    revs.len(&txn).expect("len")
}

fn hash_kv(state: &State) -> u32 {
    let txn = state.read_txn().expect("read txn");
    state.kv.view(&txn).expect("view").hash_kv(0).expect("hash_kv").hash
}

/// Steps of at most `limit` until removal is done; each removes at most `limit`, and `HashKV` holds.
fn remove_all(sm: &StateMachine, limit: usize, hash: u32) -> usize {
    let mut steps = 0;
    loop {
        let before = versions(&sm.state());
        let step = sm.kv.try_compaction_step(limit).expect("step");
        assert!(step.removed <= limit && step.examined <= limit, "{step:?}");
        assert_eq!(before - versions(&sm.state()), step.removed as u64);
        assert_eq!(hash_kv(&sm.state()), hash, "HashKV moved after {step:?}");
        steps += 1;
        if step.pending.is_none() {
            return steps;
        }
    }
}

#[test]
fn the_compact_entry_removes_nothing_and_a_restart_resumes_removal() {
    let dir = tempfile::tempdir().unwrap();
    let sm = open(dir.path());
    overwritten_and_compacted(&sm.state());
    assert_eq!(versions(&sm.state()), 30, "the entry itself removed versions");
    assert_eq!(sm.kv.removal().unwrap(), (31, true));
    {
        let state = sm.state();
        let txn = state.read_txn().unwrap();
        let view = state.kv.view(&txn).unwrap();
        assert_eq!(view.range(&KeyRange::From(Vec::new()), 30, 0, false).unwrap_err(), EtcdError::Compacted);
        assert_eq!(view.range(&KeyRange::From(Vec::new()), 31, 0, false).unwrap().count, 10);
    }
    let hash = hash_kv(&sm.state());
    let step = sm.kv.try_compaction_step(4).unwrap();
    // Removal walks the history (layout 4): each of its first four entries is superseded at or below 31.
    assert_eq!((step.removed, step.pending), (4, Some(31)), "the first four history entries go");
    let step = sm.kv.try_compaction_step(10).unwrap();
    assert!(step.removed > 0 && step.pending.is_some(), "{step:?}");
    assert_eq!(hash_kv(&sm.state()), hash);
    drop(sm);

    let sm = open(dir.path());
    assert_eq!(sm.kv.removal().unwrap(), (31, true), "pending across the restart");
    remove_all(&sm, 3, hash);
    assert_eq!(versions(&sm.state()), 10, "each key's newest version is left");
    assert_eq!(sm.kv.removal().unwrap(), (31, false));

    // The same entries on a member that removed everything in one step: the same tables.
    let other_dir = tempfile::tempdir().unwrap();
    let other = open(other_dir.path());
    overwritten_and_compacted(&other.state());
    assert_eq!(remove_all(&other, 1_000, hash), 1);
    assert_eq!(other.state().table_records(), sm.state().table_records());
}

#[test]
fn a_snapshot_built_mid_removal_carries_it_and_its_installer_resumes() {
    let (source_dir, target_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let source = open(source_dir.path());
    overwritten_and_compacted(&source.state());
    let hash = hash_kv(&source.state());
    let step = source.kv.try_compaction_step(12).unwrap();
    assert!(step.removed > 0 && step.pending.is_some(), "{step:?}");

    let target = open(target_dir.path());
    target.kv.install_snapshot_of(&source.state()).unwrap();
    assert_eq!(target.kv.removal().unwrap(), (31, true));
    assert_eq!(hash_kv(&target.state()), hash);
    remove_all(&target, 5, hash);
    remove_all(&source, 1_000, hash);
    assert_eq!(target.state().table_records(), source.state().table_records());
    assert_eq!(versions(&target.state()), 10);
}

#[test]
fn a_compaction_while_removal_is_pending_extends_it() {
    let dir = tempfile::tempdir().unwrap();
    let sm = open(dir.path());
    for index in 1..=6 {
        let results = sm.state().apply_requests(index, vec![put(b"k", format!("{index}").as_bytes(), 0)]);
        assert!(results.iter().all(Result::is_ok), "{results:?}");
    }
    // Revisions 2..=7 are versions of k; compact at 4, remove part, then compact at 7.
    assert!(sm.state().apply_requests(7, vec![compaction(4)])[0].is_ok());
    let step = sm.kv.try_compaction_step(1).unwrap();
    assert_eq!(step.pending, Some(4));
    assert!(sm.state().apply_requests(8, vec![compaction(7)])[0].is_ok());
    assert_eq!(sm.kv.removal().unwrap(), (7, true));
    remove_all(&sm, 1, hash_kv(&sm.state()));
    assert_eq!(versions(&sm.state()), 1, "only k@7 is left");
}

#[test]
fn a_step_that_finds_storage_full_keeps_nothing_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let sm = open(dir.path());
    overwritten_and_compacted(&sm.state());
    let before = sm.state().table_records();
    sm.state().inject_full.store(1, Ordering::SeqCst);
    assert!(matches!(sm.kv.try_compaction_step(1_000), Err(StepFailure::Full(_))));
    assert_eq!(sm.state().table_records(), before);
    let step = sm.kv.try_compaction_step(1_000).unwrap();
    assert_eq!((step.removed, step.pending), (20, None));
}

#[test]
fn a_step_waits_while_a_writer_holds_the_gate() {
    let dir = tempfile::tempdir().unwrap();
    let sm = open(dir.path());
    overwritten_and_compacted(&sm.state());
    let busy = sm.kv.write(|_| sm.kv.try_compaction_step(1_000));
    assert!(matches!(busy, Err(StepFailure::Busy)), "{busy:?}");
    assert_eq!(versions(&sm.state()), 30);
}
