//! Bounded fuzzing of the apply phase (a proptest stand-in for a `cargo fuzz` target, so it runs in CI).
//!
//! Arbitrary batches of arbitrary requests — empty, binary and over-long keys and names, odd range ends,
//! revisions, lease ids, nested transactions, auth changes under any header — are applied to fresh state
//! machines, one entry per request. What must hold, whatever a committed entry holds:
//! - applying never fails as a whole (no storage error escapes, nothing panics);
//! - a request that is refused changes nothing: every table is byte-identical before and after it;
//! - two members applying the same entries end byte-identical, request by request.
//!
//! `KEYWARD_FUZZ_CASES` sets the number of cases (default 256); the store's semantics for valid input are
//! checked against a model in `mvcc/model_tests.rs`.

use openraft::{CommittedLeaderId, EntryPayload};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError};

use super::{StateMachine, TableRecords};
use crate::proto::authpb::{permission::Type as PermType, Permission, UserAddOptions};
use crate::proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use crate::proto::etcdserverpb::request_op::Request;
use crate::proto::etcdserverpb::*;
use crate::raft::{Entry, LogId, RaftBatch};

fn long(fill: u8, len: usize, last: u8) -> Vec<u8> {
    let mut k = vec![fill; len];
    k.push(last);
    k
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(Vec::new()),
        Just(b"a".to_vec()),
        Just(b"ab".to_vec()),
        Just(vec![0]),
        Just(vec![0xff]),
        Just(long(b'a', 600, b'a')),
        Just(long(b'a', 600, b'b')),
        Just(long(0, 246, 0)),
        Just(long(b'a', 1200, 0xff)),
    ]
}

fn range_end() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![3 => Just(Vec::new()), 1 => Just(vec![0]), 1 => Just(b"b".to_vec()), 1 => key()]
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("root".to_string()),
        Just("alice".to_string()),
        Just("r".to_string()),
        Just("n".repeat(700)),
    ]
}

fn lease() -> impl Strategy<Value = i64> {
    prop_oneof![Just(0i64), Just(1), Just(2), Just(-1)]
}

fn revision() -> impl Strategy<Value = i64> {
    prop_oneof![Just(-1i64), Just(0), Just(1), Just(2), Just(5), Just(i64::MAX)]
}

fn put() -> impl Strategy<Value = PutRequest> {
    (key(), prop::collection::vec(any::<u8>(), 0..4), lease(), any::<[bool; 3]>()).prop_map(
        |(key, value, lease, [prev_kv, ignore_value, ignore_lease])| PutRequest {
            key,
            value,
            lease,
            prev_kv,
            ignore_value,
            ignore_lease,
        },
    )
}

fn delete() -> impl Strategy<Value = DeleteRangeRequest> {
    (key(), range_end(), any::<bool>()).prop_map(|(key, range_end, prev_kv)| DeleteRangeRequest {
        key,
        range_end,
        prev_kv,
    })
}

fn range() -> impl Strategy<Value = RangeRequest> {
    (key(), range_end(), revision(), 0i64..3).prop_map(|(key, range_end, revision, limit)| RangeRequest {
        key,
        range_end,
        revision,
        limit,
        ..Default::default()
    })
}

fn compare() -> impl Strategy<Value = Compare> {
    (key(), range_end(), 0i32..4, revision()).prop_map(|(key, range_end, result, rev)| Compare {
        key,
        range_end,
        result: CompareResult::try_from(result).unwrap_or(CompareResult::Equal) as i32,
        target: CompareTarget::Mod as i32,
        target_union: Some(TargetUnion::ModRevision(rev)),
    })
}

