//! The member's listeners: one per `--listen-client-urls` entry, serving etcd's gRPC services, the
//! HTTP endpoints and the HTTP/JSON gateway (`crate::gateway`) on the same port; one per
//! `--listen-peer-urls` entry, serving the peer protocol (`cluster/peer_service.rs`) to members only
//! (`cluster/peer_guard.rs`). The peer listeners are bound here, not in `cluster/`, because every
//! listener shares one way to bind, accept (TLS or not), shut down and drop request trailers
//! (`serve_bound`); `cluster/` provides the service and its guard.

pub(crate) mod auth;
pub(crate) mod cluster;
mod concurrency;
pub(crate) mod election;
pub(crate) mod grpc_metrics;
pub(crate) mod http;
pub(crate) mod kv;
pub(crate) mod lease;
pub(crate) mod lock;
pub(crate) mod maintenance;
mod probes;
mod read_ahead;
pub(crate) mod requester;
pub(crate) mod require_leader;
pub(crate) mod run;
pub(crate) mod stream_credential;
pub(crate) mod watch;

use crate::frontend::connection_limits::{Admission, ConnectionLimits};
use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tonic::service::interceptor::InterceptedService;
use tonic::service::Routes;
use tonic::transport::Server;

use crate::cluster::peer_guard::PeerGuard;
use crate::cluster::peer_service::PeerService;
use crate::config::{Listener, GRPC_OVERHEAD_BYTES};
use crate::frontend::tls::settings::TlsSettings;
use crate::node::Node;
use crate::proto::etcdserverpb::auth_server::AuthServer;
use crate::proto::etcdserverpb::cluster_server::ClusterServer;
use crate::proto::etcdserverpb::kv_server::KvServer;
use crate::proto::etcdserverpb::lease_server::LeaseServer;
use crate::proto::etcdserverpb::maintenance_server::MaintenanceServer;
use crate::proto::keywardpb::peer_server::PeerServer;
use crate::proto::v3electionpb::election_server::ElectionServer;
use crate::proto::v3lockpb::lock_server::LockServer;

/// Binds every client listener first (so a bad address fails startup), then serves until `shutdown`.
pub(crate) async fn serve(
    node: Arc<Node>,
    listeners: &[Listener],
    tls: Option<&TlsSettings>,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let bound = bind(listeners, "client").await?;
    grpc_metrics::initialize();
    crate::metrics::initialize();
    let ready = tokio::spawn(announce_ready(node.clone(), bound.len()));
    let served = serve_bound(bound, tls, Some(limits), move || routes(node.clone()), shutdown).await;
    ready.abort();
    served
}

/// Logs etcd's `ready to serve client requests` once per client listener (as etcd's every serving
/// context does) as soon as this member answers a linearizable read: it has a leader and has applied
/// what the leader committed, etcd's `ReadyNotify`. Tools that start etcd wait for this line
/// (pifpaf, test fixtures); with `--logger zap` it is the JSON line with that `msg`.
async fn announce_ready(node: Arc<Node>, listeners: usize) {
    const ATTEMPT: std::time::Duration = std::time::Duration::from_secs(1);
    const PAUSE: std::time::Duration = std::time::Duration::from_millis(50);
    loop {
        let read = tokio::time::timeout(ATTEMPT, node.read(true, |view, _| Ok(view.rev))).await;
        if matches!(read, Ok(Ok(_))) {
            break;
        }
        tokio::time::sleep(PAUSE).await;
    }
    for _ in 0..listeners {
        tracing::info!("ready to serve client requests");
    }
}

/// Serves only `/metrics`, `/health`, `/livez` and `/readyz` (`http.rs`) on `--listen-metrics-urls`, as etcd does: https://
/// ones with the client TLS settings, and without the client listeners' connection limits (a scraper
/// holds one connection).
pub(crate) async fn serve_metrics(
    node: Arc<Node>,
    listeners: &[Listener],
    tls: Option<&TlsSettings>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let bound = bind(listeners, "metrics").await?;
    serve_bound(
        bound,
        tls,
        None,
        move || Routes::from(http::metrics_router(node.clone()).fallback(crate::gateway::unknown_path)),
        shutdown,
    )
    .await
}

/// Binds every peer listener: before raft elects, so that peers can reach this member.
pub(crate) async fn bind_peer(listeners: &[Listener]) -> anyhow::Result<Vec<(TcpListener, bool)>> {
    bind(listeners, "peer").await
}

/// Serves the peer protocol on listeners from `bind_peer` until `shutdown`, every request behind the
/// guard that admits members only (`admission`: the `--peer-cert-allowed-*` flags and `--initial-cluster`).
pub(crate) async fn serve_peer(
    node: Arc<Node>,
    bound: Vec<(TcpListener, bool)>,
    tls: Option<&TlsSettings>,
    admission: crate::cluster::admission::PeerAdmission,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let guard = PeerGuard::new(node.raft.clone(), node.member_id, admission);
    let make = move || {
        let limit = node.peers.max_message_bytes();
        let peer = PeerServer::new(PeerService::new(node.clone()))
            .max_decoding_message_size(limit)
            .max_encoding_message_size(limit);
        Routes::new(InterceptedService::new(peer, guard.clone()))
    };
    serve_bound(bound, tls, None, make, shutdown).await
}

async fn bind(listeners: &[Listener], traffic: &str) -> anyhow::Result<Vec<(TcpListener, bool)>> {
    let mut bound = Vec::new();
    for listener in listeners {
        let socket =
            TcpListener::bind(listener.addr).await.map_err(|e| anyhow::anyhow!("listen on {}: {e}", listener.url))?;
        tracing::info!(url = %listener.url, "serving {traffic} traffic");
        bound.push((socket, listener.tls));
    }
    Ok(bound)
}

