//! Writes: a request checked against the space quota, given its header (who asks, and a fresh id)
//! and proposed through raft on the leader (`node/leader.rs`); the caller gets what applying it
//! produced. A write over the quota raises this member's NOSPACE alarm instead.

use std::time::Duration;

use prost::Message;

use super::Node;
use crate::apply::Applied;
use crate::error::EtcdError;
use crate::identity::Requester;
use crate::proto::etcdserverpb::alarm_request::AlarmAction;
use crate::proto::etcdserverpb::{AlarmRequest, AlarmType, InternalRaftRequest, RequestHeader};

impl Node {
    /// A fresh id for a request or a server-chosen lease (positive, as etcd's lease ids are).
    pub(crate) fn next_id(&self) -> i64 {
        self.writes.next_id()
    }

    /// Proposes one write through raft on behalf of `who` and returns what applying it produced. The
    /// entry's header carries the requester, so apply decides permissions at the entry's place in the log.
    pub(crate) async fn propose(&self, req: InternalRaftRequest, who: &Requester) -> Result<Applied, EtcdError> {
        let cost = crate::space::cost(&req);
        // Apply refuses it anyway while NOSPACE is active: refused here it takes no room in the raft
        // log either, which matters when the disk (not the quota) is what is full.
        if cost > 0 && self.state().nospace() {
            return Err(EtcdError::NoSpace);
        }
        // etcd's quotaKVServer/quotaLeaseServer: a request that would take the database to the quota
        // is refused here, and the alarm makes every member refuse such requests from then on.
        if !self.space.admits(cost) {
            tracing::warn!(
                quota_bytes = self.space.quota().gauge(),
                in_use_bytes = self.space.in_use(),
                "request exceeds the backend quota; raising the NOSPACE alarm"
            );
            // Boxed: rare, and inline it would be part of every proposal's future.
            Box::pin(self.raise_nospace()).await;
            return Err(EtcdError::NoSpace);
        }
        self.submit(req, who).await
    }

    /// `propose` without the quota check; the response header of the result is completed (`fill`).
    async fn submit(&self, mut req: InternalRaftRequest, who: &Requester) -> Result<Applied, EtcdError> {
        let id = self.next_id() as u64;
        req.header = Some(match who {
            Requester::Member => RequestHeader { id, member_internal: true, ..Default::default() },
            Requester::Client { username, revision, origin } => {
                // The origin travels only when this member keeps an audit log: it costs log bytes.
                let (audit_client, audit_credential) = match self.auth.audit.is_some() {
                    true => {
                        (origin.client.map(|a| a.to_string()).unwrap_or_default(), origin.credential.as_str().into())
                    }
                    false => (String::new(), String::new()),
                };
                RequestHeader {
                    id,
                    username: username.clone(),
                    auth_revision: *revision,
                    member_internal: false,
                    audit_client,
                    audit_credential,
                }
            }
        });
        req.id = id;
        if req.encoded_len() > self.max_request_bytes {
            return Err(EtcdError::RequestTooLarge);
        }
        // etcd's request timeout: 5 s plus two election timeouts. The entry may still be committed
        // later (as in etcd, the client cannot tell); the caller is told it timed out.
        let deadline = Duration::from_secs(5) + 2 * self.election_timeout;
        let _pending = Pending::new();
        let mut applied =
            tokio::time::timeout(deadline, self.propose_on_leader(req)).await.map_err(|_| EtcdError::Timeout)??;
        if let Some(header) = applied.header_mut() {
            self.fill(header);
        }
        Ok(applied)
    }

    /// Raises a NOSPACE alarm for this member through raft, unless one is active or on its way.
    pub(crate) async fn raise_nospace(&self) {
        let mine = |a: &crate::proto::etcdserverpb::AlarmMember| {
            a.member_id == self.member_id && a.alarm == AlarmType::Nospace as i32
        };
        if self.state().active_alarms().iter().any(mine) || !self.writes.begin_raising_nospace() {
            return;
        }
        let alarm = AlarmRequest {
            action: AlarmAction::Activate as i32,
            member_id: self.member_id,
            alarm: AlarmType::Nospace as i32,
        };
        let req = InternalRaftRequest { alarm: Some(Box::new(alarm)), ..Default::default() };
        if let Err(e) = self.submit(req, &Requester::Member).await {
            tracing::warn!(error = %e, "raising the NOSPACE alarm failed; the next write over the quota tries again");
        }
        self.writes.end_raising_nospace();
    }
}

/// One client request proposed and not yet answered: `etcd_server_proposals_pending`.
struct Pending;

impl Pending {
    fn new() -> Pending {
        crate::metrics::PROPOSALS_PENDING.inc();
        Pending
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        crate::metrics::PROPOSALS_PENDING.dec();
    }
}
