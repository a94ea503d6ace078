//! Building a snapshot: every table streamed from one read transaction into a temp file of the snap
//! dir (`format.rs`), which then becomes `current.snap` (`dir.rs`).
//!
//! A snapshot costs the write path as little as it can, since every member builds one at the same
//! applied count:
//! - **No sync of the kv environment.** openraft purges the log behind a snapshot once it is built,
//!   so what the snapshot covers must survive a power loss — and it does, as the snapshot file: it is
//!   synced, renamed over `current.snap` and its directory synced before `build_snapshot` returns.
//!   The environment itself is never trusted after an operating-system crash (`raft/unsynced.rs`:
//!   it is rebuilt from `current.snap` and the log after it) and keeps its pages in the page cache
//!   through a process crash. Syncing it here (`mdb_env_sync`, as before) flushed every page dirtied
//!   since the last snapshot, up to gigabytes, while the raft log's `fdatasync` waited behind it.
//! - **The read transaction ends before the disk is waited for.** While it is open, LMDB cannot reuse
//!   the pages writes free, and the map cannot grow (`storage::mapping`: a grow waits for readers).
//!   The dump goes to the page cache; the file is synced after the transaction ends, a slice at a
//!   time (`storage/paced_sync.rs`), so that no single flush of the whole file queues ahead of the log's.

use std::fs::File;
use std::time::Instant;

use openraft::SnapshotMeta;

use super::format::{self, Meta};
use crate::raft::state_machine::state::{BoxError, State, APPLIED, MEMBERSHIP};
use crate::raft::{LogId, StoredMembership};

impl State {
    /// Streams every table into a new snapshot file and makes it current. Returns its metadata and
    /// the file, open for reading.
    pub(in crate::raft::state_machine) fn build_snapshot(&self) -> Result<(Meta, File), BoxError> {
        let started = Instant::now();
        let txn = self.read_txn()?;
        let last_log_id = self.read_meta::<Option<LogId>>(&txn, APPLIED)?.flatten();
        let last_membership: StoredMembership = self.read_meta(&txn, MEMBERSHIP)?.unwrap_or_default();
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let snapshot_id = match last_log_id {
            Some(id) => format!("{}-{}-{nanos}", id.leader_id, id.index),
            None => format!("empty-{nanos}"),
        };
        let meta = SnapshotMeta { last_log_id, last_membership, snapshot_id };
        let (temp, file) = self.snaps.temp("build")?;
        // The environment's last page before and after the dump (read under `txn`'s pin): what writes
        // took past it meanwhile, the pages they could not reuse while `txn` was open, at most.
        let last_page_before = self.env.info().last_page_number;
        let file = format::write(file, &meta, &self.tables(), &txn)?;
        let last_page_after = self.env.info().last_page_number;
        drop(txn);
        let dumped = started.elapsed();
        let bytes = crate::storage::paced_sync::sync(&file)?;
        // Opened before it is published: if a newer snapshot is installed meanwhile, this one is not
        // made current, and the open file stays readable after its name is gone.
        let reading = File::open(temp.path())?;
        self.snaps.publish(temp, &meta)?;
        tracing::info!(
            snapshot = %meta.snapshot_id,
            bytes,
            read_txn_ms = dumped.as_millis() as u64,
            pages_taken_meanwhile = last_page_after.saturating_sub(last_page_before),
            total_ms = started.elapsed().as_millis() as u64,
            "snapshot built"
        );
        Ok((meta, reading))
    }
}
