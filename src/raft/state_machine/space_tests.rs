//! Full storage, the NOSPACE alarm and the size in use, applied through the state machine.

use std::os::unix::fs::PermissionsExt;

use openraft::{CommittedLeaderId, EntryPayload};

use super::*;
use crate::error::EtcdError;
use crate::proto::etcdserverpb::alarm_request::AlarmAction;
use crate::proto::etcdserverpb::request_op::Request;
use crate::proto::etcdserverpb::{
    AlarmRequest, AlarmType, CompactionRequest, DeleteRangeRequest, InternalRaftBatch, InternalRaftRequest,
    LeaseGrantRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use crate::raft::{Applied, RaftBatch};
use crate::space::ballast::Ballast;
use crate::space::Quota;

fn open(dir: &Path, space: Space) -> Arc<State> {
    StateMachine::open_with(&dir.join("kv"), &dir.join("snap"), Arc::new(space)).expect("open").state()
}

fn entry(index: u64, requests: Vec<InternalRaftRequest>) -> Entry {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(RaftBatch::new(InternalRaftBatch { requests })),
    }
}

fn put(key: &str, value: &[u8]) -> InternalRaftRequest {
    InternalRaftRequest {
        put: Some(Box::new(PutRequest { key: key.into(), value: value.to_vec(), ..Default::default() })),
        ..Default::default()
    }
}

fn delete(key: &str) -> InternalRaftRequest {
    InternalRaftRequest {
        delete_range: Some(Box::new(DeleteRangeRequest { key: key.into(), ..Default::default() })),
        ..Default::default()
    }
}

fn alarm(action: AlarmAction) -> InternalRaftRequest {
    let alarm = AlarmRequest { action: action as i32, member_id: 42, alarm: AlarmType::Nospace as i32 };
    InternalRaftRequest { alarm: Some(Box::new(alarm)), ..Default::default() }
}

fn txn(success: Vec<RequestOp>) -> InternalRaftRequest {
    InternalRaftRequest { txn: Some(Box::new(TxnRequest { success, ..Default::default() })), ..Default::default() }
}

fn apply(state: &State, index: u64, requests: Vec<InternalRaftRequest>) -> Vec<Result<Applied, EtcdError>> {
    state.apply_until_applied(&[entry(index, requests)]).expect("apply").remove(0)
}

fn value(state: &State, key: &str) -> Option<Vec<u8>> {
    let txn = state.read_txn().unwrap();
    let view = state.kv.view(&txn).unwrap();
    let resp = crate::mvcc::kv::range(&view, &RangeRequest { key: key.into(), ..Default::default() }).unwrap();
    resp.kvs.first().map(|kv| kv.value.clone())
}

#[test]
fn a_batch_that_finds_the_disk_full_is_applied_unchanged_after_the_ballast_goes() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let ballast = Ballast::new(a.path().join("ballast"), 1 << 20);
    assert!(ballast.ensure().unwrap());
    let full = open(a.path(), Space::new(Quota::Bytes(1 << 30), ballast));
    let clean = open(b.path(), Space::without_ballast());
    let batch = vec![put("k", b"v1"), put("k", b"v2"), delete("missing"), put("other", b"x")];
    full.inject_full.store(1, std::sync::atomic::Ordering::SeqCst);
    let got = apply(&full, 1, batch.clone());
    assert_eq!(got, apply(&clean, 1, batch), "same results as a member whose disk was never full");
    assert!(!full.space.ballast().present(), "the ballast made the room");
    assert!(!full.space.stalled());
    assert_eq!(value(&full, "k"), Some(b"v2".to_vec()));
    assert_eq!(full.kv.view(&full.read_txn().unwrap()).unwrap().rev, 4, "applied exactly once");
}

