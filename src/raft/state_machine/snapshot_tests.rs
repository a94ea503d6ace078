//! Snapshots through openraft's state machine trait: built on one member, sent chunk by chunk, installed
//! on another; what an install must rebuild; the snap dir's edges (old format, crashes, corruption).
//! Its request builders serve the node's and the watchers' install tests too.

use std::sync::Mutex;
use std::time::Duration;

use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::snapshot::format;
use super::*;
use crate::auth::check::Authorizer;
use crate::auth::permissions::Access;
use crate::auth::simple::SimpleTokens;
use crate::auth::token_config::TokenConfig;
use crate::auth::tokens::Tokens;
use crate::identity::Requester;
use crate::keyrange::KeyRange;
use crate::lease::store::LeaseRecord;
use crate::proto::authpb::{permission::Type as PermType, Permission};
use crate::proto::etcdserverpb::alarm_request::AlarmAction;
use crate::proto::etcdserverpb::{
    AlarmRequest, AlarmType, AuthEnableRequest, AuthRoleAddRequest, AuthRoleGrantPermissionRequest, AuthUserAddRequest,
    AuthUserGrantRoleRequest, DeleteRangeRequest, InternalRaftRequest, LeaseCheckpoint, LeaseCheckpointRequest,
    LeaseGrantRequest, PutRequest, RequestHeader,
};

/// Applies `requests` as the entry at `index`; every one must succeed.
fn apply(state: &State, index: u64, requests: Vec<InternalRaftRequest>) {
    let results = state.apply_requests(index, requests);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
}

fn open(dir: &Path) -> StateMachine {
    StateMachine::open(&dir.join("kv"), &dir.join("snap")).expect("open")
}

pub(crate) fn as_member(req: InternalRaftRequest) -> InternalRaftRequest {
    InternalRaftRequest { header: Some(RequestHeader { member_internal: true, ..Default::default() }), ..req }
}

pub(crate) fn put(key: &[u8], value: &[u8], lease: i64) -> InternalRaftRequest {
    let put = PutRequest { key: key.to_vec(), value: value.to_vec(), lease, ..Default::default() };
    InternalRaftRequest { put: Some(Box::new(put)), ..Default::default() }
}

pub(crate) fn delete(key: &[u8]) -> InternalRaftRequest {
    let delete = DeleteRangeRequest { key: key.to_vec(), ..Default::default() };
    InternalRaftRequest { delete_range: Some(Box::new(delete)), ..Default::default() }
}

pub(crate) fn grant(id: i64, ttl: i64) -> InternalRaftRequest {
    InternalRaftRequest { lease_grant: Some(Box::new(LeaseGrantRequest { ttl, id })), ..Default::default() }
}

pub(crate) fn checkpoint(id: i64, remaining_ttl: i64) -> InternalRaftRequest {
    let checkpoints = vec![LeaseCheckpoint { id, remaining_ttl }];
    as_member(InternalRaftRequest {
        lease_checkpoint: Some(Box::new(LeaseCheckpointRequest { checkpoints })),
        ..Default::default()
    })
}

pub(crate) fn alarm(member_id: u64) -> InternalRaftRequest {
    let alarm = AlarmRequest { action: AlarmAction::Activate as i32, member_id, alarm: AlarmType::Nospace as i32 };
    as_member(InternalRaftRequest { alarm: Some(Box::new(alarm)), ..Default::default() })
}

/// root, and alice who may read `readable`; then auth on. The same number of auth changes whatever
/// `readable` is, so two members end at the same auth revision with different permissions.
pub(crate) fn auth_with_alice_reading(readable: &[u8]) -> Vec<InternalRaftRequest> {
    let user = |name: &str| AuthUserAddRequest { name: name.into(), hashed_password: "x".into(), ..Default::default() };
    let role = |name: &str| AuthRoleAddRequest { name: name.into() };
    let user_role = |user: &str, role: &str| AuthUserGrantRoleRequest { user: user.into(), role: role.into() };
    let perm = Permission { perm_type: PermType::Read as i32, key: readable.to_vec(), range_end: Vec::new() };
    [
        InternalRaftRequest { auth_user_add: Some(Box::new(user("root"))), ..Default::default() },
        InternalRaftRequest { auth_role_add: Some(Box::new(role("root"))), ..Default::default() },
        InternalRaftRequest { auth_user_grant_role: Some(Box::new(user_role("root", "root"))), ..Default::default() },
        InternalRaftRequest { auth_user_add: Some(Box::new(user("alice"))), ..Default::default() },
        InternalRaftRequest { auth_role_add: Some(Box::new(role("reader"))), ..Default::default() },
        InternalRaftRequest {
            auth_role_grant_permission: Some(Box::new(AuthRoleGrantPermissionRequest {
                name: "reader".into(),
                perm: Some(perm),
            })),
            ..Default::default()
        },
        InternalRaftRequest {
            auth_user_grant_role: Some(Box::new(user_role("alice", "reader"))),
            ..Default::default()
        },
        InternalRaftRequest { auth_enable: Some(Box::new(AuthEnableRequest {})), ..Default::default() },
    ]
    .into_iter()
    .map(as_member)
    .collect()
}

