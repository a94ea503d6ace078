//! Plain HTTP endpoints served on the client port beside gRPC, as etcd serves them: `/health`,
//! `/metrics` (Prometheus text) and `/version`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use super::maintenance::ETCD_API_VERSION;
use crate::node::Node;

pub fn router(node: Arc<Node>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/version", get(version))
        .with_state(node)
}

/// Healthy when there is a leader and a linearizable read completes within a second (etcd's QGET check).
async fn health(State(node): State<Arc<Node>>) -> impl IntoResponse {
    let has_leader = node.raft.metrics().borrow().current_leader.is_some();
    let read_ok = has_leader
        && tokio::time::timeout(Duration::from_secs(1), node.read(true, |view, _| Ok(view.rev)))
            .await
            .is_ok_and(|r| r.is_ok());
    crate::metrics::HEALTH_CHECKS.with_label_values(&[if read_ok { "success" } else { "failed" }]).inc();
    let (status, body) = if read_ok {
        (StatusCode::OK, r#"{"health":"true"}"#)
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, r#"{"health":"false"}"#)
    };
    (status, [(header::CONTENT_TYPE, "application/json")], body)
}

async fn metrics(State(node): State<Arc<Node>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], crate::metrics::render(&node.gauges()))
}

async fn version() -> impl IntoResponse {
    let body = format!(
        r#"{{"etcdserver":"{ETCD_API_VERSION}","etcdcluster":"{ETCD_API_VERSION}","keyward":"{}"}}"#,
        env!("CARGO_PKG_VERSION")
    );
    ([(header::CONTENT_TYPE, "application/json")], body)
}
