//! Prometheus metrics, named as etcd names them where etcd has the same metric. The counters are
//! statics any module may bump; the node's gauges come in as plain values (`NodeGauges`), so this
//! module depends on nothing of keyward's.

use std::sync::LazyLock;

use prometheus::{
    exponential_buckets, Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

pub(crate) static REGISTRY: LazyLock<Registry> = LazyLock::new(Registry::new);

fn register<T: prometheus::core::Collector + Clone + 'static>(metric: T) -> T {
    // Registration fails only for a duplicate name, which the statics below rule out.
    let _ = REGISTRY.register(Box::new(metric.clone()));
    metric
}

fn histogram(name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    register(
        Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
            .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
}

/// etcd's disk latency buckets: 1 ms doubling to 8.192 s.
fn disk_buckets() -> Vec<f64> {
    exponential_buckets(0.001, 2.0, 14).unwrap_or_else(|e| unreachable!("static buckets: {e}"))
}

/// keyward's raft log commit (one LMDB transaction, fsynced) of an append batch: etcd's WAL fsync.
pub(crate) static WAL_FSYNC_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "etcd_disk_wal_fsync_duration_seconds",
        "The latency distributions of fsync called by WAL.",
        disk_buckets(),
    )
});

/// An AppendEntries to a follower, from the leader's send to its answer (etcd's
/// `etcd_network_peer_round_trip_time_seconds` measures a probe instead): `kind` is `entries` or
/// `heartbeat` (none). With the follower's own handling time below, it shows where a replicated
/// write's time goes (docs/performance.md, issue 33).
pub(crate) static PEER_APPEND_ROUND_TRIP_SECONDS: LazyLock<HistogramVec> = LazyLock::new(|| {
    register(
        HistogramVec::new(
            HistogramOpts::new(
                "keyward_peer_append_entries_round_trip_seconds",
                "AppendEntries sent by this member as the leader, from send to answer.",
            )
            .buckets(peer_buckets()),
            &["kind"],
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

/// An AppendEntries received as a follower, from its decoding to its answer (the follower's log
/// write and sync included): `kind` as above.
pub(crate) static PEER_APPEND_HANDLING_SECONDS: LazyLock<HistogramVec> = LazyLock::new(|| {
    register(
        HistogramVec::new(
            HistogramOpts::new(
                "keyward_peer_append_entries_handling_seconds",
                "AppendEntries received by this member, from decoding to answer.",
            )
            .buckets(peer_buckets()),
            &["kind"],
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

/// How this member's AppendEntries reached it: `stream` (the long-lived stream per leader,
/// `cluster/append_stream.rs`) or `call` (one gRPC call each, from a member without the stream).
pub(crate) static PEER_APPEND_RECEIVED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new("keyward_peer_append_entries_received_total", "AppendEntries received, by transport."),
            &["transport"],
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

/// 50 us to about 1.6 s: a loopback round trip to a slow sync.
fn peer_buckets() -> Vec<f64> {
    exponential_buckets(0.00005, 2.0, 16).unwrap_or_else(|e| unreachable!("static buckets: {e}"))
}

/// The commit of one applied batch's kv transaction: etcd's backend commit.
pub(crate) static BACKEND_COMMIT_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "etcd_disk_backend_commit_duration_seconds",
        "The latency distributions of commit called by backend.",
        disk_buckets(),
    )
});

pub(crate) static DEFRAG_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "etcd_disk_backend_defrag_duration_seconds",
        "The latency distribution of backend defragmentation.",
        exponential_buckets(0.1, 2.0, 13).unwrap_or_else(|e| unreachable!("static buckets: {e}")),
    )
});

/// One background step removing compacted versions (`mvcc/compaction.rs`): how long it held the
/// write path, as etcd's compaction batch holds its backend's lock.
pub(crate) static COMPACTION_PAUSE_MS: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "etcd_debugging_mvcc_db_compaction_pause_duration_milliseconds",
        "Bucketed histogram of db compaction pause duration.",
        exponential_buckets(1.0, 2.0, 20).unwrap_or_else(|e| unreachable!("static buckets: {e}")),
    )
});

