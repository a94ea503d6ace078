//! A cluster member: the raft engine, the applied state it drives, and the two ways requests reach them.
//!
//! - `propose`: a write becomes an `InternalRaftRequest` with its request header; the proposer puts it
//!   in the next raft entry (with whatever else arrived meanwhile: group commit), which is committed
//!   and applied by the state machine; the request's own apply result comes back to the caller.
//! - `read`: a linearizable read first confirms leadership and waits until the read index is applied
//!   (openraft's `ensure_linearizable`), then reads from an LMDB read transaction; a serializable read
//!   skips the wait.
//!
//! Before proposing a put, a txn with a put or a lease grant, the node checks the space quota
//! (etcd's `quotaKVServer`): over it, the request gets "database space exceeded" and the member raises
//! a NOSPACE alarm through raft (`space/mod.rs`). The node owns the data dir lock for as long as it lives.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use openraft::error::Fatal;
use openraft::storage::RaftLogStorage;
use prost::Message;

use crate::apply::Applied;
use crate::auth::check::Authorizer;
use crate::auth::tokens::Tokens;
use crate::cluster::bootstrap;
use crate::cluster::network::PeerNetwork;
use crate::cluster::peers::Peers;
use crate::config::ClusterState;
use crate::config::Config;
use crate::error::EtcdError;
use crate::frontend::identity_rules::identity_rules;
use crate::identity::IdentityRules;
use crate::identity::{Origin, Requester};
use crate::lease::lessor::Lessor;
use crate::mvcc::ReadView;
use crate::proto::etcdserverpb::alarm_request::AlarmAction;
use crate::proto::etcdserverpb::{
    AlarmRequest, AlarmType, InternalRaftRequest, LeaseCheckpoint, LeaseCheckpointRequest, LeaseRevokeRequest,
    RequestHeader, ResponseHeader,
};
use crate::raft::proposer::Proposer;
use crate::raft::state_machine::{Committed, KvEnv, State, StateMachine};
use crate::raft::{NodeId, Raft};
use crate::space::Space;

pub(crate) mod compactor;
mod for_peers;
mod leader;
pub(crate) mod login_throttle;
mod read_rounds;
mod transfer;

pub(crate) struct Node {
    pub raft: Raft,
    proposer: Proposer,
    /// Linearizable reads here share their read index rounds (`node/read_rounds.rs`)...
    read_rounds: read_rounds::ReadRounds,
    /// ...and so do those the leader confirms, for itself and for followers.
    leader_read_rounds: read_rounds::ReadRounds,
    /// The applied state's environment, swapped by Defragment: reach it through `state()`.
    kv: Arc<KvEnv>,
    pub member_id: u64,
    pub cluster_id: u64,
    pub name: String,
    pub client_urls: Vec<String>,
    pub cluster_token: String,
    /// Dials the other members: raft's transport, and forwarding to the leader (`node/leader.rs`).
    pub peers: Arc<Peers>,
    /// `--election-timeout`: how much longer every lease lives when a new leader takes over.
    election_timeout: Duration,
    /// Notified when the leader says this member was removed from the cluster.
    removed: tokio::sync::Notify,
    pub max_request_bytes: usize,
    pub max_txn_ops: usize,
    /// Who is calling: `--client-cert-auth`, `--trusted-proxy-cn` (see `identity/rules.rs`).
    pub identity: IdentityRules,
    pub bcrypt_cost: u32,
    /// Login attempts slow down the next ones from the same source (`auth/throttle.rs`); the
    /// leader's decides for the cluster (`node/login_throttle.rs`).
    pub login_throttle: Arc<crate::auth::throttle::LoginThrottle>,
    /// Passwords Authenticate verified (`auth/verified.rs`).
    pub verified_passwords: crate::auth::verified::VerifiedPasswords,
    /// `--audit-log`: every auth decision as a JSON line (`auth/audit.rs`).
    pub audit: Option<Arc<crate::auth::audit::AuditLog>>,
    pub tokens: Arc<Tokens>,
    /// Whether auth is enabled, and the auth revision, as of the latest applied batch.
    auth_enabled: Arc<std::sync::atomic::AtomicBool>,
    auth_revision: Arc<AtomicU64>,
    /// `(auth revision, enabled)`, changed at the apply that changes either: long-lived streams
    /// re-judge their credentials then (`server/stream_credential.rs`).
    auth_changes: tokio::sync::watch::Sender<(u64, bool)>,
    next_request_id: AtomicU64,
    pub lessor: Arc<Lessor>,
    revision: Arc<std::sync::atomic::AtomicI64>,
    /// Requests applied since the process started (a blank or membership entry counts as one).
    applied_requests: Arc<AtomicU64>,
    /// The watchers' side of that broadcast (`watch_hub/`): the one subscriber that keeps up.
    pub watch_hub: Arc<crate::watch_hub::WatchHub>,
    pub space: Arc<Space>,
    /// A NOSPACE alarm proposal is on its way: concurrent writes at the quota propose only one.
    raising_nospace: std::sync::atomic::AtomicBool,
    /// This process's hold on the data dir (released when the node is dropped).
    _data_dir: crate::storage::data_dir::DataDirLock,
    /// Where raft runs (`raft/thread.rs`); dropped last, after the handles above.
    _raft_thread: crate::raft::thread::RaftThread,
}

