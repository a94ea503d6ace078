//! Membership as etcd's Cluster API sees it, on top of openraft's membership: the members (voters and
//! learners) with their peer URLs, and the name and client URLs each started member published.
//!
//! Changes run on the leader (a follower forwards them, `node/leader.rs`), with etcd 3.4's checks: peer URLs
//! are unique; at most one learner; a voter is added or removed only while enough voters have started
//! to keep a quorum (etcd's `--strict-reconfig-check`, on by default); a learner is promoted only once
//! it is in sync with the leader. openraft commits each change through joint consensus, and refuses
//! a change while the previous one is not committed yet; etcd queues configuration changes instead, so
//! a change waits here for the previous one (its checks run again on the membership that results).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::ChangeMembers;

use crate::error::EtcdError;
use crate::proto::etcdserverpb::Member;
use crate::raft::member::MemberNode;
use crate::raft::{Membership, NodeId, Raft};

/// How long a change waits for the previous one to commit (etcd's request timeout) before it fails
/// with "request timed out".
const PREVIOUS_CHANGE_WAIT: Duration = Duration::from_secs(5);

/// etcd 3.4 allows one learner at a time.
const MAX_LEARNERS: usize = 1;
/// A learner is in sync once it has at least this share of the leader's log (etcd's 90%).
const LEARNER_READY_PERCENT: u64 = 90;

/// The membership this member has (committed or not yet: as etcd, what it last applied or appended).
pub(crate) fn current(raft: &Raft) -> Membership {
    raft.metrics().borrow().membership_config.membership().clone()
}

/// Every member as etcd's `Member`, voters and learners, in id order.
pub(crate) fn members(membership: &Membership) -> Vec<Member> {
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    membership
        .nodes()
        .map(|(&id, node)| Member {
            id,
            name: node.name.clone(),
            peer_ur_ls: node.peer_urls.clone(),
            client_ur_ls: node.client_urls.clone(),
            is_learner: !voters.contains(&id),
        })
        .collect()
}

fn node_of(membership: &Membership, id: NodeId) -> Result<MemberNode, EtcdError> {
    membership.get_node(&id).cloned().ok_or(EtcdError::MemberNotFound)
}

/// Whether `count` of `members` voters form a quorum.
fn majority(count: usize, members: usize) -> bool {
    count > members / 2
}

fn started(node: &MemberNode) -> bool {
    !node.name.is_empty()
}

/// Refuses peer URLs that another member (other than `except`) already has.
fn check_unique_urls(membership: &Membership, peer_urls: &[String], except: Option<NodeId>) -> Result<(), EtcdError> {
    let taken = membership
        .nodes()
        .filter(|(id, _)| Some(**id) != except)
        .any(|(_, node)| node.peer_urls.iter().any(|u| peer_urls.contains(u)));
    if taken {
        return Err(EtcdError::PeerUrlExists);
    }
    Ok(())
}

/// etcd's `IsReadyToAddVotingMember`: with the new voter, the started voters still form a quorum.
fn ready_to_add_voter(membership: &Membership) -> bool {
    let voters: Vec<&MemberNode> = membership.voter_ids().filter_map(|id| membership.get_node(&id)).collect();
    let members = voters.len() + 1;
    let started = voters.iter().filter(|n| started(n)).count();
    // A single started member may add a second one (which has not started yet, by definition).
    (started == 1 && members == 2) || majority(started, members)
}

/// etcd's `IsReadyToPromoteMember`: with the learner counted as a started voter, the started voters
/// form a quorum.
fn ready_to_promote(membership: &Membership) -> bool {
    let voters: Vec<&MemberNode> = membership.voter_ids().filter_map(|id| membership.get_node(&id)).collect();
    let members = voters.len() + 1;
    let started = voters.iter().filter(|n| started(n)).count() + 1;
    majority(started, members)
}

/// etcd's `IsReadyToRemoveVotingMember`: without `id`, the started voters still form a quorum.
fn ready_to_remove_voter(membership: &Membership, id: NodeId) -> bool {
    let rest: Vec<&MemberNode> =
        membership.voter_ids().filter(|v| *v != id).filter_map(|v| membership.get_node(&v)).collect();
    let started = rest.iter().filter(|n| started(n)).count();
    majority(started, rest.len())
}

