//! Installing a snapshot (a member that fell behind the leader's log): the snapshot's records become
//! the applied state, the file becomes `current.snap`, and everything derived from the applied state
//! is derived again (`Committed::installed`).
//!
//! The records are loaded into a fresh environment beside the current one (`<kv>.install`), which
//! then replaces it as Defragment's copy does (`defrag.rs`, `KvEnv::swap_in_copy`). Loaded in place,
//! in one write transaction, the old state's pages stay in use until the commit: the file had to hold
//! the old state and the new one side by side, and kept that size (3.2 GB for a 1 GB store, issue 30).
//! The fresh file holds the new state only, its pages filled in key order, trimmed to the pages used.
//! In place remains the fallback when reads on the current environment do not end (a snapshot being
//! built holds one for its whole length) and the way a crash between the two steps is finished at
//! open (`install_current_if_newer`).
//!
//! Crash safety, in order: the fresh environment is loaded and committed (a crash leaves a directory
//! that the next open removes); the snapshot file becomes current (a crash from here on leaves a
//! current snapshot newer than the applied state, which open installs); the fresh file replaces
//! `data.mdb` by a rename. Neither file of the environment is synced: it never is
//! (`raft/unsynced.rs`), and after an operating-system crash it is rebuilt from `current.snap`.

use std::fs::File;
use std::path::Path;
use std::sync::PoisonError;
use std::time::Instant;

use super::dir::TempFile;
use super::format::{self, Meta};
use crate::raft::state_machine::committed::{Committed, Installed};
use crate::raft::state_machine::defrag::SwapFailed;
use crate::raft::state_machine::full_retry::ApplyFailure;
use crate::raft::state_machine::kv_env::KvEnv;
use crate::raft::state_machine::layout::SkippedLive;
use crate::raft::state_machine::state::{BoxError, Paced, State, APPLIED, MEMBERSHIP};
use crate::raft::LogId;
use crate::storage::compacted;

impl KvEnv {
    /// Installs the snapshot in `file` (received into `received`, or from elsewhere): loaded into a
    /// fresh environment that replaces the current one (see the module doc), or in place when reads on
    /// the current one do not end.
    pub(in crate::raft::state_machine) fn install_snapshot(
        &self,
        meta: &Meta,
        file: File,
        received: Option<TempFile>,
    ) -> Result<(), BoxError> {
        let _writing = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        let state = self.current();
        let temp = state.snapshot_in_snap_dir(file, received)?;
        let kv_dir = state.dir().to_path_buf();
        let loading = Instant::now();
        let trimmed = state.load_fresh(temp.path(), meta)?;
        let loaded = loading.elapsed();
        // Current before the swap: see the module doc.
        state.snaps.publish(temp, meta)?;
        compacted::adopt(&kv_dir, &compacted::fresh_dir(&kv_dir).join("data.mdb"))?;
        drop(state);
        let swapping = Instant::now();
        let installed = match self.swap_in_copy(&kv_dir) {
            Ok(installed) => installed,
            Err(SwapFailed::Busy) => {
                tracing::warn!(snapshot = %meta.snapshot_id, "reads on the kv database did not end: installing the snapshot in place");
                let state = self.current();
                state.load_growing(&state.snaps.current_path(), meta)?.commit()?;
                state.migrate_layout()?;
                state
            }
            Err(SwapFailed::Failed(e)) => return Err(e),
        };
        compacted::remove_fresh(&kv_dir)?;
        installed.rebuild_after_install()?;
        tracing::info!(
            snapshot = %meta.snapshot_id,
            load_ms = loaded.as_millis() as u64,
            swap_ms = swapping.elapsed().as_millis() as u64,
            file_bytes = trimmed,
            total_ms = loading.elapsed().as_millis() as u64,
            "snapshot loaded into the state machine"
        );
        Ok(())
    }
}

