//! Prometheus metrics, named as etcd names them where etcd has the same metric.

use std::sync::LazyLock;

use prometheus::{Encoder, IntCounter, IntCounterVec, Opts, Registry, TextEncoder};

use crate::node::Node;

pub static REGISTRY: LazyLock<Registry> = LazyLock::new(Registry::new);

fn register<T: prometheus::core::Collector + Clone + 'static>(metric: T) -> T {
    // Registration fails only for a duplicate name, which the statics below rule out.
    let _ = REGISTRY.register(Box::new(metric.clone()));
    metric
}

pub static HEALTH_CHECKS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(Opts::new("etcd_server_health_checks_total", "/health checks by result."), &["result"])
            .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

pub static AUTH_DENIALS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new("keyward_auth_denials_total", "Requests refused by an auth check, by operation and reason."),
            &["op", "reason"],
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

pub static TLS_HANDSHAKE_FAILURES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new("keyward_tls_handshake_failures_total", "Client TLS connections refused, by reason."),
            &["reason"],
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

pub static PROPOSALS_FAILED: LazyLock<IntCounter> = LazyLock::new(|| {
    register(
        IntCounter::new("etcd_server_proposals_failed_total", "Proposals that failed.")
            .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

/// Gauges read from the node at scrape time, then everything registered.
pub fn render(node: &Node) -> String {
    let metrics = node.raft.metrics().borrow().clone();
    // A stopped raft core keeps its last leader in openraft's metrics: it has none any more.
    let leader = node.leader();
    let db_size = node.state().env.real_disk_size().unwrap_or(0);
    let mut out = format!(
        "# HELP etcd_server_has_leader Whether or not a leader exists. 1 is existence, 0 is not.\n\
         # TYPE etcd_server_has_leader gauge\netcd_server_has_leader {}\n\
         # HELP etcd_server_is_leader Whether or not this member is a leader.\n\
         # TYPE etcd_server_is_leader gauge\netcd_server_is_leader {}\n\
         # HELP etcd_server_proposals_committed_total The total number of consensus proposals committed.\n\
         # TYPE etcd_server_proposals_committed_total gauge\netcd_server_proposals_committed_total {}\n\
         # HELP etcd_server_proposals_applied_total The total number of consensus proposals applied.\n\
         # TYPE etcd_server_proposals_applied_total gauge\netcd_server_proposals_applied_total {}\n\
         # HELP etcd_server_quota_backend_bytes Current backend storage quota size in bytes.\n\
         # TYPE etcd_server_quota_backend_bytes gauge\netcd_server_quota_backend_bytes {}\n\
         # HELP etcd_mvcc_db_total_size_in_bytes Total size of the underlying database physically allocated in bytes.\n\
         # TYPE etcd_mvcc_db_total_size_in_bytes gauge\netcd_mvcc_db_total_size_in_bytes {}\n\
         # HELP etcd_mvcc_db_total_size_in_use_in_bytes Total size of the underlying database logically in use in bytes.\n\
         # TYPE etcd_mvcc_db_total_size_in_use_in_bytes gauge\netcd_mvcc_db_total_size_in_use_in_bytes {}\n\
         # HELP keyward_apply_waiting_for_space Whether applying committed entries waits for storage space (1) or not (0).\n\
         # TYPE keyward_apply_waiting_for_space gauge\nkeyward_apply_waiting_for_space {}\n",
        u8::from(leader.is_some()),
        u8::from(leader == Some(node.member_id)),
        metrics.last_log_index.unwrap_or(0),
        metrics.last_applied.map_or(0, |l| l.index),
        node.space.quota().gauge(),
        db_size,
        node.space.in_use(),
        u8::from(node.space.stalled()),
    );
    let mut buf = Vec::new();
    LazyLock::force(&HEALTH_CHECKS);
    LazyLock::force(&PROPOSALS_FAILED);
    LazyLock::force(&AUTH_DENIALS);
    LazyLock::force(&TLS_HANDSHAKE_FAILURES);
    if TextEncoder::new().encode(&REGISTRY.gather(), &mut buf).is_ok() {
        out.push_str(&String::from_utf8_lossy(&buf));
    }
    out
}
