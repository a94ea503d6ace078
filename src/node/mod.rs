//! A cluster member: the raft engine, the applied state it drives, and the two ways requests reach them.
//!
//! - `propose` (`propose.rs`): a write becomes an `InternalRaftRequest` with its request header; the
//!   proposer puts it in the next raft entry (with whatever else arrived meanwhile: group commit),
//!   which is committed and applied by the state machine; the request's own apply result comes back
//!   to the caller.
//! - `read` (`read.rs`): a linearizable read first confirms leadership and waits until the read index
//!   is applied (openraft's `ensure_linearizable`), then reads from an LMDB read transaction; a
//!   serializable read skips the wait.
//!
//! Before proposing a put, a txn with a put or a lease grant, the node checks the space quota
//! (etcd's `quotaKVServer`): over it, the request gets "database space exceeded" and the member raises
//! a NOSPACE alarm through raft (`space/mod.rs`). The node owns the data dir lock for as long as it lives.
//!
//! The rest of the folder: `start.rs` (opening a member, step by step; the member's run around it is
//! `server/run.rs`), `jobs/` (everything that runs in the background), `leader.rs` (what must happen
//! on the leader), `check_quorum.rs` (a leader that lost its quorum steps down), `writes.rs`, `latest_applied.rs` and `auth_service.rs` (parts of `Node`).

use std::sync::Arc;
use std::time::Duration;

use openraft::error::Fatal;

use crate::auth::tokens::Tokens;
use crate::cluster::peers::Peers;
use crate::error::EtcdError;
use crate::identity::IdentityRules;
use crate::identity::Origin;
use crate::lease::lessor::Lessor;
use crate::proto::etcdserverpb::ResponseHeader;
use crate::raft::state_machine::{KvEnv, State};
use crate::raft::{NodeId, Raft};
use crate::space::Space;

mod applied_index;
mod auth_service;
mod check_quorum;
mod for_peers;
pub(crate) mod jobs;
mod latest_applied;
mod leader;
pub(crate) mod login_throttle;
mod propose;
mod read;
mod read_lease;
mod read_rounds;
mod start;
#[cfg(test)]
mod tests;
mod transfer;
mod writes;

pub(crate) struct Node {
    pub(crate) raft: Raft,
    /// Writes on their way into raft (`node/writes.rs`, `node/propose.rs`).
    writes: writes::Writes,
    /// Linearizable reads here share their read index rounds (`node/read_rounds.rs`)...
    read_rounds: read_rounds::ReadRounds,
    /// ...and so do those the leader confirms, for itself and for followers.
    leader_read_rounds: read_rounds::ReadRounds,
    /// The applied state's environment, swapped by Defragment: reach it through `state()`.
    kv: Arc<KvEnv>,
    /// What the latest applied batch left: the revision, the auth state, the request count.
    latest: Arc<latest_applied::LatestApplied>,
    pub(crate) member_id: u64,
    pub(crate) cluster_id: u64,
    /// What this member publishes of itself (`node/jobs/publish.rs`).
    name: String,
    client_urls: Vec<String>,
    /// `--initial-cluster-token`: part of the id a member added here gets (`node/leader.rs`).
    cluster_token: String,
    /// Dials the other members: raft's transport, and forwarding to the leader (`node/leader.rs`).
    pub(crate) peers: Arc<Peers>,
    /// Forwarded writes, on one stream per leader (`cluster/propose_stream.rs`).
    forwarded_writes: crate::cluster::propose_stream::ProposeStreams,
    /// The forwarded writes waiting for their apply here, which answers them (`raft/awaited.rs`).
    awaited: Arc<crate::raft::awaited::Awaited>,
    /// `--election-timeout`: how much longer every lease lives when a new leader takes over.
    election_timeout: Duration,
    /// When this member campaigns; the peer service resets it (`raft/election_timer.rs`).
    election_timer: Arc<crate::raft::election_timer::ElectionTimer>,
    /// Notified when the leader says this member was removed from the cluster.
    removed: tokio::sync::Notify,
    pub(crate) max_request_bytes: usize,
    /// `--watch-progress-notify-interval`: how often an idle watcher that asked for progress gets one.
    pub(crate) watch_progress_notify_interval: Duration,
    pub(crate) max_txn_ops: usize,
    /// Who is calling: `--client-cert-auth`, `--trusted-proxy-cn` (see `identity/rules.rs`).
    pub(crate) identity: IdentityRules,
    pub(crate) tokens: Arc<Tokens>,
    /// What the auth service needs beyond the applied auth state (`node/auth_service.rs`).
    pub(crate) auth: auth_service::AuthService,
    pub(crate) lessor: Arc<Lessor>,
    /// Where the applied batches go to the watchers (`watch_hub/`).
    pub(crate) watch_hub: Arc<crate::watch_hub::WatchHub>,
    /// The compacted revision up to which removal is done on this member (`jobs/compaction.rs`).
    compaction_removed: tokio::sync::watch::Sender<i64>,
    pub(crate) space: Arc<Space>,
    /// What the node holds only to release it when dropped; declared last, dropped last.
    _held: Held,
}

/// The data dir lock and the raft thread: released when the node is dropped.
struct Held {
    /// This process's hold on the data dir.
    _data_dir: crate::storage::data_dir::DataDirLock,
    /// Where raft runs (`raft/thread.rs`); dropped last, after the handles above.
    _raft_thread: crate::raft::thread::RaftThread,
}

impl Node {
    pub(crate) fn is_leader(&self) -> bool {
        self.leader() == Some(self.member_id)
    }