#[test]
fn without_a_ballast_apply_waits_and_retries_until_the_batch_fits() {
    let dir = tempfile::tempdir().unwrap();
    let state = open(dir.path(), Space::without_ballast());
    state.inject_full.store(2, std::sync::atomic::Ordering::SeqCst);
    let results = apply(&state, 1, vec![put("k", b"v")]);
    assert!(matches!(results[0], Ok(Applied::Put(_))), "{results:?}");
    assert_eq!(state.inject_full.load(std::sync::atomic::Ordering::SeqCst), 0, "both full attempts were retried");
    assert!(!state.space.stalled(), "no longer waiting once applied");
    assert_eq!(state.kv.view(&state.read_txn().unwrap()).unwrap().rev, 2);
}

#[test]
fn nospace_alarm_refuses_writes_that_take_space_on_every_member_until_disarmed() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let members = [open(a.path(), Space::without_ballast()), open(b.path(), Space::without_ballast())];
    let lease = |id| InternalRaftRequest {
        lease_grant: Some(Box::new(LeaseGrantRequest { ttl: 60, id })),
        ..Default::default()
    };
    let put_op = |k: &str| RequestOp {
        request: Some(Request::RequestPut(PutRequest { key: k.into(), value: b"v".to_vec(), ..Default::default() })),
    };
    let del_op = |k: &str| RequestOp {
        request: Some(Request::RequestDeleteRange(DeleteRangeRequest { key: k.into(), ..Default::default() })),
    };
    let compact = |revision| InternalRaftRequest {
        compaction: Some(Box::new(CompactionRequest { revision, physical: false })),
        ..Default::default()
    };
    let nested_put = txn(vec![RequestOp {
        request: Some(Request::RequestTxn(TxnRequest { success: vec![put_op("n")], ..Default::default() })),
    }]);
    let mut outcomes = Vec::new();
    for state in &members {
        assert!(matches!(apply(state, 1, vec![put("a", b"1"), put("b", b"2")])[..], [Ok(_), Ok(_)]));
        let raised = apply(state, 2, vec![alarm(AlarmAction::Activate)]);
        let Ok(Applied::Alarm(resp)) = &raised[0] else { panic!("{raised:?}") };
        assert_eq!(resp.alarms.len(), 1);
        assert!(state.nospace());
        let capped = apply(
            state,
            3,
            vec![
                put("c", b"3"),
                txn(vec![put_op("d")]),
                nested_put.clone(),
                lease(7),
                delete("a"),
                txn(vec![del_op("b")]),
                compact(2),
            ],
        );
        let refused: Vec<bool> = capped.iter().map(|r| r == &Err(EtcdError::NoSpace)).collect();
        assert_eq!(refused, [true, true, true, true, false, false, false], "{capped:?}");
        assert!(capped[4..].iter().all(Result::is_ok), "{capped:?}");
        assert_eq!(value(state, "a"), None);
        assert_eq!(value(state, "c"), None);
        let cleared = apply(state, 4, vec![alarm(AlarmAction::Deactivate), put("c", b"3"), lease(7)]);
        assert!(cleared.iter().all(Result::is_ok), "{cleared:?}");
        assert!(!state.nospace());
        assert_eq!(value(state, "c"), Some(b"3".to_vec()));
        outcomes.push((raised, capped, cleared));
    }
    assert_eq!(outcomes[0], outcomes[1], "every member decides alike");
}