/// Sends `snapshot` to `target` as openraft does (chunks of `chunk` bytes written into what
/// `begin_receiving_snapshot` returned), then installs it.
async fn send(snapshot: Snapshot<TypeConfig>, target: &mut StateMachine, chunk: usize) -> Result<(), StorageError> {
    let mut sending = snapshot.snapshot;
    let mut receiving = target.begin_receiving_snapshot().await?;
    let mut buf = vec![0u8; chunk];
    loop {
        let n = sending.read(&mut buf).await.expect("read the snapshot");
        if n == 0 {
            break;
        }
        receiving.write_all(&buf[..n]).await.expect("write a chunk");
    }
    target.install_snapshot(&snapshot.meta, receiving).await
}

/// Builds a snapshot on `source` and sends it to `target`.
async fn transfer(source: &mut StateMachine, target: &mut StateMachine) -> Meta {
    let snapshot = source.get_snapshot_builder().await.build_snapshot().await.expect("build");
    let meta = snapshot.meta.clone();
    send(snapshot, target, 1000).await.expect("install");
    meta
}

fn temp_files(dir: &Path) -> Vec<String> {
    let names = std::fs::read_dir(dir.join("snap")).expect("snap dir").map(|e| e.expect("entry").file_name());
    names.filter_map(|n| n.into_string().ok()).filter(|n| n.ends_with(".tmp")).collect()
}

