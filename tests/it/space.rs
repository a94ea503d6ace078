//! Space and the member's own health, end to end:
//!
//! * `--quota-backend-bytes` filled up: "database space exceeded", the NOSPACE alarm (`etcdctl alarm
//!   list`), reads still served, deletes + compaction + defragment + `alarm disarm` bring writes back —
//!   through the etcd-client crate, and with etcdctl step by step against a real etcd.
//! * Alarms are root's once auth is enabled (beyond etcd 3.4, which lets anyone raise or clear them).
//! * `/health` and `/metrics` report the alarm, the quota and the size in use.
//! * A full disk (a small tmpfs; needs root, skipped otherwise): the member deletes its ballast,
//!   applies the write, raises NOSPACE and keeps serving.
//! * One process per data dir: a second `keyward serve` exits at once, naming the dir and the holder.
//! * A storage failure stops the raft core: the process exits non-zero and says why.
//!
//! With `KEYWARD_HARNESS_SELFTEST=1` the tests etcd also passes run against a real etcd; the others
//! return early.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::common::auth::{connect, connect_as, msg, AuthServer, FAST_BCRYPT, ROOT_PW};
use crate::common::etcd_errors::NO_SPACE;
use crate::common::{
    self, assert_status, etcdctl, free_port, http_get, keyward_bin, member_flags, metric, step, step_stdin, Kind,
    Scenario, Server,
};
use etcd_client::{
    AlarmAction, AlarmOptions, AlarmType, Client, CompactionOptions, DeleteOptions, GetOptions, Txn, TxnOp,
};
use tonic::Code;

/// A quota that values of `VALUE_BYTES` fill within a few dozen puts, on etcd and on keyward.
const QUOTA: [&str; 2] = ["--quota-backend-bytes", "4194304"];
const QUOTA_BYTES: u64 = 4_194_304;
const VALUE_BYTES: usize = 100_000;

/// Puts `{prefix}NNNN` = `value_bytes` bytes until a put is refused: how many were accepted, and the
/// refusal.
async fn fill(c: &mut Client, prefix: &str, value_bytes: usize) -> (usize, etcd_client::Error) {
    let value = vec![b'x'; value_bytes];
    for i in 0..10_000 {
        if let Err(e) = c.put(format!("{prefix}{i:04}"), value.clone(), None).await {
            return (i, e);
        }
    }
    panic!("no put was ever refused");
}

async fn alarms(c: &mut Client) -> Vec<(u64, AlarmType)> {
    let resp = c.alarm(AlarmAction::Get, AlarmType::None, None).await.expect("alarm list");
    resp.alarms().iter().map(|a| (a.member_id(), a.alarm())).collect()
}

fn for_member(member_id: u64) -> Option<AlarmOptions> {
    let mut options = AlarmOptions::new();
    options.with_member(member_id);
    Some(options)
}