/// From the first removal step of a compaction to its last.
pub(crate) static COMPACTION_TOTAL_MS: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "etcd_debugging_mvcc_db_compaction_total_duration_milliseconds",
        "Bucketed histogram of db compaction total duration.",
        exponential_buckets(100.0, 2.0, 14).unwrap_or_else(|e| unreachable!("static buckets: {e}")),
    )
});

/// Versions removed by compaction (etcd counts the keys its batches delete from the backend).
pub(crate) static COMPACTION_KEYS: LazyLock<IntCounter> = LazyLock::new(|| {
    register(
        IntCounter::new("etcd_debugging_mvcc_db_compaction_keys_total", "Total number of db keys compacted.")
            .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

pub(crate) static LEADER_CHANGES: LazyLock<IntCounter> = LazyLock::new(|| {
    register(
        IntCounter::new("etcd_server_leader_changes_seen_total", "The number of leader changes seen.")
            .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

/// Leaderships given up for want of a quorum (`node/check_quorum.rs`).
pub(crate) static LEADER_STEP_DOWNS: LazyLock<IntCounter> = LazyLock::new(|| {
    register(
        IntCounter::new(
            "keyward_server_leader_step_downs_total",
            "Times this member gave up its leadership: no quorum of voters heard from within an election timeout.",
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

/// Client requests proposed and not yet applied (or failed).
pub(crate) static PROPOSALS_PENDING: LazyLock<IntGauge> = LazyLock::new(|| {
    register(
        IntGauge::new("etcd_server_proposals_pending", "The current number of pending proposals to commit.")
            .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

const GRPC_LABELS: [&str; 3] = ["grpc_type", "grpc_service", "grpc_method"];

/// go-grpc-prometheus' server metrics, bumped by `server/grpc_metrics.rs`.
pub(crate) static GRPC_STARTED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new("grpc_server_started_total", "Total number of RPCs started on the server."),
            &GRPC_LABELS,
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

pub(crate) static GRPC_HANDLED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new(
                "grpc_server_handled_total",
                "Total number of RPCs completed on the server, regardless of success or failure.",
            ),
            &["grpc_type", "grpc_service", "grpc_method", "grpc_code"],
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

pub(crate) static GRPC_MSG_RECEIVED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new("grpc_server_msg_received_total", "Total number of RPC stream messages received on the server."),
            &GRPC_LABELS,
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

pub(crate) static GRPC_MSG_SENT: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new("grpc_server_msg_sent_total", "Total number of gRPC stream messages sent by the server."),
            &GRPC_LABELS,
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

pub(crate) static GRPC_HANDLING_SECONDS: LazyLock<HistogramVec> = LazyLock::new(|| {
    register(
        HistogramVec::new(
            HistogramOpts::new(
                "grpc_server_handling_seconds",
                "Histogram of response latency (seconds) of gRPC that had been application-level handled by the \
                 server.",
            ),
            &GRPC_LABELS,
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

/// etcd's `client_requests_total`: calls by type (unary, stream) and the client's `client-api-version`.
pub(crate) static CLIENT_REQUESTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new("etcd_server_client_requests_total", "The total number of client requests per client version."),
            &["type", "client_api_version"],
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

/// gRPC bytes (HTTP/2 DATA: messages with their 5-byte prefix) received from and sent to clients.
pub(crate) static GRPC_RECEIVED_BYTES: LazyLock<IntCounter> = LazyLock::new(|| {
    register(
        IntCounter::new(
            "etcd_network_client_grpc_received_bytes_total",
            "The total number of bytes received from grpc clients.",
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

pub(crate) static GRPC_SENT_BYTES: LazyLock<IntCounter> = LazyLock::new(|| {
    register(
        IntCounter::new("etcd_network_client_grpc_sent_bytes_total", "The total number of bytes sent to grpc clients.")
            .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

/// `/health` answers, under etcd's names (`HEALTH_CHECKS` counts the same by label).
pub(crate) static HEALTH_SUCCESS: LazyLock<IntCounter> = LazyLock::new(|| {
    register(
        IntCounter::new("etcd_server_health_success", "The total number of successful health checks")
            .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

pub(crate) static HEALTH_FAILURES: LazyLock<IntCounter> = LazyLock::new(|| {
    register(
        IntCounter::new("etcd_server_health_failures", "The total number of failed health checks")
            .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

/// The Snapshot RPC's copy of the database: etcd's backend snapshot.
pub(crate) static BACKEND_SNAPSHOT_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "etcd_disk_backend_snapshot_duration_seconds",
        "The latency distribution of backend snapshots.",
        exponential_buckets(0.01, 2.0, 17).unwrap_or_else(|e| unreachable!("static buckets: {e}")),
    )
});

fn counter(name: &str, help: &str) -> IntCounter {
    register(IntCounter::new(name, help).unwrap_or_else(|e| unreachable!("static metric definition: {e}")))
}

/// etcd's mvcc operation counters, each under its name and its `etcd_debugging_` twin (etcd 3.4 keeps
/// both); bumped by `mvcc/counts.rs`.
pub(crate) static MVCC_RANGES: LazyLock<[IntCounter; 2]> = LazyLock::new(|| {
    let help = "Total number of ranges seen by this member.";
    [counter("etcd_mvcc_range_total", help), counter("etcd_debugging_mvcc_range_total", help)]
});

pub(crate) static MVCC_PUTS: LazyLock<[IntCounter; 2]> = LazyLock::new(|| {
    let help = "Total number of puts seen by this member.";
    [counter("etcd_mvcc_put_total", help), counter("etcd_debugging_mvcc_put_total", help)]
});

pub(crate) static MVCC_DELETES: LazyLock<[IntCounter; 2]> = LazyLock::new(|| {
    let help = "Total number of deletes seen by this member.";
    [counter("etcd_mvcc_delete_total", help), counter("etcd_debugging_mvcc_delete_total", help)]
});

pub(crate) static MVCC_TXNS: LazyLock<[IntCounter; 2]> = LazyLock::new(|| {
    let help = "Total number of txns seen by this member.";
    [counter("etcd_mvcc_txn_total", help), counter("etcd_debugging_mvcc_txn_total", help)]
});

pub(crate) static MVCC_PUT_BYTES: LazyLock<IntGauge> = LazyLock::new(|| {
    register(
        IntGauge::new(
            "etcd_debugging_mvcc_total_put_size_in_bytes",
            "The total size of put kv pairs seen by this member.",
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

/// At a member's start: `process_*` (CPU, memory, file descriptors, start time, from `/proc`, as Go's
/// client reports them), and the series of keyward's counters whose label values are known, at zero,
/// so that a dashboard sees a rate of 0 rather than no series.
pub(crate) fn initialize() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        #[cfg(target_os = "linux")]
        let _ = REGISTRY.register(Box::new(prometheus::process_collector::ProcessCollector::for_self()));
        for outcome in ["match", "mismatch", "unknown_user", "queue_full", "abandoned"] {
            PASSWORD_CHECKS.with_label_values(&[outcome]);
        }
        for action in ["delayed", "refused"] {
            LOGINS_THROTTLED.with_label_values(&[action]);
        }
    });
}

/// `/livez` and `/readyz` (etcd 3.5.11+): each check's last result (1 ok, 0 failed) and count, by the
/// probe (`type`: livez, readyz) and the check's `name`.
pub(crate) static PROBE_CHECK: LazyLock<prometheus::IntGaugeVec> = LazyLock::new(|| {
    register(
        prometheus::IntGaugeVec::new(
            Opts::new("etcd_server_healthcheck", "The result of each kind of healthcheck."),
            &["type", "name"],
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

pub(crate) static PROBE_CHECKS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new("etcd_server_healthchecks_total", "The total number of each kind of healthcheck."),
            &["type", "name", "status"],
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

pub(crate) static HEALTH_CHECKS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(Opts::new("etcd_server_health_checks_total", "/health checks by result."), &["result"])
            .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

pub(crate) static AUTH_DENIALS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new("keyward_auth_denials_total", "Requests refused by an auth check, by operation and reason."),
            &["op", "reason"],
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

pub(crate) static TLS_HANDSHAKE_FAILURES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new(
                "keyward_tls_handshake_failures_total",
                "TLS connections refused, by reason (closed_before_hello: closed before any byte, a port check).",
            ),
            &["reason"],
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

fn counter_vec(name: &str, help: &str, label: &str) -> IntCounterVec {
    register(
        IntCounterVec::new(Opts::new(name, help), &[label])
            .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
}

/// Read index rounds (`node/read_rounds.rs`) by kind: `member` (every member's own; a follower's ask
/// the leader) and `leader` (the leader's, serving its own members' rounds and the followers').
pub(crate) static READ_INDEX_ROUNDS: LazyLock<IntCounterVec> =
    LazyLock::new(|| counter_vec("keyward_read_index_rounds_total", "Read index rounds, by kind.", "kind"));

/// The linearizable reads those rounds served: reads per round is this over the rounds.
pub(crate) static READ_INDEX_READS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec("keyward_read_index_reads_total", "Reads served by read index rounds, by kind of round.", "kind")
});

/// The leader's read indexes by what confirmed them: `lease` (`node/read_lease.rs`) or `quorum` (a
/// heartbeat round).
pub(crate) static READ_INDEX_CONFIRMATIONS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec("keyward_read_index_confirmations_total", "The leader's read indexes, by what confirmed them.", "by")
});

/// How long a round took, from its start to its read index.
pub(crate) static READ_INDEX_ROUND_SECONDS: LazyLock<HistogramVec> = LazyLock::new(|| {
    register(
        HistogramVec::new(
            HistogramOpts::new("keyward_read_index_round_duration_seconds", "Read index round durations, by kind.")
                .buckets(
                    exponential_buckets(0.000_05, 2.0, 16).unwrap_or_else(|e| unreachable!("static buckets: {e}")),
                ),
            &["kind"],
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

/// Snapshots sent to a member (`To`, its id in hex) and installed there (`cluster/snapshot_sender.rs`).
pub(crate) static SNAPSHOT_SEND_SUCCESS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec("etcd_network_snapshot_send_success", "Total number of successful snapshot sends", "To")
});

/// Snapshot transfers given up (openraft's replication starts another, which resumes this one).
pub(crate) static SNAPSHOT_SEND_FAILURES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec("etcd_network_snapshot_send_failures", "Total number of snapshot send failures", "To")
});

/// Snapshots not sent: the member already held what they cover.
pub(crate) static SNAPSHOT_SEND_SKIPPED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "keyward_network_snapshot_send_skipped_total",
        "Snapshot transfers not made: the member already held the log the snapshot covers.",
        "To",
    )
});

/// Snapshot chunks sent while an earlier chunk of the same transfer was still unanswered
/// (`cluster/snapshot_sender.rs` keeps several in flight).
pub(crate) static SNAPSHOT_CHUNKS_SENT_AHEAD: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "keyward_network_snapshot_chunks_sent_ahead_total",
        "Snapshot chunks sent while an earlier chunk of the same transfer was still unanswered.",
        "To",
    )
});

/// Snapshot chunks a member holds that came before the chunks ahead of them
/// (`cluster/snapshot_receiver.rs`): they wait for those, a few at most.
pub(crate) static SNAPSHOT_CHUNKS_WAITING: LazyLock<IntGauge> = LazyLock::new(|| {
    register(
        IntGauge::new(
            "keyward_network_snapshot_chunks_waiting",
            "Snapshot chunks received ahead of the end of what was received, waiting for the chunks before them.",
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

/// Snapshots received whole from the leader (`From`), installed or already covered
/// (`cluster/snapshot_receiver.rs`).
pub(crate) static SNAPSHOT_RECEIVE_SUCCESS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec("etcd_network_snapshot_receive_success", "Total number of successful snapshot receives", "From")
});

/// Bytes of snapshot chunks written by this member, resent ones included: against the size of the
/// snapshots received, what restarts from byte 0 cost.
pub(crate) static SNAPSHOT_RECEIVED_BYTES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "keyward_network_snapshot_received_bytes_total",
        "Bytes of snapshot chunks received from the leader, chunks received again included.",
        "From",
    )
});

/// Snapshots whose receipt or install failed, or that were abandoned half-received for another.
pub(crate) static SNAPSHOT_RECEIVE_FAILURES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec("etcd_network_snapshot_receive_failures", "Total number of snapshot receive failures", "From")
});

/// Peer requests refused because their caller is not a member (`cluster/peer_guard.rs`), by reason.
pub(crate) static PEER_REQUESTS_REFUSED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new("keyward_peer_requests_refused_total", "Peer requests refused: the caller is not a member."),
            &["reason"],
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

pub(crate) static PASSWORD_CHECKS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new(
                "keyward_auth_password_checks_total",
                "Password checks by outcome: match, mismatch, unknown_user, queue_full, abandoned (bcrypt), cached (a password verified before: no bcrypt).",
            ),
            &["outcome"],
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

pub(crate) static LOGINS_THROTTLED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new(
                "keyward_auth_logins_throttled_total",
                "Authenticate attempts slowed down after earlier attempts from the same source: delayed (waited \
                 before the password check) or refused (too many requests).",
            ),
            &["action"],
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

pub(crate) static GATEWAY_BASIC_LOGINS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new(
                "keyward_gateway_basic_logins_total",
                "HTTP gateway requests with Basic credentials, by outcome: cached (a verified login reused), \
                 verified (Authenticate ran and accepted them), refused (Authenticate refused them).",
            ),
            &["outcome"],
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

pub(crate) static CLIENT_CONNECTIONS_REFUSED: LazyLock<IntCounter> = LazyLock::new(|| {
    register(
        IntCounter::new(
            "keyward_client_connections_refused_total",
            "Client connections closed on accept because the listener held --max-client-connections.",
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

pub(crate) static CLIENT_CONNECTIONS_EVICTED: LazyLock<IntCounter> = LazyLock::new(|| {
    register(
        IntCounter::new(
            "keyward_client_connections_evicted_total",
            "Client connections that had not yet had a request answered (nor a verified client certificate), \
             closed to make room for a new connection at --max-client-connections.",
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

pub(crate) static CLIENT_CONNECTIONS_IDLE_CLOSED: LazyLock<IntCounter> = LazyLock::new(|| {
    register(
        IntCounter::new(
            "keyward_client_connections_idle_closed_total",
            "Client connections closed because the client sent nothing for --client-idle-timeout (or no \
             first bytes within 10 s).",
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

pub(crate) static AUDIT_WRITE_FAILURES: LazyLock<IntCounter> = LazyLock::new(|| {
    register(
        IntCounter::new("keyward_audit_write_failures_total", "Audit log lines that could not be written.")
            .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

pub(crate) static PROPOSALS_FAILED: LazyLock<IntCounter> = LazyLock::new(|| {
    register(
        IntCounter::new("etcd_server_proposals_failed_total", "Proposals that failed.")
            .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

/// A member's state at scrape time, as etcd's gauges report it.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NodeGauges {
    pub member_id: u64,
    /// The etcd version keyward answers as (`etcd_server_version`), filled by `server/http.rs`.
    pub server_version: &'static str,
    /// major.minor of `server_version` (`etcd_cluster_version`).
    pub cluster_version: &'static str,
    pub has_leader: bool,
    pub is_leader: bool,
    pub is_learner: bool,
    /// Client requests (and raft's own entries) committed and applied since the process started:
    /// keyward applies an entry as soon as it learns it is committed, so the two are the same count.
    pub proposals_applied: u64,
    pub current_revision: i64,
    pub quota_bytes: i64,
    pub db_size_bytes: u64,
    pub db_size_in_use_bytes: u64,
    pub defragmenting: bool,
    pub apply_waiting_for_space: bool,
}

/// One gauge family in Prometheus' text format.
fn gauge(out: &mut String, name: &str, help: &str, labels: &str, value: impl std::fmt::Display) {
    use std::fmt::Write;
    let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{labels} {value}\n");
}

/// The node's gauges, then everything registered.
pub(crate) fn render(node: &NodeGauges) -> String {
    let mut out = String::new();
    for (name, help, labels, value) in node_gauges(node) {
        gauge(&mut out, name, help, &labels, value);
    }
    register_every_family();
    let mut buf = Vec::new();
    if TextEncoder::new().encode(&REGISTRY.gather(), &mut buf).is_ok() {
        out.push_str(&String::from_utf8_lossy(&buf));
    }
    out
}

/// Name, help, labels and value of each gauge read from the node (etcd's names and help texts).
fn node_gauges(node: &NodeGauges) -> [(&'static str, &'static str, String, i128); 15] {
    [
        (
            "etcd_server_has_leader",
            "Whether or not a leader exists. 1 is existence, 0 is not.",
            String::new(),
            i128::from(node.has_leader),
        ),
        (
            "etcd_server_is_leader",
            "Whether or not this member is a leader. 1 if is, 0 otherwise.",
            String::new(),
            i128::from(node.is_leader),
        ),
        (
            "etcd_server_is_learner",
            "Whether or not this member is a learner. 1 if is, 0 otherwise.",
            String::new(),
            i128::from(node.is_learner),
        ),
        (
            "etcd_server_id",
            "Server or member ID in hexadecimal format. 1 for 'server_id' label with current ID.",
            format!("{{server_id=\"{:x}\"}}", node.member_id),
            1,
        ),
        (
            "etcd_server_version",
            "Which version is running. 1 for 'server_version' label with current version.",
            format!("{{server_version=\"{}\"}}", node.server_version),
            1,
        ),
        (
            "etcd_cluster_version",
            "Which version is running. 1 for 'cluster_version' label with current cluster version",
            format!("{{cluster_version=\"{}\"}}", node.cluster_version),
            1,
        ),
        (
            "etcd_server_proposals_committed_total",
            "The total number of consensus proposals committed.",
            String::new(),
            i128::from(node.proposals_applied),
        ),
        (
            "etcd_server_proposals_applied_total",
            "The total number of consensus proposals applied.",
            String::new(),
            i128::from(node.proposals_applied),
        ),
        (
            "etcd_server_quota_backend_bytes",
            "Current backend storage quota size in bytes.",
            String::new(),
            i128::from(node.quota_bytes),
        ),
        (
            "etcd_mvcc_db_total_size_in_bytes",
            "Total size of the underlying database physically allocated in bytes.",
            String::new(),
            i128::from(node.db_size_bytes),
        ),
        (
            "etcd_mvcc_db_total_size_in_use_in_bytes",
            "Total size of the underlying database logically in use in bytes.",
            String::new(),
            i128::from(node.db_size_in_use_bytes),
        ),
        (
            "etcd_debugging_mvcc_db_total_size_in_bytes",
            "Total size of the underlying database physically allocated in bytes.",
            String::new(),
            i128::from(node.db_size_bytes),
        ),
        (
            "etcd_debugging_mvcc_current_revision",
            "The current revision of store.",
            String::new(),
            i128::from(node.current_revision),
        ),
        (
            "etcd_disk_defrag_inflight",
            "Whether or not defrag is active on the member. 1 means active, 0 means not.",
            String::new(),
            i128::from(node.defragmenting),
        ),
        (
            "keyward_apply_waiting_for_space",
            "Whether applying committed entries waits for storage space (1) or not (0).",
            String::new(),
            i128::from(node.apply_waiting_for_space),
        ),
    ]
}

/// Families appear in the exposition, at zero, before anything was counted in them (as Go's
/// client shows a registered family): each is created on first use, so use them all here.
fn register_every_family() {
    for family in [&HEALTH_CHECKS, &AUTH_DENIALS, &TLS_HANDSHAKE_FAILURES, &PEER_REQUESTS_REFUSED] {
        LazyLock::force(family);
    }
    for family in [&READ_INDEX_ROUNDS, &READ_INDEX_READS, &READ_INDEX_CONFIRMATIONS] {
        LazyLock::force(family);
    }
    LazyLock::force(&READ_INDEX_ROUND_SECONDS);
    for histogram in [&WAL_FSYNC_SECONDS, &BACKEND_COMMIT_SECONDS, &DEFRAG_SECONDS, &BACKEND_SNAPSHOT_SECONDS] {
        LazyLock::force(histogram);
    }
    for histogram in [&COMPACTION_PAUSE_MS, &COMPACTION_TOTAL_MS] {
        LazyLock::force(histogram);
    }
    LazyLock::force(&COMPACTION_KEYS);
    for counter in [&GRPC_RECEIVED_BYTES, &GRPC_SENT_BYTES, &HEALTH_SUCCESS, &HEALTH_FAILURES] {
        LazyLock::force(counter);
    }
    for counters in [&MVCC_RANGES, &MVCC_PUTS, &MVCC_DELETES, &MVCC_TXNS] {
        LazyLock::force(counters);
    }
    LazyLock::force(&MVCC_PUT_BYTES);
    LazyLock::force(&PROPOSALS_FAILED);
    LazyLock::force(&PROPOSALS_PENDING);
    LazyLock::force(&LEADER_CHANGES);
    LazyLock::force(&LEADER_STEP_DOWNS);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gauges_render_as_etcd_names_them() {
        let text = render(&NodeGauges {
            member_id: 0xbdae9bbc11dd390d,
            server_version: "3.5.13",
            cluster_version: "3.5",
            has_leader: true,
            is_leader: false,
            is_learner: false,
            proposals_applied: 7,
            current_revision: 12,
            quota_bytes: 1 << 31,
            db_size_bytes: 4096,
            db_size_in_use_bytes: 2048,
            defragmenting: true,
            apply_waiting_for_space: true,
        });
        for line in [
            "etcd_server_has_leader 1",
            "etcd_server_is_leader 0",
            "etcd_server_is_learner 0",
            "etcd_server_id{server_id=\"bdae9bbc11dd390d\"} 1",
            "etcd_server_version{server_version=\"3.5.13\"} 1",
            "etcd_server_proposals_committed_total 7",
            "etcd_server_proposals_applied_total 7",
            "etcd_server_quota_backend_bytes 2147483648",
            "etcd_mvcc_db_total_size_in_use_in_bytes 2048",
            "etcd_debugging_mvcc_current_revision 12",
            "etcd_disk_defrag_inflight 1",
            "keyward_apply_waiting_for_space 1",
            "etcd_mvcc_db_total_size_in_bytes 4096",
            "# TYPE etcd_disk_wal_fsync_duration_seconds histogram",
            "# TYPE etcd_disk_backend_commit_duration_seconds histogram",
            "# TYPE etcd_server_leader_changes_seen_total counter",
            "# TYPE etcd_server_proposals_pending gauge",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
        }
    }
}
