//! The members behind the proxy: one HTTP/2 connection per endpoint, health, and failover.
//!
//! Every client request becomes one stream on the connection to the member chosen for it. The
//! member last answered from is preferred (as etcd's client pins an endpoint); a member marked down
//! (a failed connect, a failed connection, a failed health check: `health.rs`) is tried only after
//! every healthy one. A request is retried on the next member only while it provably has not been
//! sent (no connection, or hyper handed it back unsent); once it may have reached a member, a failure
//! is the client's to see, since a write must not be applied twice.
//!
//! A connection is replaced when it closes, or when the proxy's certificate files changed
//! (`client_tls.rs`): the requests that follow open a new one with the new identity.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::uri::{Authority, Scheme};
use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;

use super::body::Body;
use super::client_tls::ClientTls;
use super::endpoint::Endpoint;
use super::error::ProxyError;

/// How long a connection to a member may take (TCP, TLS and HTTP/2 handshakes), as etcd's
/// grpc-proxy dials with a 5 s timeout.
pub(crate) const DIAL_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) struct Upstreams {
    members: Vec<Member>,
    preferred: AtomicUsize,
    tls: Option<Arc<ClientTls>>,
}

/// One member endpoint and the proxy's connection to it.
pub(crate) struct Member {
    pub endpoint: Endpoint,
    scheme: Scheme,
    authority: Authority,
    healthy: AtomicBool,
    /// The open connection, if any. Connecting happens under `connecting`, so concurrent requests
    /// share one new connection instead of opening one each.
    connection: Mutex<Option<Connection>>,
    connecting: tokio::sync::Mutex<()>,
}

#[derive(Clone)]
struct Connection {
    sender: SendRequest<Body>,
    /// The `ClientTls` generation it was opened with.
    generation: u64,
}

impl Upstreams {
    pub(crate) fn new(endpoints: Vec<Endpoint>, tls: Option<Arc<ClientTls>>) -> Result<Arc<Upstreams>, String> {
        let members = endpoints.into_iter().map(Member::new).collect::<Result<Vec<_>, _>>()?;
        Ok(Arc::new(Upstreams { members, preferred: AtomicUsize::new(0), tls }))
    }

    pub(crate) fn members(&self) -> &[Member] {
        &self.members
    }

    /// Sends `request` (its URI: path and query only) to a member and returns the member's response
    /// head; the response body streams from the member as the caller reads it. Dropping the future
    /// or the body resets the member's stream (cancellation reaches the member).
    pub(crate) async fn send(&self, mut request: Request<Body>) -> Result<Response<Incoming>, ProxyError> {
        let mut unreachable = Vec::new();
        for index in self.order() {
            let member = &self.members[index];
            let mut sender = match member.connection(self.tls.as_deref()).await {
                Ok(sender) => sender,
                Err(why) => {
                    member.mark_down(&why);
                    unreachable.push(format!("{}: {why}", member.endpoint.url));
                    continue;
                }
            };
            *request.uri_mut() = member.uri(request.uri())?;
            match sender.try_send_request(request).await {
                Ok(response) => {
                    self.preferred.store(index, Ordering::Relaxed);
                    return Ok(response);
                }
                Err(mut failed) => {
                    let reason = error_chain(failed.error());
                    if member.forget_if_closed() {
                        member.mark_down(&reason);
                    }
                    match failed.take_message() {
                        // Never sent: the next member may have it.
                        Some(unsent) => {
                            request = unsent;
                            unreachable.push(format!("{}: {reason}", member.endpoint.url));
                        }
                        None => return Err(ProxyError::MemberFailed { member: member.endpoint.url.clone(), reason }),
                    }
                }
            }
        }
        Err(ProxyError::Unreachable(unreachable.join("; ")))
    }

    /// The order members are tried in: the preferred one, then the others, healthy ones before
    /// those marked down (which are still tried: a health check can be wrong, and a member that
    /// answers is better than none).
    fn order(&self) -> Vec<usize> {
        let n = self.members.len();
        let first = self.preferred.load(Ordering::Relaxed) % n;
        let rotation = (0..n).map(|i| (first + i) % n);
        let (mut healthy, down): (Vec<usize>, Vec<usize>) =
            rotation.partition(|&i| self.members[i].healthy.load(Ordering::Relaxed));
        healthy.extend(down);
        healthy
    }

    /// A connection to `member` for a health check (opened if needed).
    pub(crate) async fn sender_for_check(&self, member: &Member) -> Result<SendRequest<Body>, String> {
        member.connection(self.tls.as_deref()).await
    }

    /// Whether any member passed its last check.
    pub(crate) fn any_healthy(&self) -> bool {
        self.members.iter().any(Member::is_healthy)
    }
}