// ---------------------------------------------------------------------------
// the quota
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_full_raises_nospace_reads_go_on_and_compaction_defrag_disarm_bring_writes_back() {
    let mut server = tokio::task::spawn_blocking(|| Server::start_with(Kind::under_test(), &QUOTA)).await.unwrap();
    let mut c = server.client().await;
    let (accepted, refused) = fill(&mut c, "fill/", VALUE_BYTES).await;
    assert!(accepted >= 5, "only {accepted} puts fit in a 4 MiB quota");
    assert_status::<()>(Err(refused), Code::ResourceExhausted, NO_SPACE);
    let member_id = c.status().await.unwrap().header().unwrap().member_id();
    assert_eq!(alarms(&mut c).await, [(member_id, AlarmType::Nospace)]);

    // Whatever takes space is refused, also a single small put and a txn that would put...
    assert_status(c.put("small", "v", None).await, Code::ResourceExhausted, NO_SPACE);
    assert_status(c.txn(Txn::new().and_then([TxnOp::put("t", "v", None)])).await, Code::ResourceExhausted, NO_SPACE);
    assert_status(c.lease_grant(60, None).await, Code::ResourceExhausted, NO_SPACE);
    // ...while reads, deletes and a txn without a put go through.
    let got = c.get("fill/0000", Some(GetOptions::new().with_serializable())).await.unwrap();
    assert_eq!(got.kvs()[0].value().len(), VALUE_BYTES);
    assert_eq!(
        c.get("fill/", Some(GetOptions::new().with_prefix().with_count_only())).await.unwrap().count(),
        accepted as i64
    );
    let txn = c.txn(Txn::new().and_then([TxnOp::delete("fill/0000", None)])).await.unwrap();
    assert!(txn.succeeded());

    // The alarm is replicated state: it is still there after a restart.
    tokio::task::block_in_place(|| server.restart());
    let mut c = server.client().await;
    assert_eq!(alarms(&mut c).await, [(member_id, AlarmType::Nospace)]);
    assert_status(c.put("small", "v", None).await, Code::ResourceExhausted, NO_SPACE);

    // Make room; writes stay refused until the alarm is disarmed.
    let deleted = c.delete("fill/", Some(DeleteOptions::new().with_prefix())).await.unwrap();
    assert_eq!(deleted.deleted() as usize, accepted - 1);
    let revision = deleted.header().unwrap().revision();
    c.compact(revision, Some(CompactionOptions::new().with_physical())).await.unwrap();
    c.defragment().await.unwrap();
    assert_status(c.put("small", "v", None).await, Code::ResourceExhausted, NO_SPACE);
    let disarmed = c.alarm(AlarmAction::Deactivate, AlarmType::Nospace, for_member(member_id)).await.unwrap();
    assert_eq!(disarmed.alarms().len(), 1);
    assert!(alarms(&mut c).await.is_empty());
    c.put("small", "v", None).await.unwrap();
    c.lease_grant(60, None).await.unwrap();
    assert_eq!(c.get("small", None).await.unwrap().kvs()[0].value(), b"v");
}

/// The same steps with etcdctl against etcd and keyward: after each server was filled to its quota
/// (not compared: bbolt and LMDB fit different numbers of values), every step prints the same.
#[test]
fn etcdctl_alarm_list_and_disarm_at_a_full_quota_match_etcd() {
    let mut sc = Scenario::start_with(&QUOTA);
    let value = "x".repeat(VALUE_BYTES);
    for server in [&sc.reference, &sc.candidate] {
        for n in 0.. {
            let out = server.etcdctl(&["put", &format!("fill/{n:04}"), &value]);
            if !out.success() {
                assert!(out.stderr.contains(NO_SPACE), "{}: {}", server.kind.label(), out.stderr);
                break;
            }
            assert!(n < 1000, "{}: the quota never refused a put", server.kind.label());
        }
    }
    sc.run(&[
        step(&["put", "x", "y"]),
        step(&["alarm", "list"]),
        step(&["alarm", "list", "-w", "json"]),
        step(&["endpoint", "status"]),
        step(&["get", "fill/0000", "--keys-only"]),
        step(&["lease", "grant", "60"]),
        step_stdin(&["txn"], "\nput x y\n\n"),
        step_stdin(&["txn"], "\ndel nothing\n\n"),
    ]);
    for server in [&sc.reference, &sc.candidate] {
        let deleted = server.etcdctl(&["del", "--prefix", "fill/", "-w", "json"]);
        deleted.assert_ok();
        let json: serde_json::Value = serde_json::from_str(&deleted.stdout).expect("del -w json");
        let revision = json["header"]["revision"].as_i64().expect("header revision");
        server.etcdctl(&["compaction", "--physical", &revision.to_string()]).assert_ok();
        server.etcdctl(&["defrag"]).assert_ok();
    }
    sc.run(&[
        step(&["put", "x", "y"]),
        step(&["alarm", "disarm"]),
        step(&["alarm", "list"]),
        step(&["put", "x", "y"]),
        step(&["get", "x"]),
        step(&["endpoint", "status"]),
        step(&["alarm", "disarm", "-w", "json"]),
    ]);
}