    /// `--election-timeout`.
    pub(crate) fn election_timeout(&self) -> Duration {
        self.election_timeout
    }

    /// The leader this member knows of; none once the raft core has stopped (openraft's metrics keep
    /// the last leader they saw).
    pub(crate) fn leader(&self) -> Option<NodeId> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        metrics.running_state.as_ref().ok().and(metrics.current_leader)
    }

    /// Resolves when the raft core stops, with the reason. A core that stops has met a storage failure
    /// (or was shut down): it never resumes, and the process must exit so that it is restarted.
    pub(crate) async fn stopped(&self) -> Fatal<NodeId> {
        // The server metrics change only with the leader, the vote or the membership (the full
        // metrics change with every entry), and close when the core is gone; the core publishes why
        // it stopped in the full metrics before that.
        let mut server = self.raft.server_metrics();
        loop {
            if let Err(fatal) = &self.raft.metrics().borrow().running_state {
                return fatal.clone();
            }
            if server.changed().await.is_err() {
                return self.raft.metrics().borrow().running_state.clone().err().unwrap_or(Fatal::Stopped);
            }
        }
    }

    /// Resolves once this member has been removed from the cluster (MemberRemove), as the leader
    /// tells it (`cluster/peer_service.rs`): it gets no more entries and must stop, as etcd's member does
    /// ("permanently removed from the cluster").
    pub(crate) async fn removed(&self) {
        self.removed.notified().await
    }

    /// The leader says this member was removed.
    pub(crate) fn mark_removed(&self) {
        self.removed.notify_one();
    }

    /// Whether the member can serve writes: a leader, a running core and an apply that is not
    /// waiting for storage space.
    pub(crate) fn serving(&self) -> bool {
        self.leader().is_some() && !self.space.stalled()
    }

    pub(crate) fn auth_enabled(&self) -> bool {
        self.latest.auth_enabled()
    }

    pub(crate) fn auth_revision(&self) -> u64 {
        self.latest.auth_revision()
    }

    /// Told of every applied change of the auth revision or of whether auth is enabled.
    pub(crate) fn auth_changes(&self) -> tokio::sync::watch::Receiver<(u64, bool)> {
        self.latest.auth_changes()
    }

    /// Waits until this member has removed what compacting at `revision` made unreachable (etcd's
    /// `physical` compaction).
    pub(crate) async fn removed_through(&self, revision: i64) {
        let mut removed = self.compaction_removed.subscribe();
        // The sender lives as long as the node, which `self` holds.
        let _ = removed.wait_for(|&done| done >= revision).await;
    }

    /// The store's revision after the latest applied batch.
    pub(crate) fn revision(&self) -> i64 {
        self.latest.revision()
    }

    /// Records a login's outcome in the audit log, if there is one.
    pub(crate) fn audit_login<T>(&self, user: &str, origin: Origin, outcome: &Result<T, EtcdError>) {
        self.auth.audit_login(user, origin, outcome, self.auth_revision());
    }

    /// Completes a response header with this member's identity and the raft term.
    pub(crate) fn fill(&self, header: &mut Option<ResponseHeader>) {
        let header = header.get_or_insert_with(Default::default);
        header.cluster_id = self.cluster_id;
        header.member_id = self.member_id;
        header.raft_term = self.raft.metrics().borrow().current_term;
    }

    /// A response header at `revision`, completed with this member's identity and the raft term.
    pub(crate) fn header(&self, revision: i64) -> Option<ResponseHeader> {
        let mut header = Some(ResponseHeader { revision, ..Default::default() });
        self.fill(&mut header);
        header
    }

    /// The applied state on the current kv environment. Hold it only for a read: a defragment
    /// waits for every holder before it swaps the environment.
    pub(crate) fn state(&self) -> Arc<State> {
        self.kv.current()
    }

    /// The swappable kv environment (tests: a snapshot installed without openraft).
    #[cfg(test)]
    pub(crate) fn kv_env(&self) -> &Arc<crate::raft::state_machine::KvEnv> {
        &self.kv
    }

    /// Replaces the kv environment with a compacting copy (`raft/state_machine/defrag.rs`).
    pub(crate) async fn defragment(&self) -> Result<crate::raft::state_machine::defrag::Defragmented, EtcdError> {
        let kv = self.kv.clone();
        match tokio::task::spawn_blocking(move || kv.defragment()).await {
            Ok(Ok(done)) => Ok(done),
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "failed to defragment");
                Err(EtcdError::DefragFailed(err.to_string()))
            }
            Err(_) => Err(EtcdError::Internal),
        }
    }

    /// This member's state for `/metrics` (the versions are the API layer's to fill).
    pub(crate) fn gauges(&self) -> crate::metrics::NodeGauges {
        let metrics = self.raft.metrics().borrow().clone();
        // A stopped raft core keeps its last leader in openraft's metrics: it has none any more.
        let leader = self.leader();
        let is_learner = metrics.membership_config.membership().learner_ids().any(|id| id == self.member_id);
        crate::metrics::NodeGauges {
            member_id: self.member_id,
            has_leader: leader.is_some(),
            is_leader: leader == Some(self.member_id),
            is_learner,
            proposals_applied: self.latest.requests(),
            current_revision: self.revision(),
            quota_bytes: self.space.quota().gauge(),
            db_size_bytes: self.state().disk_size().unwrap_or(0),
            db_size_in_use_bytes: self.space.in_use(),
            defragmenting: self.kv.defragmenting(),
            apply_waiting_for_space: self.space.stalled(),
            ..Default::default()
        }
    }
}
