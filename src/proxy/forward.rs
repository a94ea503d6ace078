//! Forwarding one gRPC call of etcd's six services to a member, unchanged but for the identity
//! metadata.
//!
//! The call is passed through at the HTTP/2 level — request and response streamed frame by frame,
//! messages never decoded — so every RPC of KV, Watch, Lease, Auth, Cluster and Maintenance, unary or
//! streaming (Watch, LeaseKeepAlive, Snapshot), is forwarded the same way, with no message size limit
//! of the proxy's own. Headers travel as the client sent them (tokens, `grpc-timeout`, compression),
//! except the `keyward-` names, which `client_identity.rs` decides. The request's trailers never
//! pass: the member would merge them into the metadata over the headers decided here (gRPC clients
//! send none; `frontend/request_trailers.rs`). Response trailers (the gRPC status) come back from the
//! member as it sent them.
//!
//! Cancellation: when the client resets its stream or goes away, hyper drops this call, and with it
//! the member's stream, which is reset. Deadline: `grpc-timeout` reaches the member, which enforces
//! it; the proxy also gives up on a member that has not answered by then.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response};

use super::body::{boxed, Body, BoxError};
use super::client_identity::ClientConnection;
use super::error::ProxyError;
use super::upstream::Upstreams;
use crate::frontend::request_trailers::WithoutTrailers;

/// The gRPC services forwarded (etcd's `etcdserverpb` client API).
const SERVICES: [&str; 6] = ["KV", "Watch", "Lease", "Auth", "Cluster", "Maintenance"];

/// Whether `path` is a call of a forwarded service (`/etcdserverpb.KV/Range`).
pub(crate) fn is_forwarded(path: &str) -> bool {
    path.strip_prefix("/etcdserverpb.")
        .and_then(|rest| rest.split_once('/'))
        .is_some_and(|(service, method)| SERVICES.contains(&service) && !method.is_empty())
}

/// Forwards one call to a member; a failure of the proxy's own becomes a gRPC status response.
pub(crate) async fn forward<B>(request: Request<B>, client: &ClientConnection, upstreams: &Upstreams) -> Response<Body>
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    match try_forward(request, client, upstreams).await {
        Ok(response) => response,
        Err(error) => {
            tracing::debug!(error = %error, "call answered by the proxy");
            tonic::Status::from(error).into_http()
        }
    }
}

async fn try_forward<B>(
    request: Request<B>,
    client: &ClientConnection,
    upstreams: &Upstreams,
) -> Result<Response<Body>, ProxyError>
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    if !is_forwarded(request.uri().path()) {
        return Err(ProxyError::UnknownService(request.uri().path().to_string()));
    }
    let (mut parts, body) = request.into_parts();
    client.apply(&mut parts.headers)?;
    // HTTP/2 carries the authority in the URI; the member's is set by `upstream.rs`.
    parts.headers.remove(http::header::HOST);
    let deadline = grpc_timeout(&parts.headers);
    let upstream = Request::from_parts(parts, boxed(WithoutTrailers::new(body)));
    let response = match deadline {
        Some(deadline) => {
            tokio::time::timeout(deadline, upstreams.send(upstream)).await.map_err(|_| ProxyError::Deadline)??
        }
        None => upstreams.send(upstream).await?,
    };
    Ok(response.map(boxed))
}

/// The client's deadline (gRPC's `grpc-timeout`: up to 8 digits and a unit), if it sent one.
fn grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount.saturating_mul(3600)),
        "M" => Duration::from_secs(amount.saturating_mul(60)),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_six_etcd_services_are_forwarded_and_nothing_else() {
        for path in [
            "/etcdserverpb.KV/Range",
            "/etcdserverpb.Watch/Watch",
            "/etcdserverpb.Lease/LeaseKeepAlive",
            "/etcdserverpb.Auth/Authenticate",
            "/etcdserverpb.Cluster/MemberList",
            "/etcdserverpb.Maintenance/Snapshot",
        ] {
            assert!(is_forwarded(path), "{path}");
        }
        for path in
            ["/v3lockpb.Lock/Lock", "/etcdserverpb.KV/", "/etcdserverpb.Raft/Send", "/health", "/etcdserverpb.KV"]
        {
            assert!(!is_forwarded(path), "{path}");
        }
    }

    #[test]
    fn grpc_timeouts_parse_as_grpc_defines_them() {
        let timeout = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert("grpc-timeout", http::HeaderValue::from_static(value));
            grpc_timeout(&headers)
        };
        assert_eq!(timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(timeout("1500m"), Some(Duration::from_millis(1500)));
        assert_eq!(timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(timeout("99999999n"), Some(Duration::from_nanos(99_999_999)));
        assert_eq!(timeout("S"), None);
        assert_eq!(timeout("123456789S"), None, "more than 8 digits");
        assert_eq!(timeout("5s"), None, "units are case-sensitive");
        assert_eq!(grpc_timeout(&HeaderMap::new()), None);
    }
}