fn txn() -> BoxedStrategy<TxnRequest> {
    let leaf = prop_oneof![
        put().prop_map(Request::RequestPut),
        delete().prop_map(Request::RequestDeleteRange),
        range().prop_map(Request::RequestRange),
    ];
    let op = leaf.prop_recursive(2, 8, 3, |inner| {
        (
            prop::collection::vec(compare(), 0..2),
            prop::collection::vec(inner.clone(), 0..3),
            prop::collection::vec(inner, 0..3),
        )
            .prop_map(|(compare, success, failure)| {
                let ops = |v: Vec<Request>| v.into_iter().map(|r| RequestOp { request: Some(r) }).collect();
                Request::RequestTxn(TxnRequest { compare, success: ops(success), failure: ops(failure) })
            })
    });
    let ops = || prop::collection::vec(op.clone().prop_map(|r| RequestOp { request: Some(r) }), 0..3);
    (prop::collection::vec(compare(), 0..2), ops(), ops())
        .prop_map(|(compare, success, failure)| TxnRequest { compare, success, failure })
        .boxed()
}

fn permission() -> impl Strategy<Value = Permission> {
    (0i32..3, key(), range_end()).prop_map(|(perm_type, key, range_end)| Permission {
        perm_type: PermType::try_from(perm_type).unwrap_or(PermType::Read) as i32,
        key,
        range_end,
    })
}

/// One request of any kind, with the operation fields etcd's raft entries carry.
fn operation() -> BoxedStrategy<InternalRaftRequest> {
    let kv = prop_oneof![
        put().prop_map(|put| InternalRaftRequest { put: Some(Box::new(put)), ..Default::default() }),
        delete().prop_map(|d| InternalRaftRequest { delete_range: Some(Box::new(d)), ..Default::default() }),
        txn().prop_map(|t| InternalRaftRequest { txn: Some(Box::new(t)), ..Default::default() }),
        revision().prop_map(|revision| InternalRaftRequest {
            compaction: Some(Box::new(CompactionRequest { revision, physical: false })),
            ..Default::default()
        }),
    ];
    let leases = prop_oneof![
        (lease(), -2i64..4).prop_map(|(id, ttl)| InternalRaftRequest {
            lease_grant: Some(Box::new(LeaseGrantRequest { ttl, id })),
            ..Default::default()
        }),
        lease().prop_map(|id| InternalRaftRequest {
            lease_revoke: Some(Box::new(LeaseRevokeRequest { id })),
            ..Default::default()
        }),
        (lease(), -1i64..100).prop_map(|(id, remaining_ttl)| InternalRaftRequest {
            lease_checkpoint: Some(Box::new(LeaseCheckpointRequest {
                checkpoints: vec![LeaseCheckpoint { id, remaining_ttl }]
            })),
            ..Default::default()
        }),
    ];
    let users = prop_oneof![
        Just(InternalRaftRequest { auth_enable: Some(Box::new(AuthEnableRequest {})), ..Default::default() }),
        Just(InternalRaftRequest { auth_disable: Some(Box::new(AuthDisableRequest {})), ..Default::default() }),
        (name(), any::<bool>()).prop_map(|(name, no_password)| InternalRaftRequest {
            auth_user_add: Some(Box::new(AuthUserAddRequest {
                name,
                password: String::new(),
                options: Some(UserAddOptions { no_password }),
                hashed_password: if no_password { String::new() } else { "$2b$04$not.a.real.hash".into() },
            })),
            ..Default::default()
        }),
        name().prop_map(|name| InternalRaftRequest {
            auth_user_delete: Some(Box::new(AuthUserDeleteRequest { name })),
            ..Default::default()
        }),
        (name(), name()).prop_map(|(user, role)| InternalRaftRequest {
            auth_user_grant_role: Some(Box::new(AuthUserGrantRoleRequest { user, role })),
            ..Default::default()
        }),
        (name(), name()).prop_map(|(name, role)| InternalRaftRequest {
            auth_user_revoke_role: Some(Box::new(AuthUserRevokeRoleRequest { name, role })),
            ..Default::default()
        }),
        (name(), name()).prop_map(|(name, simple_token)| InternalRaftRequest {
            authenticate: Some(Box::new(InternalAuthenticateRequest { name, password: String::new(), simple_token })),
            ..Default::default()
        }),
    ];
    let roles = prop_oneof![
        name().prop_map(|name| InternalRaftRequest {
            auth_role_add: Some(Box::new(AuthRoleAddRequest { name })),
            ..Default::default()
        }),
        name().prop_map(|role| InternalRaftRequest {
            auth_role_delete: Some(Box::new(AuthRoleDeleteRequest { role })),
            ..Default::default()
        }),
        (name(), prop::option::of(permission())).prop_map(|(name, perm)| InternalRaftRequest {
            auth_role_grant_permission: Some(Box::new(AuthRoleGrantPermissionRequest { name, perm })),
            ..Default::default()
        }),
        (name(), key(), range_end()).prop_map(|(role, key, range_end)| InternalRaftRequest {
            auth_role_revoke_permission: Some(Box::new(AuthRoleRevokePermissionRequest { role, key, range_end })),
            ..Default::default()
        }),
    ];
    // Boxed: the union's value trees are large, and a debug build would overflow a test thread's stack.
    prop_oneof![6 => kv.boxed(), 2 => leases.boxed(), 2 => users.boxed(), 2 => roles.boxed(), 1 => Just(InternalRaftRequest::default()).boxed()]
        .boxed()
}

