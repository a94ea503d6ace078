//! Helpers for tests here and elsewhere in the crate (the node's, the watchers').

use openraft::EntryPayload;

use super::kv_env::KvEnv;
use super::snapshot::format::Meta;
use super::state::{BoxError, State};
use crate::raft::{BatchResults, Entry, LogId};
use crate::storage::Db;

/// Every table's records, in snapshot order (tests).
pub(crate) type TableRecords = Vec<Vec<(Vec<u8>, Vec<u8>)>>;

impl State {
    /// Every table's records, in snapshot order.
    pub(crate) fn table_records(&self) -> TableRecords {
        let txn = self.read_txn().expect("read txn");
        let records = |db: &Db| -> Vec<(Vec<u8>, Vec<u8>)> {
            db.iter(&txn).expect("iter").map(|kv| kv.map(|(k, v)| (k.to_vec(), v.to_vec())).expect("record")).collect()
        };
        self.tables().iter().map(records).collect()
    }

    /// Applies `requests` as the entry at log index `index`.
    pub(crate) fn apply_requests(
        &self,
        index: u64,
        requests: Vec<crate::proto::etcdserverpb::InternalRaftRequest>,
    ) -> BatchResults {
        let entry = Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(crate::raft::RaftBatch::new(crate::proto::etcdserverpb::InternalRaftBatch {
                requests,
            })),
        };
        self.apply_until_applied(&[entry]).expect("apply").remove(0)
    }
}

impl KvEnv {
    /// Builds a snapshot of `source` and installs it here as `install_snapshot` installs one from
    /// outside the snap dir, without openraft (which owns a node's state machine).
    pub(crate) fn install_snapshot_of(&self, source: &State) -> Result<Meta, BoxError> {
        let (meta, file) = source.build_snapshot()?;
        self.install_snapshot(&meta, file, None)?;
        Ok(meta)
    }
}
