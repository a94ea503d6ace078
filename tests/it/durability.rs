//! Durability of `keyward serve` across crashes and restarts, through the `etcd-client` crate.
//!
//! * SIGKILL in the middle of a concurrent write load: every acknowledged put survives.
//! * A graceful stop (SIGTERM) and restart keeps values, revisions, versions and the compaction.
//! * SIGTERM with an open watch stream: the server must still exit promptly (as etcd does).
//! * Enough writes to pass the raft snapshot policy (`--snapshot-count`) so the restart has to
//!   come back from a snapshot plus the log after it.
//! * An operating-system crash, simulated by hand (another boot id, a torn LMDB file), and a power
//!   loss on a FUSE file system that loses every unsynced write and directory change
//!   (`common/faultfs.rs`; skipped, saying so, where FUSE is not available): the kv environment
//!   is rebuilt from the snapshot and the log, and every acknowledged put is there.
//!
//! With `KEYWARD_HARNESS_SELFTEST=1` the tests run against a real etcd instead (to check the
//! expectations themselves); the keyward-specific snapshot-file check is then skipped.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::etcd_errors::COMPACTED;
use crate::common::faultfs::{FaultFs, Loss};
use crate::common::{self, assert_status, current_revision, Kind, Server};
use etcd_client::{Client, GetOptions, KeyValue};
use tonic::Code;