fn may_read(state: &State, key: &[u8]) -> bool {
    let txn = state.read_txn().unwrap();
    let authz = Authorizer::new(&state.auth, &txn).unwrap();
    let alice = Requester::client("alice".into(), authz.revision());
    authz.check(&alice, "range", Access::Read, &KeyRange::new(key, b"")).is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_installed_snapshot_makes_the_follower_table_for_table_identical_to_the_leader() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut source, mut target) = (open(a.path()), open(b.path()));
    // Past LMDB's key limit: the snapshot carries the long-key remainders too.
    let long_key = vec![b'k'; 1500];
    let first = vec![put(b"a", b"1", 0), put(&long_key, b"long", 0), put(&[0, 0xff], &[7; 3000], 0), grant(7, 60)];
    apply(&source.state(), 1, first);
    apply(&source.state(), 2, vec![put(b"leased", b"x", 7), delete(b"a"), checkpoint(7, 20), alarm(42)]);
    apply(&source.state(), 3, auth_with_alice_reading(b"b"));
    // The follower's own state, all of which the install replaces.
    apply(&target.state(), 1, vec![put(b"only-on-the-follower", b"x", 0), grant(9, 30), alarm(7)]);

    let meta = transfer(&mut source, &mut target).await;

    assert_eq!(target.state().table_records(), source.state().table_records());
    assert_eq!(target.applied_state().await.unwrap(), source.applied_state().await.unwrap());
    let current = target.get_current_snapshot().await.unwrap().expect("a current snapshot");
    assert_eq!(current.meta, meta);
    let (sent, kept) = (a.path().join("snap/current.snap"), b.path().join("snap/current.snap"));
    assert_eq!(std::fs::read(&kept).unwrap(), std::fs::read(&sent).unwrap(), "the follower keeps what it received");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&kept).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(temp_files(b.path()), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_install_rebuilds_everything_derived_from_the_applied_state() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut source, mut target) = (open(a.path()), open(b.path()));
    let (src, dst) = (source.state(), target.state());
    apply(&src, 1, auth_with_alice_reading(b"b"));
    // Auth is on: the member's own requests need no user.
    let later = vec![grant(7, 60), checkpoint(7, 20), put(b"k", b"v", 7), alarm(42)];
    apply(&src, 2, later.into_iter().map(as_member).collect());
    apply(&dst, 1, auth_with_alice_reading(b"a"));
    let bulk = (0..64).map(|i| as_member(put(format!("bulk/{i}").as_bytes(), &[1; 16 << 10], 0))).collect();
    apply(&dst, 2, bulk);
    apply(&dst, 3, vec![as_member(grant(9, 30)), alarm(7)]);
    let revision_of = |state: &State| state.auth.revision(&state.read_txn().unwrap()).unwrap();
    let auth_revision = revision_of(&src);
    assert_eq!(revision_of(&dst), auth_revision, "same auth revision, different permissions");

    // What the follower derived from its own state: a cached permission, tokens, the size in use.
    assert!(may_read(&dst, b"a") && !may_read(&dst, b"b"));
    let tokens = Arc::new(Tokens::new(&TokenConfig::Simple, Duration::from_secs(300)).unwrap());
    dst.use_tokens(tokens.clone());
    let simple = tokens.simple().unwrap();
    // Before alice was added (auth revision 1): void in the installed state.
    simple.assign(&SimpleTokens::digest("issued-before"), 1, "alice", 1);
    simple.assign(&SimpleTokens::digest("issued-at"), 2, "alice", auth_revision);
    // A user the installed state does not have.
    simple.assign(&SimpleTokens::digest("ghost"), 3, "ghost", auth_revision);
    let size_before = dst.space.in_use();
    let observed = Arc::new(Mutex::new(Vec::new()));
    let seen = observed.clone();
    dst.observe(Box::new(move |batch| seen.lock().unwrap().push(batch)));

    transfer(&mut source, &mut target).await;

    assert!(may_read(&dst, b"b") && !may_read(&dst, b"a"), "permissions of the installed state, not cached ones");
    let alarms: Vec<u64> = dst.active_alarms().iter().map(|a| a.member_id).collect();
    assert_eq!(alarms, [42]);
    let reported = dst.space.in_use();
    assert!(reported < size_before / 2, "{size_before} -> {reported}");
    dst.refresh_size_in_use(&dst.read_txn().unwrap()).unwrap();
    assert_eq!(dst.space.in_use(), reported, "the size in use was measured on the installed state");
    assert_eq!(simple.info("issued-before.1"), None, "issued before alice's credentials in the installed state");
    assert_eq!(simple.info("ghost.3"), None, "the installed state has no such user");
    assert_eq!(simple.info("issued-at.2"), Some(("alice".into(), auth_revision)));

    let observed = observed.lock().unwrap();
    let [told] = &observed[..] else { panic!("one notice of the install: {observed:?}") };
    let installed = told.installed.as_ref().expect("an install, not a batch");
    assert_eq!(installed.leases, [(7, LeaseRecord { ttl: 60, remaining_ttl: 20, owner: None })]);
    let src_txn = src.read_txn().unwrap();
    assert_eq!(told.revision, src.kv.view(&src_txn).unwrap().rev);
    assert!(told.auth_enabled);
    assert_eq!(told.auth_revision, auth_revision);
    assert!(told.effects.events.is_empty());
}

