//! Opens a member's raft log, moving it first from the LMDB log of older versions if need be.
//!
//! Older versions kept the log in `<member>/raft` (LMDB, `raft/log/legacy.rs`). When `<member>/wal` does
//! not exist but that environment does, everything it holds — vote, committed id, last purged id,
//! identity, every entry — is written to `<member>/wal.migrating` (each write synced), which is then
//! renamed to `<member>/wal`; the directory is synced, and the LMDB directory is renamed aside to
//! `<member>/raft.lmdb-migrated` (kept, never read again). A crash before the first rename leaves
//! no `wal`: the next start migrates again from scratch. A crash after it leaves both: the next start
//! only renames the old one aside.

use std::path::Path;
use std::sync::Arc;

use openraft::storage::RaftLogStorage;
use openraft::RaftLogReader;

use super::segment::State;
use super::Wal;
use crate::raft::log::legacy::LegacyLog;
use crate::space::Space;

/// The log's directory under the member directory.
pub(crate) const DIR: &str = "wal";
/// Where older versions kept the log (LMDB).
pub(crate) const LEGACY_DIR: &str = "raft";
/// Where the LMDB log goes once migrated.
pub(crate) const MIGRATED_DIR: &str = "raft.lmdb-migrated";
const TEMP_DIR: &str = "wal.migrating";
/// Entries read and written at a time.
const BATCH: u64 = 1024;

/// Opens the log of the member whose directory is `member_dir`, migrating an LMDB log first.
pub(crate) async fn open_member(member_dir: &Path, space: Arc<Space>) -> std::io::Result<Wal> {
    let wal = member_dir.join(DIR);
    let legacy = member_dir.join(LEGACY_DIR);
    if !wal.exists() && legacy.join("data.mdb").exists() {
        let temp = member_dir.join(TEMP_DIR);
        let entries = copy(&legacy, &temp).await?;
        std::fs::rename(&temp, &wal)?;
        crate::storage::data_dir::sync_dir(member_dir)?;
        tracing::info!(from = %legacy.display(), to = %wal.display(), entries, "raft log migrated from LMDB");
    }
    if legacy.exists() && wal.exists() {
        let aside = member_dir.join(MIGRATED_DIR);
        if aside.exists() {
            return Err(std::io::Error::other(format!(
                "{} and {} both exist: move one of them away",
                legacy.display(),
                aside.display()
            )));
        }
        std::fs::rename(&legacy, &aside)?;
        crate::storage::data_dir::sync_dir(member_dir)?;
    }
    Wal::open_with(&wal, space)
}

/// Copies the LMDB log in `legacy` to a new log in `temp` (replacing anything there), synced;
/// returns how many entries it copied.
async fn copy(legacy: &Path, temp: &Path) -> std::io::Result<u64> {
    let io = |e: crate::raft::StorageError| std::io::Error::other(format!("reading {}: {e}", legacy.display()));
    if temp.exists() {
        std::fs::remove_dir_all(temp)?; // a migration a crash interrupted
    }
    let mut old = LegacyLog::open(legacy).map_err(|e| std::io::Error::other(format!("{}: {e}", legacy.display())))?;
    let log_state = old.get_log_state().await.map_err(io)?;
    let state = State {
        vote: old.read_vote().await.map_err(io)?,
        committed: old.read_committed().await.map_err(io)?,
        last_purged: log_state.last_purged_log_id,
        identity: old.identity().map_err(io)?,
    };
    let new = Wal::open(temp)?;
    new.restore(state)?;
    let mut copied = 0;
    if let Some(last) = log_state.last_log_id {
        let mut from = log_state.last_purged_log_id.map_or(0, |p| p.index + 1);
        while from <= last.index {
            let to = from.saturating_add(BATCH).min(last.index + 1);
            let entries = old.try_get_log_entries(from..to).await.map_err(io)?;
            new.append_now(&entries)?;
            copied += entries.len() as u64;
            from = to;
        }
    }
    Ok(copied)
}