/// How often the leader looks for expired leases.
const LEASE_EXPIRY_TICK: Duration = Duration::from_millis(250);
/// How often remaining lease TTLs are checkpointed through raft (etcd's default interval).
const LEASE_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(300);
/// Committed batches the broadcast holds for a subscriber that falls behind (the watch hub, which
/// keeps its own backlog bounded in bytes; behind by more, its watchers replay from LMDB).
const COMMITTED_BACKLOG: usize = 1024;
/// How often a missing disk-full ballast is put back (once no NOSPACE alarm is active).
const BALLAST_CHECK_INTERVAL: Duration = Duration::from_secs(10);

impl Node {
    /// Opens the member's storage, finds its place in the cluster (`cluster/bootstrap.rs`) and starts
    /// raft. A member that is its cluster's only voter is returned once it leads and has applied its
    /// log; otherwise at once — its peers reach it through the peer listener, which the caller starts
    /// next (`lib.rs`), and it catches up in the background.
    pub(crate) async fn start(config: &Config) -> anyhow::Result<Arc<Node>> {
        // Before any LMDB environment is opened: a second process on this data dir stops here.
        let data_dir = crate::storage::data_dir::lock(&config.data_dir)?;
        let member_dir = config.data_dir.join("member");
        crate::storage::data_dir::create_private_dir(&member_dir)?;
        let space = Arc::new(Space::new(
            config.quota,
            crate::space::ballast::Ballast::new(member_dir.join("ballast"), config.ballast_bytes),
        ));
        match config.quota {
            crate::space::Quota::Bytes(bytes) if bytes > crate::space::MAX_RECOMMENDED_QUOTA_BYTES => {
                tracing::warn!(
                    quota_bytes = bytes,
                    maximum_recommended_bytes = crate::space::MAX_RECOMMENDED_QUOTA_BYTES,
                    "quota exceeds the maximum value"
                );
            }
            crate::space::Quota::Bytes(bytes) => tracing::info!(quota_bytes = bytes, "enabled backend quota"),
            crate::space::Quota::Disabled { .. } => tracing::info!("disabled backend quota"),
        }
        if let Err(e) = space.ballast().ensure() {
            tracing::warn!(error = %e, "cannot put the disk-full ballast in place; will try again later");
        }
        // The segment log in `member/wal`; an LMDB log of an older version is moved into it first.
        let mut log = crate::raft::log::wal::migrate::open_member(&member_dir, space.clone()).await?;
        prepare_unsynced_kv(&member_dir)?;
        let sm = StateMachine::open_with(&member_dir.join("kv"), &member_dir.join("snap"), space.clone())?;
        let (state, kv) = (sm.state(), sm.kv_env());
        log.overlap_with_apply(sm.applied_index());
        let lessor = Arc::new(Lessor::default());
        let tokens = Arc::new(
            Tokens::new(&config.auth_token, config.auth_token_ttl).map_err(|e| anyhow::anyhow!("--auth-token: {e}"))?,
        );
        state.use_tokens(tokens.clone());
        let identity = identity_rules(config.client_tls.as_ref()).map_err(|e| anyhow::anyhow!("client TLS: {e}"))?;
        let (revision, auth_enabled, auth_revision) = {
            let txn = state.read_txn()?;
            lessor.recover(state.leases.all(&txn)?);
            (
                Arc::new(std::sync::atomic::AtomicI64::new(state.kv.view(&txn)?.rev)),
                Arc::new(std::sync::atomic::AtomicBool::new(state.auth.enabled(&txn)?)),
                Arc::new(AtomicU64::new(state.auth.revision(&txn)?)),
            )
        };
        let (committed, _) = tokio::sync::broadcast::channel(COMMITTED_BACKLOG);
        let auth_changes = tokio::sync::watch::Sender::new((
            auth_revision.load(Ordering::Acquire),
            auth_enabled.load(Ordering::Acquire),
        ));
        // Subscribed before anything is applied: the hub sees every batch from the store's revision on.
        let watch_hub = crate::watch_hub::WatchHub::start(committed.subscribe(), revision.load(Ordering::Acquire));
        let applied_requests = Arc::new(AtomicU64::new(0));
        let snapshot_due = Arc::new(tokio::sync::Notify::new());
        {
            let (lessor, committed, revision) = (lessor.clone(), committed.clone(), revision.clone());
            let applied_requests = applied_requests.clone();
            let (auth_enabled, auth_revision) = (auth_enabled.clone(), auth_revision.clone());
            let auth_changes = auth_changes.clone();
            let (snapshot_due, snapshot_count) = (snapshot_due.clone(), config.snapshot_count);
            let since_snapshot = AtomicU64::new(0);
            state.observe(Box::new(move |mut batch: Committed| {
                // Only the apply thread calls this: load and store need not be one atomic step.
                let applied = since_snapshot.load(Ordering::Relaxed) + batch.requests;
                if applied >= snapshot_count {
                    snapshot_due.notify_one();
                }
                since_snapshot.store(if applied >= snapshot_count { 0 } else { applied }, Ordering::Relaxed);
                revision.store(batch.revision, Ordering::Release);
                applied_requests.fetch_add(batch.requests, Ordering::Relaxed);
                auth_enabled.store(batch.auth_enabled, Ordering::Release);
                auth_revision.store(batch.auth_revision, Ordering::Release);
                let auth_now = (batch.auth_revision, batch.auth_enabled);
                auth_changes.send_if_modified(|auth| std::mem::replace(auth, auth_now) != auth_now);
                for &(id, ttl) in &batch.effects.granted {
                    lessor.granted(id, ttl);
                }
                for &id in &batch.effects.revoked {
                    lessor.revoked(id);
                }
                if let Some(installed) = &mut batch.installed {
                    // A snapshot install: the lease clock follows the installed lease table. Leases it
                    // no longer holds are dropped, the others resume from their last checkpoint (as
                    // after a restart). Taken out: the broadcast keeps the last batches.
                    let leases = std::mem::take(&mut installed.leases);
                    let kept: std::collections::HashSet<i64> = leases.iter().map(|&(id, _)| id).collect();
                    for (id, _) in lessor.remaining() {
                        if !kept.contains(&id) {
                            lessor.revoked(id);
                        }
                    }
                    lessor.recover(leases);
                }
                // No subscriber is fine: nobody is watching.
                let _ = committed.send(Arc::new(batch));
            }));
        }
        let peer_tls = match &config.peer_tls {
            Some(tls) => Some(
                crate::frontend::tls::client::client_config(
                    tls.trusted_ca_file.as_deref().unwrap_or(&tls.cert_file),
                    Some((&tls.cert_file, &tls.key_file)),
                    ("--peer-trusted-ca-file", "--peer-cert-file", "--peer-key-file"),
                )
                .map_err(|e| anyhow::anyhow!("peer TLS: {e}"))?,
            ),
            None => None,
        };
        let peer_message_limit = crate::cluster::peers::max_peer_message_bytes(config.max_request_bytes);
        let peers = Arc::new(Peers::new(peer_tls, peer_message_limit));
        let (member_id, cluster_id) = match log.identity()? {
            Some(ids) => ids,
            None => {
                let ids = match config.cluster_state {
                    ClusterState::New => {
                        let new = bootstrap::new_cluster(config);
                        (new.member_id, new.cluster_id)
                    }
                    ClusterState::Existing => bootstrap::join(&peers, config).await?,
                };
                log.set_identity(ids)?;
                ids
            }
        };
        peers.identify(member_id, cluster_id);
        // What this member knows was committed: applied before it serves (see below).
        let committed_at_start = log.read_committed().await?;
        let heartbeat = config.heartbeat_interval.as_millis() as u64;
        let election = config.election_timeout.as_millis() as u64;
        let raft_config = openraft::Config {
            cluster_name: config.cluster_token.clone(),
            heartbeat_interval: heartbeat,
            // etcd randomizes each election timeout in [timeout, 2 × timeout).
            election_timeout_min: election,
            election_timeout_max: 2 * election,
            // A single raft message stays within the peer transport's limit.
            snapshot_max_chunk_size: 4 << 20,
            max_payload_entries: crate::cluster::peers::max_append_entries(config.max_request_bytes),
            // --snapshot-count counts requests, as etcd's does, not entries (which group-commit
            // requests): the observer above triggers snapshots.
            snapshot_policy: openraft::SnapshotPolicy::Never,
            // etcd keeps 5,000 entries behind a snapshot for slow followers.
            max_in_snapshot_log_to_keep: config.snapshot_count.min(5_000),
            ..Default::default()
        }
        .validate()?;
        // openraft's core, state machine worker and replication tasks run on the raft thread.
        let raft_thread = crate::raft::thread::RaftThread::start()?;
        let network = PeerNetwork::new(peers.clone());
        let raft = raft_thread.run(Raft::new(member_id, Arc::new(raft_config), network, log, sm)).await?;
        let initialized = raft.is_initialized().await?;
        if !initialized && config.cluster_state == ClusterState::New {
            // Every initial member initializes with the same membership: whichever start, they agree.
            let members: BTreeMap<_, _> = bootstrap::new_cluster(config).members;
            raft.initialize(members).await?;
        }
        let sole_voter = if initialized || config.cluster_state == ClusterState::New {
            // The core publishes the membership it loaded (or was initialized with) shortly after start.
            let metrics = raft
                .wait(Some(Duration::from_secs(10)))
                .metrics(|m| m.membership_config.membership().nodes().next().is_some(), "membership loaded")
                .await?;
            metrics.membership_config.membership().voter_ids().eq([member_id])
        } else {
            false // joining: the leader's log brings the membership
        };
        if sole_voter {
            // No one to wait for: campaign now rather than after an election timeout.
            raft.trigger().elect().await?;
        }
        // Entries replayed at start are audited again: their lines carry the same raft index.
        let audit = match &config.audit {
            Some(audit) => {
                let log = Arc::new(
                    crate::auth::audit::AuditLog::open(audit.clone(), config.name.clone())
                        .map_err(anyhow::Error::msg)?,
                );
                let _ = state.auth.audit.set(log.clone());
                Some(log)
            }
            None => None,
        };
        let logged = raft.metrics().borrow().last_log_index;
        let seed =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let proposer = Proposer::start(raft_thread.handle(), raft.clone(), config.max_request_bytes)?;
        let node = Arc::new_cyclic(|me: &std::sync::Weak<Node>| Node {
            proposer,
            read_rounds: read_rounds::ReadRounds::new({
                let me = me.clone();
                Box::new(move || {
                    let me = me.clone();
                    async move { me.upgrade().ok_or(EtcdError::Stopped)?.fetch_read_index().await }.boxed()
                })
            }),
            leader_read_rounds: read_rounds::ReadRounds::new(read_rounds::confirmed_by_quorum(raft.clone())),
            raft,
            kv,
            member_id,
            cluster_id,
            name: config.name.clone(),
            client_urls: config.advertise_client_urls.clone(),
            cluster_token: config.cluster_token.clone(),
            peers,
            election_timeout: config.election_timeout,
            removed: tokio::sync::Notify::new(),
            max_request_bytes: config.max_request_bytes,
            max_txn_ops: config.max_txn_ops,
            bcrypt_cost: config.bcrypt_cost,
            login_throttle: Arc::new(crate::auth::throttle::LoginThrottle::new(config.login_throttle)),
            verified_passwords: Default::default(),
            audit,
            identity,
            tokens,
            auth_enabled,
            auth_revision,
            auth_changes,
            // Unique across restarts: member bits, then time, then a counter (as etcd's idutil).
            next_request_id: AtomicU64::new(((member_id & 0xffff) << 48) | ((seed & 0xff_ffff_ffff) << 8)),
            lessor,
            revision,
            applied_requests,
            watch_hub,
            space,
            raising_nospace: Default::default(),
            _data_dir: data_dir,
            _raft_thread: raft_thread,
        });
        if sole_voter {
            // Everything in the log at startup is committed once this (only) voter leads: serve after
            // it is applied, so that not even a serializable read misses an acknowledged write that a
            // power loss took out of the kv environment (it commits without syncing its meta page).
            node.raft
                .wait(Some(Duration::from_secs(10)))
                .metrics(|m| m.current_leader.is_some(), "leader elected")
                .await?;
            if let Some(index) = logged {
                // No deadline: however long the log is, serving earlier would serve older state.
                node.raft.wait(None).applied_index_at_least(Some(index), "log applied").await?;
            }
        } else if let Some(committed) = committed_at_start {
            // With peers, the log's tail may be uncommitted: wait for what this member knows was
            // committed, which openraft re-applies at once.
            node.raft.wait(None).applied_index_at_least(Some(committed.index), "committed log applied").await?;
        }
        tokio::spawn(count_leader_changes(node.raft.clone()));
        tokio::spawn(publish_attributes(Arc::downgrade(&node)));
        tokio::spawn(extend_leases_on_leadership(Arc::downgrade(&node)));
        tokio::spawn(raise_nospace_when_storage_full(Arc::downgrade(&node)));
        tokio::spawn(restore_ballast(Arc::downgrade(&node)));
        tokio::spawn(snapshot_when_due(node.raft.clone(), snapshot_due));
        tokio::spawn(expire_leases(Arc::downgrade(&node)));
        tokio::spawn(checkpoint_leases(Arc::downgrade(&node)));
        Ok(node)
    }

