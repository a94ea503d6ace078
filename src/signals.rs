//! How a member or a proxy is told to stop: SIGINT (a terminal) or SIGTERM (systemd, Kubernetes).

/// Resolves at the first SIGINT or SIGTERM.
pub(crate) async fn shutdown() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let terminated = async {
        match term.as_mut() {
            Some(term) => term.recv().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminated => {}
    }
}
