//! Defragment: the kv environment replaced, while the member runs, by a compacting copy of itself
//! (LMDB's `mdb_env_copy2` with `MDB_CP_COMPACT`: free pages left out, the file as small as the data).
//!
//! LMDB reuses freed pages in place but never shrinks its file; only a new file gives the space back
//! to the file system. The steps, each leaving `data.mdb` complete should the process die:
//!
//! 1. Writes pause (`KvEnv::writing`: apply and snapshot installs wait; reads go on on the old
//!    environment), so the copy is the latest applied state and nothing applied after it is lost.
//! 2. The copy is written to `data.mdb.defrag.tmp` in the same directory and fsynced; the old file
//!    gets a second name, `data.mdb.predefrag` (a hard link: no space, no copy).
//! 3. New readers wait (the write lock of `KvEnv::current`) while those in flight finish; the old
//!    environment is closed (heed refuses to open a path that is open in the process).
//! 4. The copy is renamed over `data.mdb`, the directory fsynced, and the copy opened; readers and
//!    writers resume on it. Should that fail, the old file is renamed back and opened again.
//! 5. `data.mdb.predefrag` is removed: this is when the space is returned.
//!
//! The files are `storage::compacted`'s; its `remove_leftovers` (at every open) removes what a crash
//! left of steps 2–5: `data.mdb` is the old file or the complete, synced copy, never anything else.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use super::{BoxError, KvEnv, State};
use crate::storage::compacted;

/// How long new readers may wait for the reads in flight on the old environment (a snapshot being
/// built or sent holds one for its whole length). Past it the defragment fails and nothing changed.
/// (Short in unit tests, which hold a read past it.)
const DRAIN_DEADLINE: Duration = if cfg!(test) { Duration::from_millis(500) } else { Duration::from_secs(10) };
/// Once every `State` of the old environment is gone, its `Env` closes at once; this is only a bound
/// on a bug (an `Env` clone kept outside a `State`).
const CLOSE_DEADLINE: Duration = Duration::from_secs(30);

/// What a defragment did.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Defragmented {
    /// `data.mdb`'s size before and after.
    pub before: u64,
    pub after: u64,
    pub took: Duration,
}

/// Clears `KvEnv::defragmenting` however `defragment` returns.
struct InFlight<'a>(&'a KvEnv);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.defragmenting.store(false, Ordering::Relaxed);
    }
}

impl KvEnv {
    /// Replaces the kv environment with a compacting copy of itself (see the module doc). Blocks:
    /// call it off the async reactor. On an error the old environment is serving, unchanged.
    pub(crate) fn defragment(&self) -> Result<Defragmented, BoxError> {
        let started = Instant::now();
        let _writing = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        self.defragmenting.store(true, Ordering::Relaxed);
        let _in_flight = InFlight(self);
        let state = self.current();
        let dir = state.dir().to_path_buf();
        let before = state.disk_size()?;
        // Writes are paused, so the map cannot grow meanwhile; pinned all the same, as every reader.
        let prepared = {
            let _pin = state.mapping.pin();
            compacted::prepare(&state.env)
        };
        if let Err(err) = prepared {
            compacted::remove_leftovers(&dir)?;
            return Err(err.into());
        }
        drop(state);
        match self.swap_in_copy(&dir) {
            Ok(new) => {
                let after = new.disk_size()?;
                let took = started.elapsed();
                crate::metrics::DEFRAG_SECONDS.observe(took.as_secs_f64());
                tracing::info!(before_bytes = before, after_bytes = after, ?took, "defragmented the kv database");
                Ok(Defragmented { before, after, took })
            }
            Err(SwapFailed::Busy) => {
                Err(format!("reads on the database did not finish within {DRAIN_DEADLINE:?}").into())
            }
            Err(SwapFailed::Failed(err)) => Err(err),
        }
    }

