//! etcd's gRPC server metrics (go-grpc-prometheus' `grpc_server_started_total`,
//! `grpc_server_handled_total`, `grpc_server_handling_seconds`): one axum middleware over the member's
//! gRPC routes, so no handler counts anything itself.
//!
//! A call is handled when its response ends: the `grpc-status` of its trailers (or of a trailers-only
//! response's headers) is the code; a response dropped before its end (the client went away) counts as
//! `Canceled`, as grpc-go's handler sees a canceled context. Only etcd's six services are counted, so a
//! client cannot create label values with made-up paths. The same middleware counts the messages of
//! each call (`grpc_server_msg_{received,sent}_total`, from gRPC's length-prefixed framing of the
//! bodies), etcd's `etcd_server_client_requests_total` and the gRPC bytes received and sent.

use std::pin::Pin;
use std::sync::{LazyLock, OnceLock};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Body;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use http::HeaderMap;
use http_body::Frame;
use prometheus::{Histogram, IntCounter};

use crate::metrics::{
    CLIENT_REQUESTS, GRPC_HANDLED, GRPC_HANDLING_SECONDS, GRPC_MSG_RECEIVED, GRPC_MSG_SENT, GRPC_RECEIVED_BYTES,
    GRPC_SENT_BYTES, GRPC_STARTED,
};

/// Every method of etcd's client services: (service, method, go-grpc-prometheus' type).
pub(crate) const METHODS: &[(&str, &str, &str)] = &[
    ("etcdserverpb.KV", "Range", UNARY),
    ("etcdserverpb.KV", "Put", UNARY),
    ("etcdserverpb.KV", "DeleteRange", UNARY),
    ("etcdserverpb.KV", "Txn", UNARY),
    ("etcdserverpb.KV", "Compact", UNARY),
    ("etcdserverpb.Watch", "Watch", BIDI),
    ("etcdserverpb.Lease", "LeaseGrant", UNARY),
    ("etcdserverpb.Lease", "LeaseRevoke", UNARY),
    ("etcdserverpb.Lease", "LeaseKeepAlive", BIDI),
    ("etcdserverpb.Lease", "LeaseTimeToLive", UNARY),
    ("etcdserverpb.Lease", "LeaseLeases", UNARY),
    ("etcdserverpb.Cluster", "MemberAdd", UNARY),
    ("etcdserverpb.Cluster", "MemberRemove", UNARY),
    ("etcdserverpb.Cluster", "MemberUpdate", UNARY),
    ("etcdserverpb.Cluster", "MemberList", UNARY),
    ("etcdserverpb.Cluster", "MemberPromote", UNARY),
    ("etcdserverpb.Maintenance", "Alarm", UNARY),
    ("etcdserverpb.Maintenance", "Status", UNARY),
    ("etcdserverpb.Maintenance", "Defragment", UNARY),
    ("etcdserverpb.Maintenance", "Hash", UNARY),
    ("etcdserverpb.Maintenance", "HashKV", UNARY),
    ("etcdserverpb.Maintenance", "Snapshot", SERVER_STREAM),
    ("etcdserverpb.Maintenance", "MoveLeader", UNARY),
    ("etcdserverpb.Auth", "AuthEnable", UNARY),
    ("etcdserverpb.Auth", "AuthDisable", UNARY),
    ("etcdserverpb.Auth", "Authenticate", UNARY),
    ("etcdserverpb.Auth", "UserAdd", UNARY),
    ("etcdserverpb.Auth", "UserGet", UNARY),
    ("etcdserverpb.Auth", "UserList", UNARY),
    ("etcdserverpb.Auth", "UserDelete", UNARY),
    ("etcdserverpb.Auth", "UserChangePassword", UNARY),
    ("etcdserverpb.Auth", "UserGrantRole", UNARY),
    ("etcdserverpb.Auth", "UserRevokeRole", UNARY),
    ("etcdserverpb.Auth", "RoleAdd", UNARY),
    ("etcdserverpb.Auth", "RoleGet", UNARY),
    ("etcdserverpb.Auth", "RoleList", UNARY),
    ("etcdserverpb.Auth", "RoleDelete", UNARY),
    ("etcdserverpb.Auth", "RoleGrantPermission", UNARY),
    ("etcdserverpb.Auth", "RoleRevokePermission", UNARY),
];

const UNARY: &str = "unary";
const BIDI: &str = "bidi_stream";
const SERVER_STREAM: &str = "server_stream";

/// gRPC status codes by number, as grpc-go's `codes.Code.String()` names them.
const CODES: [&str; 17] = [
    "OK",
    "Canceled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
];

