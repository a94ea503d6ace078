//! Any member serves every request: what must happen on the leader is done there.
//!
//! On the leader these run locally. On a follower they go to the leader over the peer protocol
//! (`cluster/peer_service.rs` answers): a write is proposed by the leader with the header this member built
//! (requester and auth revision, so apply decides permissions exactly as for a local write) and this
//! member answers once it has applied that entry itself, so a client reads its own write here; a
//! linearizable read asks the leader for a read index confirmed by a quorum, then waits until this
//! member has applied it; lease keep-alives reach the leader's lease clock; membership changes run on
//! the leader; so does the login throttle (`node/login_throttle.rs`).
//!
//! During an election a request waits for the new leader (up to two of the longest randomized
//! election timeouts, 4 E), and a member that answers "not leader" before doing anything is asked
//! again at the leader it names next. A leader that cannot be reached is one that died or is dying
//! (this member learns so only when a new one is elected, up to 2 E later): the request waits for
//! the next leader within the same patience and is sent there — when that cannot apply it twice.
//! A request that never left (the connection was refused: `tonic::ConnectError`) is always safe
//! to send again; a read, a lease renewal or a lease's time-to-live is safe to send again whatever
//! happened to it. A write that was sent and whose answer was lost may or may not be committed:
//! as etcd, the client is told "leader changed" and decides. After the patience the answer is etcd's
//! retryable "no leader" (or "leader changed").

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use futures::future::{BoxFuture, FutureExt};
use tonic::transport::Channel;

use super::Node;
use crate::apply::Applied;
use crate::cluster::membership;
use crate::cluster::propose_stream::{Forwarded, NeverSent};
use crate::error::EtcdError;
use crate::proto::etcdserverpb::{
    InternalRaftRequest, LeaseKeepAliveRequest, LeaseTimeToLiveRequest, MemberAddRequest, MemberPromoteRequest,
    MemberRemoveRequest, MemberUpdateRequest,
};
use crate::proto::keywardpb::peer_client::PeerClient;
use crate::proto::keywardpb::{PublishRequest, ReadIndexRequest, RemovedRequest};
use crate::raft::NodeId;

/// How long a forwarded request may take at the leader (etcd's default request timeout is 5 s plus
/// an election; a write that waits longer gets "request timed out").
const FORWARD_TIMEOUT: Duration = Duration::from_secs(7);
/// How long this member waits to apply what the leader applied or confirmed.
const APPLY_WAIT: Duration = Duration::from_secs(5);
/// Times a request is sent again to the next leader after "not leader".
const REROUTES: usize = 3;

type Leader = PeerClient<Channel>;

/// Whether a forwarded request may be sent again after the leader could not be reached.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Resend {
    /// Only if it never left this member: it changes state at the leader (a write, a membership
    /// change, a login attempt).
    IfUnsent,
    /// Whatever happened to it: doing it twice is doing it once (a read index, a lease renewal).
    Always,
}

impl Resend {
    fn allows(self, status: &tonic::Status) -> bool {
        match self {
            Resend::IfUnsent => never_sent(status),
            Resend::Always => never_sent(status) || crate::error::is_transport_failure(status),
        }
    }
}

/// Whether `status` is the channel's failure to connect, or the propose stream's word that it never
/// took the write: the request was never sent.
fn never_sent(status: &tonic::Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(err) = source {
        if err.is::<tonic::ConnectError>() || err.is::<NeverSent>() {
            return true;
        }
        source = err.source();
    }
    false
}