    /// Steps 3–5 above: replaces the current environment of `dir` with the copy prepared beside its
    /// `data.mdb` (`compacted::prepare` or `compacted::adopt`: the old file also named `OLD`), and
    /// returns the state on it. Writes must be paused (`writing` held). On an error the old
    /// environment is serving, unchanged, and the leftovers are removed.
    pub(super) fn swap_in_copy(&self, dir: &Path) -> Result<Arc<State>, SwapFailed> {
        let mut slot = self.current.write().unwrap_or_else(PoisonError::into_inner);
        let Some(old_state) = slot.take() else { unreachable!("`current` is `None` only inside this function") };
        let old_state = match drain(old_state) {
            Ok(state) => state,
            Err(still_shared) => {
                *slot = Some(still_shared);
                drop(slot);
                compacted::remove_leftovers(dir).map_err(|e| SwapFailed::Failed(e.into()))?;
                return Err(SwapFailed::Busy);
            }
        };
        let carried = old_state.carried();
        let closing = old_state.env.clone().prepare_for_closing();
        drop(old_state);
        if !closing.wait_timeout(CLOSE_DEADLINE) {
            fatal(dir, "the old environment is still open (an Env outside a State)".into());
        }

        let opened = compacted::swap_in(dir)
            .map_err(BoxError::from)
            .and_then(|()| State::open(dir, carried.clone()).map_err(BoxError::from));
        let result = match opened {
            Ok(new) => {
                let new = Arc::new(new);
                *slot = Some(new.clone());
                Ok(new)
            }
            Err(err) => {
                tracing::error!(error = %err, "cannot open the new kv database: reopening the database as it was");
                let reopened = compacted::roll_back(dir)
                    .map_err(BoxError::from)
                    .and_then(|()| State::open(dir, carried).map_err(BoxError::from));
                match reopened {
                    Ok(state) => *slot = Some(Arc::new(state)),
                    Err(again) => fatal(dir, again),
                }
                Err(SwapFailed::Failed(err))
            }
        };
        drop(slot);
        compacted::remove_leftovers(dir).map_err(|e| SwapFailed::Failed(e.into()))?;
        result
    }
}

/// Why a prepared copy did not replace the environment (`KvEnv::swap_in_copy`); either way the old
/// one is serving.
pub(super) enum SwapFailed {
    /// Reads in flight did not end within `DRAIN_DEADLINE`.
    Busy,
    /// The copy could not be opened (the old file is back), or the leftovers not removed.
    Failed(BoxError),
}

