//! The member's run (`keyward serve`): the peer listener first (raft needs it to join an election),
//! then the node (`node/start.rs`), the metrics and client listeners, until a signal, this member's
//! removal or a stopped raft core; then an orderly shutdown that leaves the kv environment synced.
//! It lives with the services it starts: `server/` is above `node/`, which imports nothing of it.

use std::future::Future;
use std::sync::Arc;

use openraft::error::Fatal;

use crate::config::{self, Config};
use crate::node::Node;
use crate::raft::NodeId;
use crate::{auth, cluster, raft, server, signals, space};

/// Runs a member until SIGINT or SIGTERM, or until its raft core stops: a stopped core never
/// resumes (a storage failure), so the process then exits with an error, for systemd or Kubernetes to
/// restart it, rather than answer "server stopped" forever.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    // Bound before raft starts: peers must reach this member for it to join an election.
    let peer_listeners = server::bind_peer(&config.listen_peer).await?;
    warn_about_plain_text_listeners(&config);
    let node = Node::start(&config).await?;
    let (peer_stop_tx, peer_stopped) = stop_signal();
    let peer_server = {
        let (node, tls, admission) =
            (node.clone(), config.peer_tls.clone(), cluster::admission::PeerAdmission::of(&config));
        tokio::spawn(
            async move { server::serve_peer(node, peer_listeners, tls.as_ref(), admission, peer_stopped).await },
        )
    };
    announce(&config, &node);
    if let Some(policy) = config.auto_compaction {
        tokio::spawn(crate::node::jobs::compactor::run(node.clone(), policy));
    }
    let (metrics_stop_tx, metrics_stopped) = stop_signal();
    let metrics_server = {
        let (node, listeners, tls) = (node.clone(), config.listen_metrics.clone(), config.client_tls.clone());
        tokio::spawn(async move { server::serve_metrics(node, &listeners, tls.as_ref(), metrics_stopped).await })
    };
    let (fatal_tx, mut fatal_rx) = tokio::sync::oneshot::channel();
    let stop = shutdown_requested(node.clone(), fatal_tx);
    server::serve(node.clone(), &config.listen_client, config.client_tls.as_ref(), config.connections, stop).await?;
    let _ = peer_stop_tx.send(());
    let _ = metrics_stop_tx.send(());
    if peer_server.is_finished() {
        // The peer listeners failed while clients were served: say why.
        peer_server.await??;
    }
    if metrics_server.is_finished() {
        metrics_server.await??;
    }
    if let Ok(fatal) = fatal_rx.try_recv() {
        anyhow::bail!("raft core stopped: {fatal}");
    }
    shut_down(&node, &config).await
}

/// Listener settings that are allowed but cost something: said once, at start.
fn warn_about_plain_text_listeners(config: &Config) {
    for listener in config.listen_peer.iter().filter(|l| !l.tls && !l.addr.ip().is_loopback()) {
        // Allowed by --peer-allow-plaintext (`config/listeners.rs` refuses it otherwise): say what it costs.
        tracing::warn!(
            url = %listener.url,
            "plain-text peer traffic beyond loopback (--peer-allow-plaintext): anyone who reaches this port can \
             act as a member; use https:// peer URLs with peer certificates"
        );
    }
    if config.client_tls.as_ref().is_some_and(|tls| tls.client_cert_auth) {
        for listener in config.listen_client.iter().filter(|l| !l.tls) {
            // As etcd: client certificates exist only on TLS listeners.
            tracing::warn!(
                url = %listener.url,
                "--client-cert-auth does not apply to this http:// listener: its clients present no certificate \
                 and are anonymous unless they send a token"
            );
        }
    }
}

/// A listener's stop: the sender ends the future that the listener's server runs until.
fn stop_signal() -> (tokio::sync::oneshot::Sender<()>, impl Future<Output = ()>) {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let stopped = async move {
        let _ = stop_rx.await;
    };
    (stop_tx, stopped)
}