#[test]
fn with_auth_on_only_root_or_the_member_itself_changes_alarms_at_apply() {
    use crate::proto::etcdserverpb::{
        AuthEnableRequest, AuthRoleAddRequest, AuthUserAddRequest, AuthUserGrantRoleRequest, RequestHeader,
    };
    let dir = tempfile::tempdir().unwrap();
    let state = open(dir.path(), Space::without_ballast());
    let member = Some(RequestHeader { member_internal: true, ..Default::default() });
    let as_member = |req: InternalRaftRequest| InternalRaftRequest { header: member.clone(), ..req };
    let user_add = AuthUserAddRequest { name: "root".into(), hashed_password: "x".into(), ..Default::default() };
    let setup = apply(
        &state,
        1,
        vec![
            as_member(InternalRaftRequest { auth_user_add: Some(Box::new(user_add)), ..Default::default() }),
            as_member(InternalRaftRequest {
                auth_role_add: Some(Box::new(AuthRoleAddRequest { name: "root".into() })),
                ..Default::default()
            }),
            as_member(InternalRaftRequest {
                auth_user_grant_role: Some(Box::new(AuthUserGrantRoleRequest {
                    user: "root".into(),
                    role: "root".into(),
                })),
                ..Default::default()
            }),
            as_member(InternalRaftRequest { auth_enable: Some(Box::new(AuthEnableRequest {})), ..Default::default() }),
        ],
    );
    assert!(setup.iter().all(Result::is_ok), "{setup:?}");
    let revision = state.auth.revision(&state.read_txn().unwrap()).unwrap();
    let bob = Some(RequestHeader { username: "bob".into(), auth_revision: revision, ..Default::default() });
    let refused = apply(
        &state,
        2,
        vec![alarm(AlarmAction::Activate), InternalRaftRequest { header: bob, ..alarm(AlarmAction::Activate) }],
    );
    assert_eq!(refused, [Err(EtcdError::UserEmpty), Err(EtcdError::UserNotFound)]);
    assert!(!state.nospace());
    let raised = apply(&state, 3, vec![as_member(alarm(AlarmAction::Activate))]);
    assert!(raised[0].is_ok() && state.nospace(), "{raised:?}");
    let root = Some(RequestHeader { username: "root".into(), auth_revision: revision, ..Default::default() });
    let cleared = apply(
        &state,
        4,
        vec![alarm(AlarmAction::Deactivate), InternalRaftRequest { header: root, ..alarm(AlarmAction::Deactivate) }],
    );
    assert_eq!(cleared[0], Err(EtcdError::UserEmpty));
    assert!(cleared[1].is_ok(), "{cleared:?}");
    assert!(!state.nospace());
}

#[test]
fn size_in_use_falls_after_deletes_and_compaction_while_the_file_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let state = open(dir.path(), Space::without_ballast());
    let empty = state.space.in_use();
    let value = vec![7u8; 64 << 10];
    let puts: Vec<_> = (0..64).map(|i| put(&format!("k{i:03}"), &value)).collect();
    apply(&state, 1, puts);
    let full = state.space.in_use();
    assert!(full > empty + 64 * (64 << 10), "{empty} -> {full}");
    let file = state.disk_size().unwrap();
    let mut requests: Vec<_> = (0..64).map(|i| delete(&format!("k{i:03}"))).collect();
    requests.push(InternalRaftRequest {
        compaction: Some(Box::new(CompactionRequest { revision: 129, physical: false })),
        ..Default::default()
    });
    apply(&state, 2, requests);
    assert!(state.space.in_use() > full / 2, "the compaction entry only schedules removal");
    while state.compaction_step(crate::mvcc::compaction::STEP_LIMIT).expect("step").pending.is_some() {}
    let after = state.space.in_use();
    assert!(after < full / 4, "removal frees the pages: {full} -> {after}");
    assert!(state.disk_size().unwrap() >= file, "LMDB keeps its file, reusing the pages");
}

#[test]
fn snapshots_carry_alarms_and_are_owner_only() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let source = open(a.path(), Space::without_ballast());
    apply(&source, 1, vec![put("k", b"v"), alarm(AlarmAction::Activate)]);
    let (meta, file) = source.build_snapshot().unwrap();
    let path = a.path().join("snap").join("current.snap");
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    for dir in [a.path().join("kv"), a.path().join("snap")] {
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700, "{}", dir.display());
    }
    let target =
        StateMachine::open_with(&b.path().join("kv"), &b.path().join("snap"), Arc::new(Space::without_ballast()))
            .expect("open");
    target.kv.install_snapshot(&meta, file, None).unwrap();
    let target = target.state();
    assert!(target.nospace(), "the alarm is replicated state");
    assert_eq!(value(&target, "k"), Some(b"v".to_vec()));
    assert_eq!(target.space.in_use(), source.space.in_use());
}
