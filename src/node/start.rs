//! Opening a member, in order: lock the data dir, open the space and the log, open the applied
//! state, find this member's place in the cluster (`cluster/bootstrap.rs`), start raft, then wait
//! until what is known committed is applied and start the background jobs (`node/jobs/`).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use openraft::storage::RaftLogStorage;

use super::auth_service::AuthService;
use super::latest_applied::LatestApplied;
use super::read_lease::ReadLease;
use super::writes::Writes;
use super::{jobs, read_rounds, Held, Node};
use crate::auth::tokens::Tokens;
use crate::cluster::bootstrap;
use crate::cluster::network::PeerNetwork;
use crate::cluster::peers::Peers;
use crate::cluster::quorum_acks::QuorumAcks;
use crate::config::{ClusterState, Config};
use crate::error::EtcdError;
use crate::lease::lessor::Lessor;
use crate::raft::election_timer::ElectionTimer;
use crate::raft::log::wal::Wal;
use crate::raft::proposer::Proposer;
use crate::raft::relay::Relay;
use crate::raft::state_machine::{State, StateMachine};
use crate::raft::thread::RaftThread;
use crate::raft::{LogId, NodeId, Raft};
use crate::space::Space;

impl Node {
    /// Opens the member's storage, finds its place in the cluster (`cluster/bootstrap.rs`) and starts
    /// raft. A member that is its cluster's only voter is returned once it leads and has applied its
    /// log; otherwise at once — its peers reach it through the peer listener, which the caller starts
    /// next (`server/run.rs`), and it catches up in the background.
    pub(crate) async fn start(config: &Config) -> anyhow::Result<Arc<Node>> {
        // Before any LMDB environment is opened: a second process on this data dir stops here.
        let data_dir = crate::storage::data_dir::lock(&config.data_dir)?;
        let member_dir = config.data_dir.join("member");
        crate::storage::data_dir::create_private_dir(&member_dir)?;
        let space = Arc::new(Space::open(&member_dir, config.quota, config.ballast_bytes));
        // The segment log in `member/wal`; an LMDB log of an older version is moved into it first.
        let mut log = crate::raft::log::wal::migrate::open_member(&member_dir, space.clone()).await?;
        let sm = open_state_machine(&member_dir, &space, &mut log)?;
        let (state, kv) = (sm.state(), sm.kv_env());
        let lessor = Arc::new(Lessor::default());
        let tokens = Arc::new(
            // The key files' messages already start with `--auth-token:`.
            Tokens::new(&config.auth_token, config.auth_token_ttl).map_err(|e| anyhow::anyhow!(e))?,
        );
        state.use_tokens(tokens.clone());
        let identity = crate::frontend::identity_rules::identity_rules(config.client_tls.as_ref())
            .map_err(|e| anyhow::anyhow!("client TLS: {e}"))?;
        let latest = Arc::new(recover(&state, &lessor)?);
        let counted =
            jobs::apply_observer::staggered_start(config.snapshot_count, &config.name, &config.initial_cluster);
        // Wake-ups from the raft thread to this runtime: answers and what each applied batch tells.
        let relay = Arc::new(Relay::start()?);
        let observed = jobs::apply_observer::observe(
            &state,
            relay.clone(),
            lessor.clone(),
            latest.clone(),
            config.snapshot_count,
            counted,
        );
        let peers = dial_peers(config)?;
        let (member_id, cluster_id) = place_in_cluster(&mut log, &peers, config).await?;
        // What this member knows was committed: applied before it serves (see `catch_up`).
        let committed_at_start = log.read_committed().await?;
        let acks = Arc::new(QuorumAcks::default());
        let (raft_thread, raft, election_timer) = start_raft(config, member_id, &peers, acks.clone(), log, sm).await?;
        let read_lease = config.leader_lease_reads.then(|| ReadLease::new(acks, member_id, raft.config()));
        let sole_voter = initialize(&raft, config, member_id).await?;
        let auth = AuthService::start(config, &state)?;
        let logged = raft.metrics().borrow().last_log_index;
        let proposer = Proposer::start(raft_thread.handle(), raft.clone(), relay, config.max_request_bytes);
        let node = Arc::new_cyclic(|me: &std::sync::Weak<Node>| Node {
            writes: Writes::new(proposer, member_id),
            read_rounds: read_rounds::ReadRounds::new("member", {
                let me = me.clone();
                Box::new(move || {
                    let me = me.clone();
                    async move { me.upgrade().ok_or(EtcdError::Stopped)?.fetch_read_index().await }.boxed()
                })
            }),
            leader_read_rounds: read_rounds::ReadRounds::new(
                "leader",
                read_rounds::confirmed_by_leader(raft.clone(), read_lease),
            ),
            raft,
            kv,
            latest,
            member_id,
            cluster_id,
            name: config.name.clone(),
            client_urls: config.advertise_client_urls.clone(),
            cluster_token: config.cluster_token.clone(),
            peers,
            forwarded_writes: Default::default(),
            awaited: state.awaited().clone(),
            election_timeout: config.election_timeout,
            election_timer,
            removed: tokio::sync::Notify::new(),
            max_request_bytes: config.max_request_bytes,
            watch_progress_notify_interval: config.watch_progress_notify_interval,
            max_txn_ops: config.max_txn_ops,
            identity,
            tokens,
            auth,
            lessor,
            watch_hub: observed.watch_hub,
            compaction_removed: tokio::sync::watch::Sender::new(-1),
            space,
            _held: Held { _data_dir: data_dir, _raft_thread: raft_thread },
        });
        node.catch_up(sole_voter, logged, committed_at_start).await?;
        jobs::spawn(&node, observed.snapshot_due, observed.removal_due);
        Ok(node)
    }