    /// A fresh id for a request or a server-chosen lease (positive, as etcd's lease ids are).
    pub(crate) fn next_id(&self) -> i64 {
        (self.next_request_id.fetch_add(1, Ordering::Relaxed) & (i64::MAX as u64)) as i64
    }

    pub(crate) fn is_leader(&self) -> bool {
        self.leader() == Some(self.member_id)
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

    /// Raises a NOSPACE alarm for this member through raft, unless one is active or on its way.
    pub(crate) async fn raise_nospace(&self) {
        let mine = |a: &crate::proto::etcdserverpb::AlarmMember| {
            a.member_id == self.member_id && a.alarm == AlarmType::Nospace as i32
        };
        if self.state().active_alarms().iter().any(mine) || self.raising_nospace.swap(true, Ordering::AcqRel) {
            return;
        }
        let alarm = AlarmRequest {
            action: AlarmAction::Activate as i32,
            member_id: self.member_id,
            alarm: AlarmType::Nospace as i32,
        };
        let req = InternalRaftRequest { alarm: Some(Box::new(alarm)), ..Default::default() };
        if let Err(e) = self.submit(req, &Requester::Member).await {
            tracing::warn!(error = %e, "raising the NOSPACE alarm failed; the next write over the quota tries again");
        }
        self.raising_nospace.store(false, Ordering::Release);
    }

    /// Proposes the remaining TTL of every lease, so a restart resumes them where they were.
    pub(crate) async fn checkpoint_leases(&self) -> Result<(), EtcdError> {
        let checkpoints: Vec<_> = self
            .lessor
            .remaining()
            .into_iter()
            .map(|(id, remaining_ttl)| LeaseCheckpoint { id, remaining_ttl })
            .collect();
        if checkpoints.is_empty() {
            return Ok(());
        }
        let req = LeaseCheckpointRequest { checkpoints };
        self.propose(
            InternalRaftRequest { lease_checkpoint: Some(Box::new(req)), ..Default::default() },
            &Requester::Member,
        )
        .await
        .map(|_| ())
    }

    pub(crate) fn auth_enabled(&self) -> bool {
        self.auth_enabled.load(Ordering::Acquire)
    }

    pub(crate) fn auth_revision(&self) -> u64 {
        self.auth_revision.load(Ordering::Acquire)
    }

    /// Told of every applied change of the auth revision or of whether auth is enabled.
    pub(crate) fn auth_changes(&self) -> tokio::sync::watch::Receiver<(u64, bool)> {
        self.auth_changes.subscribe()
    }

    /// Proposes one write through raft on behalf of `who` and returns what applying it produced. The
    /// entry's header carries the requester, so apply decides permissions at the entry's place in the log.
    pub(crate) async fn propose(&self, req: InternalRaftRequest, who: &Requester) -> Result<Applied, EtcdError> {
        let cost = crate::space::cost(&req);
        // Apply refuses it anyway while NOSPACE is active: refused here it takes no room in the raft
        // log either, which matters when the disk (not the quota) is what is full.
        if cost > 0 && self.state().nospace() {
            return Err(EtcdError::NoSpace);
        }
        // etcd's quotaKVServer/quotaLeaseServer: a request that would take the database to the quota
        // is refused here, and the alarm makes every member refuse such requests from then on.
        if !self.space.admits(cost) {
            tracing::warn!(
                quota_bytes = self.space.quota().gauge(),
                in_use_bytes = self.space.in_use(),
                "request exceeds the backend quota; raising the NOSPACE alarm"
            );
            // Boxed: rare, and inline it would be part of every proposal's future.
            Box::pin(self.raise_nospace()).await;
            return Err(EtcdError::NoSpace);
        }
        self.submit(req, who).await
    }

    /// `propose` without the quota check; the response header of the result is completed (`fill`).
    async fn submit(&self, mut req: InternalRaftRequest, who: &Requester) -> Result<Applied, EtcdError> {
        let id = self.next_id() as u64;
        req.header = Some(match who {
            Requester::Member => RequestHeader { id, member_internal: true, ..Default::default() },
            Requester::Client { username, revision, origin } => {
                // The origin travels only when this member keeps an audit log: it costs log bytes.
                let (audit_client, audit_credential) = match self.audit.is_some() {
                    true => {
                        (origin.client.map(|a| a.to_string()).unwrap_or_default(), origin.credential.as_str().into())
                    }
                    false => (String::new(), String::new()),
                };
                RequestHeader {
                    id,
                    username: username.clone(),
                    auth_revision: *revision,
                    member_internal: false,
                    audit_client,
                    audit_credential,
                }
            }
        });
        req.id = id;
        if req.encoded_len() > self.max_request_bytes {
            return Err(EtcdError::RequestTooLarge);
        }
        // etcd's request timeout: 5 s plus two election timeouts. The entry may still be committed
        // later (as in etcd, the client cannot tell); the caller is told it timed out.
        let deadline = Duration::from_secs(5) + 2 * self.election_timeout;
        let _pending = Pending::new();
        let mut applied =
            tokio::time::timeout(deadline, self.propose_on_leader(req)).await.map_err(|_| EtcdError::Timeout)??;
        if let Some(header) = applied.header_mut() {
            self.fill(header);
        }
        Ok(applied)
    }

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

    /// Completes a response header with this member's identity and the raft term.
    pub(crate) fn fill(&self, header: &mut Option<ResponseHeader>) {
        let header = header.get_or_insert_with(Default::default);
        header.cluster_id = self.cluster_id;
        header.member_id = self.member_id;
        header.raft_term = self.raft.metrics().borrow().current_term;
    }

    /// A response header at `revision`, completed with this member's identity and the raft term.
    /// Records a login's outcome in the audit log, if there is one.
    pub(crate) fn audit_login<T>(&self, user: &str, origin: Origin, outcome: &Result<T, EtcdError>) {
        let Some(log) = &self.audit else { return };
        let client = origin.client.map(|a| a.to_string());
        log.record(&crate::auth::audit::Decision {
            time: crate::auth::audit::now(),
            member: log.member(),
            client: client.as_deref(),
            source: origin.credential.as_str(),
            user,
            op: "authenticate",
            key: None,
            range_end: None,
            allowed: outcome.is_ok(),
            reason: outcome.as_ref().err().map(ToString::to_string),
            auth_revision: self.auth_revision(),
            raft_index: None,
        });
    }

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
            proposals_applied: self.applied_requests.load(Ordering::Relaxed),
            current_revision: self.revision(),
            quota_bytes: self.space.quota().gauge(),
            db_size_bytes: self.state().disk_size().unwrap_or(0),
            db_size_in_use_bytes: self.space.in_use(),
            defragmenting: self.kv.defragmenting(),
            apply_waiting_for_space: self.space.stalled(),
            ..Default::default()
        }
    }

    /// The store's revision after the latest applied batch.
    pub(crate) fn revision(&self) -> i64 {
        self.revision.load(Ordering::Acquire)
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
}