impl State {
    /// A write transaction with the snapshot in `path` loaded into it (`load`). A mapped environment
    /// first grows to hold the old state and the new one side by side (the old pages are freed only
    /// at the commit), and again whenever the load still finds its map full.
    pub(super) fn load_growing(&self, path: &Path, meta: &Meta) -> Result<heed::RwTxn<'_>, BoxError> {
        if let Some(reserved) = self.mapping.reserved() {
            let incoming = std::fs::metadata(path)?.len();
            self.grow_map(reserved.saturating_add(2 * incoming)).map_err(ApplyFailure::into_error)?;
        }
        loop {
            let mut txn = self.env.write_txn()?;
            match self.load(&mut txn, File::open(path)?, meta) {
                Ok(()) => return Ok(txn),
                Err(e) if matches!(e.downcast_ref(), Some(heed::Error::Mdb(heed::MdbError::MapFull))) => {
                    drop(txn);
                    if !self.grow_map(0).map_err(ApplyFailure::into_error)? {
                        return Err(e);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The snapshot file as a temp file of the snap dir, so that it can become current: as received,
    /// or copied in (openraft's storage suite hands over another state machine's snapshot).
    pub(in crate::raft::state_machine) fn snapshot_in_snap_dir(
        &self,
        file: File,
        received: Option<TempFile>,
    ) -> Result<TempFile, BoxError> {
        match received {
            Some(temp) if temp.path().parent() == Some(self.snaps.path()) => Ok(temp),
            _ => self.copy_in(file),
        }
    }

    /// Loads the snapshot in `path` into a fresh environment at `fresh_dir` (emptied first), commits
    /// it and closes it, its file trimmed to the pages used (a mapped environment's reservation
    /// grows to twice the snapshot's size for the load). Returns the file's size.
    fn load_fresh(&self, path: &Path, meta: &Meta) -> Result<u64, BoxError> {
        let dir = compacted::fresh_dir(self.dir());
        compacted::remove_fresh(self.dir())?;
        let mut carried = self.carried();
        carried.audit = None;
        let fresh = State::open_bare(&dir, carried, Paced::Not)?;
        fresh.load_growing(path, meta)?.commit()?;
        let used = fresh.mapping.handed_out(&fresh.env);
        let closing = fresh.env.clone().prepare_for_closing();
        drop(fresh);
        closing.wait();
        let data = std::fs::OpenOptions::new().write(true).open(dir.join("data.mdb"))?;
        // Pages past the last one handed out hold nothing: LMDB opens a shorter file and maps past it.
        let size = data.metadata()?.len().min(used.next_multiple_of(1 << 20));
        data.set_len(size)?;
        Ok(size)
    }

    /// Copies a snapshot file into a synced temp file of the snap dir.
    fn copy_in(&self, mut file: File) -> Result<TempFile, BoxError> {
        let (temp, out) = self.snaps.temp("copy")?;
        let mut out = std::io::BufWriter::new(out);
        std::io::copy(&mut file, &mut out)?;
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        Ok(temp)
    }

    /// Replaces every table with the snapshot's records and records its log id and membership as
    /// applied, in `txn`. The file must hold the snapshot `expected` describes.
    fn load(&self, txn: &mut heed::RwTxn, file: File, expected: &Meta) -> Result<(), BoxError> {
        let (meta, records) = format::Reader::open(file)?;
        if meta != *expected {
            return Err(format!("the snapshot file holds {meta}, not {expected}").into());
        }
        // A snapshot of the layout before 2 also holds `kv_live`: skipped, with the long-key groups
        // its records named (`layout.rs`).
        let mut skipped = SkippedLive::default();
        format::load(records, &self.tables(), txn, &mut |key, value| skipped.skip(&self.long, key, value))?;
        skipped.finish(self, txn)?;
        self.meta.put(txn, APPLIED, &postcard::to_allocvec(&meta.last_log_id)?)?;
        self.meta.put(txn, MEMBERSHIP, &postcard::to_allocvec(&meta.last_membership)?)?;
        Ok(())
    }

    /// At open: a current snapshot newer than the applied state (a crash between making an installed
    /// snapshot current and committing it) is installed again.
    pub(in crate::raft::state_machine) fn install_current_if_newer(&self) -> Result<(), BoxError> {
        let Some((meta, _)) = self.snaps.current()? else { return Ok(()) };
        let (applied, _) = self.applied_state()?;
        if meta.last_log_id <= applied {
            return Ok(());
        }
        tracing::warn!(snapshot = %meta, "the current snapshot is newer than the applied state: installing it");
        // Nothing else uses the snap dir while the state opens: the current file stays this one.
        self.load_growing(&self.snaps.current_path(), &meta)?.commit()?;
        self.migrate_layout()?;
        self.sync()?;
        Ok(())
    }

    /// After an install, everything derived from the applied state is derived again from the installed
    /// state (etcd #14571 restored a snapshot and kept serving from an emptied permission cache): the
    /// permission cache, the size in use, the active alarms and the simple tokens here; the observer
    /// rebuilds the rest (the node's auth state and revision, the lease clock, watchers).
    pub(super) fn rebuild_after_install(&self) -> Result<(), BoxError> {
        self.auth.cache.clear();
        let txn = self.read_txn()?;
        self.after_commit(&txn)?;
        let revision = self.kv.view(&txn)?.rev;
        let (auth_enabled, auth_revision) = (self.auth.enabled(&txn)?, self.auth.revision(&txn)?);
        if let Some(simple) = self.tokens.get().and_then(|t| t.simple()) {
            // Entries this member never applied may have deleted a user, changed a password or
            // disabled auth: only the tokens that still stand in the installed state are kept.
            if auth_enabled {
                simple.retain(|user, issued| self.auth.token_valid(&txn, user, issued).unwrap_or(false));
            } else {
                simple.clear();
            }
        }
        let leases = self.leases.all(&txn)?;
        let last_index = self.read_meta::<Option<LogId>>(&txn, APPLIED)?.flatten().map_or(0, |id| id.index);
        drop(txn);
        if let Some(observer) = self.observer.get() {
            let installed = Some(Installed { leases });
            observer(Committed { revision, auth_enabled, auth_revision, last_index, installed, ..Default::default() });
        }
        Ok(())
    }
}