/// The snapshot file before the streamed format: postcard of `{meta, data}`.
#[derive(serde::Serialize)]
struct LegacyFile {
    meta: Meta,
    #[serde(with = "serde_bytes")]
    data: Vec<u8>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_current_snapshot_of_the_format_before_streaming_is_converted_at_open_and_still_installs() {
    let (a, b, c) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut source = open(a.path());
    apply(&source.state(), 1, vec![put(b"x", &[3; 5000], 0), put(&[b'y'; 900], b"long", 0), grant(5, 10)]);
    let (applied, membership) = source.applied_state().await.unwrap();
    let meta = Meta { last_log_id: applied, last_membership: membership, snapshot_id: "1-1-legacy".into() };
    let tables: Vec<Vec<(serde_bytes::ByteBuf, serde_bytes::ByteBuf)>> = source
        .state()
        .table_records()
        .into_iter()
        .map(|t| t.into_iter().map(|(k, v)| (k.into(), v.into())).collect())
        .collect();
    let data = postcard::to_allocvec(&tables).unwrap();
    let legacy = postcard::to_allocvec(&LegacyFile { meta: meta.clone(), data }).unwrap();
    std::fs::create_dir_all(b.path().join("snap")).unwrap();
    std::fs::write(b.path().join("snap/current.snap"), legacy).unwrap();

    let mut upgraded = open(b.path());

    let converted = std::fs::read(b.path().join("snap/current.snap")).unwrap();
    assert!(converted.starts_with(format::MAGIC));
    let current = upgraded.get_current_snapshot().await.unwrap().expect("still a current snapshot");
    assert_eq!(current.meta, meta);
    // This member's applied state was behind its snapshot, so opening installed it.
    assert_eq!(upgraded.state().table_records(), source.state().table_records());
    let mut follower = open(c.path());
    send(current, &mut follower, 4096).await.unwrap();
    assert_eq!(follower.state().table_records(), source.state().table_records());
    assert_eq!(follower.applied_state().await.unwrap().0, applied);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_an_install_made_its_snapshot_current_is_completed_at_open() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut source = open(a.path());
    apply(&source.state(), 1, vec![put(b"k", b"v", 0), grant(3, 30)]);
    source.get_snapshot_builder().await.build_snapshot().await.unwrap();
    // The snapshot is current, the transaction that installs it never committed.
    std::fs::create_dir_all(b.path().join("snap")).unwrap();
    std::fs::copy(a.path().join("snap/current.snap"), b.path().join("snap/current.snap")).unwrap();

    let mut restarted = open(b.path());

    assert_eq!(restarted.state().table_records(), source.state().table_records());
    assert_eq!(restarted.applied_state().await.unwrap(), source.applied_state().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_snapshot_files_are_removed_at_open_and_an_abandoned_transfer_leaves_none() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("snap")).unwrap();
    // The name the format before streaming used, and one of a transfer cut by a crash.
    for name in ["current.snap.tmp", "receive-3.tmp"] {
        std::fs::write(dir.path().join("snap").join(name), b"half").unwrap();
    }
    let mut sm = open(dir.path());
    assert_eq!(temp_files(dir.path()), Vec::<String>::new());
    let mut receiving = sm.begin_receiving_snapshot().await.unwrap();
    receiving.write_all(b"the first chunk").await.unwrap();
    assert_eq!(temp_files(dir.path()).len(), 1);
    drop(receiving);
    assert_eq!(temp_files(dir.path()), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_truncated_or_mismatched_snapshot_is_refused_and_changes_nothing() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut source = open(a.path());
    apply(&source.state(), 1, vec![put(b"big", &[b'v'; 10_000], 0), put(b"small", b"s", 0)]);
    let built = source.get_snapshot_builder().await.build_snapshot().await.unwrap();
    let bytes = std::fs::read(a.path().join("snap/current.snap")).unwrap();
    let mut target = open(b.path());
    apply(&target.state(), 1, vec![put(b"mine", b"m", 0)]);
    let (tables, applied) = (target.state().table_records(), target.applied_state().await.unwrap());

    let mut flipped = bytes.clone();
    flipped[bytes.len() / 2] ^= 1;
    let other = Meta { snapshot_id: "another".into(), ..built.meta.clone() };
    let cases = [
        ("a flipped byte", flipped, built.meta.clone()),
        ("truncated", bytes[..bytes.len() - 100].to_vec(), built.meta.clone()),
        ("another snapshot's metadata", bytes.clone(), other),
    ];
    for (what, bytes, meta) in cases {
        let mut receiving = target.begin_receiving_snapshot().await.unwrap();
        receiving.write_all(&bytes).await.unwrap();
        let refused = target.install_snapshot(&meta, receiving).await;
        assert!(refused.is_err(), "{what}");
        assert_eq!(target.state().table_records(), tables, "{what}");
        assert_eq!(target.applied_state().await.unwrap(), applied, "{what}");
        assert!(target.get_current_snapshot().await.unwrap().is_none(), "{what}");
        assert_eq!(temp_files(b.path()), Vec::<String>::new(), "{what}");
    }
}

#[test]
fn a_snapshot_of_an_older_state_never_replaces_a_newer_current_one() {
    let dir = tempfile::tempdir().unwrap();
    let state = open(dir.path()).state();
    apply(&state, 1, vec![put(b"a", b"1", 0)]);
    let (older, mut older_file) = state.build_snapshot().unwrap();
    apply(&state, 2, vec![put(b"b", b"2", 0)]);
    let (newer, _) = state.build_snapshot().unwrap();
    // The older build finishing late, after the newer one became current.
    let (late, mut out) = state.snaps.temp("late").unwrap();
    std::io::copy(&mut older_file, &mut out).unwrap();
    assert!(!state.snaps.publish(late, &older).unwrap());
    assert_eq!(state.snaps.current().unwrap().expect("current").0, newer);
    assert_eq!(temp_files(dir.path()), Vec::<String>::new());
}