/// One method's series, looked up once: a call touches only these handles, never a label lookup.
struct MethodMetrics {
    labels: [&'static str; 3],
    started: IntCounter,
    handling: Histogram,
    /// By gRPC code number (`CODES`).
    handled: Vec<IntCounter>,
    received: IntCounter,
    sent: IntCounter,
}

/// Every method's series, created at zero as go-grpc-prometheus' `InitializeMetrics` (which etcd calls)
/// does: a dashboard sees a rate of 0, not a missing series, before the first call.
static BY_METHOD: LazyLock<Vec<MethodMetrics>> = LazyLock::new(|| {
    METHODS
        .iter()
        .map(|&(service, method, kind)| {
            let labels = [kind, service, method];
            MethodMetrics {
                labels,
                started: GRPC_STARTED.with_label_values(&labels),
                handling: GRPC_HANDLING_SECONDS.with_label_values(&labels),
                handled: CODES
                    .iter()
                    .map(|code| GRPC_HANDLED.with_label_values(&[kind, service, method, code]))
                    .collect(),
                received: GRPC_MSG_RECEIVED.with_label_values(&labels),
                sent: GRPC_MSG_SENT.with_label_values(&labels),
            }
        })
        .collect()
});

/// Creates every method's series (at start, so `/metrics` shows them before the first call).
pub(crate) fn initialize() {
    LazyLock::force(&BY_METHOD);
}

/// The middleware (`axum::middleware::from_fn(grpc_metrics::record)`).
pub(crate) async fn record(request: Request, next: Next) -> Response {
    let Some(metrics) = method_of(request.uri().path()) else {
        return next.run(request).await;
    };
    metrics.started.inc();
    client_requests(metrics.labels[0] != UNARY, client_api_version(request.headers())).inc();
    let call = Call { metrics, started: Instant::now() };
    let request = request.map(|body| Body::new(Received { body, metrics, messages: Messages::default() }));
    let response = next.run(request).await;
    // A trailers-only response (most errors) carries its status in the headers.
    let code = status(response.headers());
    response.map(|body| Body::new(Metered { body, call: Some(call), code, messages: Messages::default() }))
}

fn method_of(path: &str) -> Option<&'static MethodMetrics> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    let index = METHODS.iter().position(|&(s, m, _)| s == service && m == method)?;
    BY_METHOD.get(index)
}

/// The `client_api_version` labels: what etcd's clients send (`client-api-version: 3.4`), then
/// `unknown` for anything else, which a client could otherwise use to make up label values.
const API_VERSIONS: [&str; 9] = ["3.0", "3.1", "3.2", "3.3", "3.4", "3.5", "3.6", "3.7", "unknown"];

/// The client's API version, as an index into `API_VERSIONS`.
fn client_api_version(headers: &HeaderMap) -> usize {
    let sent = headers.get("client-api-version").and_then(|v| v.to_str().ok());
    API_VERSIONS[..API_VERSIONS.len() - 1].iter().position(|&v| Some(v) == sent).unwrap_or(API_VERSIONS.len() - 1)
}

/// `etcd_server_client_requests_total`'s series for a unary call or a stream and a version, looked
/// up once like the per-method series, but created on first use (etcd shows only versions seen).
fn client_requests(stream: bool, version: usize) -> &'static IntCounter {
    static SERIES: [[OnceLock<IntCounter>; API_VERSIONS.len()]; 2] =
        [const { [const { OnceLock::new() }; API_VERSIONS.len()] }; 2];
    SERIES[usize::from(stream)][version].get_or_init(|| {
        let kind = if stream { "stream" } else { "unary" };
        CLIENT_REQUESTS.with_label_values(&[kind, API_VERSIONS[version]])
    })
}

/// The call's gRPC code number, from its `grpc-status`; an unknown number is Unknown (2).
fn status(headers: &HeaderMap) -> Option<usize> {
    let code: usize = headers.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    Some(if code < CODES.len() { code } else { UNKNOWN })
}

const CANCELED: usize = 1;
const UNKNOWN: usize = 2;

struct Call {
    metrics: &'static MethodMetrics,
    started: Instant,
}

impl Call {
    fn handled(self, code: usize) {
        self.metrics.handled[code].inc();
        self.metrics.handling.observe(self.started.elapsed().as_secs_f64());
    }
}

/// Counts the gRPC messages in a body's bytes: each is a 1-byte flag, a 4-byte big-endian length and
/// that many bytes, split across DATA frames anyhow.
#[derive(Default)]
struct Messages {
    prefix: [u8; 5],
    prefix_read: usize,
    payload_left: usize,
}