/// etcd's `etcd_server_leader_changes_seen_total`: each time this member sees a leader where it saw
/// another or none before (the first election included, as etcd counts it).
async fn count_leader_changes(raft: Raft) {
    // Not `metrics()`: those change with every entry, and each change would wake this task.
    let mut metrics = raft.server_metrics();
    let mut last = None;
    loop {
        let leader = metrics.borrow_and_update().current_leader;
        if leader.is_some() && leader != last {
            crate::metrics::LEADER_CHANGES.inc();
        }
        last = leader;
        if metrics.changed().await.is_err() {
            return; // the raft core is gone
        }
    }
}

/// One client request proposed and not yet answered: `etcd_server_proposals_pending`.
struct Pending;

impl Pending {
    fn new() -> Pending {
        crate::metrics::PROPOSALS_PENDING.inc();
        Pending
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        crate::metrics::PROPOSALS_PENDING.dec();
    }
}

/// The leader revokes expired leases through raft, so their keys are deleted at an ordered revision.
/// Builds a snapshot each time the apply observer says `--snapshot-count` requests were applied since
/// the last one; openraft then purges the log behind it.
async fn snapshot_when_due(raft: Raft, due: Arc<tokio::sync::Notify>) {
    loop {
        due.notified().await;
        if let Err(fatal) = raft.trigger().snapshot().await {
            tracing::debug!(error = %fatal, "raft stopped: no more snapshots");
            return;
        }
    }
}

