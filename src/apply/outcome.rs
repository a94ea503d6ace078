//! What applying one request produces: the result its proposer waits for (`Applied`) and the changes
//! the observers are told about once the transaction commits (`Effects`).

use serde::{Deserialize, Serialize};

use crate::auth::cache::Affected;
use crate::error::EtcdError;
use crate::proto::etcdserverpb::{
    AlarmResponse, CompactionResponse, DeleteRangeResponse, LeaseCheckpointResponse, LeaseGrantResponse,
    LeaseRevokeResponse, PutResponse, ResponseHeader, TxnResponse,
};
use crate::proto::mvccpb::Event;

/// What an applied entry changed, for the observers told after the transaction commits
/// (watchers, the lease clock, the auth state).
#[derive(Debug, Default, Clone)]
pub(crate) struct Effects {
    pub events: Vec<Event>,
    pub granted: Vec<(i64, i64)>,
    pub revoked: Vec<i64>,
    /// Whose permissions changed, when an auth entry changed any.
    pub auth: Option<Affected>,
    /// An alarm was raised or cleared.
    pub alarms_changed: bool,
    /// A compaction was scheduled: its removal runs in the background (`node/jobs/compaction.rs`).
    pub compacted: bool,
}

/// What applying one request produced for its proposer (serialised into openraft's apply results, so
/// the protobuf responses travel as their encoding).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Applied {
    /// No response of its own (a step inside a larger operation).
    Nothing,
    Put(#[serde(with = "crate::proto::as_bytes")] PutResponse),
    DeleteRange(#[serde(with = "crate::proto::as_bytes")] DeleteRangeResponse),
    Txn(#[serde(with = "crate::proto::as_bytes")] TxnResponse),
    Compaction(#[serde(with = "crate::proto::as_bytes")] CompactionResponse),
    LeaseGrant(#[serde(with = "crate::proto::as_bytes")] LeaseGrantResponse),
    LeaseRevoke(#[serde(with = "crate::proto::as_bytes")] LeaseRevokeResponse),
    LeaseCheckpoint(#[serde(with = "crate::proto::as_bytes")] LeaseCheckpointResponse),
    Alarm(#[serde(with = "crate::proto::as_bytes")] AlarmResponse),
    /// A user/role/auth-config change was applied; the API layer builds the typed response.
    AuthChanged {
        #[serde(with = "crate::proto::option_as_bytes")]
        header: Option<ResponseHeader>,
    },
    /// A login was ordered at `index` and this auth revision: a simple token was issued there (its
    /// prefix is the proposer's; `auth/simple.rs`), or the API layer signs a JWT.
    Authenticated {
        index: u64,
        auth_revision: u64,
    },
}

impl Applied {
    /// The response header inside, for the kinds of result that carry one.
    pub fn header_mut(&mut self) -> Option<&mut Option<ResponseHeader>> {
        match self {
            Applied::Put(r) => Some(&mut r.header),
            Applied::DeleteRange(r) => Some(&mut r.header),
            Applied::Txn(r) => Some(&mut r.header),
            Applied::Compaction(r) => Some(&mut r.header),
            Applied::LeaseGrant(r) => Some(&mut r.header),
            Applied::LeaseRevoke(r) => Some(&mut r.header),
            Applied::LeaseCheckpoint(r) => Some(&mut r.header),
            Applied::Alarm(r) => Some(&mut r.header),
            Applied::AuthChanged { header } => Some(header),
            Applied::Nothing | Applied::Authenticated { .. } => None,
        }
    }

    /// The error for an apply result of the wrong kind for its proposal: the raft layer mixed up
    /// proposals, which is never expected.
    pub fn mismatch(self) -> EtcdError {
        tracing::error!(applied = ?self, "apply result does not match the proposal");
        EtcdError::Internal
    }
}