fn s(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Every kv whose key starts with `prefix`, read in pages at one revision.
async fn all_with_prefix(c: &mut Client, prefix: &str) -> Vec<KeyValue> {
    const PAGE: i64 = 2000;
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().expect("non-empty prefix") += 1;
    let rev = current_revision(c).await;
    let mut from = prefix.as_bytes().to_vec();
    let mut out: Vec<KeyValue> = Vec::new();
    loop {
        let opts = GetOptions::new().with_range(end.clone()).with_limit(PAGE).with_revision(rev);
        let resp = c.get(from.clone(), Some(opts)).await.expect("range page");
        out.extend(resp.kvs().iter().cloned());
        if !resp.more() {
            break;
        }
        from = resp.kvs().last().expect("a page with more").key().to_vec();
        from.push(0);
    }
    out
}

/// How long a server may take to exit after SIGTERM (etcd 3.4 takes ~50 ms).
const SIGTERM_TIMEOUT_S: u64 = 10;

/// Send SIGTERM and wait until the process has exited (it stays a zombie until the harness
/// reaps it in `restart`). Async, so that this runtime's client connections can answer the
/// server's graceful shutdown.
async fn sigterm_and_wait(server: &Server) {
    let pid = server.pid().expect("server is running");
    let status = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().expect("run kill");
    assert!(status.success(), "kill -TERM {pid} failed");
    let deadline = Instant::now() + Duration::from_secs(SIGTERM_TIMEOUT_S);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // "pid (comm) S ...": the state follows the last ')'
        let state = stat.rsplit(')').next().unwrap_or("").trim_start().chars().next();
        if stat.is_empty() || state == Some('Z') || state == Some('X') {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "server did not exit within {SIGTERM_TIMEOUT_S} s of SIGTERM\n--- log ---\n{}",
            server.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether any file named `*.snap` exists under `dir` (keyward's raft snapshot file).
fn has_snapshot_file(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|e| {
        let path = e.path();
        if path.is_dir() {
            has_snapshot_file(&path)
        } else {
            path.extension().is_some_and(|x| x == "snap")
        }
    })
}

// ---------------------------------------------------------------------------
// SIGKILL under load
// ---------------------------------------------------------------------------

const WRITERS: usize = 8;
/// Acknowledged puts before the kill: enough that the kill lands mid-load, counted rather than timed so a
/// busy machine only makes the test slower.
const ACKED_BEFORE_KILL: u64 = 200;

struct WriterReport {
    /// (key, value, header revision) of every acknowledged put
    acked: Vec<(String, String, i64)>,
    failed: usize,
}

/// Every writer's report, together.
async fn gather(writers: Vec<tokio::task::JoinHandle<WriterReport>>) -> WriterReport {
    let mut all = WriterReport { acked: Vec::new(), failed: 0 };
    for w in writers {
        let report = w.await.expect("writer task");
        all.acked.extend(report.acked);
        all.failed += report.failed;
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_puts_survive_kill_9_mid_load() {
    let mut server = Server::start(Kind::under_test());
    let stop = Arc::new(AtomicBool::new(false));
    let acked_so_far = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let client = server.client().await;
        let (stop, acked_so_far) = (stop.clone(), acked_so_far.clone());
        writers.push(tokio::spawn(async move {
            let mut c = client;
            let mut report = WriterReport { acked: Vec::new(), failed: 0 };
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let key = format!("w/{w:02}/{n:08}");
                let value = format!("value-{w}-{n}");
                n += 1;
                let put = c.put(key.as_str(), value.as_str(), None);
                match tokio::time::timeout(Duration::from_secs(5), put).await {
                    Ok(Ok(resp)) => {
                        let rev = resp.header().expect("put header").revision();
                        report.acked.push((key, value, rev));
                        acked_so_far.fetch_add(1, Ordering::SeqCst);
                    }
                    _ => {
                        report.failed += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            report
        }));
    }

    let started = Instant::now();
    while acked_so_far.load(Ordering::SeqCst) < ACKED_BEFORE_KILL {
        assert!(started.elapsed() < Duration::from_secs(120), "writers made no progress");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let kill_at = started.elapsed();
    tokio::task::block_in_place(|| server.kill_9());
    // let every writer see its in-flight put fail
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    let WriterReport { acked, failed } = gather(writers).await;
    eprintln!(
        "kill -9 under load after {kill_at:?}: {} puts acknowledged by {WRITERS} writers, {failed} failed after the kill",
        acked.len()
    );
    assert!(acked.len() as u64 >= ACKED_BEFORE_KILL);
    assert!(failed >= WRITERS, "writers kept writing after the kill");

    tokio::task::block_in_place(|| server.restart());
    let mut c = server.client().await;
    let rev = current_revision(&mut c).await;
    let kvs = all_with_prefix(&mut c, "w/").await;
    let stored: HashMap<String, &KeyValue> = kvs.iter().map(|kv| (s(kv.key()), kv)).collect();

    let max_acked = acked.iter().map(|a| a.2).max().unwrap();
    assert!(rev >= max_acked, "store revision {rev} < max acknowledged {max_acked}");
    let mut acked_revs = HashSet::new();
    for (key, value, ack_rev) in &acked {
        assert!(acked_revs.insert(*ack_rev), "revision {ack_rev} acknowledged twice");
        let kv = stored.get(key).unwrap_or_else(|| panic!("acknowledged key {key} (revision {ack_rev}) lost"));
        assert_eq!(s(kv.value()), *value, "value of {key}");
        assert_eq!(
            (kv.mod_revision(), kv.create_revision(), kv.version()),
            (*ack_rev, *ack_rev, 1),
            "revisions of {key}"
        );
    }
    // every put wrote a new key, so the keys' revisions are exactly 2..=rev, each once
    let mut revs: Vec<i64> = kvs.iter().map(|kv| kv.mod_revision()).collect();
    revs.sort_unstable();
    let expected: Vec<i64> = (2..=rev).collect();
    assert!(
        revs == expected,
        "mod revisions of the {} stored keys are not exactly 2..={rev} (duplicates or holes)",
        kvs.len()
    );
    eprintln!(
        "after restart: revision {rev}, {} keys stored ({} acknowledged, {} written but unacknowledged)",
        kvs.len(),
        acked.len(),
        kvs.len() - acked.len()
    );

    // and the store keeps going at the next revision
    let r = c.put("after", "crash", None).await.expect("put after restart");
    assert_eq!(r.header().unwrap().revision(), rev + 1);
}

// ---------------------------------------------------------------------------
// graceful restart
// ---------------------------------------------------------------------------

type Meta = (String, i64, i64, i64);

fn metas(kvs: &[KeyValue]) -> BTreeMap<String, Meta> {
    kvs.iter().map(|kv| (s(kv.key()), (s(kv.value()), kv.create_revision(), kv.mod_revision(), kv.version()))).collect()
}

#[tokio::test]
async fn clean_restart_keeps_data_and_revisions() {
    let mut server = Server::start(Kind::under_test());
    let mut c = server.client().await;
    // revisions 2, 3, 4, 5
    for (k, v) in [("k/a", "1"), ("k/a", "2"), ("k/b", "1"), ("k/c", "1")] {
        c.put(k, v, None).await.unwrap();
    }
    c.delete("k/c", None).await.unwrap(); // 6
    c.put("k/d", "1", None).await.unwrap(); // 7
    c.put("k/a", "3", None).await.unwrap(); // 8
    c.put("k/c", "again", None).await.unwrap(); // 9
    let nothing = c.delete("x", None).await.unwrap();
    assert_eq!(nothing.header().unwrap().revision(), 9);
    c.compact(7, None).await.unwrap();

    let before = metas(&all_with_prefix(&mut c, "k/").await);
    assert_eq!(current_revision(&mut c).await, 9);
    let at7_before = metas(c.get("k/", Some(GetOptions::new().with_prefix().with_revision(7))).await.unwrap().kvs());

    drop(c);
    sigterm_and_wait(&server).await;
    server.restart();
    let mut c = server.client().await;

    assert_eq!(current_revision(&mut c).await, 9, "revision after restart");
    let after = metas(&all_with_prefix(&mut c, "k/").await);
    assert_eq!(after, before, "data after restart");
    let m = |v: &str, c: i64, m: i64, ver: i64| (v.to_string(), c, m, ver);
    assert_eq!(after["k/a"], m("3", 2, 8, 3));
    assert_eq!(after["k/b"], m("1", 4, 4, 1));
    assert_eq!(after["k/c"], m("again", 9, 9, 1));
    assert_eq!(after["k/d"], m("1", 7, 7, 1));

    // the compaction survived: below it refused, at it the same view as before
    assert_status(c.get("k/a", Some(GetOptions::new().with_revision(6))).await, Code::OutOfRange, COMPACTED);
    assert_status(c.compact(7, None).await, Code::OutOfRange, COMPACTED);
    let at7 = c.get("k/", Some(GetOptions::new().with_prefix().with_revision(7))).await.unwrap();
    assert_eq!(metas(at7.kvs()), at7_before);
    assert_eq!(at7_before.keys().collect::<Vec<_>>(), ["k/a", "k/b", "k/d"], "k/c was deleted at 6");
    // history above the compaction is still readable
    let at8 = c.get("k/a", Some(GetOptions::new().with_revision(8))).await.unwrap();
    assert_eq!(s(at8.kvs()[0].value()), "3");

    // new writes continue at the next revision, versions continue too
    let r = c.put("k/a", "4", None).await.unwrap();
    assert_eq!(r.header().unwrap().revision(), 10);
    let r = c.put("k/e", "1", None).await.unwrap();
    assert_eq!(r.header().unwrap().revision(), 11);
    let a = c.get("k/a", None).await.unwrap();
    assert_eq!(metas(a.kvs())["k/a"], m("4", 2, 10, 4), "k/a after a post-restart put");
    c.compact(10, None).await.unwrap();
    assert_status(c.get("k/a", Some(GetOptions::new().with_revision(9))).await, Code::OutOfRange, COMPACTED);
}

/// A graceful stop must not wait for long-lived streams to end on their own: etcd 3.4 ends open
/// watch streams and exits within milliseconds of SIGTERM.
#[tokio::test]
async fn sigterm_with_an_open_watch_stream_exits_promptly() {
    let mut server = Server::start(Kind::under_test());
    let mut c = server.client().await;
    c.put("w", "1", None).await.unwrap();
    let mut watch = c.watch("w", None).await.expect("watch");
    let created = watch.message().await.expect("watch created").expect("a response");
    assert!(created.created());
    let (ended_tx, ended_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        while let Ok(Some(_)) = watch.message().await {}
        let _ = ended_tx.send(());
    });

    let started = Instant::now();
    sigterm_and_wait(&server).await;
    eprintln!("exited {:.1?} after SIGTERM with a watch open", started.elapsed());
    tokio::time::timeout(Duration::from_secs(5), ended_rx)
        .await
        .expect("the watch stream ends when the server stops")
        .expect("watch task");

    drop(c);
    server.restart();
    let mut c = server.client().await;
    let kv = c.get("w", None).await.unwrap();
    assert_eq!(s(kv.kvs()[0].value()), "1");
    assert_eq!(current_revision(&mut c).await, 2);
}

// ---------------------------------------------------------------------------
// restart after a raft snapshot
// ---------------------------------------------------------------------------

/// More puts (one raft log entry each) than the `--snapshot-count` the server runs with, so a
/// snapshot is built and the log is purged behind it before the restart.
const SNAPSHOT_COUNT: &str = "400";
const SNAPSHOT_PUTS: usize = 1_000;
const SNAPSHOT_WRITERS: usize = 16;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restart_after_a_raft_snapshot_keeps_all_data() {
    let mut server = Server::start_with(Kind::under_test(), &["--snapshot-count", SNAPSHOT_COUNT]);
    let client = server.client().await;
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut writers = Vec::new();
    for _ in 0..SNAPSHOT_WRITERS {
        let mut c = client.clone();
        let next = next.clone();
        writers.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= SNAPSHOT_PUTS {
                    break;
                }
                let key = format!("s/{i:05}");
                let resp =
                    c.put(key.as_str(), format!("v{i}"), None).await.unwrap_or_else(|e| panic!("put {key}: {e}"));
                acked.push((i, resp.header().unwrap().revision()));
            }
            acked
        }));
    }
    let mut rev_of = vec![0i64; SNAPSHOT_PUTS];
    for w in writers {
        for (i, rev) in w.await.expect("writer task") {
            rev_of[i] = rev;
        }
    }
    eprintln!("{SNAPSHOT_PUTS} puts with {SNAPSHOT_WRITERS} writers took {:.1?}", started.elapsed());
    let last_rev = SNAPSHOT_PUTS as i64 + 1;
    let mut c = client;
    assert_eq!(current_revision(&mut c).await, last_rev);

    if server.kind == Kind::Keyward {
        // the snapshot is built in the background once --snapshot-count logs are applied
        let deadline = Instant::now() + Duration::from_secs(20);
        while !has_snapshot_file(&server.data_dir()) {
            assert!(
                Instant::now() < deadline,
                "no raft snapshot (*.snap) under {} after {SNAPSHOT_PUTS} puts",
                server.data_dir().display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    drop(c);
    tokio::task::block_in_place(|| server.restart());
    let mut c = server.client().await;
    assert_eq!(current_revision(&mut c).await, last_rev, "revision after restart");
    let count = c.get("s/", Some(GetOptions::new().with_prefix().with_count_only())).await.unwrap().count();
    assert_eq!(count, SNAPSHOT_PUTS as i64);
    let kvs = all_with_prefix(&mut c, "s/").await;
    assert_eq!(kvs.len(), SNAPSHOT_PUTS);
    for (i, kv) in kvs.iter().enumerate() {
        assert_eq!(s(kv.key()), format!("s/{i:05}"));
        assert_eq!(s(kv.value()), format!("v{i}"), "value of s/{i:05}");
        assert_eq!(
            (kv.create_revision(), kv.mod_revision(), kv.version()),
            (rev_of[i], rev_of[i], 1),
            "revisions of s/{i:05}"
        );
    }
    // history is still there, from before the snapshot as well as after it
    for i in [0, 1, SNAPSHOT_PUTS / 2, SNAPSHOT_PUTS - 1] {
        let key = format!("s/{i:05}");
        let at = |r: i64| Some(GetOptions::new().with_prefix().with_revision(r).with_count_only());
        let r = c.get("s/", at(rev_of[i])).await.unwrap();
        assert_eq!(r.count(), rev_of[i] - 1, "keys at revision {}", rev_of[i]);
        let r = c.get(key.as_str(), Some(GetOptions::new().with_revision(rev_of[i] - 1))).await.unwrap();
        assert!(r.kvs().is_empty(), "{key} before its put");
    }
    let r = c.put("after", "snapshot", None).await.unwrap();
    assert_eq!(r.header().unwrap().revision(), last_rev + 1);
}

// ---------------------------------------------------------------------------
// an operating-system crash: the unsynced kv environment is rebuilt
// ---------------------------------------------------------------------------

/// Puts `keys` keys `{prefix}{i:05}` with 8 writers; returns each key's revision.
async fn put_many(client: &Client, prefix: &str, keys: usize) -> BTreeMap<String, i64> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut writers = Vec::new();
    for _ in 0..8 {
        let (mut c, next, prefix) = (client.clone(), next.clone(), prefix.to_string());
        writers.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= keys {
                    return acked;
                }
                let key = format!("{prefix}{i:05}");
                let resp =
                    c.put(key.as_str(), format!("v{i}"), None).await.unwrap_or_else(|e| panic!("put {key}: {e}"));
                acked.push((key, resp.header().unwrap().revision()));
            }
        }));
    }
    let mut revisions = BTreeMap::new();
    for writer in writers {
        revisions.extend(writer.await.expect("writer"));
    }
    revisions
}

