//! keyward: an etcd-v3-compatible replicated key-value store with authentication done right.
//!
//! The request path, top to bottom: `server` (the member's gRPC services, request validation; who is
//! calling is decided in `frontend`, shared with the proxy and the gateway) → `node` (proposes
//! writes through raft, serves reads) → `raft` (openraft log and state machine on LMDB) → `apply` (one
//! committed entry → effects) → `mvcc` (the revisioned store). `proxy` is `keyward grpc-proxy`:
//! it shares `frontend` and has no store.
#![deny(unsafe_code)] // the one exception is opening LMDB, in storage.rs

pub mod alarm;
pub mod apply;
pub mod auth;
pub mod ballast;
pub mod config;
pub mod data_dir;
pub mod error;
pub mod frontend;
pub mod keyrange;
pub mod lease;
pub mod metrics;
pub mod mvcc;
pub mod node;
pub mod proto;
pub mod proxy;
pub mod raft;
pub mod server;
pub mod space;
pub mod storage;

/// Runs a member until SIGINT or SIGTERM, or until its raft core stops: a stopped core never
/// resumes (a storage failure), so the process then exits with an error, for systemd or Kubernetes to
/// restart it, rather than answer "server stopped" forever.
pub async fn serve(config: config::Config) -> anyhow::Result<()> {
    let node = node::Node::start(&config).await?;
    tracing::info!(name = %config.name, member_id = format!("{:x}", node.member_id), cluster_id = format!("{:x}", node.cluster_id), "member ready");
    let (fatal_tx, mut fatal_rx) = tokio::sync::oneshot::channel();
    let watched = node.clone();
    let stop = async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        let terminated = async {
            match term.as_mut() {
                Some(term) => term.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => tracing::info!("shutting down"),
            _ = terminated => tracing::info!("shutting down"),
            fatal = watched.stopped() => {
                tracing::error!(error = %fatal, "raft core stopped; exiting so that the member is restarted");
                let _ = fatal_tx.send(fatal);
            }
        }
    };
    server::serve(node.clone(), &config.listen_client, config.client_tls.as_ref(), stop).await?;
    if let Ok(fatal) = fatal_rx.try_recv() {
        anyhow::bail!("raft core stopped: {fatal}");
    }
    node.raft.shutdown().await.map_err(|e| anyhow::anyhow!("raft shutdown: {e}"))?;
    Ok(())
}
