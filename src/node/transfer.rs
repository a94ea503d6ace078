//! MoveLeader: leadership handed to a chosen voter (etcd's leader transfer).
//!
//! openraft 0.9 has no transfer of its own, and its followers refuse to vote while their leader's
//! lease (the longest election timeout since its last message) runs. So the leader: pauses the
//! elections of every other voter but the transferee (so none of them campaigns when the heartbeats
//! stop), stops its own heartbeats, waits out the lease, then asks the transferee to campaign (etcd's
//! MsgTimeoutNow) and waits for it to lead. Whatever happens, heartbeats and elections are resumed.
//! Writes arriving meanwhile still replicate and renew the lease, so a busy cluster may time out
//! ("leader transfer took too long"), as etcd's transfer can.

use std::time::Duration;

use super::Node;
use crate::cluster::membership;
use crate::error::EtcdError;
use crate::proto::keywardpb::{CampaignRequest, ElectionsRequest};
use crate::raft::NodeId;

impl Node {
    /// Transfers leadership to voter `target`; this member must be the leader.
    pub(crate) async fn move_leader(&self, target: NodeId) -> Result<(), EtcdError> {
        if !self.is_leader() {
            return Err(EtcdError::NotLeader);
        }
        if target == self.member_id {
            return Ok(());
        }
        let membership = membership::current(&self.raft);
        let url_of = |id: NodeId| membership.get_node(&id).and_then(|n| n.peer_url()).map(str::to_string);
        if !membership.voter_ids().any(|v| v == target) {
            return Err(EtcdError::BadLeaderTransferee);
        }
        let target_url = url_of(target).ok_or(EtcdError::BadLeaderTransferee)?;
        let others: Vec<String> =
            membership.voter_ids().filter(|&v| v != target && v != self.member_id).filter_map(url_of).collect();
        let timeout = Duration::from_millis(self.raft.config().election_timeout_max);
        let pause = |enabled: bool| {
            let others = others.clone();
            async move {
                for url in &others {
                    if let Ok(mut peer) = self.peers.client(url) {
                        let request = self.peers.request(ElectionsRequest { enabled }, Some(timeout));
                        if let Err(e) = peer.elections(request).await {
                            tracing::warn!(peer = url, error = %e, enabled, "cannot pause or resume a peer's elections");
                        }
                    }
                }
            }
        };
        tracing::info!(target = format!("{target:x}"), "transferring leadership");
        pause(false).await;
        self.raft.runtime_config().heartbeat(false);
        let transferred = async {
            // The followers' leader lease is the longest election timeout since the last heartbeat.
            tokio::time::sleep(timeout + Duration::from_millis(self.raft.config().heartbeat_interval)).await;
            let mut peer = self.peers.client(&target_url).map_err(|_| EtcdError::BadLeaderTransferee)?;
            peer.campaign(self.peers.request(CampaignRequest {}, Some(timeout))).await?;
            self.raft
                .wait(Some(2 * timeout))
                .metrics(|m| m.current_leader == Some(target), "leadership transferred")
                .await
                .map(|_| ())
                .map_err(|_| EtcdError::LeaderTransferTimeout)
        }
        .await;
        self.raft.runtime_config().heartbeat(true);
        pause(true).await;
        match &transferred {
            Ok(()) => tracing::info!(target = format!("{target:x}"), "leadership transferred"),
            Err(e) => tracing::warn!(target = format!("{target:x}"), error = %e, "leadership transfer failed"),
        }
        transferred
    }
}