/// The kv environment commits without syncing (`raft/unsynced.rs`). After `kill -9` under the same
/// kernel its writes are in the page cache and it is used as it is; after an operating-system crash —
/// simulated here: the marker names another boot, and the environment's file is torn — it is rebuilt
/// from the current snapshot and the raft log, and every acknowledged write is there with its revision.
/// A clean stop syncs it and removes the marker.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_an_os_crash_the_kv_environment_is_rebuilt_from_the_snapshot_and_the_log() {
    if common::selftest() {
        return; // keyward's own files
    }
    let mut server = Server::start_with(Kind::Keyward, &["--snapshot-count", "1000"]);
    let client = server.client().await;
    let mut revisions = put_many(&client, "a/", 2500).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !has_snapshot_file(&server.data_dir()) {
        assert!(Instant::now() < deadline, "no raft snapshot after 2500 puts");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    revisions.extend(put_many(&client, "b/", 300).await); // after the snapshot: in the log only
    drop(client);
    let member = server.data_dir().join("member");
    let marker = member.join("kv.unsynced");
    assert!(marker.exists(), "a running member has its marker");

    // kill -9, same kernel: used as it is.
    tokio::task::block_in_place(|| server.restart());
    check_at(&server, &revisions).await;
    assert!(!server.log_tail(400).contains("rebuilding the kv environment"), "{}", server.log_tail(40));
    assert!(server.log_tail(400).contains("under this same kernel"));

    // kill -9, then as if the machine crashed: another boot in the marker, a torn file.
    server.kill_9();
    std::fs::write(&marker, "00000000-another-boot").unwrap();
    let data = member.join("kv").join("data.mdb");
    let len = std::fs::metadata(&data).unwrap().len();
    let torn = std::fs::OpenOptions::new().write(true).open(&data).unwrap();
    torn.set_len(len / 2).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&torn, &vec![0xA5; 64 * 1024], 0).unwrap();
    drop(torn);
    tokio::task::block_in_place(|| server.restart());
    assert!(server.log_tail(400).contains("rebuilding the kv environment"), "{}", server.log_tail(40));
    check_at(&server, &revisions).await;
    let mut c = server.client().await;
    let after = c.put("after", "rebuild", None).await.unwrap().header().unwrap().revision();
    assert_eq!(after, revisions.values().max().unwrap() + 1, "the next revision follows the last acknowledged one");

    // A clean stop syncs the environment and removes the marker.
    sigterm_and_wait(&server).await;
    assert!(!marker.exists(), "no marker after a clean stop");
}

