//! What the proxy answers on its listener, per request: calls of etcd's six gRPC services are
//! forwarded to a member (`forward.rs`); any other gRPC call is Unimplemented; `/health` is the
//! proxy's own (`health.rs`); any other HTTP path is a 404.

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;

use super::body::{full, Body};
use super::client_identity::ClientIdentity;
use super::forward::forward;
use super::health::proxy_health;
use super::upstream::Upstreams;

pub async fn answer(request: Request<Incoming>, client: &ClientIdentity, upstreams: &Upstreams) -> Response<Body> {
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
    let mut response = Response::new(full("404 page not found\n"));
    *response.status_mut() = StatusCode::NOT_FOUND;
    response
}