/// Adds a member with `peer_urls` (a learner, or a voter), returning its new id.
///
/// A voter is answered for as soon as the configuration that includes it is in the leader's log, as
/// etcd answers once its ConfChange is applied: from then on the new voter counts in the quorum, and
/// the change completes (openraft's joint consensus) once it has started and caught up. Waiting for
/// that here would keep `etcdctl member add` waiting for a member that is only started after it.
pub(crate) async fn add(raft: &Raft, id: NodeId, peer_urls: Vec<String>, learner: bool) -> Result<NodeId, EtcdError> {
    after_previous_change(|| add_once(raft, id, peer_urls.clone(), learner)).await
}

/// Removes member `id`, voter or learner.
pub(crate) async fn remove(raft: &Raft, id: NodeId) -> Result<(), EtcdError> {
    after_previous_change(|| remove_once(raft, id)).await
}

/// Changes member `id`'s peer URLs, keeping what it published.
pub(crate) async fn update(raft: &Raft, id: NodeId, peer_urls: Vec<String>) -> Result<(), EtcdError> {
    after_previous_change(|| update_once(raft, id, peer_urls.clone())).await
}

/// Records the name and client URLs member `id` publishes once it has started.
pub(crate) async fn publish(raft: &Raft, id: NodeId, name: String, client_urls: Vec<String>) -> Result<(), EtcdError> {
    after_previous_change(|| publish_once(raft, id, name.clone(), client_urls.clone())).await
}

/// Makes learner `id` a voter, once it is in sync with this leader's log.
pub(crate) async fn promote(raft: &Raft, id: NodeId) -> Result<(), EtcdError> {
    after_previous_change(|| promote_once(raft, id)).await
}

/// Why a change did not happen: etcd's error, or the previous change is not committed yet.
enum Refused {
    Etcd(EtcdError),
    PreviousInProgress,
}

impl From<EtcdError> for Refused {
    fn from(e: EtcdError) -> Self {
        Refused::Etcd(e)
    }
}

/// Runs `change` (checks included) again while the previous change is uncommitted, up to
/// [`PREVIOUS_CHANGE_WAIT`].
async fn after_previous_change<T, Fut>(mut change: impl FnMut() -> Fut) -> Result<T, EtcdError>
where
    Fut: std::future::Future<Output = Result<T, Refused>>,
{
    let deadline = tokio::time::Instant::now() + PREVIOUS_CHANGE_WAIT;
    loop {
        match change().await {
            Ok(done) => return Ok(done),
            Err(Refused::Etcd(e)) => return Err(e),
            Err(Refused::PreviousInProgress) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(Refused::PreviousInProgress) => return Err(EtcdError::Timeout),
        }
    }
}

async fn add_once(raft: &Raft, id: NodeId, peer_urls: Vec<String>, learner: bool) -> Result<NodeId, Refused> {
    let membership = current(raft);
    // etcd checks the id first (ids of adds within one second collide), then the URLs.
    if membership.get_node(&id).is_some() {
        return Err(EtcdError::MemberIdExists.into());
    }
    check_unique_urls(&membership, &peer_urls, None)?;
    let node = MemberNode::unstarted(peer_urls);
    if learner {
        let learners = membership.learner_ids().count();
        if learners >= MAX_LEARNERS {
            return Err(EtcdError::TooManyLearners.into());
        }
        raft.add_learner(id, node, false).await.map_err(change_error)?;
    } else {
        if !ready_to_add_voter(&membership) {
            return Err(EtcdError::NotEnoughStartedMembers.into());
        }
        let change = {
            let raft = raft.clone();
            tokio::spawn(async move {
                let added = raft.change_membership(ChangeMembers::AddVoters(BTreeMap::from([(id, node)])), false).await;
                if let Err(e) = &added {
                    tracing::warn!(member = format!("{id:x}"), error = %e, "adding a voter did not complete");
                }
                added
            })
        };
        let wait = raft.wait(None);
        let in_log = wait.metrics(|m| m.membership_config.membership().get_node(&id).is_some(), "voter in the log");
        tokio::select! {
            finished = change => finished.map_err(|_| EtcdError::Internal)?.map(|_| ()).map_err(change_error)?,
            seen = in_log => seen.map(|_| ()).map_err(|_| EtcdError::Stopped)?,
        }
    }
    Ok(id)
}

async fn remove_once(raft: &Raft, id: NodeId) -> Result<(), Refused> {
    let membership = current(raft);
    node_of(&membership, id)?;
    let is_voter = membership.voter_ids().any(|v| v == id);
    if is_voter {
        if !ready_to_remove_voter(&membership, id) {
            return Err(EtcdError::NotEnoughStartedMembers.into());
        }
        raft.change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false).await.map_err(change_error)?;
    }
    // A removed voter becomes a learner first (openraft's joint consensus), then leaves.
    raft.change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false).await.map_err(change_error)?;
    Ok(())
}

