//! The raft engine's types: what a log entry carries and what applying it returns.
//!
//! An entry's payload is a batch of etcd's `InternalRaftRequest`s (each a request header + exactly one
//! operation) proposed together, stored protobuf-encoded so the on-disk log format evolves the way
//! etcd's wire format does. Applying an entry applies its requests in order and returns one result each.

// openraft's storage traits fix `StorageError` (large) as the error type; boxing it locally would only
// move the allocation to every call site.
#![allow(clippy::result_large_err)]

pub mod log_cache;
pub mod log_store;
pub mod network;
pub mod proposer;
pub mod state_machine;

use std::io::Cursor;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::EtcdError;
use crate::proto::etcdserverpb::{
    AlarmResponse, CompactionResponse, DeleteRangeResponse, InternalRaftBatch, LeaseCheckpointResponse,
    LeaseGrantResponse, LeaseRevokeResponse, PutResponse, ResponseHeader, TxnResponse,
};

pub type NodeId = u64;

openraft::declare_raft_types!(
    pub TypeConfig:
        D = RaftBatch,
        R = BatchResults,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        SnapshotData = Cursor<Vec<u8>>,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type StorageError = openraft::StorageError<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, openraft::BasicNode>;

/// The requests of one raft entry, each with the identity of who asked (`header.username`,
/// `header.auth_revision`).
#[derive(Clone, Debug, PartialEq)]
pub struct RaftBatch(pub InternalRaftBatch);

/// What applying one entry produced: one result per request of its batch, in order (none for blank and
/// membership entries).
pub type BatchResults = Vec<ApplyResult>;

/// What applying one request produced: a response for the proposer, or the etcd error the apply phase
/// decided (permission denied, compacted, ...). Storage failures are not here: they stop the node.
pub type ApplyResult = Result<Applied, EtcdError>;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Applied {
    /// No response of its own (a step inside a larger operation).
    Nothing,
    Put(#[serde(with = "prost_bytes")] PutResponse),
    DeleteRange(#[serde(with = "prost_bytes")] DeleteRangeResponse),
    Txn(#[serde(with = "prost_bytes")] TxnResponse),
    Compaction(#[serde(with = "prost_bytes")] CompactionResponse),
    LeaseGrant(#[serde(with = "prost_bytes")] LeaseGrantResponse),
    LeaseRevoke(#[serde(with = "prost_bytes")] LeaseRevokeResponse),
    LeaseCheckpoint(#[serde(with = "prost_bytes")] LeaseCheckpointResponse),
    Alarm(#[serde(with = "prost_bytes")] AlarmResponse),
    /// A user/role/auth-config change was applied; the API layer builds the typed response.
    AuthChanged {
        #[serde(with = "prost_option")]
        header: Option<ResponseHeader>,
    },
    /// A token was issued (empty for JWT: the API layer signs it) at this auth revision.
    Authenticated {
        token: String,
        auth_revision: u64,
    },
}

/// serde for an optional protobuf message.
mod prost_option {
    use prost::Message;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<M: Message, S: Serializer>(m: &Option<M>, s: S) -> Result<S::Ok, S::Error> {
        m.as_ref().map(|m| serde_bytes::ByteBuf::from(m.encode_to_vec())).serialize(s)
    }

    pub fn deserialize<'de, M: Message + Default, D: Deserializer<'de>>(d: D) -> Result<Option<M>, D::Error> {
        Option::<serde_bytes::ByteBuf>::deserialize(d)?
            .map(|b| M::decode(b.as_slice()).map_err(serde::de::Error::custom))
            .transpose()
    }
}

impl Serialize for RaftBatch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        prost_bytes::serialize(&self.0, s)
    }
}

impl<'de> Deserialize<'de> for RaftBatch {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        prost_bytes::deserialize(d).map(RaftBatch)
    }
}

/// serde for protobuf messages: their protobuf encoding as a byte string.
mod prost_bytes {
    use prost::Message;
    use serde::de::Error;
    use serde::{Deserializer, Serializer};

    pub fn serialize<M: Message, S: Serializer>(m: &M, s: S) -> Result<S::Ok, S::Error> {
        serde_bytes::serialize(&m.encode_to_vec(), s)
    }

    pub fn deserialize<'de, M: Message + Default, D: Deserializer<'de>>(d: D) -> Result<M, D::Error> {
        let bytes: serde_bytes::ByteBuf = serde_bytes::deserialize(d)?;
        M::decode(bytes.as_slice()).map_err(D::Error::custom)
    }
}

/// Wraps any error for openraft's storage error types.
pub(crate) fn any_error(err: impl std::fmt::Display) -> openraft::AnyError {
    openraft::AnyError::error(err.to_string())
}

/// Runs blocking LMDB work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, StorageError> + Send + 'static,
) -> Result<T, StorageError> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|join| Err(openraft::StorageIOError::write(any_error(join)).into()))
}

#[cfg(test)]
mod tests {
    use openraft::testing::{StoreBuilder, Suite};

    use super::log_store::LogStore;
    use super::state_machine::StateMachine;
    use super::{StorageError, TypeConfig};

    struct HeedBuilder;

    impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for HeedBuilder {
        async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError> {
            let dir = tempfile::tempdir().expect("temp dir");
            let log = LogStore::open(&dir.path().join("raft")).expect("open raft env");
            let sm = StateMachine::open(&dir.path().join("kv"), &dir.path().join("snap")).expect("open kv env");
            Ok((dir, log, sm))
        }
    }

    #[test]
    fn heed_store_passes_openraft_storage_suite() -> Result<(), StorageError> {
        Suite::test_all(HeedBuilder)
    }
}