/// Resolves when the member must stop serving: SIGINT or SIGTERM, its removal from the cluster, or
/// its raft core stopping (the reason goes to `fatal`).
async fn shutdown_requested(node: Arc<Node>, fatal_tx: tokio::sync::oneshot::Sender<Fatal<NodeId>>) {
    tokio::select! {
        _ = signals::shutdown() => tracing::info!("shutting down"),
        _ = node.removed() => tracing::warn!(
            "this member has been permanently removed from the cluster; shutting down (its data dir \
             must be removed before it can join again)"
        ),
        fatal = node.stopped() => {
            tracing::error!(error = %fatal, "raft core stopped; exiting so that the member is restarted");
            let _ = fatal_tx.send(fatal);
        }
    }
}

/// Stops raft, then syncs the kv environment.
async fn shut_down(node: &Node, config: &Config) -> anyhow::Result<()> {
    node.raft.shutdown().await.map_err(|e| anyhow::anyhow!("raft shutdown: {e}"))?;
    // Nothing applies any more: sync the kv environment, and say so (`raft/unsynced.rs`), so that the
    // next start never rebuilds it.
    node.state().sync().map_err(|e| anyhow::anyhow!("sync the kv environment: {e}"))?;
    let member_dir = config.data_dir.join("member");
    raft::unsynced::clear(&member_dir).map_err(|e| anyhow::anyhow!("clear {}: {e}", member_dir.display()))?;
    Ok(())
}

/// The start-up summary an operator reads first (etcd prints the same facts): version, data dir, ids,
/// every listener with its TLS, client-certificate settings, token type, quota; and the `ETCD_*`
/// variables no flag reads.
fn announce(config: &Config, node: &Node) {
    match &config.config_file {
        // As etcd: the file replaces flags and variables, so unknown variables are moot.
        Some(path) => tracing::info!(
            path = %path.display(),
            "loaded the configuration file; other command-line flags and ETCD_* variables are ignored"
        ),
        None => {
            for name in crate::cli::member::unknown_etcd_variables(std::env::vars().map(|(name, _)| name)) {
                tracing::warn!(variable = %name, "unrecognized environment variable: no keyward flag reads it");
            }
        }
    }
    for warning in &config.warnings {
        tracing::warn!(path = ?config.config_file, "{warning}");
    }
    let listeners = |listeners: &[config::Listener]| {
        listeners
            .iter()
            .map(|l| format!("{} ({})", l.url, if l.tls { "TLS" } else { "plain text" }))
            .collect::<Vec<_>>()
    };
    let client_tls = config.client_tls.as_ref();
    let token = match &config.auth_token {
        auth::token_config::TokenConfig::Simple => "simple".to_string(),
        auth::token_config::TokenConfig::Jwt(jwt) => format!("jwt ({:?})", jwt.sign_method),
    };
    let quota = match config.quota {
        space::Quota::Bytes(bytes) => format!("{bytes} bytes"),
        space::Quota::Disabled { .. } => "none".to_string(),
    };
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        name = %config.name,
        data_dir = %config.data_dir.display(),
        member_id = format!("{:x}", node.member_id),
        cluster_id = format!("{:x}", node.cluster_id),
        client_urls = ?listeners(&config.listen_client),
        peer_urls = ?listeners(&config.listen_peer),
        metrics_urls = ?listeners(&config.listen_metrics),
        client_cert_auth = client_tls.is_some_and(|t| t.client_cert_auth),
        client_crl = ?client_tls.and_then(|t| t.crl_file.as_ref()),
        peer_client_cert_auth = config.peer_tls.as_ref().is_some_and(|t| t.client_cert_auth),
        auth_token = %token,
        quota = %quota,
        audit_log = ?config.audit.as_ref().map(|a| &a.path),
        auto_compaction = ?config.auto_compaction,
        "member ready"
    );
}