/// A NOSPACE alarm turns the cluster read-only and disarming it turns writes back on: with auth
/// enabled, both are root's. etcd 3.4 lets any client, even an unauthenticated one, do either.
/// Listing stays open, as in etcd (`endpoint status` shows the same alarms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raising_and_clearing_alarms_needs_root_when_auth_is_enabled() {
    if common::selftest() {
        return; // etcd 3.4 does not check
    }
    let mut s = AuthServer::start_with(Kind::Keyward, &FAST_BCRYPT).await;
    let member_id = s.root.status().await.unwrap().header().unwrap().member_id();
    let mut bob = s.user("bob", &[]).await;
    // Adding bob moved the auth revision: root's token predates it (etcd-client does not re-login).
    s.root = connect_as(&s.ep(), "root", ROOT_PW).await;
    let mut anonymous = connect(&s.ep()).await;
    for (who, c, expected) in
        [("bob", &mut bob, "auth: permission denied"), ("anonymous", &mut anonymous, "auth: user name is empty")]
    {
        let raised = c.alarm(AlarmAction::Activate, AlarmType::Nospace, for_member(member_id)).await;
        assert_eq!(raised.as_ref().map_err(msg).err().as_deref(), Some(expected), "{who} raising: {raised:?}");
    }
    assert!(alarms(&mut bob).await.is_empty(), "bob lists alarms");
    // Listing alarms needs an authenticated user (etcd 3.4 answers anyone).
    let listed = anonymous.alarm(AlarmAction::Get, AlarmType::None, None).await;
    assert_eq!(listed.as_ref().map_err(msg).err().as_deref(), Some("auth: user name is empty"), "{listed:?}");
    assert!(alarms(&mut s.root).await.is_empty(), "nothing was raised");
    s.root.put("k", "v", None).await.unwrap();

    // Root can; then neither bob nor an anonymous client can clear it.
    let raised = s.root.alarm(AlarmAction::Activate, AlarmType::Nospace, for_member(member_id)).await.unwrap();
    assert_eq!(raised.alarms().len(), 1);
    assert_status(s.root.put("k", "v2", None).await, Code::ResourceExhausted, NO_SPACE);
    for (who, c, expected) in
        [("bob", &mut bob, "auth: permission denied"), ("anonymous", &mut anonymous, "auth: user name is empty")]
    {
        let cleared = c.alarm(AlarmAction::Deactivate, AlarmType::Nospace, for_member(member_id)).await;
        assert_eq!(cleared.as_ref().map_err(msg).err().as_deref(), Some(expected), "{who} clearing: {cleared:?}");
    }
    assert_eq!(alarms(&mut bob).await, [(member_id, AlarmType::Nospace)], "bob lists the alarm");
    assert_eq!(alarms(&mut s.root).await, [(member_id, AlarmType::Nospace)]);
    let cleared = s.root.alarm(AlarmAction::Deactivate, AlarmType::Nospace, for_member(member_id)).await.unwrap();
    assert_eq!(cleared.alarms().len(), 1);
    s.root.put("k", "v2", None).await.unwrap();
}

/// keyward raises NOSPACE only: it has no corruption check that could justify a CORRUPT alarm.
#[tokio::test]
async fn only_nospace_can_be_raised() {
    if common::selftest() {
        return; // etcd accepts CORRUPT (and then refuses every request)
    }
    let server = tokio::task::spawn_blocking(|| Server::start(Kind::Keyward)).await.unwrap();
    let mut c = server.client().await;
    let refused = c.alarm(AlarmAction::Activate, AlarmType::Corrupt, None).await;
    assert_status(refused, Code::Unimplemented, "etcdserver: keyward raises only NOSPACE alarms, not CORRUPT");
    assert!(alarms(&mut c).await.is_empty());
    c.put("k", "v", None).await.unwrap();
}