/// Every `a/` and `b/` key on `server`, with its mod revision, equals `revisions`.
async fn check_at(server: &Server, revisions: &BTreeMap<String, i64>) {
    let mut c = server.client().await;
    let got: BTreeMap<String, i64> = [all_with_prefix(&mut c, "a/").await, all_with_prefix(&mut c, "b/").await]
        .concat()
        .into_iter()
        .map(|kv| (s(kv.key()), kv.mod_revision()))
        .collect();
    assert_eq!(got.len(), revisions.len(), "every acknowledged key");
    assert_eq!(&got, revisions, "each with the revision it was acknowledged at");
}

// ---------------------------------------------------------------------------
// a power loss: what was not synced is gone (tests/it/common/faultfs.rs)
// ---------------------------------------------------------------------------

/// A temp dir with an empty faultfs mounted at `<dir>/data` (the harness's data dir), or `None`
/// (with one line saying why) where FUSE is not available.
fn faultfs_dir(test: &str) -> Option<(tempfile::TempDir, FaultFs)> {
    let dir = tempfile::Builder::new().prefix("harness-keyward-faultfs-").tempdir().expect("temp dir");
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    match FaultFs::mount(&data) {
        Ok(fs) => Some((dir, fs)),
        Err(why) => {
            eprintln!("{test}: skipped, FUSE is not available: {why}");
            None
        }
    }
}