/// A write found storage full (and gave back the ballast, if there was one): raise NOSPACE, so that
/// writes are refused until an operator makes room and disarms it.
async fn raise_nospace_when_storage_full(node: std::sync::Weak<Node>) {
    loop {
        let Some(space) = node.upgrade().map(|n| n.space.clone()) else { return };
        space.full_reported().await;
        let Some(node) = node.upgrade() else { return };
        node.raise_nospace().await;
    }
}

/// Puts a given-back ballast in place again once the NOSPACE alarm is disarmed and the disk has room.
async fn restore_ballast(node: std::sync::Weak<Node>) {
    let mut tick = tokio::time::interval(BALLAST_CHECK_INTERVAL);
    loop {
        tick.tick().await;
        let Some(node) = node.upgrade() else { return };
        let ballast_wanted = node.space.ballast().size() > 0 && !node.space.ballast().present();
        if !ballast_wanted || node.state().nospace() || node.space.stalled() {
            continue;
        }
        let space = node.space.clone();
        drop(node);
        match tokio::task::spawn_blocking(move || space.ballast().ensure()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot put the disk-full ballast back yet"),
            Err(_) => return,
        }
    }
}

async fn expire_leases(node: std::sync::Weak<Node>) {
    let mut tick = tokio::time::interval(LEASE_EXPIRY_TICK);
    loop {
        tick.tick().await;
        let Some(node) = node.upgrade() else { return };
        if !node.is_leader() {
            continue;
        }
        for id in node.lessor.take_expired() {
            let node = node.clone();
            tokio::spawn(async move {
                let revoke = LeaseRevokeRequest { id };
                match node
                    .propose(
                        InternalRaftRequest { lease_revoke: Some(Box::new(revoke)), ..Default::default() },
                        &Requester::Member,
                    )
                    .await
                {
                    Ok(_) => tracing::debug!(lease = format!("{id:x}"), "lease expired and was revoked"),
                    // Revoked meanwhile by a client: nothing left to do.
                    Err(EtcdError::LeaseNotFound) => node.lessor.revoked(id),
                    Err(e) => {
                        tracing::warn!(lease = format!("{id:x}"), error = %e, "revoking an expired lease failed; will retry")
                    }
                }
            });
        }
    }
}

