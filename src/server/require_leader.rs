//! clientv3's `WithRequireLeader`: a call whose metadata holds `hasleader: true` wants to fail, not
//! wait, while the member has no leader. As etcd's interceptors do: a unary call or a stream opened
//! on a member without a leader is refused with `etcdserver: no leader` (Unavailable); a stream
//! (Watch, LeaseKeepAlive) opened with it ends with that error once the member has seen no leader
//! at `NO_LEADER_CHECKS` checks in a row, one per election timeout (etcd's `monitorLeader`, which
//! is slower to end a stream than to refuse a call: reconnecting costs the client more).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use tonic::codegen::http;
use tonic::metadata::MetadataMap;
use tonic::Status;

use crate::error::EtcdError;
use crate::node::Node;

/// etcd's `rpctypes.MetadataRequireLeaderKey` and `MetadataHasLeader`.
const REQUIRE_LEADER_KEY: &str = "hasleader";
const HAS_LEADER: &str = "true";
/// etcd's `maxNoLeaderCnt`.
const NO_LEADER_CHECKS: u32 = 3;

/// The gRPC listener's layer: a call (unary, or a stream being opened) that asked for a leader on a
/// member without one is refused before any service sees it.
pub(crate) async fn refuse_without_leader(State(node): State<Arc<Node>>, request: Request, next: Next) -> Response {
    if asks_for_leader(request.headers()) && node.leader().is_none() {
        return Status::from(EtcdError::NoLeader).into_http::<axum::body::Body>();
    }
    next.run(request).await
}

/// Whether a stream was opened with `WithRequireLeader` (see `leader_lost`).
pub(crate) fn stream_requires_leader(metadata: &MetadataMap) -> bool {
    metadata.get(REQUIRE_LEADER_KEY).is_some_and(|value| value.as_bytes() == HAS_LEADER.as_bytes())
}

/// Whether a call with these headers asked for a leader (the first `hasleader` value, as etcd reads it).
fn asks_for_leader(headers: &http::HeaderMap) -> bool {
    headers.get(REQUIRE_LEADER_KEY).is_some_and(|value| value.as_bytes() == HAS_LEADER.as_bytes())
}

/// Resolves, with the error to end the stream with, once the member has had no leader at
/// `NO_LEADER_CHECKS` checks in a row, one per election timeout.
pub(crate) async fn leader_lost(node: &Node) -> Status {
    let every = node.election_timeout().max(Duration::from_millis(1));
    let mut without = 0;
    loop {
        tokio::time::sleep(every).await;
        without = if node.leader().is_none() { without + 1 } else { 0 };
        if without >= NO_LEADER_CHECKS {
            return EtcdError::NoLeader.into();
        }
    }
}
