//! A front before a member's plain-text peer port (`PeerFront`): an HTTP/2 relay the member's peers
//! reach it through (the member advertises the front's URL, [`super::cluster::Options::peer_fronts`]),
//! so a test can act on the link between the leader and one follower:
//!
//! - [`PeerFront::cut`] breaks every connection through the front at once, as a dropped link or a
//!   restarted middlebox would: each stream on it ends mid-way, the next request opens a new
//!   connection;
//! - [`PeerFront::refuse_stream`] answers `Peer.AppendEntriesStream` as a keyward older than the stream
//!   does (`Unimplemented`, tonic's answer to a method it does not know), and relays every other
//!   method: the member behind it is an older version to its leader; [`PeerFront::refuse_propose_stream`]
//!   does the same with `Peer.ProposeStream`: the leader behind it is an older version to its
//!   followers;
//! - it counts what it relays by method, so a test sees how the leader reached the member.
//!
//! One upstream connection per downstream connection: a cut closes both sides, as a broken link
//! would. Its tasks run on the test's runtime and end with it (or when the front is dropped).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

/// The peer protocol's stream of AppendEntries and its unary AppendEntries (`proto/keywardpb/peer.proto`).
const STREAM_METHOD: &str = "/keywardpb.Peer/AppendEntriesStream";
const CALL_METHOD: &str = "/keywardpb.Peer/AppendEntries";
/// A follower's stream of forwarded writes, and the unary call it replaces.
const PROPOSE_STREAM_METHOD: &str = "/keywardpb.Peer/ProposeStream";
const PROPOSE_METHOD: &str = "/keywardpb.Peer/Propose";

/// A running front. Its connections are closed when it is dropped.
pub(crate) struct PeerFront {
    shared: Arc<Shared>,
    accept: AbortHandle,
}

#[derive(Default)]
struct Shared {
    refuse_stream: AtomicBool,
    /// `Peer.AppendEntriesStream` requests relayed to the member.
    streams_relayed: AtomicUsize,
    /// `Peer.AppendEntriesStream` requests answered `Unimplemented`.
    streams_refused: AtomicUsize,
    /// `Peer.AppendEntries` calls relayed.
    calls_relayed: AtomicUsize,
    refuse_propose_stream: AtomicBool,
    /// `Peer.ProposeStream` requests relayed, and answered `Unimplemented`.
    propose_streams_relayed: AtomicUsize,
    propose_streams_refused: AtomicUsize,
    /// `Peer.Propose` calls relayed.
    proposes_relayed: AtomicUsize,
    /// Connections cut so far.
    cuts: AtomicUsize,
    connections: Mutex<Vec<AbortHandle>>,
}

/// What a front relayed, by method.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Relayed {
    pub streams: usize,
    pub streams_refused: usize,
    pub calls: usize,
    pub propose_streams: usize,
    pub propose_streams_refused: usize,
    pub proposes: usize,
}

impl PeerFront {
    /// Listens on `front` (`http://host:port`, the URL the member advertises) and relays to `upstream`
    /// (the member's `--listen-peer-urls`).
    pub(crate) async fn start(front: &str, upstream: &str) -> PeerFront {
        let addr = |url: &str| -> SocketAddr {
            let host_port = url.strip_prefix("http://").unwrap_or_else(|| panic!("a plain-text peer URL: {url}"));
            host_port.trim_end_matches('/').parse().unwrap_or_else(|e| panic!("{url}: {e}"))
        };
        let (front, upstream) = (addr(front), addr(upstream));
        let listener = TcpListener::bind(front).await.unwrap_or_else(|e| panic!("bind the front at {front}: {e}"));
        let shared = Arc::new(Shared::default());
        let accepting = shared.clone();
        let accept = tokio::spawn(async move {
            while let Ok((downstream, _)) = listener.accept().await {
                let relay = tokio::spawn(relay(accepting.clone(), downstream, upstream));
                let mut connections = accepting.connections.lock().unwrap();
                connections.retain(|c| !c.is_finished());
                connections.push(relay.abort_handle());
            }
        });
        PeerFront { shared, accept: accept.abort_handle() }
    }

