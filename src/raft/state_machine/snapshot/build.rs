//! Building a snapshot: every table streamed from one read transaction into a temp file of the snap
//! dir (`format.rs`), which then becomes `current.snap` (`dir.rs`).

use std::fs::File;

use openraft::SnapshotMeta;

use super::format::{self, Meta};
use crate::raft::state_machine::state::{BoxError, State, APPLIED, MEMBERSHIP};
use crate::raft::{LogId, StoredMembership};

impl State {
    /// Streams every table into a new snapshot file and makes it current. Returns its metadata and
    /// the file, open for reading.
    pub(in crate::raft::state_machine) fn build_snapshot(&self) -> Result<(Meta, File), BoxError> {
        // The log is purged behind a snapshot: everything the snapshot covers must be durable first.
        self.sync()?;
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
        format::write(file, &meta, &self.tables(), &txn)?;
        drop(txn);
        // Opened before it is published: if a newer snapshot is installed meanwhile, this one is not
        // made current, and the open file stays readable after its name is gone.
        let reading = File::open(temp.path())?;
        self.snaps.publish(temp, &meta)?;
        Ok((meta, reading))
    }
}
