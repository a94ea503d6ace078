//! Installing a snapshot: its records replace every table in one write transaction (growing a mapped
//! environment to hold both), the file becomes `current.snap`, and everything derived from the
//! applied state is derived again (`Committed::installed`).

use std::fs::File;
use std::path::Path;
use std::time::Instant;

use super::dir::TempFile;
use super::format::{self, Meta};
use crate::raft::state_machine::committed::{Committed, Installed};
use crate::raft::state_machine::full_retry::ApplyFailure;
use crate::raft::state_machine::layout::SkippedLive;
use crate::raft::state_machine::state::{BoxError, State, APPLIED, MEMBERSHIP};

impl State {
    /// A write transaction with the snapshot in `path` loaded into it (`load`). A mapped environment
    /// first grows to hold the old state and the new one side by side (the old pages are freed only
    /// at the commit), and again whenever the load still finds its map full.
    fn load_growing(&self, path: &Path, meta: &Meta) -> Result<heed::RwTxn<'_>, BoxError> {
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

    /// Installs the snapshot in `file` (received into `received`, or from elsewhere): its records replace
    /// every table in one write transaction, and the file becomes the current snapshot.
    pub(in crate::raft::state_machine) fn install_snapshot(
        &self,
        meta: &Meta,
        file: File,
        received: Option<TempFile>,
    ) -> Result<(), BoxError> {
        let temp = match received {
            Some(temp) if temp.path().parent() == Some(self.snaps.path()) => temp,
            // Not received into this snap dir (openraft's storage suite hands over another state
            // machine's snapshot): copied in, so that it can become current.
            _ => self.copy_in(file)?,
        };
        let loading = Instant::now();
        let txn = self.load_growing(temp.path(), meta)?;
        let loaded = loading.elapsed();
        // Current before the commit: a crash in between leaves a snapshot newer than the applied
        // state, which `open` installs (`install_current_if_newer`); the other order could leave a
        // member whose current snapshot is older than its purged log.
        self.snaps.publish(temp, meta)?;
        let committing = Instant::now();
        txn.commit()?;
        let committed = committing.elapsed();
        // A snapshot of a member of an older layout holds its encodings (`layout.rs`).
        self.migrate_layout()?;
        // No sync of the environment: openraft purges the log behind the snapshot, and what it covered
        // survives a power loss as `current.snap` (synced, renamed, its directory synced above), from
        // which a member whose environment may be torn is rebuilt (`raft/unsynced.rs`), as after a
        // build (`build.rs`). Syncing here wrote every installed page to the disk a second time.
        self.rebuild_after_install()?;
        tracing::info!(
            snapshot = %meta.snapshot_id,
            load_ms = loaded.as_millis() as u64,
            commit_ms = committed.as_millis() as u64,
            total_ms = loading.elapsed().as_millis() as u64,
            "snapshot loaded into the state machine"
        );
        Ok(())
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
    fn rebuild_after_install(&self) -> Result<(), BoxError> {
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
        drop(txn);
        if let Some(observer) = self.observer.get() {
            let installed = Some(Installed { leases });
            observer(Committed { revision, auth_enabled, auth_revision, installed, ..Default::default() });
        }
        Ok(())
    }
}
