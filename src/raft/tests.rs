//! The raft log stores and the state machine against openraft's own storage suite.

use openraft::testing::{StoreBuilder, Suite};

use super::log::legacy::LegacyLog;
use super::log::wal::Wal;
use super::state_machine::StateMachine;
use super::{StorageError, TypeConfig};

struct WalBuilder;

impl StoreBuilder<TypeConfig, Wal, StateMachine, tempfile::TempDir> for WalBuilder {
    async fn build(&self) -> Result<(tempfile::TempDir, Wal, StateMachine), StorageError> {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = Wal::open(&dir.path().join("wal")).expect("open raft log");
        let sm = StateMachine::open(&dir.path().join("kv"), &dir.path().join("snap")).expect("open kv env");
        Ok((dir, log, sm))
    }
}

#[test]
fn segment_log_passes_openraft_storage_suite() -> Result<(), StorageError> {
    Suite::test_all(WalBuilder)
}

/// The LMDB log of older versions, still read by the migration (`log/wal/migrate.rs`).
struct LegacyLogBuilder;

impl StoreBuilder<TypeConfig, LegacyLog, StateMachine, tempfile::TempDir> for LegacyLogBuilder {
    async fn build(&self) -> Result<(tempfile::TempDir, LegacyLog, StateMachine), StorageError> {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = LegacyLog::open(&dir.path().join("raft")).expect("open raft env");
        let sm = StateMachine::open(&dir.path().join("kv"), &dir.path().join("snap")).expect("open kv env");
        Ok((dir, log, sm))
    }
}

#[test]
fn legacy_lmdb_log_passes_openraft_storage_suite() -> Result<(), StorageError> {
    Suite::test_all(LegacyLogBuilder)
}
