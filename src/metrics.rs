//! Prometheus metrics, named as etcd names them where etcd has the same metric. The counters are
//! statics any module may bump; the node's gauges come in as plain values (`NodeGauges`), so this
//! module depends on nothing of keyward's.

use std::sync::LazyLock;

use prometheus::{Encoder, IntCounter, IntCounterVec, Opts, Registry, TextEncoder};

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

pub static PASSWORD_CHECKS: LazyLock<IntCounterVec> = LazyLock::new(|| {
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

pub static LOGINS_THROTTLED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(
        IntCounterVec::new(
            Opts::new(
                "keyward_auth_logins_throttled_total",
                "Authenticate attempts slowed down after failed logins from the same address: delayed (waited \
                 before the password check) or refused (too many requests).",
            ),
            &["action"],
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

pub static GATEWAY_BASIC_LOGINS: LazyLock<IntCounterVec> = LazyLock::new(|| {
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

pub static CLIENT_CONNECTIONS_REFUSED: LazyLock<IntCounter> = LazyLock::new(|| {
    register(
        IntCounter::new(
            "keyward_client_connections_refused_total",
            "Client connections closed on accept because the listener held --max-client-connections.",
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

pub static CLIENT_CONNECTIONS_IDLE_CLOSED: LazyLock<IntCounter> = LazyLock::new(|| {
    register(
        IntCounter::new(
            "keyward_client_connections_idle_closed_total",
            "Client connections closed because the client sent nothing for --client-idle-timeout (or no \
             first bytes within 10 s).",
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

pub static AUDIT_WRITE_FAILURES: LazyLock<IntCounter> = LazyLock::new(|| {
    register(
        IntCounter::new("keyward_audit_write_failures_total", "Audit log lines that could not be written.")
            .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

pub static PROPOSALS_FAILED: LazyLock<IntCounter> = LazyLock::new(|| {
    register(
        IntCounter::new("etcd_server_proposals_failed_total", "Proposals that failed.")
            .unwrap_or_else(|e| unreachable!("static metric definition: {e}")),
    )
});

/// A member's state at scrape time, as etcd's gauges report it.
#[derive(Clone, Copy, Debug, Default)]
pub struct NodeGauges {
    pub has_leader: bool,
    pub is_leader: bool,
    pub committed_index: u64,
    pub applied_index: u64,
    pub quota_bytes: i64,
    pub db_size_bytes: u64,
    pub db_size_in_use_bytes: u64,
    pub apply_waiting_for_space: bool,
}

/// The node's gauges, then everything registered.
pub fn render(node: &NodeGauges) -> String {
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
        u8::from(node.has_leader),
        u8::from(node.is_leader),
        node.committed_index,
        node.applied_index,
        node.quota_bytes,
        node.db_size_bytes,
        node.db_size_in_use_bytes,
        u8::from(node.apply_waiting_for_space),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gauges_render_as_etcd_names_them() {
        let text = render(&NodeGauges {
            has_leader: true,
            is_leader: false,
            committed_index: 7,
            applied_index: 6,
            quota_bytes: 1 << 31,
            db_size_bytes: 4096,
            db_size_in_use_bytes: 2048,
            apply_waiting_for_space: true,
        });
        for line in [
            "etcd_server_has_leader 1",
            "etcd_server_is_leader 0",
            "etcd_server_proposals_committed_total 7",
            "etcd_server_proposals_applied_total 6",
            "etcd_server_quota_backend_bytes 2147483648",
            "etcd_mvcc_db_total_size_in_use_in_bytes 2048",
            "keyward_apply_waiting_for_space 1",
            "etcd_mvcc_db_total_size_in_bytes 4096",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
        }
    }
}