/// The file system the power-loss test stands on: synced data and synced names survive, nothing
/// else does; mmap reads see writes at once (LMDB reads its file through an mmap and writes it with
/// `pwrite`); `flock` works (the data dir lock).
#[test]
#[allow(unsafe_code)] // reads a file through mmap, as LMDB does (the SAFETY comments below)
fn faultfs_keeps_what_was_synced_and_nothing_else() {
    use std::os::unix::fs::FileExt;
    let Some((dir, fs)) = faultfs_dir("faultfs_keeps_what_was_synced_and_nothing_else") else { return };
    let root = fs.mountpoint().to_path_buf();
    let sync_dir = |d: &Path| std::fs::File::open(d).unwrap().sync_all().unwrap();
    let open_rw = |p: &Path| std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(p);

    // a file synced and named durably, then written again without a sync
    let kept = open_rw(&root.join("kept")).unwrap();
    kept.write_all_at(b"synced", 0).unwrap();
    kept.sync_data().unwrap();
    std::fs::create_dir(root.join("dir")).unwrap();
    std::fs::write(root.join("old-name"), b"renamed later").unwrap();
    std::fs::File::open(root.join("old-name")).unwrap().sync_all().unwrap();
    std::fs::write(root.join("unlinked"), b"unlinked later").unwrap();
    std::fs::File::open(root.join("unlinked")).unwrap().sync_all().unwrap();
    sync_dir(&root);
    kept.write_all_at(b"UNSYNCED and longer", 0).unwrap();
    // names changed after the last sync of their directory
    std::fs::rename(root.join("old-name"), root.join("new-name")).unwrap();
    std::fs::remove_file(root.join("unlinked")).unwrap();
    std::fs::write(root.join("never-named"), b"the file is synced, its directory is not").unwrap();
    std::fs::File::open(root.join("never-named")).unwrap().sync_all().unwrap();
    std::fs::create_dir(root.join("new-dir")).unwrap();
    std::fs::write(root.join("new-dir/inside"), b"x").unwrap();
    sync_dir(&root.join("new-dir")); // not its parent: the directory itself is not named durably

    // preallocation is sparse and cheap; a truncation and extension reads zeros
    let ballast = open_rw(&root.join("dir/ballast")).unwrap();
    rustix::fs::fallocate(&ballast, rustix::fs::FallocateFlags::empty(), 0, 64 << 20).unwrap();
    rustix::fs::fallocate(&ballast, rustix::fs::FallocateFlags::KEEP_SIZE, 0, 128 << 20).unwrap();
    ballast.write_all_at(&[7; 10_000], (64 << 20) - 5_000).unwrap();
    ballast.set_len((64 << 20) - 4_000).unwrap();
    ballast.set_len(64 << 20).unwrap();
    let mut tail = vec![0; 10_000];
    ballast.read_exact_at(&mut tail, (64 << 20) - 10_000).unwrap();
    assert!(tail[..5_000].iter().all(|&b| b == 0) && tail[5_000..6_000].iter().all(|&b| b == 7));
    assert!(tail[6_000..].iter().all(|&b| b == 0), "truncated bytes come back as zeros");
    ballast.sync_all().unwrap();
    assert!(free_bytes(&root) > 1 << 30, "statfs reports room");
    sync_dir(&root.join("dir"));

    // mmap reads see pwrite at once, whole pages and parts of pages
    let mapped = open_rw(&root.join("dir/mapped")).unwrap();
    mapped.set_len(64 << 10).unwrap();
    let len = 64 << 10;
    // SAFETY: a fresh read-only shared mapping of a file this test owns, unmapped below.
    let map = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            rustix::mm::ProtFlags::READ,
            rustix::mm::MapFlags::SHARED,
            &mapped,
            0,
        )
        .unwrap()
    };
    // SAFETY: `len` mapped bytes, read only while mapped.
    let view = || unsafe { std::slice::from_raw_parts(map as *const u8, len) }.to_vec();
    assert!(view().iter().all(|&b| b == 0));
    mapped.write_all_at(&[1; 8192], 4096).unwrap();
    assert_eq!(&view()[4096..12288], &[1; 8192][..]);
    mapped.write_all_at(&[2; 100], 5000).unwrap();
    let v = view();
    assert!(v[4096..5000].iter().all(|&b| b == 1) && v[5000..5100].iter().all(|&b| b == 2) && v[5100] == 1);
    // SAFETY: the mapping made above, no longer used.
    unsafe { rustix::mm::munmap(map, len).unwrap() };

    // flock: the kernel keeps it (a second open file description conflicts)
    let lock_a = open_rw(&root.join("lock")).unwrap();
    let lock_b = open_rw(&root.join("lock")).unwrap();
    rustix::fs::flock(&lock_a, rustix::fs::FlockOperation::NonBlockingLockExclusive).unwrap();
    assert_eq!(
        rustix::fs::flock(&lock_b, rustix::fs::FlockOperation::NonBlockingLockExclusive),
        Err(rustix::io::Errno::WOULDBLOCK)
    );

    // a listing survives removals while it is read
    for i in 0..300 {
        std::fs::write(root.join(format!("dir/f{i:03}")), b"").unwrap();
    }
    let mut listed = 0;
    for entry in std::fs::read_dir(root.join("dir")).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name().to_string_lossy().starts_with('f') {
            std::fs::remove_file(entry.path()).unwrap();
            listed += 1;
        }
    }
    assert_eq!(listed, 300);

    drop((kept, ballast, mapped, lock_a, lock_b));
    let report = fs.power_loss(Loss::Clean).expect("power loss");
    eprintln!("{report:?}");
    let image = dir.path().join("data");
    assert_eq!(std::fs::read(image.join("kept")).unwrap(), b"synced", "only the synced bytes and size");
    assert_eq!(std::fs::read(image.join("old-name")).unwrap(), b"renamed later", "the rename was not synced");
    assert!(!image.join("new-name").exists());
    assert_eq!(std::fs::read(image.join("unlinked")).unwrap(), b"unlinked later", "the unlink was not synced");
    assert!(!image.join("never-named").exists(), "a synced file whose name was not");
    assert!(!image.join("new-dir").exists(), "a directory whose parent was not synced");
    assert!(!image.join("lock").exists());
    let ballast = std::fs::metadata(image.join("dir/ballast")).unwrap();
    assert_eq!(ballast.len(), 64 << 20);
    assert!(std::os::unix::fs::MetadataExt::blocks(&ballast) * 512 <= 64 << 10, "written sparse: only its one page");
    assert!(!image.join("dir/mapped").exists());
    let mut lost = report.lost_paths.clone();
    lost.sort();
    assert_eq!(lost, ["/dir/mapped", "/lock", "/never-named", "/new-dir", "/new-name"]);
    assert_eq!(report.revived_paths, ["/old-name", "/unlinked"]);
    assert_no_mount(&image);
}

