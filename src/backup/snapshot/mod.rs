//! `keyward snapshot save | restore | status`: etcdctl's and etcdutl's backup commands for keyward's
//! backups (the Snapshot RPC's stream: a compacting copy of the kv LMDB environment, padded to 512
//! bytes, then its SHA-256).
//!
//! - `save.rs`: streams the Snapshot RPC into a file (etcdctl's client flags);
//! - `restore.rs`: a new data dir from a backup (`backup/restore/` builds it, shared with `keyward migrate`);
//! - `status.rs`: hash, revision, total keys and size, in etcdctl's formats.

pub(crate) mod restore;
pub(crate) mod save;
pub(crate) mod status;

use crate::cli::backup::SnapshotCommand;

/// Runs a snapshot command; the error (naming the file or flag) is the caller's to print once.
pub fn run(command: SnapshotCommand) -> anyhow::Result<()> {
    match command {
        SnapshotCommand::Save(args) => save::run(args),
        SnapshotCommand::Restore(args) => restore::run(args),
        SnapshotCommand::Status(args) => status::run(args),
    }
}
