//! The node as a whole, started on a temporary data dir: proposals, their size and deadline, a
//! snapshot install, the quota.

use clap::Parser;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::Node;
use crate::cli::{Cli, Command};
use crate::config::Config;
use crate::error::EtcdError;
use crate::identity::Requester;
use crate::proto::etcdserverpb::{AlarmType, InternalRaftRequest, PutRequest};
use crate::raft::state_machine::StateMachine;

fn config(data_dir: &std::path::Path, extra: &[&str]) -> Config {
    let dir = data_dir.display().to_string();
    let mut args = vec!["keyward", "serve", "--data-dir", dir.as_str(), "--ballast-bytes", "0"];
    args.extend_from_slice(extra);
    let Command::Serve(args) = Cli::try_parse_from(args).expect("flags").command else { panic!("not serve") };
    args.into_config().expect("config")
}

fn put(key: &str) -> InternalRaftRequest {
    let put = PutRequest { key: key.into(), value: b"v".to_vec(), ..Default::default() };
    InternalRaftRequest { put: Some(Box::new(put)), ..Default::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_raft_core_is_reported_and_no_leader_is_claimed() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(&config(dir.path(), &[])).await.unwrap();
    node.propose(put("a"), &Requester::Member).await.unwrap();
    assert!(crate::metrics::render(&node.gauges()).contains("etcd_server_has_leader 1\n"));
    let failed_before = crate::metrics::PROPOSALS_FAILED.get();

    node.state().inject_failure.store(true, Ordering::SeqCst);
    assert_eq!(node.propose(put("b"), &Requester::Member).await, Err(EtcdError::Stopped));
    let fatal = tokio::time::timeout(Duration::from_secs(30), node.stopped()).await.expect("the core stops");
    assert!(fatal.to_string().contains("injected storage failure"), "{fatal}");
    assert_eq!(node.leader(), None, "openraft's metrics still name the old leader; the node must not");
    let metrics = crate::metrics::render(&node.gauges());
    assert!(metrics.contains("etcd_server_has_leader 0\n"), "{metrics}");
    assert!(metrics.contains("etcd_server_is_leader 0\n"), "{metrics}");
    assert!(crate::metrics::PROPOSALS_FAILED.get() > failed_before, "the failed proposal is counted");
    assert!(!node.serving());
}

/// Every write's future is moved into a box of its own by the gRPC service (and moved again on
/// the way): its size is copied per request. A raft request held inline (1,112 bytes before its
/// kinds were boxed) and rare waits held inline made a proposal's future 8.6 KB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proposal_and_its_future_stay_small() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(&config(dir.path(), &[])).await.unwrap();
    let request = std::mem::size_of::<InternalRaftRequest>();
    assert!(request <= 512, "InternalRaftRequest is {request} bytes: is a new kind of request not boxed?");
    let future = std::mem::size_of_val(&node.propose(put("a"), &Requester::Member));
    assert!(future <= 3584, "a proposal's future is {future} bytes (3,336 when this test was written)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proposal_not_applied_in_time_gets_etcds_request_timed_out() {
    let dir = tempfile::tempdir().unwrap();
    let fast = ["--heartbeat-interval", "10", "--election-timeout", "100"];
    let node = Node::start(&config(dir.path(), &fast)).await.unwrap();
    node.propose(put("a"), &Requester::Member).await.unwrap();
    // Storage stays full: apply retries the batch and the proposal waits for it.
    node.state().inject_full.store(u32::MAX, Ordering::SeqCst);
    let started = std::time::Instant::now();
    assert_eq!(node.propose(put("b"), &Requester::Member).await, Err(EtcdError::Timeout));
    assert!(started.elapsed() >= Duration::from_secs(5), "not before etcd's request timeout");
    node.state().inject_full.store(0, Ordering::SeqCst);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_install_rebuilds_the_revision_the_auth_state_and_the_lease_clock() {
    use crate::raft::state_machine::snapshot_tests::{as_member, auth_with_alice_reading, checkpoint, grant};
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(&config(dir.path(), &[])).await.unwrap();
    for id in [1, 2] {
        node.propose(grant(id, 60), &Requester::Member).await.unwrap();
    }
    assert_eq!((node.revision(), node.auth_enabled()), (1, false));
    // The leader's state: lease 1 revoked, lease 2 checkpointed with 20 s left, lease 3 new,
    // three more revisions, auth on.
    let leader_dir = tempfile::tempdir().unwrap();
    let leader = StateMachine::open(&leader_dir.path().join("kv"), &leader_dir.path().join("snap")).unwrap().state();
    let mut requests = vec![grant(2, 60), checkpoint(2, 20), grant(3, 30), put("a"), put("b"), put("c")];
    requests.extend(auth_with_alice_reading(b"a"));
    let results = leader.apply_requests(1, requests.into_iter().map(as_member).collect());
    assert!(results.iter().all(Result::is_ok), "{results:?}");

    node.kv_env().install_snapshot_of(&leader).unwrap();

    assert_eq!(node.lessor.time_to_live(1), None, "a lease the installed state does not hold is dropped");
    let (ttl, left) = node.lessor.time_to_live(2).expect("lease 2");
    assert_eq!(ttl, 60);
    assert!(left <= 20 && left > 10, "resumes from its checkpoint (20 s), not its TTL: {left}");
    assert!(node.lessor.time_to_live(3).is_some_and(|(ttl, left)| ttl == 30 && left > 20));
    let txn = leader.read_txn().unwrap();
    assert_eq!(node.revision(), 4);
    assert!(node.auth_enabled());
    assert_eq!(node.auth_revision(), leader.auth.revision(&txn).unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_over_the_quota_raise_this_members_nospace_alarm_once() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(&config(dir.path(), &["--quota-backend-bytes", "1048576"])).await.unwrap();
    let value = vec![b'x'; 64 << 10];
    let mut accepted = 0;
    let refused = loop {
        let req = InternalRaftRequest {
            put: Some(Box::new(PutRequest {
                key: format!("k{accepted}").into(),
                value: value.clone(),
                ..Default::default()
            })),
            ..Default::default()
        };
        match node.propose(req, &Requester::anonymous()).await {
            Ok(_) => accepted += 1,
            Err(e) => break e,
        }
        assert!(accepted < 1000, "the quota never refused a write");
    };
    assert_eq!(refused, EtcdError::NoSpace);
    assert!(accepted >= 2, "{accepted}");
    assert!(node.state().nospace());
    let alarms = node.state().active_alarms();
    assert_eq!(alarms.len(), 1);
    assert_eq!((alarms[0].member_id, alarms[0].alarm), (node.member_id, AlarmType::Nospace as i32));
    // Deletes still go through; a lease grant does not.
    let del = crate::proto::etcdserverpb::DeleteRangeRequest { key: b"k0".to_vec(), ..Default::default() };
    node.propose(
        InternalRaftRequest { delete_range: Some(Box::new(del)), ..Default::default() },
        &Requester::anonymous(),
    )
    .await
    .unwrap();
    let grant = crate::proto::etcdserverpb::LeaseGrantRequest { ttl: 60, id: 9 };
    let grant = InternalRaftRequest { lease_grant: Some(Box::new(grant)), ..Default::default() };
    assert_eq!(node.propose(grant, &Requester::anonymous()).await, Err(EtcdError::NoSpace));
    assert_eq!(node.state().active_alarms().len(), 1, "raised once");
}