/// Torn: the pages written since the last sync are each kept or lost, as the seed says.
#[test]
fn faultfs_torn_power_loss_keeps_some_unsynced_pages() {
    use std::os::unix::fs::FileExt;
    let image = |seed: u64| {
        let (dir, fs) = faultfs_dir("faultfs_torn_power_loss_keeps_some_unsynced_pages")?;
        let path = fs.mountpoint().join("f");
        let file = std::fs::File::create(&path).unwrap();
        file.write_all_at(&[1; 64 * 4096], 0).unwrap();
        file.sync_data().unwrap();
        std::fs::File::open(fs.mountpoint()).unwrap().sync_all().unwrap();
        file.write_all_at(&[2; 64 * 4096], 0).unwrap();
        drop(file);
        let report = fs.power_loss(Loss::Torn { seed }).unwrap();
        assert_eq!(report.unsynced_pages_kept + report.unsynced_pages_lost, 64);
        let bytes = std::fs::read(dir.path().join("data/f")).unwrap();
        let pages: Vec<u8> = bytes.chunks(4096).map(|p| p[0]).collect();
        assert!(bytes.chunks(4096).all(|p| p.iter().all(|&b| b == p[0])), "whole pages");
        assert_eq!(pages.iter().filter(|&&b| b == 2).count(), report.unsynced_pages_kept);
        Some(pages)
    };
    let Some(a) = image(7) else { return };
    let kept = a.iter().filter(|&&b| b == 2).count();
    assert!(kept > 0 && kept < 64, "{kept} of 64 unsynced pages kept");
    assert_eq!(image(7).unwrap(), a, "the same seed, the same image");
    assert_ne!(image(8).unwrap(), a, "another seed, another image");
}

fn free_bytes(dir: &Path) -> u64 {
    let stat = rustix::fs::statvfs(dir).unwrap();
    stat.f_bavail * stat.f_frsize
}

/// `path` is not (or no longer) a mount point.
fn assert_no_mount(path: &Path) {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let path = path.canonicalize().unwrap();
    assert!(
        !mounts.lines().any(|l| l.split(' ').nth(4) == Some(path.to_str().unwrap())),
        "{} is still mounted",
        path.display()
    );
}