/// Serves `routes` on every bound socket. Client listeners have `limits` (`frontend/connection_limits.rs`):
/// a connection cap, an idle timeout, etcd's keepalive and stream settings; peer listeners none.
async fn serve_bound(
    bound: Vec<(TcpListener, bool)>,
    tls: Option<&TlsSettings>,
    limits: Option<ConnectionLimits>,
    routes: impl Fn() -> Routes,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let mut servers = Vec::new();
    for (socket, is_tls) in bound {
        let routes = without_request_trailers(routes());
        let mut stop = stop_rx.clone();
        let stopped = async move {
            let _ = stop.wait_for(|stopped| *stopped).await;
        };
        let mut builder = Server::builder().accept_http1(true).tcp_nodelay(true);
        if let Some(limits) = &limits {
            builder = builder
                .http2_keepalive_interval(limits.ping_interval())
                .http2_keepalive_timeout(limits.ping_timeout())
                .max_concurrent_streams(Some(limits.max_concurrent_streams));
        }
        let server = builder.add_routes(routes);
        // Every connection of a client listener is admitted (or closed) and watched for silence.
        let admission = limits
            .map(Admission::new)
            .unwrap_or_else(Admission::unbounded)
            .giving_way_while(&crate::frontend::answers::ANSWERS);
        servers.push(match (is_tls, tls) {
            (true, Some(tls)) => {
                let accepted =
                    crate::frontend::tls::listener::accept(socket, tls.clone()).map_err(|e| anyhow::anyhow!(e))?;
                let incoming = futures::StreamExt::filter_map(
                    tokio_stream::wrappers::ReceiverStream::new(accepted),
                    move |conn| std::future::ready(conn.map(|c| admission.admit_tls(c)).transpose()),
                );
                tokio::spawn(async move { server.serve_with_incoming_shutdown(incoming, stopped).await })
            }
            (true, None) => anyhow::bail!("an https:// listener needs a certificate and key"),
            (false, _) => tokio::spawn(async move {
                let incoming = crate::frontend::connection_limits::admitted_tcp(socket, admission);
                server.serve_with_incoming_shutdown(incoming, stopped).await
            }),
        });
    }
    // Graceful shutdown waits for open connections; watch and keep-alive streams never end on their
    // own, so after a grace period the servers are simply dropped (as etcd exits promptly too).
    let mut stop = stop_rx.clone();
    let grace = async move {
        let _ = stop.wait_for(|stopped| *stopped).await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    tokio::select! {
        results = futures::future::join_all(servers) => {
            for result in results {
                result??;
            }
        }
        _ = grace => tracing::info!("closing client connections still open after {SHUTDOWN_GRACE:?}"),
    }
    Ok(())
}

/// `routes` with every request's trailers dropped before any service sees the request: metadata (who
/// is calling, from which address, which cluster) is the request's headers only
/// (`identity/metadata.rs`). The one place this is done for every listener: client (gRPC, HTTP, the
/// gateway), metrics and peer. The gateway's in-process calls come from tonic's client, which sends
/// no request trailers, with metadata of the gateway's own (`gateway/calls.rs`).
fn without_request_trailers(routes: Routes) -> Routes {
    let layer = axum::middleware::map_request(crate::frontend::request_trailers::drop_request_trailers);
    Routes::from(routes.into_axum_router().layer(layer))
}

/// How long open client connections get to finish after a shutdown signal.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// The listener's services: etcd's gRPC services; beside them on the same port the HTTP endpoints
/// (`http.rs`) and the HTTP/JSON gateway, which calls those same gRPC services in process.
fn routes(node: Arc<Node>) -> Routes {
    let limit = node.max_request_bytes + GRPC_OVERHEAD_BYTES;
    let kv = KvServer::new(kv::KvService::new(node.clone())).max_decoding_message_size(limit);
    let maintenance = MaintenanceServer::new(maintenance::MaintenanceService::new(node.clone()));
    let cluster = ClusterServer::new(cluster::ClusterService::new(node.clone()));
    let lease = LeaseServer::new(lease::LeaseService::new(node.clone()));
    let watch = watch::WatchServer::new(watch::WatchService::new(node.clone()));
    let auth = AuthServer::new(auth::AuthService::new(node.clone()));
    let core = Routes::new(kv)
        .add_service(maintenance)
        .add_service(cluster)
        .add_service(lease)
        .add_service(watch)
        .add_service(auth);
    // Lock and Election are made of calls of the services above, each as the caller.
    let lock = LockServer::new(lock::LockService::new(core.clone()));
    let election = ElectionServer::new(election::ElectionService::new(core.clone()));
    let grpc = core.add_service(lock).add_service(election);
    let gateway = crate::gateway::router(grpc.clone(), node.max_request_bytes);
    // etcd's grpc_server_* metrics for every gRPC call of a client (the gateway's in-process calls
    // are not counted: they are the HTTP requests it serves).
    let grpc = grpc
        .into_axum_router()
        .layer(axum::middleware::from_fn_with_state(node.clone(), require_leader::refuse_without_leader))
        .layer(axum::middleware::from_fn(grpc_metrics::record));
    // A path no route takes is answered as etcd's mux answers it (404, or Unimplemented for gRPC),
    // in place of tonic's Unimplemented for every request.
    let router = grpc.merge(http::router(node)).merge(gateway).fallback(crate::gateway::unknown_path);
    Routes::from(crate::gateway::with_v3beta_paths(router))
}