impl Node {
    /// Runs `here` if this member leads, else `there` against the leader; see the module docs. `here`'s
    /// future is held as it is, since on the leader every request runs it (membership changes, rare and
    /// large, box theirs); `there`'s are boxed. `resend` says when `there` may run again after the
    /// leader could not be reached.
    pub(super) async fn on_leader<'a, T, Here: Future<Output = Result<T, EtcdError>>>(
        &'a self,
        resend: Resend,
        here: impl FnOnce() -> Here,
        mut there: impl FnMut(Leader, &str) -> BoxFuture<'a, Result<T, tonic::Status>>,
    ) -> Result<T, EtcdError> {
        let not_leader = EtcdError::NotLeader.to_string();
        let patience = Instant::now() + 4 * self.election_timeout;
        let mut tried = 0;
        loop {
            let leader = self.await_leader(patience).await?;
            if leader == self.member_id {
                return here().await;
            }
            let url = membership::current(&self.raft)
                .get_node(&leader)
                .and_then(|n| n.peer_url().map(str::to_string))
                .ok_or(EtcdError::NoLeader)?;
            match there(self.peers.client(&url)?, &url).await {
                // Refused before anything was done: ask the leader it knows of next.
                Err(status) if status.message() == not_leader && tried < REROUTES => {
                    tried += 1;
                    let heartbeat = Duration::from_millis(self.raft.config().heartbeat_interval);
                    tokio::time::sleep(heartbeat).await;
                }
                // The leader is gone or going: wait for the next one, then send it there.
                Err(status) if resend.allows(&status) && Instant::now() < patience => {
                    tracing::debug!(leader = format!("{leader:x}"), error = %status, "leader unreachable; waiting for the next");
                    Box::pin(self.await_leader_change(leader, patience)).await;
                }
                answer => return answer.map_err(EtcdError::from),
            }
        }
    }

    /// The leader, waiting until `patience` for one to be elected.
    async fn await_leader(&self, patience: Instant) -> Result<NodeId, EtcdError> {
        if let Some(leader) = self.leader() {
            return Ok(leader);
        }
        let wait = patience.saturating_duration_since(Instant::now());
        // Boxed: only a request during an election waits here, and inline this wait would be part of
        // every request's future (each is moved into a box of its own per call).
        let _ = Box::pin(self.raft.wait(Some(wait)).metrics(|m| m.current_leader.is_some(), "a leader")).await;
        self.leader().ok_or(EtcdError::NoLeader)
    }

    /// Waits until this member knows of a leader other than `unreachable`, for at most a heartbeat
    /// interval (then `unreachable` is tried again: it may only have lost a connection) and never
    /// past `patience`.
    async fn await_leader_change(&self, unreachable: NodeId, patience: Instant) {
        let heartbeat = Duration::from_millis(self.raft.config().heartbeat_interval);
        let wait = heartbeat.min(patience.saturating_duration_since(Instant::now()));
        let _ = self.raft.wait(Some(wait)).metrics(|m| m.current_leader != Some(unreachable), "another leader").await;
    }

    fn forwarded<T>(&self, message: T) -> tonic::Request<T> {
        self.peers.request(message, Some(FORWARD_TIMEOUT))
    }

    /// Proposes `req` (its header set) through the leader and returns what applying it produced.
    pub(super) async fn propose_on_leader(&self, req: InternalRaftRequest) -> Result<Applied, EtcdError> {
        // Proposed here it is moved, not copied; each forwarding attempt sends a copy.
        let req = std::sync::Mutex::new(Some(req));
        let take = || req.lock().unwrap_or_else(|e| e.into_inner()).take();
        let copy = || req.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let (index, result) = self
            .on_leader(
                Resend::IfUnsent,
                move || async move {
                    let here = take().ok_or(EtcdError::Internal)?;
                    self.writes.proposer().propose(here).await.map(|p| (None, p.result))
                },
                |mut leader, url| {
                    let (req, url) = (copy(), url.to_string());
                    async move {
                        let req = req.ok_or_else(|| tonic::Status::internal("the request was proposed here"))?;
                        let answer = if self.forwarded_writes.served_by(&url) {
                            // Answered by this member's own apply, unless the leader refuses it.
                            let awaiting = req.header.as_ref().and_then(|h| self.awaited.register(h.id));
                            let forwarded = &self.forwarded_writes;
                            match forwarded.propose(&self.peers, &url, req, FORWARD_TIMEOUT, awaiting).await? {
                                Forwarded::AppliedHere(result) => return Ok((None, result)),
                                Forwarded::Answered(answer) => answer,
                            }
                        } else {
                            leader.propose(self.forwarded(req)).await?.into_inner()
                        };
                        let result = postcard::from_bytes(&answer.result)
                            .map_err(|e| tonic::Status::internal(format!("undecodable apply result: {e}")))?;
                        Ok((Some(answer.index), result))
                    }
                    .boxed()
                },
            )
            .await?;
        if let Some(index) = index {
            // Answer once applied here too: a client that reads from this member next sees it.
            Box::pin(self.wait_applied(index)).await?;
        }
        result
    }

    /// Serves a follower's forwarded write: proposes it as it is (the follower built its header).
    pub(crate) async fn propose_forwarded(
        &self,
        req: InternalRaftRequest,
    ) -> Result<(u64, Result<Applied, EtcdError>), EtcdError> {
        if !self.is_leader() {
            // Leadership moved on meanwhile: the follower asks the leader it learns of next.
            return Err(EtcdError::NotLeader);
        }
        self.writes.proposer().propose(req).await.map(|p| (p.index, p.result))
    }

    /// Waits until this member may serve a linearizable read: a read index confirmed by the leader
    /// with a quorum, and this member's applied state caught up with it. Concurrent reads share
    /// their rounds (`node/read_rounds.rs`), here and at the leader.
    pub(crate) async fn read_index(&self) -> Result<(), EtcdError> {
        let index = self.read_rounds.read_index().await?;
        self.wait_applied(index).await
    }

    /// One round of `read_index`: the leader's read index, asked of it if this member does not lead.
    pub(super) async fn fetch_read_index(&self) -> Result<u64, EtcdError> {
        self.on_leader(
            Resend::Always,
            move || self.leader_read_rounds.read_index(),
            |mut leader, _| {
                let req = self.forwarded(ReadIndexRequest {});
                async move { Ok(leader.read_index(req).await?.into_inner().index) }.boxed()
            },
        )
        .await
    }

    /// The leader's read index for a linearizable read, here or on a follower (confirmed with a
    /// quorum; the reader waits for its own member's apply). Only a leader answers.
    pub(crate) async fn leader_read_index(&self) -> Result<u64, EtcdError> {
        self.leader_read_rounds.read_index().await
    }

    async fn wait_applied(&self, index: u64) -> Result<(), EtcdError> {
        self.latest.index.reached(index, APPLY_WAIT).await.map_err(|_| EtcdError::TimeoutWaitAppliedIndex)
    }

    /// Renews lease `id` on the leader's clock: its TTL, or 0 for an unknown or expired lease.
    pub(crate) async fn lease_renew(&self, id: i64) -> Result<i64, EtcdError> {
        self.on_leader(
            Resend::Always,
            move || async move { Ok(self.lessor.renew(id).unwrap_or(0)) },
            |mut leader, _| {
                let req = self.forwarded(LeaseKeepAliveRequest { id });
                async move { Ok(leader.lease_keep_alive(req).await?.into_inner().ttl) }.boxed()
            },
        )
        .await
    }

    /// `(granted TTL, remaining seconds)` of lease `id` on the leader's clock.
    pub(crate) async fn lease_time_to_live(&self, id: i64) -> Result<Option<(i64, i64)>, EtcdError> {
        self.on_leader(
            Resend::Always,
            move || async move { Ok(self.lessor.time_to_live(id)) },
            |mut leader, _| {
                let req = self.forwarded(LeaseTimeToLiveRequest { id, keys: false });
                async move {
                    let answer = leader.lease_time_to_live(req).await?.into_inner();
                    Ok((answer.ttl >= 0).then_some((answer.granted_ttl, answer.ttl)))
                }
                .boxed()
            },
        )
        .await
    }

    /// Adds a member (MemberAdd) and returns its id; answers once this member's view includes it.
    pub(crate) async fn member_add(&self, req: MemberAddRequest) -> Result<NodeId, EtcdError> {
        let local = req.clone();
        let id = self
            .on_leader(
                Resend::IfUnsent,
                move || {
                    async move {
                        let now =
                            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                        let urls = local.peer_ur_ls;
                        let id = crate::cluster::ids::added_member_id(&urls, &self.cluster_token, now.as_secs());
                        membership::add(&self.raft, id, urls, local.is_learner).await
                    }
                    .boxed()
                },
                |mut leader, _| {
                    let req = self.forwarded(req.clone());
                    async move { Ok(leader.member_add(req).await?.into_inner().member.map_or(0, |m| m.id)) }.boxed()
                },
            )
            .await?;
        self.await_membership(move |m| m.get_node(&id).is_some()).await;
        Ok(id)
    }

    /// Removes a member; the leader tells it, so that it shuts down.
    pub(crate) async fn member_remove(&self, req: MemberRemoveRequest) -> Result<(), EtcdError> {
        let id = req.id;
        self.on_leader(
            Resend::IfUnsent,
            move || {
                async move {
                    let membership = membership::current(&self.raft);
                    let url = membership.get_node(&id).and_then(|n| n.peer_url()).map(str::to_string);
                    membership::remove(&self.raft, id).await?;
                    // Best effort: a member that is down when it is removed is not told; its peers
                    // no longer replicate to it, and it stays outside the cluster until it is stopped.
                    if let Some(Ok(mut peer)) = url.map(|u| self.peers.client(&u)) {
                        let _ = peer.removed(self.peers.request(RemovedRequest {}, Some(APPLY_WAIT))).await;
                    }
                    Ok(())
                }
                .boxed()
            },
            |mut leader, _| {
                let req = self.forwarded(req);
                async move { leader.member_remove(req).await.map(|_| ()) }.boxed()
            },
        )
        .await?;
        self.await_membership(move |m| m.get_node(&id).is_none()).await;
        Ok(())
    }

    pub(crate) async fn member_update(&self, req: MemberUpdateRequest) -> Result<(), EtcdError> {
        let local = req.clone();
        self.on_leader(
            Resend::IfUnsent,
            move || async move { membership::update(&self.raft, local.id, local.peer_ur_ls).await }.boxed(),
            |mut leader, _| {
                let req = self.forwarded(req.clone());
                async move { leader.member_update(req).await.map(|_| ()) }.boxed()
            },
        )
        .await
    }

    pub(crate) async fn member_promote(&self, req: MemberPromoteRequest) -> Result<(), EtcdError> {
        let id = req.id;
        self.on_leader(
            Resend::IfUnsent,
            move || async move { membership::promote(&self.raft, id).await }.boxed(),
            |mut leader, _| {
                let req = self.forwarded(req);
                async move { leader.member_promote(req).await.map(|_| ()) }.boxed()
            },
        )
        .await
    }

    /// Publishes this member's name and client URLs (on the leader, through raft).
    pub(crate) async fn publish(&self) -> Result<(), EtcdError> {
        self.publish_member(PublishRequest {
            member_id: self.member_id,
            name: self.name.clone(),
            client_urls: self.client_urls.clone(),
        })
        .await
    }

    /// Records a member's published attributes (on the leader; a follower forwards).
    pub(crate) async fn publish_member(&self, req: PublishRequest) -> Result<(), EtcdError> {
        let local = req.clone();
        self.on_leader(
            Resend::IfUnsent,
            move || {
                async move { membership::publish(&self.raft, local.member_id, local.name, local.client_urls).await }
                    .boxed()
            },
            |mut leader, _| {
                let req = self.forwarded(req.clone());
                async move { leader.publish(req).await.map(|_| ()) }.boxed()
            },
        )
        .await
    }

    /// Waits (briefly) until this member's membership satisfies `done`: a member answers a change
    /// with a membership that shows it, as the leader did.
    async fn await_membership(&self, done: impl Fn(&crate::raft::Membership) -> bool + Send + Sync) {
        let _ = self
            .raft
            .wait(Some(APPLY_WAIT))
            .metrics(|m| done(m.membership_config.membership()), "membership change seen")
            .await;
    }
}