/// Writers of the power-loss test.
const POWER_LOSS_WRITERS: usize = 8;
/// Raft snapshots every this many requests, with as many log entries kept behind each. Puts share
/// log entries (group commit: 2,600 puts of 8 writers were about 1,100 entries), so a count of 1,000
/// would take more than 5,000 puts to purge any log; at 250 the log is purged long before the power
/// loss, and some acknowledged puts are in the log only, after the newest snapshot.
const POWER_LOSS_SNAPSHOT_COUNT: &str = "250";
/// Acknowledged puts before the power goes out.
const POWER_LOSS_PUTS: u64 = 2_600;
/// The torn power losses the test goes through, one fresh member each.
const POWER_LOSS_SEEDS: [u64; 3] = [0x5eed_0001, 0x5eed_0002, 0x5eed_0003];

/// The value every power-loss put writes at `key`: a put that comes back must carry its own.
fn power_loss_value(key: &str) -> String {
    format!("value of {key}")
}

/// The kv environment is not synced (`raft/unsynced.rs`), the raft log and the snapshot are. On a
/// file system that loses everything unsynced at a power loss (`common/faultfs.rs`), the power goes
/// out in the middle of a concurrent write load, during a sync (mostly the raft log's `fdatasync`),
/// with the pages being synced torn (any of them may be on the disk or not) and unsynced directory
/// changes lost. The member comes back with every acknowledged put at its acknowledged revision,
/// the kv environment rebuilt from the snapshot and the log after it; puts in flight at the crash
/// may be there or not, and no revision is reused for anything else.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_puts_survive_power_loss() {
    if common::selftest() {
        return; // keyward's own files
    }
    for seed in POWER_LOSS_SEEDS {
        if !power_loss_round(seed).await {
            return; // no FUSE here
        }
    }
}