async fn checkpoint_leases(node: std::sync::Weak<Node>) {
    let mut tick = tokio::time::interval(LEASE_CHECKPOINT_INTERVAL);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(node) = node.upgrade() else { return };
        if node.is_leader() {
            if let Err(e) = node.checkpoint_leases().await {
                tracing::warn!(error = %e, "lease checkpoint failed");
            }
        }
    }
}

/// Publishes this member's name and client URLs through raft once it has started (etcd's publish
/// step), so MemberList on every member shows them; retried until it is recorded.
async fn publish_attributes(node: std::sync::Weak<Node>) {
    loop {
        let Some(node) = node.upgrade() else { return };
        let membership = crate::cluster::membership::current(&node.raft);
        let published = membership
            .get_node(&node.member_id)
            .is_some_and(|m| m.name == node.name && m.client_urls == node.client_urls);
        if published {
            return;
        }
        if let Err(e) = node.publish().await {
            tracing::debug!(error = %e, "publishing this member's attributes failed; retrying");
        }
        drop(node);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// When this member becomes leader, every lease gets its full TTL again plus an election timeout
/// (etcd's `Promote`): keep-alives went to the old leader, whose clock this member did not see.
async fn extend_leases_on_leadership(node: std::sync::Weak<Node>) {
    let Some(mut metrics) = node.upgrade().map(|n| n.raft.server_metrics()) else { return };
    let mut led_term = None;
    loop {
        let (leader, term) = {
            let m = metrics.borrow_and_update();
            (m.current_leader, m.vote.leader_id().get_term())
        };
        let Some(node) = node.upgrade() else { return };
        if leader == Some(node.member_id) && led_term != Some(term) {
            led_term = Some(term);
            node.lessor.promote(node.election_timeout);
        }
        drop(node);
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// The kv environment commits without syncing (`raft/unsynced.rs`). If the run that left unsynced
/// pages ran under another kernel (an operating-system crash or power loss since), the environment
/// may be torn: it is thrown away, and the current snapshot (installed when the state machine opens)
/// plus the raft log after it rebuild it. Then this run is recorded as the one that may leave
/// unsynced pages.
fn prepare_unsynced_kv(member_dir: &std::path::Path) -> anyhow::Result<()> {
    use crate::raft::unsynced::{self, Previous};
    let boot = unsynced::boot_id();
    let previous = unsynced::previous(member_dir, boot.as_deref())
        .map_err(|e| anyhow::anyhow!("read {}: {e}", member_dir.join(unsynced::MARKER).display()))?;
    match previous {
        Previous::Clean => {}
        Previous::SameBoot => tracing::info!(
            "the last run stopped without a clean shutdown under this same kernel: its applied writes are in the \
             page cache"
        ),
        Previous::OtherBoot => {
            tracing::warn!(
                "the last run stopped without syncing the kv environment and the machine restarted since (or its \
                 boot id is unknown): rebuilding the kv environment from the current snapshot and the raft log"
            );
            let kv = member_dir.join("kv");
            unsynced::discard(&kv).map_err(|e| anyhow::anyhow!("discard {}: {e}", kv.display()))?;
        }
    }
    unsynced::mark(member_dir, boot.as_deref())
        .map_err(|e| anyhow::anyhow!("write {}: {e}", member_dir.join(unsynced::MARKER).display()))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};
    use crate::proto::etcdserverpb::PutRequest;

    fn config(data_dir: &std::path::Path, extra: &[&str]) -> Config {
        let dir = data_dir.display().to_string();
        let mut args = vec!["keyward", "serve", "--data-dir", dir.as_str(), "--ballast-bytes", "0"];
        args.extend_from_slice(extra);
        let Command::Serve(args) = Cli::try_parse_from(args).expect("flags").command else { panic!("not serve") };
        args.into_config().expect("config")
    }

    fn put(key: &str) -> InternalRaftRequest {
        let put = PutRequest { key: key.into(), value: b"v".to_vec(), ..Default::default() };
        InternalRaftRequest { put: Some(Box::new(put)), ..Default::default() }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stopped_raft_core_is_reported_and_no_leader_is_claimed() {
        let dir = tempfile::tempdir().unwrap();
        let node = Node::start(&config(dir.path(), &[])).await.unwrap();
        node.propose(put("a"), &Requester::Member).await.unwrap();
        assert!(crate::metrics::render(&node.gauges()).contains("etcd_server_has_leader 1\n"));
        let failed_before = crate::metrics::PROPOSALS_FAILED.get();

        node.state().inject_failure.store(true, Ordering::SeqCst);
        assert_eq!(node.propose(put("b"), &Requester::Member).await, Err(EtcdError::Stopped));
        let fatal = tokio::time::timeout(Duration::from_secs(30), node.stopped()).await.expect("the core stops");
        assert!(fatal.to_string().contains("injected storage failure"), "{fatal}");
        assert_eq!(node.leader(), None, "openraft's metrics still name the old leader; the node must not");
        let metrics = crate::metrics::render(&node.gauges());
        assert!(metrics.contains("etcd_server_has_leader 0\n"), "{metrics}");
        assert!(metrics.contains("etcd_server_is_leader 0\n"), "{metrics}");
        assert!(crate::metrics::PROPOSALS_FAILED.get() > failed_before, "the failed proposal is counted");
        assert!(!node.serving());
    }

    /// Every write's future is moved into a box of its own by the gRPC service (and moved again on
    /// the way): its size is copied per request. A raft request held inline (1,112 bytes before its
    /// kinds were boxed) and rare waits held inline made a proposal's future 8.6 KB.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_proposal_and_its_future_stay_small() {
        let dir = tempfile::tempdir().unwrap();
        let node = Node::start(&config(dir.path(), &[])).await.unwrap();
        let request = std::mem::size_of::<InternalRaftRequest>();
        assert!(request <= 512, "InternalRaftRequest is {request} bytes: is a new kind of request not boxed?");
        let future = std::mem::size_of_val(&node.propose(put("a"), &Requester::Member));
        assert!(future <= 3584, "a proposal's future is {future} bytes (3,336 when this test was written)");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_proposal_not_applied_in_time_gets_etcds_request_timed_out() {
        let dir = tempfile::tempdir().unwrap();
        let fast = ["--heartbeat-interval", "10", "--election-timeout", "100"];
        let node = Node::start(&config(dir.path(), &fast)).await.unwrap();
        node.propose(put("a"), &Requester::Member).await.unwrap();
        // Storage stays full: apply retries the batch and the proposal waits for it.
        node.state().inject_full.store(u32::MAX, Ordering::SeqCst);
        let started = std::time::Instant::now();
        assert_eq!(node.propose(put("b"), &Requester::Member).await, Err(EtcdError::Timeout));
        assert!(started.elapsed() >= Duration::from_secs(5), "not before etcd's request timeout");
        node.state().inject_full.store(0, Ordering::SeqCst);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_snapshot_install_rebuilds_the_revision_the_auth_state_and_the_lease_clock() {
        use crate::raft::state_machine::snapshot_tests::{as_member, auth_with_alice_reading, checkpoint, grant};
        let dir = tempfile::tempdir().unwrap();
        let node = Node::start(&config(dir.path(), &[])).await.unwrap();
        for id in [1, 2] {
            node.propose(grant(id, 60), &Requester::Member).await.unwrap();
        }
        assert_eq!((node.revision(), node.auth_enabled()), (1, false));
        // The leader's state: lease 1 revoked, lease 2 checkpointed with 20 s left, lease 3 new,
        // three more revisions, auth on.
        let leader_dir = tempfile::tempdir().unwrap();
        let leader =
            StateMachine::open(&leader_dir.path().join("kv"), &leader_dir.path().join("snap")).unwrap().state();
        let mut requests = vec![grant(2, 60), checkpoint(2, 20), grant(3, 30), put("a"), put("b"), put("c")];
        requests.extend(auth_with_alice_reading(b"a"));
        let results = leader.apply_requests(1, requests.into_iter().map(as_member).collect());
        assert!(results.iter().all(Result::is_ok), "{results:?}");

        node.state().install_snapshot_of(&leader).unwrap();

        assert_eq!(node.lessor.time_to_live(1), None, "a lease the installed state does not hold is dropped");
        let (ttl, left) = node.lessor.time_to_live(2).expect("lease 2");
        assert_eq!(ttl, 60);
        assert!(left <= 20 && left > 10, "resumes from its checkpoint (20 s), not its TTL: {left}");
        assert!(node.lessor.time_to_live(3).is_some_and(|(ttl, left)| ttl == 30 && left > 20));
        let txn = leader.read_txn().unwrap();
        assert_eq!(node.revision(), 4);
        assert!(node.auth_enabled());
        assert_eq!(node.auth_revision(), leader.auth.revision(&txn).unwrap());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_over_the_quota_raise_this_members_nospace_alarm_once() {
        let dir = tempfile::tempdir().unwrap();
        let node = Node::start(&config(dir.path(), &["--quota-backend-bytes", "1048576"])).await.unwrap();
        let value = vec![b'x'; 64 << 10];
        let mut accepted = 0;
        let refused = loop {
            let req = InternalRaftRequest {
                put: Some(Box::new(PutRequest {
                    key: format!("k{accepted}").into(),
                    value: value.clone(),
                    ..Default::default()
                })),
                ..Default::default()
            };
            match node.propose(req, &Requester::anonymous()).await {
                Ok(_) => accepted += 1,
                Err(e) => break e,
            }
            assert!(accepted < 1000, "the quota never refused a write");
        };
        assert_eq!(refused, EtcdError::NoSpace);
        assert!(accepted >= 2, "{accepted}");
        assert!(node.state().nospace());
        let alarms = node.state().active_alarms();
        assert_eq!(alarms.len(), 1);
        assert_eq!((alarms[0].member_id, alarms[0].alarm), (node.member_id, AlarmType::Nospace as i32));
        // Deletes still go through; a lease grant does not.
        let del = crate::proto::etcdserverpb::DeleteRangeRequest { key: b"k0".to_vec(), ..Default::default() };
        node.propose(
            InternalRaftRequest { delete_range: Some(Box::new(del)), ..Default::default() },
            &Requester::anonymous(),
        )
        .await
        .unwrap();
        let grant = crate::proto::etcdserverpb::LeaseGrantRequest { ttl: 60, id: 9 };
        let grant = InternalRaftRequest { lease_grant: Some(Box::new(grant)), ..Default::default() };
        assert_eq!(node.propose(grant, &Requester::anonymous()).await, Err(EtcdError::NoSpace));
        assert_eq!(node.state().active_alarms().len(), 1, "raised once");
    }
}
