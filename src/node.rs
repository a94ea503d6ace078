//! A cluster member: the raft engine, the applied state it drives, and the two ways requests reach them.
//!
//! - `propose`: a write becomes one raft entry (`InternalRaftRequest` with its request header), is
//!   committed, and is applied by the state machine; the apply result comes back to the caller.
//! - `read`: a linearizable read first confirms leadership and waits until the read index is applied
//!   (openraft's `ensure_linearizable`), then reads from an LMDB read transaction; a serializable read
//!   skips the wait.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::BasicNode;

use crate::config::Config;
use crate::error::EtcdError;
use crate::mvcc::ReadView;
use crate::proto::etcdserverpb::{InternalRaftRequest, RequestHeader, ResponseHeader};
use crate::raft::log_store::LogStore;
use crate::raft::network::PeerNetwork;
use crate::raft::state_machine::{State, StateMachine};
use crate::raft::{Applied, Raft, RaftRequest};

pub struct Node {
    pub raft: Raft,
    state: Arc<State>,
    pub member_id: u64,
    pub cluster_id: u64,
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub max_request_bytes: usize,
    pub max_txn_ops: usize,
    next_request_id: AtomicU64,
}

/// A stable 64-bit id from strings (FNV-1a), never 0 (etcd reserves 0 for "no member").
fn stable_id<'a>(parts: impl IntoIterator<Item = &'a str>) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in part.as_bytes().iter().chain(b"\0") {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash.max(1)
}

impl Node {
    pub async fn start(config: &Config) -> anyhow::Result<Arc<Node>> {
        let member_dir = config.data_dir.join("member");
        let log = LogStore::open(&member_dir.join("raft"))?;
        let sm = StateMachine::open(&member_dir.join("kv"), &member_dir.join("snap"))?;
        let state = sm.state();
        let (member_id, cluster_id) = log.identity(|| {
            let member = stable_id(
                config
                    .peer_urls
                    .iter()
                    .map(String::as_str)
                    .chain([config.cluster_token.as_str()]),
            );
            let cluster = stable_id([
                format!("{member:x}").as_str(),
                config.cluster_token.as_str(),
            ]);
            (member, cluster)
        })?;
        let raft_config = openraft::Config {
            cluster_name: config.cluster_token.clone(),
            heartbeat_interval: 100,
            election_timeout_min: 300,
            election_timeout_max: 600,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(10_000),
            max_in_snapshot_log_to_keep: 1_000,
            ..Default::default()
        }
        .validate()?;
        let raft = Raft::new(member_id, Arc::new(raft_config), PeerNetwork, log, sm).await?;
        if !raft.is_initialized().await? {
            let me = BasicNode {
                addr: config.peer_urls.join(","),
            };
            raft.initialize(BTreeMap::from([(member_id, me)])).await?;
        }
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let node = Arc::new(Node {
            raft,
            state,
            member_id,
            cluster_id,
            name: config.name.clone(),
            peer_urls: config.peer_urls.clone(),
            client_urls: config.advertise_client_urls.clone(),
            max_request_bytes: config.max_request_bytes,
            max_txn_ops: config.max_txn_ops,
            // Unique across restarts: member bits, then time, then a counter (as etcd's idutil).
            next_request_id: AtomicU64::new(
                ((member_id & 0xffff) << 48) | ((seed & 0xff_ffff_ffff) << 8),
            ),
        });
        node.raft
            .wait(Some(Duration::from_secs(10)))
            .metrics(|m| m.current_leader.is_some(), "leader elected")
            .await?;
        Ok(node)
    }

    /// Proposes one write through raft and returns what applying it produced.
    pub async fn propose(&self, mut req: InternalRaftRequest) -> Result<Applied, EtcdError> {
        let id = self.next_request_id.fetch_add(1, Ordering::Relaxed);
        req.header = Some(RequestHeader {
            id,
            username: String::new(),
            auth_revision: 0,
        });
        req.id = id;
        let req = RaftRequest(req);
        if req.encoded_len() > self.max_request_bytes {
            return Err(EtcdError::RequestTooLarge);
        }
        match self.raft.client_write(req).await {
            Ok(written) => written.data,
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(to))) => {
                Err(if to.leader_id.is_some() {
                    EtcdError::NotLeader
                } else {
                    EtcdError::NoLeader
                })
            }
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
                tracing::error!(error = %e, "unexpected membership error on a client write");
                Err(EtcdError::Internal)
            }
            Err(RaftError::Fatal(fatal)) => {
                tracing::error!(error = %fatal, "raft stopped");
                Err(EtcdError::Stopped)
            }
        }
    }

    /// Runs `read` on a consistent view of the applied state: linearizable (confirmed leadership and
    /// applied up to the read index) or serializable (whatever this member has applied).
    pub async fn read<T: Send + 'static>(
        &self,
        linearizable: bool,
        read: impl FnOnce(&ReadView) -> Result<T, EtcdError> + Send + 'static,
    ) -> Result<T, EtcdError> {
        if linearizable {
            self.raft.ensure_linearizable().await.map_err(|e| match e {
                RaftError::APIError(_) => EtcdError::NoLeader,
                RaftError::Fatal(_) => EtcdError::Stopped,
            })?;
        }
        let state = self.state.clone();
        tokio::task::spawn_blocking(move || {
            let txn = state.env.read_txn()?;
            let view = state.kv.view(&txn)?;
            read(&view)
        })
        .await
        .map_err(|_| EtcdError::Internal)?
    }

    /// Completes a response header with this member's identity and the raft term.
    pub fn fill(&self, header: &mut Option<ResponseHeader>) {
        let header = header.get_or_insert_with(Default::default);
        header.cluster_id = self.cluster_id;
        header.member_id = self.member_id;
        header.raft_term = self.raft.metrics().borrow().current_term;
    }

    pub fn state(&self) -> &State {
        &self.state
    }
}
