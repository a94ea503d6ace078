//! What the proxy answers on its listener, per request: calls of etcd's six gRPC services are
//! forwarded to a member (`forward.rs`); any other gRPC call is Unimplemented; `/health` is the
//! proxy's own (`health.rs`); any other HTTP request goes to the HTTP/JSON gateway (`gateway.rs`),
//! which answers etcd's `/v3/...` paths and 404 to the rest.

use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;

use super::body::Body;
use super::client_identity::ClientConnection;
use super::forward::forward;
use super::gateway;
use super::health::proxy_health;
use super::upstream::Upstreams;

pub(crate) async fn answer(
    request: Request<Incoming>,
    client: &Arc<ClientConnection>,
    upstreams: &Upstreams,
    gateway: &axum::Router,
) -> Response<Body> {
    let grpc = request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    if grpc {
        return forward(request, client, upstreams).await;
    }
    if request.uri().path() == "/health" && request.method() == http::Method::GET {
        return proxy_health(upstreams);
    }
    gateway::answer(gateway, request, client).await
}