impl Member {
    fn new(endpoint: Endpoint) -> Result<Member, String> {
        let uri: Uri = endpoint.authority_uri().parse().map_err(|e| format!("--endpoints {:?}: {e}", endpoint.url))?;
        let parts = uri.into_parts();
        let (Some(scheme), Some(authority)) = (parts.scheme, parts.authority) else {
            return Err(format!("--endpoints {:?} is not scheme://host:port", endpoint.url));
        };
        Ok(Member {
            endpoint,
            scheme,
            authority,
            // Healthy until shown otherwise, so the first request need not wait for a check.
            healthy: AtomicBool::new(true),
            connection: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
        })
    }

    pub(crate) fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    pub(crate) fn mark_up(&self) {
        if !self.healthy.swap(true, Ordering::Relaxed) {
            tracing::info!(member = %self.endpoint.url, "member is healthy again");
        }
    }

    pub(crate) fn mark_down(&self, why: &str) {
        if self.healthy.swap(false, Ordering::Relaxed) {
            tracing::warn!(member = %self.endpoint.url, reason = %why, "member marked down; requests go to the others first");
        }
    }

    /// This member's absolute URI for a request's path and query.
    fn uri(&self, request: &Uri) -> Result<Uri, ProxyError> {
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(self.scheme.clone());
        parts.authority = Some(self.authority.clone());
        parts.path_and_query = request.path_and_query().cloned();
        Uri::from_parts(parts).map_err(|e| ProxyError::MemberFailed {
            member: self.endpoint.url.clone(),
            reason: format!("request URI: {e}"),
        })
    }

    /// The current connection if it is open and of the current TLS generation; else a new one.
    async fn connection(&self, tls: Option<&ClientTls>) -> Result<SendRequest<Body>, String> {
        let generation = tls.map_or(0, ClientTls::generation);
        if let Some(sender) = self.usable(generation) {
            return Ok(sender);
        }
        let _connecting = self.connecting.lock().await;
        // Another request may have connected while this one waited.
        if let Some(sender) = self.usable(generation) {
            return Ok(sender);
        }
        let (sender, generation) = tokio::time::timeout(DIAL_TIMEOUT, self.connect(tls))
            .await
            .map_err(|_| format!("no connection within {DIAL_TIMEOUT:?}"))??;
        *self.connection.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(Connection { sender: sender.clone(), generation });
        Ok(sender)
    }

    fn usable(&self, generation: u64) -> Option<SendRequest<Body>> {
        let current = self.connection.lock().unwrap_or_else(|e| e.into_inner());
        current.as_ref().filter(|c| c.generation == generation && !c.sender.is_closed()).map(|c| c.sender.clone())
    }

    /// Drops the current connection if it has closed, so that the next request opens a new one;
    /// whether it had (a failed stream on a live connection says nothing about the member).
    fn forget_if_closed(&self) -> bool {
        let mut current = self.connection.lock().unwrap_or_else(|e| e.into_inner());
        let closed = current.as_ref().is_none_or(|c| c.sender.is_closed());
        if closed {
            *current = None;
        }
        closed
    }

    /// TCP (no Nagle), then TLS with the proxy's current certificate if the endpoint is https, then
    /// the HTTP/2 handshake; the connection is driven by a task of its own.
    async fn connect(&self, tls: Option<&ClientTls>) -> Result<(SendRequest<Body>, u64), String> {
        let endpoint = &self.endpoint;
        let tcp = TcpStream::connect((endpoint.host.as_str(), endpoint.port)).await.map_err(|e| e.to_string())?;
        let _ = tcp.set_nodelay(true);
        let mut builder = hyper::client::conn::http2::Builder::new(TokioExecutor::new());
        // Pings only while streams are open: an idle connection is checked by the health checks,
        // and etcd's servers answer idle pings with GOAWAY.
        builder
            .timer(TokioTimer::new())
            .keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5));
        if !endpoint.tls {
            let (sender, connection) = builder.handshake(TokioIo::new(tcp)).await.map_err(|e| error_chain(&e))?;
            tokio::spawn(drive(connection, endpoint.url.clone()));
            return Ok((sender, 0));
        }
        let Some(tls) = tls else { return Err("an https:// endpoint needs --cacert".into()) };
        let (config, generation) = tls.current();
        let server_name = endpoint.server_name()?;
        let stream = tokio_rustls::TlsConnector::from(config)
            .connect(server_name, tcp)
            .await
            .map_err(|e| format!("TLS handshake: {e}"))?;
        let (sender, connection) = builder.handshake(TokioIo::new(stream)).await.map_err(|e| error_chain(&e))?;
        tokio::spawn(drive(connection, endpoint.url.clone()));
        Ok((sender, generation))
    }
}

/// Runs one member connection until it closes (the member goes away, or every request on it has
/// ended after the proxy stopped using it).
async fn drive<F: std::future::Future<Output = hyper::Result<()>>>(connection: F, member: String) {
    if let Err(e) = connection.await {
        tracing::debug!(member = %member, error = %error_chain(&e), "member connection closed");
    }
}

/// An error with its causes, for logs and for the status a client sees.
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
}
