//! `/livez` and `/readyz` (etcd 3.5.11+), beside `/health` on the client and metrics listeners.
//!
//! Each probe runs named checks, as etcd's `CheckRegistry`: `/livez` whether this member answers a
//! serializable read (its process and storage work, leader or not); `/readyz` also that no CORRUPT
//! alarm is active and that a linearizable read completes (the cluster has a quorum and this member
//! is caught up). `?exclude=NAME` (repeatable) leaves a check out (an unknown name is logged, not
//! refused); `/readyz/NAME` runs that one check. Answers are etcd's, text:
//! - passing: 200 `ok\n`; with `?verbose`, one `[+]NAME ok\n` line per check first;
//! - failing: 503 with every check's line (`[-]NAME failed: REASON\n`), then a blank line (Go's
//!   `http.Error` appends a newline to the text).
//!
//! Each check's result is also a metric: `etcd_server_healthcheck{type,name}` (1 ok, 0 failed) and
//! `etcd_server_healthchecks_total{type,name,status}`.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use axum::routing::get;
use axum::Router;

use crate::error::EtcdError;
use crate::gateway::{get_only, go_http_error, go_plain_text};
use crate::node::Node;
use crate::proto::etcdserverpb::AlarmType;

/// How long a read check waits before it counts as failed (as `/health`'s read).
const READ_DEADLINE: Duration = Duration::from_secs(1);

/// The probe routes, for a listener's router.
pub(crate) fn router(node: Arc<Node>) -> Router {
    Router::new()
        .route("/livez", get(|s, u| probe(s, u, Probe::Livez, None)).fallback(get_only))
        .route("/readyz", get(|s, u| probe(s, u, Probe::Readyz, None)).fallback(get_only))
        .route("/livez/{check}", get(|s, u, Path(c)| probe(s, u, Probe::Livez, Some(c))).fallback(get_only))
        .route("/readyz/{check}", get(|s, u, Path(c)| probe(s, u, Probe::Readyz, Some(c))).fallback(get_only))
        .with_state(node)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Probe {
    Livez,
    Readyz,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Check {
    DataCorruption,
    SerializableRead,
    LinearizableRead,
}

impl Probe {
    fn name(self) -> &'static str {
        match self {
            Probe::Livez => "livez",
            Probe::Readyz => "readyz",
        }
    }

    /// The checks in etcd's order of registration.
    fn checks(self) -> &'static [Check] {
        match self {
            Probe::Livez => &[Check::SerializableRead],
            Probe::Readyz => &[Check::DataCorruption, Check::SerializableRead, Check::LinearizableRead],
        }
    }
}

impl Check {
    fn name(self) -> &'static str {
        match self {
            Check::DataCorruption => "data_corruption",
            Check::SerializableRead => "serializable_read",
            Check::LinearizableRead => "linearizable_read",
        }
    }

    async fn run(self, node: &Node) -> Result<(), String> {
        match self {
            Check::DataCorruption => {
                let corrupt = node.state().active_alarms().iter().any(|a| a.alarm == AlarmType::Corrupt as i32);
                if corrupt {
                    return Err("alarm activated: CORRUPT".to_string());
                }
                Ok(())
            }
            Check::SerializableRead => read(node, false).await,
            Check::LinearizableRead => read(node, true).await,
        }
    }
}

/// etcd's read check: a one-key, keys-only range, as root (so auth never fails it).
async fn read(node: &Node, linearizable: bool) -> Result<(), String> {
    let answered = tokio::time::timeout(READ_DEADLINE, node.read(linearizable, |view, _| Ok(view.rev))).await;
    match answered {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(EtcdError::Timeout.to_string()),
    }
}

/// One probe: the root path (every check but the excluded ones) or one check's sub-path.
async fn probe(State(node): State<Arc<Node>>, uri: Uri, probe: Probe, only: Option<String>) -> Response {
    let query = uri.query().unwrap_or("");
    let checks: Vec<Check> = match &only {
        Some(name) => match probe.checks().iter().find(|c| c.name() == name) {
            Some(check) => vec![*check],
            // Not a check: etcd's mux has no such path.
            None => return go_http_error(StatusCode::NOT_FOUND, "404 page not found"),
        },
        None => {
            let excluded: Vec<&str> = query_values(query, "exclude").collect();
            let unknown: Vec<&&str> =
                excluded.iter().filter(|name| !probe.checks().iter().any(|c| c.name() == **name)).collect();
            if !unknown.is_empty() {
                // As etcd: for version compatibility an unknown name does not fail the request.
                tracing::warn!(missing_health_checks = ?unknown, "some health checks cannot be excluded");
            }
            probe.checks().iter().copied().filter(|c| !excluded.contains(&c.name())).collect()
        }
    };
    let mut report = String::new();
    let mut healthy = true;
    for check in checks {
        let result = check.run(&node).await;
        let status = if result.is_ok() { "success" } else { "error" };
        crate::metrics::PROBE_CHECK.with_label_values(&[probe.name(), check.name()]).set(i64::from(result.is_ok()));
        crate::metrics::PROBE_CHECKS.with_label_values(&[probe.name(), check.name(), status]).inc();
        match result {
            Ok(()) => {
                let _ = writeln!(report, "[+]{} ok", check.name());
            }
            Err(reason) => {
                healthy = false;
                let _ = writeln!(report, "[-]{} failed: {reason}", check.name());
            }
        }
    }
    if !healthy {
        tracing::error!(path = %uri.path(), reason = %report.trim_end(), "health check error");
        // Go's `http.Error` adds a newline to the reason.
        return go_plain_text(StatusCode::SERVICE_UNAVAILABLE, format!("{report}\n"));
    }
    let verbose = query.split('&').any(|pair| pair == "verbose" || pair.starts_with("verbose="));
    let body = if verbose { format!("{report}ok\n") } else { "ok\n".to_string() };
    go_plain_text(StatusCode::OK, body)
}

/// The values of query parameter `name` (Go's `r.URL.Query()[name]`, percent-decoding aside: check
/// names need none). Empty values are skipped.
fn query_values<'a>(query: &'a str, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    query.split('&').filter_map(move |pair| pair.strip_prefix(name)?.strip_prefix('=')).filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exclude_values_are_read_like_gos_query() {
        let values: Vec<&str> =
            query_values("exclude=serializable_read&verbose&exclude=&exclude=x", "exclude").collect();
        assert_eq!(values, ["serializable_read", "x"]);
    }

    #[test]
    fn probes_have_etcds_checks_in_order() {
        let names = |p: Probe| p.checks().iter().map(|c| c.name()).collect::<Vec<_>>();
        assert_eq!(names(Probe::Livez), ["serializable_read"]);
        assert_eq!(names(Probe::Readyz), ["data_corruption", "serializable_read", "linearizable_read"]);
    }
}
