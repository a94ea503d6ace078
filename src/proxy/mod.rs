//! `keyward grpc-proxy start`: a gRPC proxy in front of the members that keeps the client's
//! certificate identity (etcd's grpc-proxy loses it), or, without `--client-cert-auth`, a sidecar that
//! presents the workload's certificate for a local application (see `config/mod.rs` for the rule).
//!
//! The path of a call: `listen.rs` accepts (TLS with client-certificate verification, plain TCP, or
//! a Unix socket) → `client_identity.rs` decides once per connection what the member is told about
//! the client → `service.rs` routes each request → `forward.rs` passes the call through at the
//! HTTP/2 level (HTTP/JSON requests: `gateway.rs`, the member's gateway over forwarded calls) →
//! `upstream.rs` picks a member (health from `health.rs`, failover) over a connection
//! made with the proxy's own certificate (`client_tls.rs`, reloaded when its files change).
//!
//! A proxy has no store: it must not depend on the member (`node`, `raft`, `server`).

pub(crate) mod body;
pub(crate) mod client_identity;
pub(crate) mod client_tls;
pub(crate) mod config;
pub(crate) mod endpoint;
pub(crate) mod error;
pub(crate) mod forward;
pub(crate) mod gateway;
pub(crate) mod health;
pub(crate) mod listen;
pub(crate) mod service;
pub(crate) mod upstream;

use std::convert::Infallible;
use std::sync::Arc;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;

use crate::frontend::connection_limits::{Admission, Vouched};
use client_identity::{ClientConnection, ClientIdentity};
use client_tls::ClientTls;
use config::{ListenAddr, Mode, ProxyConfig};
use listen::Listener;
use upstream::Upstreams;

/// Runs the proxy until SIGINT or SIGTERM.
pub async fn run(config: ProxyConfig) -> anyhow::Result<()> {
    let tls = config.client_tls.clone().map(ClientTls::load).transpose().map_err(anyhow::Error::msg)?;
    if let Some(tls) = &tls {
        tls.spawn_reloader();
    }
    let upstreams = Upstreams::new(config.endpoints.clone(), tls).map_err(anyhow::Error::msg)?;
    health::spawn_checks(&upstreams);
    let gateway = gateway::router(upstreams.clone(), config.max_request_bytes);
    let mut listener =
        Listener::bind(&config.listen, config.listener_tls.as_ref()).await.map_err(anyhow::Error::msg)?;
    announce(&config, &listener);
    let mut server = auto::Builder::new(TokioExecutor::new());
    // As etcd's grpc-proxy: no limit of the proxy's own on a client's concurrent streams (watches).
    // The pings keep a quiet live client (an idle watch) from looking idle to `Admission`.
    let limits = config.connections;
    server
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(u32::MAX)
        .keep_alive_interval(limits.ping_interval());
    if let Some(timeout) = limits.ping_timeout() {
        server.http2().keep_alive_timeout(timeout);
    }
    let server = Arc::new(server);
    // As on a member's client listener: a connection cap, and silent connections are closed.
    let admission = Admission::new(limits);
    let stop = crate::signals::shutdown();
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = &mut stop => break,
        };
        let Some(accepted) = accepted else { break };
        let vouched = if accepted.certificate.is_some() { Vouched::Certificate } else { Vouched::Nothing };
        let Some(io) = admission.admit(accepted.io, vouched) else { continue };
        let identity = ClientIdentity::of_connection(config.mode, accepted.certificate.as_ref());
        let client = Arc::new(ClientConnection::new(identity, accepted.remote_addr));
        tracing::debug!(identity = ?accepted.identity, forwarding = matches!(client.identity, ClientIdentity::Forward(_)), "client connected");
        let (server, upstreams, gateway) = (server.clone(), upstreams.clone(), gateway.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let (client, upstreams, gateway) = (client.clone(), upstreams.clone(), gateway.clone());
                async move { Ok::<_, Infallible>(service::answer(request, &client, &upstreams, &gateway).await) }
            });
            if let Err(e) = server.serve_connection(TokioIo::new(io), service).await {
                tracing::debug!(error = %e, "client connection ended with an error");
            }
        });
    }
    tracing::info!("shutting down");
    Ok(())
}

fn announce(config: &ProxyConfig, listener: &Listener) {
    let members: Vec<&str> = config.endpoints.iter().map(|e| e.url.as_str()).collect();
    let mode = match config.mode {
        Mode::ForwardClientCertificates => "forwarding each client's verified certificate",
        Mode::OwnIdentity => "members see the proxy's own certificate (sidecar)",
    };
    match (&config.listen, listener.local_addr()) {
        (ListenAddr::Unix(path), _) => {
            tracing::info!(listen = %format!("unix://{}", path.display()), ?members, mode, "gRPC proxy ready")
        }
        (ListenAddr::Tcp(addr), local) => {
            if config.mode == Mode::OwnIdentity
                && config.client_tls.as_ref().is_some_and(|t| t.identity.is_some())
                && !addr.ip().is_loopback()
            {
                tracing::warn!(listen = %addr, "listening beyond loopback without --client-cert-auth: anyone who reaches this address acts as the proxy's certificate");
            }
            tracing::info!(listen = %local.unwrap_or(*addr), tls = config.listener_tls.is_some(), ?members, mode, "gRPC proxy ready")
        }
    }
}