// ---------------------------------------------------------------------------
// /health and /metrics
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_metrics_and_status_report_the_quota_the_size_in_use_and_the_alarm() {
    if common::selftest() {
        return; // keyward's own metric names and values
    }
    let server = tokio::task::spawn_blocking(|| Server::start_with(Kind::Keyward, &QUOTA)).await.unwrap();
    let ep = server.endpoint();
    let get = |path: &'static str| {
        let ep = ep.clone();
        async move { tokio::task::spawn_blocking(move || http_get(&ep, path)).await.unwrap() }
    };
    let mut c = server.client().await;
    assert_eq!(get("/health").await, (200, r#"{"health":"true"}"#.to_string()));
    let (_, text) = get("/metrics").await;
    assert_eq!(metric(&text, "etcd_server_quota_backend_bytes"), QUOTA_BYTES as f64);
    assert_eq!(metric(&text, "etcd_server_has_leader"), 1.0);
    let (in_use, total) =
        (metric(&text, "etcd_mvcc_db_total_size_in_use_in_bytes"), metric(&text, "etcd_mvcc_db_total_size_in_bytes"));
    assert!(in_use > 0.0 && in_use <= total, "in use {in_use}, total {total}");

    let (_, refused) = fill(&mut c, "fill/", VALUE_BYTES).await;
    assert_status::<()>(Err(refused), Code::ResourceExhausted, NO_SPACE);
    let (_, text) = get("/metrics").await;
    let in_use = metric(&text, "etcd_mvcc_db_total_size_in_use_in_bytes");
    // Refused because size in use + the put's cost reached the quota.
    assert!(in_use > (QUOTA_BYTES - 2 * VALUE_BYTES as u64) as f64, "in use {in_use}");
    assert_eq!(get("/health").await, (503, r#"{"health":"false"}"#.to_string()), "an active alarm");
    assert_eq!(get("/health?exclude=NOSPACE").await.0, 200, "etcd's exclude parameter");
    let status = c.status().await.unwrap();
    let member_id = status.header().unwrap().member_id();
    assert_eq!(status.errors(), [format!("memberID:{member_id} alarm:NOSPACE ")]);
    assert!(status.raft_used_db_size() as f64 >= in_use * 0.9, "{}", status.raft_used_db_size());
}

// ---------------------------------------------------------------------------
// a full disk
// ---------------------------------------------------------------------------

/// A member whose data dir is a tmpfs of its own, unmounted (after the member is killed) on drop.
struct OnTmpfs {
    server: Option<Server>,
    mount: PathBuf,
}

impl Drop for OnTmpfs {
    fn drop(&mut self) {
        if let Some(server) = self.server.as_mut() {
            server.kill_9();
        }
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        self.server.take();
    }
}

/// Mounts a tmpfs of `size` at `dir`; false (with the reason printed) where that is not allowed.
fn mount_tmpfs(dir: &Path, size: &str) -> bool {
    std::fs::create_dir_all(dir).unwrap();
    let out =
        Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs"]).arg(dir).output();
    match out {
        Ok(out) if out.status.success() => true,
        Ok(out) => {
            eprintln!("skipping: cannot mount a tmpfs (needs root): {}", String::from_utf8_lossy(&out.stderr).trim());
            false
        }
        Err(e) => {
            eprintln!("skipping: cannot run mount: {e}");
            false
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_costs_the_ballast_raises_nospace_and_the_member_keeps_serving() {
    if common::selftest() {
        return; // keyward's ballast
    }
    let dir = tempfile::Builder::new().prefix("space-tmpfs-").tempdir().unwrap();
    let data = dir.path().join("data");
    if !mount_tmpfs(&data, "64m") {
        return;
    }
    let mut member = OnTmpfs { server: None, mount: data.clone() };
    // The default quota (2 GiB) is far above the disk: the disk is what fills.
    let ballast = ["--ballast-bytes", "8388608"];
    let server = tokio::task::spawn_blocking(move || Server::start_in(Kind::Keyward, dir, &ballast)).await.unwrap();
    let server = member.server.insert(server);
    let ballast_file = data.join("member").join("ballast");
    assert!(ballast_file.exists(), "the ballast is in place at startup");
    let mut c = server.client().await;

    let (accepted, refused) = fill(&mut c, "fill/", 256 << 10).await;
    assert_status::<()>(Err(refused), Code::ResourceExhausted, NO_SPACE);
    assert!(accepted >= 10, "{accepted}");
    assert!(!ballast_file.exists(), "the ballast made room for the write that found the disk full");
    let log = std::fs::read_to_string(server.log_path()).unwrap();
    assert!(log.contains("disk full: deleted the ballast"), "{}", server.log_tail(30));
    let member_id = c.status().await.unwrap().header().unwrap().member_id();
    assert_eq!(alarms(&mut c).await, [(member_id, AlarmType::Nospace)]);
    // Every accepted write is there, in order, and the member still answers reads.
    let count = c.get("fill/", Some(GetOptions::new().with_prefix().with_count_only())).await.unwrap().count();
    assert_eq!(count, accepted as i64);
    let last = c.get(format!("fill/{:04}", accepted - 1), None).await.unwrap();
    assert_eq!(last.kvs()[0].value().len(), 256 << 10);
    assert_eq!(last.kvs()[0].version(), 1);

    // Deletes and a compaction free pages inside LMDB's files; after the disarm, writes fit again.
    let deleted = c.delete("fill/", Some(DeleteOptions::new().with_prefix())).await.unwrap();
    // Physical: removal runs in the background; the writes below need the pages it frees.
    let physical = Some(etcd_client::CompactionOptions::new().with_physical());
    c.compact(deleted.header().unwrap().revision(), physical).await.unwrap();
    c.alarm(AlarmAction::Deactivate, AlarmType::Nospace, for_member(member_id)).await.unwrap();
    for i in 0..8 {
        c.put(format!("after/{i}"), vec![b'y'; 64 << 10], None).await.unwrap();
    }
    assert_eq!(c.get("after/7", None).await.unwrap().kvs()[0].value().len(), 64 << 10);
    let ep = server.endpoint();
    let health = tokio::task::spawn_blocking(move || http_get(&ep, "/health")).await.unwrap();
    assert_eq!(health.0, 200, "{health:?}");
}

// ---------------------------------------------------------------------------
// processes: one per data dir; a stopped raft core exits
// ---------------------------------------------------------------------------

/// A process started by a test: killed (by PID) and reaped on drop.
struct Spawned(Child);

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Spawned {
    /// Waits for the process to exit on its own, up to `limit` (a bound for a test that must end, not a
    /// timing assertion).
    fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(status) = self.0.try_wait().expect("try_wait") {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

/// `program args… keyward serve <flags for data_dir on fresh ports>`, output appended to `log`.
fn spawn_keyward(wrapper: &[&str], data_dir: &Path, log: &Path) -> (Spawned, String) {
    let endpoint = format!("127.0.0.1:{}", free_port());
    let peer = format!("http://127.0.0.1:{}", free_port());
    let mut cmd = Command::new(wrapper.first().copied().unwrap_or(keyward_bin().to_str().unwrap()));
    if !wrapper.is_empty() {
        cmd.args(&wrapper[1..]).arg(keyward_bin());
    }
    cmd.arg("serve").args(member_flags(data_dir, &format!("http://{endpoint}"), &peer)).args(["--ballast-bytes", "0"]);
    let log = std::fs::File::options().create(true).append(true).open(log).unwrap();
    cmd.stdin(Stdio::null()).stdout(log.try_clone().unwrap()).stderr(log);
    common::scrub_env(&mut cmd);
    (Spawned(cmd.spawn().expect("spawn keyward")), endpoint)
}

#[test]
fn a_second_process_on_a_live_data_dir_exits_at_once_and_the_first_keeps_its_data() {
    if common::selftest() {
        return; // etcd's second process waits for the lock instead of exiting
    }
    let mut first = Server::start(Kind::Keyward);
    first.etcdctl(&["put", "k", "v"]).assert_ok();
    // Everything keyward created is its user's alone: the data holds every value and bcrypt hashes.
    let data = first.data_dir();
    let mode = |p: PathBuf| std::fs::metadata(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).permissions();
    for dir in ["", "member", "member/wal", "member/kv", "member/snap"] {
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode(data.join(dir))) & 0o777, 0o700, "{dir}");
    }
    for file in ["keyward.lock", "member/ballast", "member/wal/0000000000000000.wal", "member/kv/data.mdb"] {
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode(data.join(file))) & 0o777, 0o600, "{file}");
    }
    let holder = first.pid().unwrap();
    assert_eq!(std::fs::read_to_string(data.join("keyward.lock")).unwrap(), format!("{holder}\n"));
    let log = first.dir().path().join("second.log");
    let (mut second, second_ep) = spawn_keyward(&[], &first.data_dir(), &log);
    let status = second.wait_exit(Duration::from_secs(60)).expect("the second process exits on its own");
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(!status.success(), "{status}: {said}");
    let expected = format!("data dir {} is in use by another process (pid {holder})", first.data_dir().display());
    assert!(said.contains(&expected), "expected {expected:?} in:\n{said}");
    assert!(!etcdctl(&second_ep, &["--command-timeout=2s", "endpoint", "health"]).success());

    // The first member never noticed: it serves, and the key written once is at version 1.
    let version = |server: &Server| {
        let out = server.etcdctl(&["get", "k", "-w", "json"]);
        out.assert_ok();
        let json: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        (json["kvs"][0]["version"].as_i64(), json["kvs"][0]["value"].as_str().map(String::from))
    };
    assert_eq!(version(&first), (Some(1), Some("dg==".to_string())));
    first.etcdctl(&["put", "k2", "v"]).assert_ok();
    first.restart();
    assert_eq!(version(&first), (Some(1), Some("dg==".to_string())));
}

/// A storage failure the member cannot get past (here: files may not grow beyond 8 MiB, so LMDB's
/// writes fail with EFBIG) stops the raft core; the process must then exit non-zero and say why,
/// instead of answering "server stopped" forever.
#[test]
fn a_storage_failure_stops_the_process_with_the_reason() {
    if common::selftest() {
        return; // keyward's own exit
    }
    if Command::new("prlimit").arg("--version").output().is_err() {
        eprintln!("skipping: no prlimit(1) to limit the file size");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    // SIGXFSZ ignored (inherited across exec), so an oversized write fails with EFBIG instead of
    // killing the process.
    let wrapper = ["sh", "-c", r#"trap "" XFSZ; exec prlimit --fsize=8388608 -- "$@""#, "sh"];
    let (mut member, ep) = spawn_keyward(&wrapper, &dir.path().join("data"), &log);
    let ready = (0..400).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        etcdctl(&ep, &["--command-timeout=2s", "endpoint", "health"]).success()
    });
    assert!(ready, "never ready: {}", std::fs::read_to_string(&log).unwrap_or_default());
    let value = "x".repeat(VALUE_BYTES);
    for i in 0..200 {
        if !etcdctl(&ep, &["--command-timeout=5s", "put", &format!("k{i}"), &value]).success() {
            break;
        }
    }
    let status = member.wait_exit(Duration::from_secs(60)).expect("the process exits on its own");
    let said = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(1), "{status}: {said}");
    assert!(said.contains("raft core stopped"), "{said}");
    assert!(said.contains("keyward: raft core stopped: "), "the reason on stderr: {said}");
}