/// One member, one power loss with `seed`; false if FUSE is not available.
async fn power_loss_round(seed: u64) -> bool {
    let Some((dir, fs)) = faultfs_dir("acknowledged_puts_survive_power_loss") else { return false };
    let started = Instant::now();
    let args = ["--snapshot-count", POWER_LOSS_SNAPSHOT_COUNT];
    let mut server = tokio::task::block_in_place(|| Server::start_in(Kind::Keyward, dir, &args));
    let stop = Arc::new(AtomicBool::new(false));
    let acked_so_far = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    for w in 0..POWER_LOSS_WRITERS {
        let (mut c, stop, acked_so_far) = (server.client().await, stop.clone(), acked_so_far.clone());
        writers.push(tokio::spawn(async move {
            let mut report = WriterReport { acked: Vec::new(), failed: 0 };
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let key = format!("p/{w:02}/{n:06}");
                n += 1;
                let value = power_loss_value(&key);
                match tokio::time::timeout(Duration::from_secs(5), c.put(key.as_str(), value.as_str(), None)).await {
                    Ok(Ok(resp)) => {
                        report.acked.push((key, value, resp.header().expect("put header").revision()));
                        acked_so_far.fetch_add(1, Ordering::SeqCst);
                    }
                    _ => {
                        report.failed += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            report
        }));
    }

    let data = server.data_dir();
    let mut acked_at_snapshot = None;
    while acked_so_far.load(Ordering::SeqCst) < POWER_LOSS_PUTS || acked_at_snapshot.is_none() {
        assert!(started.elapsed() < Duration::from_secs(60), "writers too slow\n{}", server.log_tail(20));
        if acked_at_snapshot.is_none() && has_snapshot_file(&data) {
            acked_at_snapshot = Some(acked_so_far.load(Ordering::SeqCst));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The power goes out during the next sync, with puts in flight: from then on the disk takes
    // nothing (the member is killed, as the machine would stop), and loses what was not synced.
    fs.stop_at_next_sync();
    while !fs.stopped() {
        assert!(started.elapsed() < Duration::from_secs(60), "no sync while writing\n{}", server.log_tail(20));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let at_kill = acked_so_far.load(Ordering::SeqCst);
    tokio::task::block_in_place(|| server.kill_9());
    let loss = tokio::task::block_in_place(|| fs.power_loss(Loss::Torn { seed })).expect("power loss");
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    let WriterReport { acked, failed } = gather(writers).await;
    eprintln!(
        "seed {seed:#x}: power loss after {:.1?}: {} puts acknowledged ({} by the time the first snapshot file \
         appeared, {at_kill} at the power loss), {failed} failed after; {loss:?}",
        started.elapsed(),
        acked.len(),
        acked_at_snapshot.unwrap_or(0),
    );
    assert!(failed >= POWER_LOSS_WRITERS, "writers kept writing after the kill");

    // A new boot: the kv environment's marker names another one (keyward compares it with the
    // running kernel's boot id).
    let marker = data.join("member").join("kv.unsynced");
    assert!(
        marker.exists(),
        "{} is not in the image the power loss left: a name on its path was never made durable (its directory \
         was not fsynced after the name was created); lost: {:?}",
        marker.display(),
        loss.lost_paths
    );
    std::fs::write(&marker, "00000000-another-boot").unwrap();
    let purged = last_purged_in(&data.join("member").join("wal"));
    assert!(purged > 0, "the raft log was never purged behind a snapshot: the test needs more puts");
    tokio::task::block_in_place(|| server.restart());
    assert!(server.log_tail(400).contains("rebuilding the kv environment"), "{}", server.log_tail(40));

    let mut c = server.client().await;
    let rev = current_revision(&mut c).await;
    let kvs = all_with_prefix(&mut c, "p/").await;
    let stored: HashMap<String, &KeyValue> = kvs.iter().map(|kv| (s(kv.key()), kv)).collect();
    let max_acked = acked.iter().map(|a| a.2).max().expect("acknowledged puts");
    let mut lost = Vec::new();
    for (key, value, ack_rev) in &acked {
        match stored.get(key) {
            None => lost.push(format!("{key}@{ack_rev}")),
            Some(kv) => {
                assert_eq!(s(kv.value()), *value, "value of {key}");
                assert_eq!(
                    (kv.mod_revision(), kv.create_revision(), kv.version()),
                    (*ack_rev, *ack_rev, 1),
                    "revisions of {key}, acknowledged at {ack_rev}"
                );
            }
        }
    }
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged puts lost by the power loss (store revision {rev}, newest acknowledged {max_acked}), \
         e.g. {:?}",
        lost.len(),
        acked.len(),
        &lost[..lost.len().min(10)]
    );
    // Puts in flight may have made it; each with its own value, and every revision once.
    for kv in &kvs {
        assert_eq!(s(kv.value()), power_loss_value(&s(kv.key())), "value at revision {}", kv.mod_revision());
    }
    let mut revs: Vec<i64> = kvs.iter().map(|kv| kv.mod_revision()).collect();
    revs.sort_unstable();
    assert!(revs == (2..=rev).collect::<Vec<i64>>(), "the {} keys' revisions are not exactly 2..={rev}", kvs.len());
    let next = c.put("after", "power loss", None).await.expect("put after the restart").header().unwrap().revision();
    assert_eq!(next, rev + 1);
    assert!(next > max_acked, "revision {next} after the restart, {max_acked} acknowledged before");
    eprintln!(
        "seed {seed:#x}: after the restart: revision {rev}, {} keys ({} acknowledged, {} in flight at the crash), \
         raft log purged up to index {purged} before the crash, {:.1?} in all",
        kvs.len(),
        acked.len(),
        kvs.len() - acked.len(),
        started.elapsed()
    );
    true
}

/// Building a snapshot does not sync the kv environment (`raft/state_machine/snapshot/build.rs`): the
/// snapshot file, synced and named durably, is what an operating-system crash recovers from, with the
/// log after it. On faultfs a member builds snapshots and purges its log behind them while its
/// `data.mdb` is never synced (syncing it at each snapshot, as before, fails here); then a power
/// loss keeps nothing unsynced, and every acknowledged put comes back at its revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn snapshots_never_sync_the_kv_environment_and_a_power_loss_recovers_from_them() {
    if common::selftest() {
        return; // keyward's own files
    }
    let test = "snapshots_never_sync_the_kv_environment_and_a_power_loss_recovers_from_them";
    let Some((dir, fs)) = faultfs_dir(test) else { return };
    let args = ["--snapshot-count", "100"];
    let mut server = tokio::task::block_in_place(|| Server::start_in(Kind::Keyward, dir, &args));
    let client = server.client().await;
    let mut revisions = put_many(&client, "a/", 1500).await;
    let data = server.data_dir();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !has_snapshot_file(&data) {
        assert!(Instant::now() < deadline, "no raft snapshot after 1500 puts");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    revisions.extend(put_many(&client, "b/", 100).await); // after the snapshot: in the log only
    drop(client);

    let member = Path::new("member");
    assert!(fs.file_syncs_of(&member.join("snap").join("current.snap")) >= 1, "the snapshot file is synced");
    assert_eq!(
        fs.file_syncs_of(&member.join("kv").join("data.mdb")),
        0,
        "the kv environment was synced while the member ran (a snapshot synced it?)"
    );
    tokio::task::block_in_place(|| server.kill_9());
    let loss = tokio::task::block_in_place(|| fs.power_loss(Loss::Clean)).expect("power loss");
    eprintln!("{test}: {loss:?}");
    std::fs::write(data.join("member").join("kv.unsynced"), "00000000-another-boot").unwrap();
    assert!(last_purged_in(&data.join("member").join("wal")) > 0, "the log was never purged behind a snapshot");
    tokio::task::block_in_place(|| server.restart());
    assert!(server.log_tail(400).contains("rebuilding the kv environment"), "{}", server.log_tail(40));
    check_at(&server, &revisions).await;
}

/// The last purged log index the raft log in `wal_dir` records (read from a copy: opening a log may
/// cut a torn tail, which is the restarted member's job).
fn last_purged_in(wal_dir: &Path) -> u64 {
    let copy = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(wal_dir).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), copy.path().join(entry.file_name())).unwrap();
    }
    keyward::raft_log_last_purged_index(copy.path()).expect("the raft log opens")
}