/// Waits until `state` is the last reference to its `State` (every read in flight ended), for at
/// most `DRAIN_DEADLINE`. New reads cannot start: the caller holds `KvEnv::current`'s write lock.
fn drain(mut state: Arc<State>) -> Result<State, Arc<State>> {
    let deadline = Instant::now() + DRAIN_DEADLINE;
    loop {
        match Arc::try_unwrap(state) {
            Ok(state) => return Ok(state),
            Err(shared) if Instant::now() >= deadline => return Err(shared),
            Err(shared) => state = shared,
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Neither the copy nor the old file can be opened: the member cannot serve. Exits, as when the raft
/// core stops (docs/architecture.md, Fail fast); `data.mdb` is complete, so a restart opens it.
fn fatal(dir: &Path, err: BoxError) -> ! {
    tracing::error!(dir = %dir.display(), error = %err, "defragment: the kv database cannot be reopened; exiting");
    std::process::exit(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::etcdserverpb::{CompactionRequest, DeleteRangeRequest, InternalRaftRequest, PutRequest};
    use crate::raft::state_machine::StateMachine;
    use crate::storage::compacted::{COPY, OLD};

    fn put(key: String, value: Vec<u8>) -> InternalRaftRequest {
        InternalRaftRequest {
            put: Some(Box::new(PutRequest { key: key.into(), value, ..Default::default() })),
            ..Default::default()
        }
    }

    /// A state machine holding 1,600 keys of 8 KiB (13 MB, each value stored once), 1,440 of them
    /// deleted and compacted away (removal finished).
    fn mostly_freed(dir: &Path) -> StateMachine {
        const KEYS: i64 = 1600;
        let sm = StateMachine::open(&dir.join("kv"), &dir.join("snap")).unwrap();
        let state = sm.state();
        state.apply_requests(1, (0..KEYS).map(|i| put(format!("k{i:04}"), vec![7; 8 << 10])).collect());
        let deletes = (0..KEYS).filter(|i| i % 10 != 0).map(|i| InternalRaftRequest {
            delete_range: Some(Box::new(DeleteRangeRequest { key: format!("k{i:04}").into(), ..Default::default() })),
            ..Default::default()
        });
        let compact = InternalRaftRequest {
            // Every put and delete has its own revision, from 2 on: the last delete's.
            compaction: Some(Box::new(CompactionRequest { revision: 1 + KEYS + KEYS * 9 / 10, physical: false })),
            ..Default::default()
        };
        state.apply_requests(2, deletes.chain([compact]).collect());
        // The entry only schedules removal (`mvcc/compaction.rs`): remove, as the member's job would.
        while sm.kv.try_compaction_step(1_000).unwrap().pending.is_some() {}
        sm
    }

    #[test]
    fn defragment_shrinks_the_file_keeps_every_record_and_the_state_machine_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let sm = mostly_freed(dir.path());
        let (records, applied) = (sm.state().table_records(), sm.state().applied_state().unwrap());
        // A read in flight when the defragment starts finishes on the old environment.
        let reader = sm.state();
        let held = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            reader.table_records().len()
        });
        let done = sm.kv.defragment().unwrap();
        assert_eq!(held.join().unwrap(), records.len());
        assert!(done.after * 3 < done.before, "{done:?}");
        assert_eq!(sm.state().disk_size().unwrap(), done.after);
        assert_eq!(sm.state().table_records(), records);
        assert_eq!(sm.state().applied_state().unwrap(), applied);
        assert!(!sm.kv.defragmenting());
        let results = sm.state().apply_requests(3, vec![put("after".into(), b"x".to_vec())]);
        assert!(results[0].is_ok(), "{results:?}");
        let names: Vec<_> = std::fs::read_dir(dir.path().join("kv")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 2, "only data.mdb and lock.mdb: {names:?}");
        drop(sm);
        let reopened = StateMachine::open(&dir.path().join("kv"), &dir.path().join("snap")).unwrap();
        assert_eq!(
            reopened.state().table_records().iter().map(Vec::len).sum::<usize>(),
            // The put after the defragment: its change in `kv_revs` and its entry in `kv_index`.
            records.iter().map(Vec::len).sum::<usize>() + 2
        );
    }

    #[test]
    fn a_defragment_that_fails_leaves_the_old_environment_serving() {
        let dir = tempfile::tempdir().unwrap();
        let sm = mostly_freed(dir.path());
        let records = sm.state().table_records();
        let size = sm.state().disk_size().unwrap();
        // The copy cannot be created: a file is in its way.
        std::fs::write(dir.path().join("kv").join(COPY), b"in the way").unwrap();
        assert!(sm.kv.defragment().is_err());
        assert_eq!(sm.state().disk_size().unwrap(), size);
        assert_eq!(sm.state().table_records(), records);
        assert!(sm.state().apply_requests(3, vec![put("after".into(), b"x".to_vec())])[0].is_ok());
        assert!(!dir.path().join("kv").join(COPY).exists() && !dir.path().join("kv").join(OLD).exists());
    }

    #[test]
    fn a_read_longer_than_the_drain_deadline_fails_the_defragment_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let sm = mostly_freed(dir.path());
        let (records, size) = (sm.state().table_records(), sm.state().disk_size().unwrap());
        let reader = sm.state();
        let held = std::thread::spawn(move || {
            std::thread::sleep(DRAIN_DEADLINE * 3);
            reader.table_records()
        });
        let err = sm.kv.defragment().unwrap_err();
        assert!(err.to_string().contains("did not finish"), "{err}");
        assert_eq!(held.join().unwrap(), records, "the long read saw the old environment throughout");
        assert_eq!(sm.state().disk_size().unwrap(), size);
        assert_eq!(sm.state().table_records(), records);
        assert!(sm.state().apply_requests(3, vec![put("after".into(), b"x".to_vec())])[0].is_ok());
        assert!(!dir.path().join("kv").join(COPY).exists() && !dir.path().join("kv").join(OLD).exists());
        assert!(!sm.kv.defragmenting());
        assert!(sm.kv.defragment().is_ok(), "with the read gone, the next defragment goes through");
    }

    #[test]
    fn what_a_crash_during_a_defragment_leaves_is_removed_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let sm = mostly_freed(dir.path());
        let records = sm.state().table_records();
        drop(sm);
        let kv = dir.path().join("kv");
        std::fs::write(kv.join(COPY), b"half a copy").unwrap();
        std::fs::hard_link(kv.join("data.mdb"), kv.join(OLD)).unwrap();
        let sm = StateMachine::open(&kv, &dir.path().join("snap")).unwrap();
        assert_eq!(sm.state().table_records(), records);
        assert!(!kv.join(COPY).exists() && !kv.join(OLD).exists());
    }
}
