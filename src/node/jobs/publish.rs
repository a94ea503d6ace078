//! This member's attributes (name, client URLs) published through raft once it has started.

use std::sync::Weak;
use std::time::Duration;

use crate::node::Node;

/// Publishes this member's name and client URLs through raft once it has started (etcd's publish
/// step), so MemberList on every member shows them; retried until it is recorded.
pub(super) async fn publish_attributes(node: Weak<Node>) {
    loop {
        let Some(node) = node.upgrade() else { return };
        let membership = crate::cluster::membership::current(&node.raft);
        let published = membership
            .get_node(&node.member_id)
            .is_some_and(|m| m.name == node.name && m.client_urls == node.client_urls);
        if published {
            return;
        }
        if let Err(e) = node.publish().await {
            tracing::debug!(error = %e, "publishing this member's attributes failed; retrying");
        }
        drop(node);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
