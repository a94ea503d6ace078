//! Plain HTTP endpoints served on the client port beside gRPC, as etcd serves them: `/health`,
//! `/metrics` (Prometheus text), `/version`, and the probes `/livez` and `/readyz` (`probes.rs`);
//! all but `/version` also on `--listen-metrics-urls`. `/metrics` answers any method (Prometheus'
//! handler does); the others only `GET` (405 otherwise, as etcd's).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{any, get};
use axum::Router;

use super::maintenance::{ETCD_API_VERSION, ETCD_CLUSTER_VERSION};
use crate::gateway::get_only;
use crate::node::Node;
use crate::proto::etcdserverpb::AlarmType;

/// The endpoints of a `--listen-metrics-urls` listener.
pub(crate) fn metrics_router(node: Arc<Node>) -> Router {
    Router::new()
        .route("/health", get(health).fallback(get_only))
        .route("/metrics", any(metrics))
        .with_state(node.clone())
        .merge(super::probes::router(node))
}

pub(crate) fn router(node: Arc<Node>) -> Router {
    Router::new()
        .route("/health", get(health).fallback(get_only))
        .route("/metrics", any(metrics))
        .route("/version", get(version).fallback(get_only))
        .with_state(node.clone())
        .merge(super::probes::router(node))
}

/// etcd's `/health`: unhealthy while an alarm is active (except the alarm types named by `exclude`
/// query parameters, e.g. `/health?exclude=NOSPACE`), without a leader (also once the raft core has
/// stopped), while applying waits for storage space, or when a linearizable read does not complete
/// within a second (etcd's QGET check).
async fn health(State(node): State<Arc<Node>>, uri: axum::http::Uri) -> impl IntoResponse {
    let excluded: Vec<&str> =
        uri.query().unwrap_or("").split('&').filter_map(|pair| pair.strip_prefix("exclude=")).collect();
    let alarmed = node.state().active_alarms().iter().find_map(|alarm| {
        let name = AlarmType::try_from(alarm.alarm).map_or("UNKNOWN", |t| t.as_str_name());
        (!excluded.contains(&name)).then(|| crate::space::alarm::go_text(alarm))
    });
    let healthy = match alarmed {
        Some(alarm) => {
            tracing::warn!(alarm = %alarm, "/health error due to an alarm");
            false
        }
        None => {
            node.serving()
                && tokio::time::timeout(Duration::from_secs(1), node.read(true, |view, _| Ok(view.rev)))
                    .await
                    .is_ok_and(|r| r.is_ok())
        }
    };
    crate::metrics::HEALTH_CHECKS.with_label_values(&[if healthy { "success" } else { "failed" }]).inc();
    if healthy { &crate::metrics::HEALTH_SUCCESS } else { &crate::metrics::HEALTH_FAILURES }.inc();
    let (status, body) = if healthy {
        (StatusCode::OK, r#"{"health":"true"}"#)
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, r#"{"health":"false"}"#)
    };
    (status, [(header::CONTENT_TYPE, "application/json")], body)
}

async fn metrics(State(node): State<Arc<Node>>) -> impl IntoResponse {
    let gauges = crate::metrics::NodeGauges {
        server_version: ETCD_API_VERSION,
        cluster_version: ETCD_CLUSTER_VERSION,
        ..node.gauges()
    };
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], crate::metrics::render(&gauges))
}

async fn version() -> impl IntoResponse {
    let body = format!(
        r#"{{"etcdserver":"{ETCD_API_VERSION}","etcdcluster":"{ETCD_CLUSTER_VERSION}.0","keyward":"{}"}}"#,
        env!("CARGO_PKG_VERSION")
    );
    ([(header::CONTENT_TYPE, "application/json")], body)
}