/// A request under an arbitrary header: any user (or none), any auth revision, sometimes member-internal.
fn request() -> impl Strategy<Value = InternalRaftRequest> {
    (operation(), prop::option::of(name()), 0u64..6, prop::bool::weighted(0.1)).prop_map(
        |(mut req, username, auth_revision, member_internal)| {
            req.header = Some(RequestHeader {
                id: 0,
                username: username.unwrap_or_default(),
                auth_revision,
                member_internal,
                ..Default::default()
            });
            req
        },
    )
}

fn entry(index: u64, req: InternalRaftRequest) -> Entry {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(RaftBatch::new(InternalRaftBatch { requests: vec![req] })),
    }
}

fn fail(what: &str, err: impl std::fmt::Debug) -> TestCaseError {
    TestCaseError::fail(format!("{what}: {err:?}"))
}

struct Member {
    sm: StateMachine,
    _dir: tempfile::TempDir,
}

impl Member {
    fn new() -> Result<Self, TestCaseError> {
        let dir = tempfile::tempdir().map_err(|e| fail("tempdir", e))?;
        let sm = StateMachine::open(&dir.path().join("kv"), &dir.path().join("snap")).map_err(|e| fail("open", e))?;
        Ok(Member { sm, _dir: dir })
    }

    /// Every replicated table, as a snapshot would hold it.
    fn tables(&self) -> TableRecords {
        self.sm.state().table_records()
    }
}

fn cases() -> u32 {
    std::env::var("KEYWARD_FUZZ_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(256)
}

proptest! {
    #![proptest_config(Config { cases: cases(), failure_persistence: None, ..Config::default() })]

    #[test]
    fn applying_any_entry_gives_a_result_and_refusals_change_nothing(reqs in prop::collection::vec(request(), 1..40)) {
        let (a, b) = (Member::new()?, Member::new()?);
        let mut before = a.tables();
        for (i, req) in reqs.into_iter().enumerate() {
            let index = i as u64 + 1;
            let ra = a.sm.state().apply_batch(&[entry(index, req.clone())]).map_err(|e| fail("apply (member a)", e))?;
            let rb = b.sm.state().apply_batch(&[entry(index, req.clone())]).map_err(|e| fail("apply (member b)", e))?;
            prop_assert_eq!(&ra, &rb, "members disagree on {:?}", req);
            let after = a.tables();
            prop_assert_eq!(&after, &b.tables(), "members' tables differ after {:?}", req);
            let result = ra.first().and_then(|r| r.first()).ok_or_else(|| fail("no result", &req))?;
            if let Err(err) = result {
                prop_assert!(after == before, "refused with {:?} but changed the tables: {:?}", err, req);
                prop_assert!(*err != crate::error::EtcdError::Internal, "internal error for {:?}", req);
            }
            before = after;
        }
    }
}
