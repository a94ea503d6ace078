//! Building a snapshot: every table streamed from one read transaction into a temp file of the snap
//! dir (`format.rs`), which then becomes `current.snap` (`dir.rs`).
//!
//! A snapshot costs the write path as little as it can (the members of a cluster build theirs at
//! staggered counts, `node/jobs/apply_observer.rs`, but every member builds one):
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
//! - **The dump gives way to a growing map.** When apply meets a full map during a dump it waits for
//!   the readers to remap; the dump, which can start over, ends its transaction at once instead of
//!   making apply wait for the rest of it (measured before: a 1.1 s stall of every client, the
//!   remap waiting for a 2.3 s dump).

use std::fs::File;
use std::io::Seek;
use std::time::Instant;

use openraft::SnapshotMeta;

use super::format::{self, Meta};
use crate::raft::state_machine::state::{BoxError, State, APPLIED, MEMBERSHIP};
use crate::raft::{LogId, StoredMembership};

/// How many times a dump gives way to a remap before it holds on (then apply waits for it): each
/// remap grows the reservation by a sixth, so the next dump rarely meets another.
const MAX_GIVE_WAY: u32 = 3;

impl State {
    /// Streams every table into a new snapshot file and makes it current. Returns its metadata and
    /// the file, open for reading.
    pub(in crate::raft::state_machine) fn build_snapshot(&self) -> Result<(Meta, File), BoxError> {
        let started = Instant::now();
        let (temp, mut file) = self.snaps.temp("build")?;
        let mut gave_way = 0;
        let (meta, file, dumped, pages_taken) = loop {
            let dump_started = Instant::now();
            let txn = self.read_txn()?;
            let meta = self.snapshot_meta(&txn)?;
            // The environment's last page before and after the dump (read under `txn`'s pin): what
            // writes took past it meanwhile, the pages they could not reuse while `txn` was open, at most.
            let last_page_before = self.env.info().last_page_number;
            let give_way = || gave_way < MAX_GIVE_WAY && self.mapping.remap_waiting();
            match format::write(file.try_clone()?, &meta, &self.tables(), &txn, &give_way) {
                Ok(written) => {
                    let pages_taken = self.env.info().last_page_number.saturating_sub(last_page_before);
                    break (meta, written, dump_started.elapsed(), pages_taken);
                }
                // Apply met a full map and waits for this transaction to remap: it ends now, and the
                // dump starts over once the map has grown (`read_txn` waits for the remap).
                Err(e) if e.is::<format::GaveWay>() => {
                    drop(txn);
                    gave_way += 1;
                    file.set_len(0)?;
                    file.rewind()?;
                    tracing::info!(gave_way, "snapshot dump gave way to a growing map; starting over");
                }
                Err(e) => return Err(e),
            }
        };
        let bytes = crate::storage::paced_sync::sync(&file)?;
        // Opened before it is published: if a newer snapshot is installed meanwhile, this one is not
        // made current, and the open file stays readable after its name is gone.
        let reading = File::open(temp.path())?;
        self.snaps.publish(temp, &meta)?;
        tracing::info!(
            snapshot = %meta.snapshot_id,
            bytes,
            read_txn_ms = dumped.as_millis() as u64,
            pages_taken_meanwhile = pages_taken,
            gave_way,
            total_ms = started.elapsed().as_millis() as u64,
            "snapshot built"
        );
        Ok((meta, reading))
    }

    /// The metadata of a snapshot of the applied state as of `txn`, with a new id.
    fn snapshot_meta(&self, txn: &heed::RoTxn) -> Result<Meta, BoxError> {
        let last_log_id = self.read_meta::<Option<LogId>>(txn, APPLIED)?.flatten();
        let last_membership: StoredMembership = self.read_meta(txn, MEMBERSHIP)?.unwrap_or_default();
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let snapshot_id = match last_log_id {
            Some(id) => format!("{}-{}-{nanos}", id.leader_id, id.index),
            None => format!("empty-{nanos}"),
        };
        Ok(SnapshotMeta { last_log_id, last_membership, snapshot_id })
    }
}
