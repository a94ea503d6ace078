//! The HTTP/JSON gateway on the proxy's listener: the member's gateway (`crate::gateway`), unchanged,
//! over gRPC services that forward every call to a member.
//!
//! The gateway turns each HTTP request into a gRPC call of the services it is given, carrying the
//! request's extensions. The proxy puts the connection's `ClientConnection` in those extensions, so a
//! call the gateway makes is forwarded exactly as a gRPC call on the same connection would be: the
//! client's verified certificate forwarded, or (sidecar) the proxy's own identity, and a client-sent
//! `keyward-forwarded-client-cert` never reaches the member (the gateway passes no HTTP header on but
//! the token from `Authorization`, and `forward.rs` drops request trailers).

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body as AxumBody;
use axum::extract::Request;
use axum::response::Response;
use tonic::codegen::Service;
use tonic::service::Routes;

use super::body::Body;
use super::client_identity::ClientConnection;
use super::error::ProxyError;
use super::forward::forward;
use super::upstream::Upstreams;

/// The gateway's routes for a proxy forwarding to `upstreams`; request bodies are limited as on a
/// member with `--max-request-bytes` = `max_request_bytes`.
pub(crate) fn router(upstreams: Arc<Upstreams>, max_request_bytes: usize) -> axum::Router {
    let forwarding = axum::Router::new().fallback(move |request: Request| {
        let upstreams = upstreams.clone();
        async move {
            let client = request.extensions().get::<Arc<ClientConnection>>().cloned();
            let response = match client {
                Some(client) => forward(request, &client, &upstreams).await,
                // Every request the proxy's listener hands the gateway carries its connection's identity.
                None => tonic::Status::from(ProxyError::NoClientCertificate).into_http(),
            };
            response.map(AxumBody::new)
        }
    });
    // Other paths get the member's answers (404), not axum's empty one.
    let router =
        crate::gateway::router(Routes::from(forwarding), max_request_bytes).fallback(crate::gateway::unknown_path);
    crate::gateway::with_v3beta_paths(router)
}

/// Answers one HTTP request of a client connection through the gateway.
pub(crate) async fn answer<B>(
    router: &axum::Router,
    mut request: http::Request<B>,
    client: &Arc<ClientConnection>,
) -> http::Response<Body>
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    request.extensions_mut().insert(client.clone());
    let mut router = router.clone();
    // An axum router is always ready.
    let response: Result<Response, Infallible> = router.call(request.map(AxumBody::new)).await;
    let response = response.unwrap_or_else(|never| match never {});
    response.map(super::body::boxed)
}
