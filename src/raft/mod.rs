//! openraft's adapter: the storage openraft runs on, and how requests reach it and answers come back.
//!
//! - `log/`: the raft log (`log/wal/`, the live one; `log/legacy.rs`, the LMDB log of older versions,
//!   read only to migrate it);
//! - `state_machine/`: the applied state on LMDB, its snapshots, and Defragment;
//! - `thread.rs`: the OS thread openraft runs on; `election_timer.rs`: when a voter campaigns
//!   (`leader_probe.rs`: whether a leader's process is gone); `proposer.rs`: group commit of client requests;
//!   `relay.rs`: their answers handed back to the gRPC runtime;
//! - `member.rs`: what the membership records per member; `unsynced.rs`: whether the kv environment
//!   must be rebuilt after an operating-system crash.
//!
//! This file holds the raft engine's types: what a log entry carries and what applying it returns.
//! An entry's payload is a batch of etcd's `InternalRaftRequest`s (each a request header + exactly one
//! operation) proposed together, stored protobuf-encoded so the on-disk log format evolves the way
//! etcd's wire format does. Applying an entry applies its requests in order and returns one result each.

// openraft's storage traits fix `StorageError` (large) as the error type; boxing it locally would only
// move the allocation to every call site.
#![allow(clippy::result_large_err)]

pub(crate) mod awaited;
pub(crate) mod election_timer;
mod leader_probe;
pub(crate) mod log;
pub(crate) mod member;
pub(crate) mod proposer;
pub(crate) mod relay;
pub(crate) mod state_machine;
pub(crate) mod thread;
pub(crate) mod unsynced;

use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::apply::Applied;
use crate::error::EtcdError;
use crate::proto::etcdserverpb::InternalRaftBatch;

pub(crate) type NodeId = u64;

openraft::declare_raft_types!(
    pub TypeConfig:
        D = RaftBatch,
        R = BatchResults,
        NodeId = NodeId,
        Node = member::MemberNode,
        SnapshotData = state_machine::snapshot::data::SnapshotData,
);

pub(crate) type Raft = openraft::Raft<TypeConfig>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub(crate) type StorageError = openraft::StorageError<NodeId>;
pub(crate) type StoredMembership = openraft::StoredMembership<NodeId, member::MemberNode>;
pub(crate) type Membership = openraft::Membership<NodeId, member::MemberNode>;

/// The requests of one raft entry, each with the identity of who asked (`header.username`,
/// `header.auth_revision`). Shared, not copied: openraft clones an entry for the log's cache of recent
/// entries, when it reads one back to apply it, and for each peer it replicates to.
#[derive(Clone, Debug, PartialEq)]
pub struct RaftBatch(pub Arc<InternalRaftBatch>);

impl RaftBatch {
    pub fn new(batch: InternalRaftBatch) -> Self {
        RaftBatch(Arc::new(batch))
    }
}

/// What applying one entry produced: one result per request of its batch, in order (none for blank and
/// membership entries).
pub(crate) type BatchResults = Vec<ApplyResult>;

/// What applying one request produced: a response for the proposer, or the etcd error the apply phase
/// decided (permission denied, compacted, ...). Storage failures are not here: they stop the node.
pub(crate) type ApplyResult = Result<Applied, EtcdError>;

impl Serialize for RaftBatch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        crate::proto::as_bytes::serialize(&*self.0, s)
    }
}

impl<'de> Deserialize<'de> for RaftBatch {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        crate::proto::as_bytes::deserialize(d).map(RaftBatch::new)
    }
}

/// Wraps any error for openraft's storage error types.
pub(crate) fn any_error(err: impl std::fmt::Display) -> openraft::AnyError {
    openraft::AnyError::error(err.to_string())
}

/// Runs blocking storage work (LMDB, the log's files) off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, StorageError> + Send + 'static,
) -> Result<T, StorageError> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|join| Err(openraft::StorageIOError::write(any_error(join)).into()))
}

#[cfg(test)]
mod tests;
