//! keyward: an etcd-v3-compatible replicated key-value store with authentication done right.
//!
//! The request path, top to bottom: `server` (gRPC front end, request validation) → `node` (proposes
//! writes through raft, serves reads) → `raft` (openraft log and state machine on LMDB) → `apply` (one
//! committed entry → effects) → `mvcc` (the revisioned store).
#![deny(unsafe_code)] // the one exception is opening LMDB, in storage.rs

pub mod apply;
pub mod auth;
pub mod config;
pub mod error;
pub mod keyrange;
pub mod lease;
pub mod metrics;
pub mod mvcc;
pub mod node;
pub mod proto;
pub mod raft;
pub mod server;
pub mod storage;
pub mod tls;

/// Runs a member until SIGINT or SIGTERM.
pub async fn serve(config: config::Config) -> anyhow::Result<()> {
    let node = node::Node::start(&config).await?;
    tracing::info!(name = %config.name, member_id = format!("{:x}", node.member_id), cluster_id = format!("{:x}", node.cluster_id), "member ready");
    let shutdown = async {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(term) => term,
            Err(_) => return std::future::pending().await,
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutting down");
    };
    server::serve(node.clone(), &config.listen_client, config.client_tls.as_ref(), shutdown).await?;
    node.raft.shutdown().await.map_err(|e| anyhow::anyhow!("raft shutdown: {e}"))?;
    Ok(())
}
