//! Reads of the applied state: each in one LMDB read transaction, linearizable (after the read index
//! is applied, `node/leader.rs`) or serializable; and the auth checks that read the auth state so.

use super::Node;
use crate::auth::check::Authorizer;
use crate::error::EtcdError;
use crate::identity::Requester;
use crate::mvcc::ReadView;
use crate::raft::state_machine::State;

impl Node {
    /// Runs `read` on a consistent view of the applied state — the kv store and the auth state of the
    /// same transaction: linearizable (confirmed leadership and applied up to the read index) or
    /// serializable (whatever this member has applied).
    pub(crate) async fn read<T: Send + 'static>(
        &self,
        linearizable: bool,
        read: impl FnOnce(&ReadView, &Authorizer) -> Result<T, EtcdError> + Send + 'static,
    ) -> Result<T, EtcdError> {
        let read = move |state: &State, txn: &heed::RoTxn| {
            let view = state.kv.view(txn)?;
            let authz = Authorizer::new(&state.auth, txn)?;
            read(&view, &authz)
        };
        if linearizable {
            self.read_state_linearizable(read).await
        } else {
            self.read_state(read).await
        }
    }

    /// `read_state` after confirming leadership and waiting until the read index is applied: one read
    /// transaction sees every table (auth, leases, kv) of the same applied state.
    pub(crate) async fn read_state_linearizable<T: Send + 'static>(
        &self,
        read: impl FnOnce(&State, &heed::RoTxn) -> Result<T, EtcdError> + Send + 'static,
    ) -> Result<T, EtcdError> {
        self.read_index().await?;
        self.read_state(read).await
    }

    /// Runs `read` in an LMDB read transaction on the applied state (no linearizability wait).
    pub(crate) async fn read_state<T: Send + 'static>(
        &self,
        read: impl FnOnce(&State, &heed::RoTxn) -> Result<T, EtcdError> + Send + 'static,
    ) -> Result<T, EtcdError> {
        let kv = self.kv.clone();
        tokio::task::spawn_blocking(move || {
            let state = kv.current();
            let txn = state.read_txn()?;
            read(&state, &txn)
        })
        .await
        .map_err(|_| EtcdError::Internal)?
    }

    /// Requires an authenticated user when auth is on, against the current auth state: anonymous
    /// calls are refused even where etcd 3.4 answers them (MemberList, Status, Alarm GET, leases:
    /// CVE-2026-33413's class).
    pub(crate) async fn require_user(&self, who: Requester, op: &'static str) -> Result<(), EtcdError> {
        if !self.auth_enabled() {
            return Ok(());
        }
        self.read_state(move |state, txn| Authorizer::new(&state.auth, txn)?.check_user(&who, op)).await
    }

    /// Requires the root role when auth is on, against the current auth state (etcd's
    /// `IsAdminPermitted`; no linearizability wait, as etcd).
    pub(crate) async fn require_admin(&self, who: Requester, op: &'static str) -> Result<(), EtcdError> {
        self.read_state(move |state, txn| Authorizer::new(&state.auth, txn)?.check_admin(&who, op)).await
    }
}