    /// Waits until this member may serve. Everything in the log at startup is committed once a sole
    /// voter leads: it serves after that is applied, so that not even a serializable read misses an
    /// acknowledged write that a power loss took out of the kv environment (it commits without
    /// syncing its meta page).
    async fn catch_up(
        &self,
        sole_voter: bool,
        logged: Option<u64>,
        committed_at_start: Option<LogId>,
    ) -> anyhow::Result<()> {
        if sole_voter {
            self.raft
                .wait(Some(Duration::from_secs(10)))
                .metrics(|m| m.current_leader.is_some(), "leader elected")
                .await?;
            if let Some(index) = logged {
                // No deadline: however long the log is, serving earlier would serve older state.
                self.raft.wait(None).applied_index_at_least(Some(index), "log applied").await?;
            }
        } else if let Some(committed) = committed_at_start {
            // With peers, the log's tail may be uncommitted: wait for what this member knows was
            // committed, which openraft re-applies at once.
            self.raft.wait(None).applied_index_at_least(Some(committed.index), "committed log applied").await?;
        }
        Ok(())
    }
}

/// Opens the applied state in `member_dir/kv` (rebuilt first if the last run may have left it torn,
/// `prepare_unsynced_kv`); the log then knows which entries apply has seen.
fn open_state_machine(member_dir: &Path, space: &Arc<Space>, log: &mut Wal) -> anyhow::Result<StateMachine> {
    prepare_unsynced_kv(member_dir)?;
    let sm = StateMachine::open_with(&member_dir.join("kv"), &member_dir.join("snap"), space.clone())?;
    log.overlap_with_apply(sm.applied_index());
    Ok(sm)
}

