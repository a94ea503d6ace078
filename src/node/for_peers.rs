//! This member as the peer protocol's serving side sees it (`cluster/peer_service.rs`): each of
//! `LocalMember`'s methods is the member's own. The trait is there so that `cluster/` holds both
//! sides of the protocol without importing `node` (which imports `cluster`).

use tonic::{Status, Streaming};

use super::Node;
use crate::apply::Applied;
use crate::cluster::peer_service::{LocalMember, LoginAttemptReplies};
use crate::error::EtcdError;
use crate::lease::lessor::Lessor;
use crate::proto::etcdserverpb::{
    InternalRaftRequest, MemberAddRequest, MemberPromoteRequest, MemberRemoveRequest, MemberUpdateRequest,
    ResponseHeader,
};
use crate::proto::keywardpb::{LoginAttemptRequest, PublishRequest};
use crate::raft::election_timer::ElectionTimer;
use crate::raft::state_machine::SnapshotInbox;
use crate::raft::{NodeId, Raft};

#[tonic::async_trait]
impl LocalMember for Node {
    fn cluster_id(&self) -> u64 {
        self.cluster_id
    }

    fn member_id(&self) -> u64 {
        self.member_id
    }

    fn raft(&self) -> &Raft {
        &self.raft
    }

    fn snapshot_inbox(&self) -> SnapshotInbox {
        self.kv.snapshot_inbox()
    }

    fn lessor(&self) -> &Lessor {
        &self.lessor
    }

    fn election_timer(&self) -> &ElectionTimer {
        &self.election_timer
    }

    fn is_leader(&self) -> bool {
        Node::is_leader(self)
    }

    fn header(&self, revision: i64) -> Option<ResponseHeader> {
        Node::header(self, revision)
    }

    async fn propose_forwarded(
        &self,
        req: InternalRaftRequest,
    ) -> Result<(u64, Result<Applied, EtcdError>), EtcdError> {
        Node::propose_forwarded(self, req).await
    }

    async fn leader_read_index(&self) -> Result<u64, EtcdError> {
        Node::leader_read_index(self).await
    }

    async fn publish_member(&self, req: PublishRequest) -> Result<(), EtcdError> {
        Node::publish_member(self, req).await
    }

    async fn member_add(&self, req: MemberAddRequest) -> Result<NodeId, EtcdError> {
        Node::member_add(self, req).await
    }

    async fn member_remove(&self, req: MemberRemoveRequest) -> Result<(), EtcdError> {
        Node::member_remove(self, req).await
    }

    async fn member_update(&self, req: MemberUpdateRequest) -> Result<(), EtcdError> {
        Node::member_update(self, req).await
    }

    async fn member_promote(&self, req: MemberPromoteRequest) -> Result<(), EtcdError> {
        Node::member_promote(self, req).await
    }

    fn mark_removed(&self) {
        Node::mark_removed(self)
    }

    async fn login_attempt(&self, steps: Streaming<LoginAttemptRequest>) -> Result<LoginAttemptReplies, Status> {
        let replies = super::login_throttle::serve_at_leader(self, steps).await?;
        Ok(Box::pin(replies))
    }
}