impl Messages {
    /// Reads `data`; returns how many messages it completed.
    fn read(&mut self, mut data: &[u8]) -> u64 {
        let mut completed = 0;
        while !data.is_empty() {
            if self.payload_left > 0 {
                let n = self.payload_left.min(data.len());
                (self.payload_left, data) = (self.payload_left - n, &data[n..]);
                completed += u64::from(self.payload_left == 0);
                continue;
            }
            let n = (5 - self.prefix_read).min(data.len());
            self.prefix[self.prefix_read..self.prefix_read + n].copy_from_slice(&data[..n]);
            (self.prefix_read, data) = (self.prefix_read + n, &data[n..]);
            if self.prefix_read == 5 {
                self.prefix_read = 0;
                let [_, a, b, c, d] = self.prefix;
                self.payload_left = u32::from_be_bytes([a, b, c, d]) as usize;
                completed += u64::from(self.payload_left == 0);
            }
        }
        completed
    }
}

/// A response body that records its call as handled when it ends (or is dropped first).
struct Metered {
    body: Body,
    call: Option<Call>,
    code: Option<usize>,
    messages: Messages,
}

impl http_body::Body for Metered {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    GRPC_SENT_BYTES.inc_by(data.len() as u64);
                    let sent = self.messages.read(data);
                    if let Some(call) = &self.call {
                        call.metrics.sent.inc_by(sent);
                    }
                }
                if let Some(code) = frame.trailers_ref().and_then(status) {
                    self.code = Some(code);
                }
            }
            Poll::Ready(Some(Err(_))) => self.code = self.code.or(Some(UNKNOWN)),
            Poll::Ready(None) => {
                let code = self.code.unwrap_or(UNKNOWN);
                if let Some(call) = self.call.take() {
                    call.handled(code);
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A request body that counts the bytes and messages a client sends.
struct Received {
    body: Body,
    metrics: &'static MethodMetrics,
    messages: Messages,
}

impl http_body::Body for Received {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                GRPC_RECEIVED_BYTES.inc_by(data.len() as u64);
                let received = self.messages.read(data);
                self.metrics.received.inc_by(received);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Metered {
    fn drop(&mut self) {
        if let Some(call) = self.call.take() {
            // Ended with a status the client may not have read yet, or the client went away.
            call.handled(self.code.unwrap_or(CANCELED));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_requests_count_by_type_and_known_version_only() {
        let headers = |version: &str| {
            let mut headers = HeaderMap::new();
            headers.insert("client-api-version", version.parse().unwrap());
            headers
        };
        assert_eq!(API_VERSIONS[client_api_version(&headers("3.4"))], "3.4");
        assert_eq!(API_VERSIONS[client_api_version(&headers("made-up"))], "unknown");
        assert_eq!(API_VERSIONS[client_api_version(&HeaderMap::new())], "unknown");

        let series = CLIENT_REQUESTS.with_label_values(&["stream", "3.7"]);
        let before = series.get();
        client_requests(true, client_api_version(&headers("3.7"))).inc();
        client_requests(false, client_api_version(&headers("3.7"))).inc();
        assert_eq!(series.get(), before + 1, "the stream's series, not the unary one");
    }

    #[test]
    fn only_etcds_methods_are_counted_with_their_type() {
        let labels = |path: &str| method_of(path).map(|m| m.labels);
        assert_eq!(labels("/etcdserverpb.KV/Put"), Some([UNARY, "etcdserverpb.KV", "Put"]));
        assert_eq!(labels("/etcdserverpb.Watch/Watch").map(|l| l[0]), Some(BIDI));
        assert_eq!(labels("/etcdserverpb.Maintenance/Snapshot").map(|l| l[0]), Some(SERVER_STREAM));
        assert_eq!(labels("/etcdserverpb.KV/Made-up"), None);
        assert_eq!(labels("/metrics"), None);
    }

    #[test]
    fn messages_are_counted_across_any_split_of_the_bytes() {
        let message = |len: u32| [&[0u8][..], &len.to_be_bytes(), &vec![7u8; len as usize]].concat();
        let stream = [message(3), message(0), message(70_000), message(1)].concat();
        for chunk in [1, 2, 5, 6, 4096, stream.len()] {
            let mut messages = Messages::default();
            let counted: u64 = stream.chunks(chunk).map(|c| messages.read(c)).sum();
            assert_eq!(counted, 4, "in chunks of {chunk}");
        }
        let mut messages = Messages::default();
        assert_eq!(messages.read(&stream[..8]), 1, "the first message, then a part of the second's prefix");
    }

    #[test]
    fn status_codes_take_grpc_gos_names() {
        let mut headers = HeaderMap::new();
        assert_eq!(status(&headers), None);
        let name = |headers: &HeaderMap| status(headers).map(|code| CODES[code]);
        headers.insert("grpc-status", "9".parse().unwrap());
        assert_eq!(name(&headers), Some("FailedPrecondition"));
        headers.insert("grpc-status", "0".parse().unwrap());
        assert_eq!(name(&headers), Some("OK"));
        headers.insert("grpc-status", "99".parse().unwrap());
        assert_eq!(name(&headers), Some("Unknown"));
    }
}