/// The kv environment commits without syncing (`raft/unsynced.rs`). If the run that left unsynced
/// pages ran under another kernel (an operating-system crash or power loss since), the environment
/// may be torn: it is thrown away, and the current snapshot (installed when the state machine opens)
/// plus the raft log after it rebuild it. Then this run is recorded as the one that may leave
/// unsynced pages.
fn prepare_unsynced_kv(member_dir: &Path) -> anyhow::Result<()> {
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

/// What the opened state holds: the lease clock resumes its leases, and the latest applied revision
/// and auth state are read, all in one read transaction.
fn recover(state: &State, lessor: &Lessor) -> anyhow::Result<LatestApplied> {
    let txn = state.read_txn()?;
    lessor.recover(state.leases.all(&txn)?);
    let (revision, auth_enabled, auth_revision) =
        (state.kv.view(&txn)?.rev, state.auth.enabled(&txn)?, state.auth.revision(&txn)?);
    let applied_index = state.applied_in(&txn).map_err(|e| anyhow::anyhow!(e))?.0.map_or(0, |id| id.index);
    Ok(LatestApplied::new(revision, auth_enabled, auth_revision, applied_index))
}

/// The client that dials the other members, with the peer certificates if there are any.
fn dial_peers(config: &Config) -> anyhow::Result<Arc<Peers>> {
    let peer_tls = match &config.peer_tls {
        Some(tls) => Some(
            crate::frontend::tls::client::client_config(
                tls.trusted_ca_file.as_deref().unwrap_or(&tls.cert_file),
                Some((&tls.cert_file, &tls.key_file)),
                ("--peer-trusted-ca-file", "--peer-cert-file", "--peer-key-file"),
                &tls.policy,
            )
            .map_err(|e| anyhow::anyhow!("peer TLS: {e}"))?,
        ),
        None => None,
    };
    let peer_message_limit = crate::cluster::peers::max_peer_message_bytes(config.max_request_bytes);
    Ok(Arc::new(Peers::new(peer_tls, peer_message_limit)))
}

/// This member's and its cluster's ids: recorded in the log, or, the first time, those of a new
/// cluster or those the cluster it joins gives it (recorded then). The peers know them too.
async fn place_in_cluster(log: &mut Wal, peers: &Peers, config: &Config) -> anyhow::Result<(NodeId, u64)> {
    let (member_id, cluster_id) = match log.identity()? {
        Some(ids) => ids,
        None => {
            let ids = match config.cluster_state {
                ClusterState::New => {
                    let new = bootstrap::new_cluster(config);
                    (new.member_id, new.cluster_id)
                }
                ClusterState::Existing => bootstrap::join(peers, config).await?,
            };
            log.set_identity(ids)?;
            ids
        }
    };
    peers.identify(member_id, cluster_id);
    Ok((member_id, cluster_id))
}

/// Starts openraft with this member's log and state machine, and the election timer that decides
/// when this member campaigns (`raft/election_timer.rs`).
async fn start_raft(
    config: &Config,
    member_id: NodeId,
    peers: &Arc<Peers>,
    acks: Arc<QuorumAcks>,
    log: Wal,
    sm: StateMachine,
) -> anyhow::Result<(RaftThread, Raft, Arc<ElectionTimer>)> {
    let raft_config = Arc::new(raft_config(config)?);
    // openraft's core, state machine worker and replication tasks run on the raft thread.
    let raft_thread = RaftThread::start()?;
    let network = PeerNetwork::new(peers.clone(), acks.clone());
    let sole_voter_log = log.clone();
    let raft = raft_thread.run(Raft::new(member_id, raft_config, network, log, sm)).await?;
    raft_thread.handle().spawn(tell_the_log_when_sole_voter(raft.clone(), sole_voter_log, member_id));
    // On the raft thread too: its ticks stop while that thread does not run, as etcd's raft loop's.
    let timer = Arc::new(ElectionTimer::default());
    let (heartbeat, election) = (config.heartbeat_interval, config.election_timeout);
    raft_thread.handle().spawn(timer.clone().run(raft.clone(), member_id, heartbeat, election));
    raft_thread.handle().spawn(super::check_quorum::step_down_without_quorum(
        raft.clone(),
        acks,
        member_id,
        heartbeat,
        election,
    ));
    Ok((raft_thread, raft, timer))
}

/// Tells the log whether this member is its cluster's only voter, whenever the membership changes:
/// a sole voter writes its own entries without the hop to the writer thread (`raft/log/wal/mod.rs`).
async fn tell_the_log_when_sole_voter(raft: Raft, log: Wal, me: NodeId) {
    let mut metrics = raft.server_metrics();
    loop {
        let sole = metrics.borrow_and_update().membership_config.membership().voter_ids().eq([me]);
        log.set_sole_voter(sole);
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// openraft's settings, from the member's flags.
fn raft_config(config: &Config) -> anyhow::Result<openraft::Config> {
    let heartbeat = config.heartbeat_interval.as_millis() as u64;
    let election = config.election_timeout.as_millis() as u64;
    let raft_config = openraft::Config {
        cluster_name: config.cluster_token.clone(),
        heartbeat_interval: heartbeat,
        // Campaigns are keyward's election timer's (`raft/election_timer.rs`: etcd's randomized
        // [E, 2E), in ticks). openraft's own would wait out a lease of `election_timeout_max` and then
        // a wall-clock timeout drawn once per process, and would campaign after a stall of this
        // member's own raft thread. What remains of openraft's settings is its leader lease: a voter
        // refuses votes for `election_timeout_max` after it heard from a leader, which at E is
        // etcd's check-quorum lease (`inLease`). The minimum bounds the leader's read lease
        // (`node/read_lease.rs`: a tenth less than E/2, well inside the voters' refusal of E).
        enable_elect: false,
        election_timeout_min: election / 2,
        election_timeout_max: election,
        // A single raft message stays within the peer transport's limit.
        snapshot_max_chunk_size: 4 << 20,
        max_payload_entries: crate::cluster::peers::max_append_entries(config.max_request_bytes),
        // --snapshot-count counts requests, as etcd's does, not entries (which group-commit
        // requests): the apply observer triggers snapshots (`node/jobs/apply_observer.rs`).
        snapshot_policy: openraft::SnapshotPolicy::Never,
        // etcd keeps 5,000 entries (one request each) behind a snapshot for slow followers; keyward's
        // entries batch requests, so the snapshot job purges by requests (`node/jobs/log_retention.rs`)
        // and openraft purges nothing by itself.
        max_in_snapshot_log_to_keep: u64::MAX,
        ..Default::default()
    };
    Ok(raft_config.validate()?)
}

/// Initializes a new cluster's raft (a restart or a joining member finds it initialized or gets it
/// from the leader). Returns whether this member is the cluster's only voter; if so, it campaigns at
/// once.
async fn initialize(raft: &Raft, config: &Config, member_id: NodeId) -> anyhow::Result<bool> {
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
    Ok(sole_voter)
}