    /// Breaks every connection through the front now (both sides closed); new ones are relayed.
    pub(crate) fn cut(&self) {
        let connections = std::mem::take(&mut *self.shared.connections.lock().unwrap());
        for connection in connections {
            connection.abort();
        }
        self.shared.cuts.fetch_add(1, Ordering::SeqCst);
    }

    /// From now on, answers `Peer.AppendEntriesStream` as a member that does not serve it.
    pub(crate) fn refuse_stream(&self) {
        self.shared.refuse_stream.store(true, Ordering::SeqCst);
    }

    /// From now on, answers `Peer.ProposeStream` as a member that does not serve it.
    pub(crate) fn refuse_propose_stream(&self) {
        self.shared.refuse_propose_stream.store(true, Ordering::SeqCst);
    }

    pub(crate) fn relayed(&self) -> Relayed {
        let count = |n: &AtomicUsize| n.load(Ordering::SeqCst);
        let shared = &self.shared;
        Relayed {
            streams: count(&shared.streams_relayed),
            streams_refused: count(&shared.streams_refused),
            calls: count(&shared.calls_relayed),
            propose_streams: count(&shared.propose_streams_relayed),
            propose_streams_refused: count(&shared.propose_streams_refused),
            proposes: count(&shared.proposes_relayed),
        }
    }
}

impl Drop for PeerFront {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

type Body = BoxBody<Bytes, hyper::Error>;

/// Serves one downstream connection (a peer of the member) over one upstream connection (to the
/// member); ends when either side closes, or when aborted (a cut), which closes both.
async fn relay(shared: Arc<Shared>, downstream: TcpStream, upstream: SocketAddr) {
    let Ok(upstream) = TcpStream::connect(upstream).await else { return };
    let _ = (downstream.set_nodelay(true), upstream.set_nodelay(true));
    let Ok((sender, upstream)) =
        hyper::client::conn::http2::Builder::new(TokioExecutor::new()).handshake(TokioIo::new(upstream)).await
    else {
        return;
    };
    let service = hyper::service::service_fn(move |request: http::Request<Incoming>| {
        let (shared, mut sender) = (shared.clone(), sender.clone());
        async move {
            let path = request.uri().path();
            if path == STREAM_METHOD && shared.refuse_stream.load(Ordering::SeqCst) {
                shared.streams_refused.fetch_add(1, Ordering::SeqCst);
                return Ok::<_, hyper::Error>(unimplemented(path));
            }
            if path == PROPOSE_STREAM_METHOD && shared.refuse_propose_stream.load(Ordering::SeqCst) {
                shared.propose_streams_refused.fetch_add(1, Ordering::SeqCst);
                return Ok::<_, hyper::Error>(unimplemented(path));
            }
            match path {
                STREAM_METHOD => shared.streams_relayed.fetch_add(1, Ordering::SeqCst),
                CALL_METHOD => shared.calls_relayed.fetch_add(1, Ordering::SeqCst),
                PROPOSE_STREAM_METHOD => shared.propose_streams_relayed.fetch_add(1, Ordering::SeqCst),
                PROPOSE_METHOD => shared.proposes_relayed.fetch_add(1, Ordering::SeqCst),
                _ => 0,
            };
            let response = sender.send_request(request).await?;
            Ok(response.map(|body| body.boxed()))
        }
    });
    let downstream = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(downstream), service);
    tokio::select! {
        _ = upstream => {}
        _ = downstream => {}
    }
}

/// tonic's answer to a method its server does not route: a trailers-only response with
/// `grpc-status` 12 (`Unimplemented`).
fn unimplemented(path: &str) -> http::Response<Body> {
    let empty = Empty::<Bytes>::new().map_err(|never| match never {}).boxed();
    http::Response::builder()
        .header("content-type", "application/grpc")
        .header("grpc-status", "12")
        .header("grpc-message", format!("unknown method {path} (a keyward older than the stream)"))
        .body(empty)
        .expect("a valid response")
}