async fn update_once(raft: &Raft, id: NodeId, peer_urls: Vec<String>) -> Result<(), Refused> {
    let membership = current(raft);
    let mut node = node_of(&membership, id)?;
    check_unique_urls(&membership, &peer_urls, Some(id))?;
    node.peer_urls = peer_urls;
    set_node(raft, id, node).await
}

async fn publish_once(raft: &Raft, id: NodeId, name: String, client_urls: Vec<String>) -> Result<(), Refused> {
    let mut node = node_of(&current(raft), id)?;
    if node.name == name && node.client_urls == client_urls {
        return Ok(());
    }
    node.name = name;
    node.client_urls = client_urls;
    set_node(raft, id, node).await
}

async fn set_node(raft: &Raft, id: NodeId, node: MemberNode) -> Result<(), Refused> {
    raft.change_membership(ChangeMembers::SetNodes(BTreeMap::from([(id, node)])), true)
        .await
        .map(|_| ())
        .map_err(change_error)
}

async fn promote_once(raft: &Raft, id: NodeId) -> Result<(), Refused> {
    let membership = current(raft);
    node_of(&membership, id)?;
    if membership.voter_ids().any(|v| v == id) {
        return Err(EtcdError::MemberNotLearner.into());
    }
    let metrics = raft.metrics().borrow().clone();
    let leader_index = metrics.last_log_index.unwrap_or(0);
    let matched = metrics
        .replication
        .as_ref()
        .and_then(|replication| replication.get(&id).cloned().flatten())
        .map_or(0, |log_id| log_id.index);
    if leader_index > 0 && matched * 100 < leader_index * LEARNER_READY_PERCENT {
        return Err(EtcdError::LearnerNotReady.into());
    }
    if !ready_to_promote(&membership) {
        return Err(EtcdError::NotEnoughStartedMembers.into());
    }
    raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false).await.map_err(change_error)?;
    Ok(())
}

fn change_error(e: RaftError<NodeId, ClientWriteError<NodeId, MemberNode>>) -> Refused {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(_)) => EtcdError::NotLeader.into(),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(ChangeMembershipError::InProgress(_))) => {
            Refused::PreviousInProgress
        }
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            tracing::warn!(error = %e, "membership change refused");
            EtcdError::Unhealthy.into()
        }
        RaftError::Fatal(_) => EtcdError::Stopped.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn membership(voters: &[(NodeId, bool)], learners: &[NodeId]) -> Membership {
        let mut nodes = BTreeMap::new();
        for &(id, is_started) in voters {
            let name = if is_started { format!("m{id}") } else { String::new() };
            nodes.insert(id, MemberNode { peer_urls: vec![format!("http://m{id}:2380")], name, client_urls: vec![] });
        }
        for &id in learners {
            nodes.insert(id, MemberNode::unstarted(vec![format!("http://m{id}:2380")]));
        }
        Membership::new(vec![voters.iter().map(|v| v.0).collect()], nodes)
    }

    #[test]
    fn strict_reconfiguration_checks_count_started_voters_as_etcd() {
        assert!(ready_to_add_voter(&membership(&[(1, true)], &[])), "1 started may add a second");
        assert!(!ready_to_add_voter(&membership(&[(1, true), (2, false)], &[])), "1 of 3 started");
        assert!(ready_to_add_voter(&membership(&[(1, true), (2, true), (3, true)], &[])));
        assert!(ready_to_remove_voter(&membership(&[(1, true), (2, true), (3, true)], &[]), 3));
        assert!(!ready_to_remove_voter(&membership(&[(1, true), (2, false), (3, true)], &[]), 3));
        assert!(!ready_to_remove_voter(&membership(&[(1, true)], &[]), 1), "the last voter stays");
        assert!(ready_to_promote(&membership(&[(1, true)], &[2])));
        assert!(!ready_to_promote(&membership(&[(1, true), (2, false), (3, false)], &[4])));
        let m = membership(&[(1, true)], &[2]);
        assert_eq!(members(&m).iter().map(|m| (m.id, m.is_learner)).collect::<Vec<_>>(), [(1, false), (2, true)]);
        assert_eq!(check_unique_urls(&m, &["http://m2:2380".into()], None), Err(EtcdError::PeerUrlExists));
        assert_eq!(check_unique_urls(&m, &["http://m2:2380".into()], Some(2)), Ok(()));
    }
}
