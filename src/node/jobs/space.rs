//! The member's space jobs: NOSPACE raised when a write finds storage full, and the disk-full
//! ballast (`space/ballast.rs`) put back once there is room again.

use std::sync::Weak;
use std::time::Duration;

use crate::node::Node;

/// How often a missing disk-full ballast is put back (once no NOSPACE alarm is active).
const BALLAST_CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// A write found storage full (and gave back the ballast, if there was one): raise NOSPACE, so that
/// writes are refused until an operator makes room and disarms it.
pub(super) async fn raise_nospace_when_storage_full(node: Weak<Node>) {
    loop {
        let Some(space) = node.upgrade().map(|n| n.space.clone()) else { return };
        space.full_reported().await;
        let Some(node) = node.upgrade() else { return };
        node.raise_nospace().await;
    }
}

/// Puts a given-back ballast in place again once the NOSPACE alarm is disarmed and the disk has room.
pub(super) async fn restore_ballast(node: Weak<Node>) {
    let mut tick = tokio::time::interval(BALLAST_CHECK_INTERVAL);
    loop {
        tick.tick().await;
        let Some(node) = node.upgrade() else { return };
        if !node.space.ballast().missing() || node.state().nospace() || node.space.stalled() {
            continue;
        }
        let space = node.space.clone();
        drop(node);
        match tokio::task::spawn_blocking(move || space.ballast().ensure()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot put the disk-full ballast back yet"),
            Err(_) => return,
        }
    }
}
