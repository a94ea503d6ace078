//! Defragment against etcd 3.4, the same commands on both: after deleting most of a large key space
//! and compacting, `etcdctl defrag` shrinks `endpoint status`'s dbSize, every remaining key answers
//! exactly as before (values, revisions), a writer and a reader running throughout never fail, a watch
//! opened before the defrag still delivers, and the member restarts on the defragmented file.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{self, Kind, Server};
use etcd_client::{Client, Txn, TxnOp, WatchOptions};

/// Keys written, their value size, and one key in `KEEP` survives the deletes: ~24 MB written,
/// ~2.4 MB kept.
const KEYS: usize = 2_400;
const VALUE_BYTES: usize = 10_000;
const KEEP: usize = 10;
/// Operations per txn (etcd's default `--max-txn-ops` is 128; 100 × 10 KB stays under 1.5 MiB).
const TXN_OPS: usize = 100;

fn key(i: usize) -> String {
    format!("big/{i:05}")
}

/// Fills the key space, deletes all but one key in `KEEP`, compacts (physically) at the current revision.
async fn fill_delete_compact(c: &mut Client) {
    let indices: Vec<usize> = (0..KEYS).collect();
    for chunk in indices.chunks(TXN_OPS) {
        let ops: Vec<TxnOp> =
            chunk.iter().map(|&i| TxnOp::put(key(i), vec![b'a' + (i % 26) as u8; VALUE_BYTES], None)).collect();
        c.txn(Txn::new().and_then(ops)).await.expect("fill txn");
    }
    let doomed: Vec<usize> = indices.into_iter().filter(|i| i % KEEP != 0).collect();
    for chunk in doomed.chunks(TXN_OPS) {
        let ops: Vec<TxnOp> = chunk.iter().map(|&i| TxnOp::delete(key(i), None)).collect();
        c.txn(Txn::new().and_then(ops)).await.expect("delete txn");
    }
    let rev = c.get("big/", None).await.expect("get").header().expect("header").revision();
    // Physical: the answer waits until the compacted versions are removed, on both servers (whose
    // removal runs in the background), so defrag then has their pages to give back.
    c.compact(rev, Some(etcd_client::CompactionOptions::new().with_physical())).await.expect("compact");
}

/// `endpoint status -w json`: (dbSize, dbSizeInUse when the server reports it).
fn db_size(server: &Server) -> (i64, Option<i64>) {
    let out = server.etcdctl(&["endpoint", "status", "-w", "json"]);
    assert!(out.success(), "endpoint status: {}{}", out.stdout, out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("status json");
    let status = &v[0]["Status"];
    (status["dbSize"].as_i64().expect("dbSize"), status["dbSizeInUse"].as_i64())
}

/// `GET /metrics` over HTTP/1.0: etcd answers HTTP/1.1 in chunks, which may split a line.
fn metrics_text(endpoint: &str) -> String {
    use std::io::{Read, Write};
    let mut tcp = std::net::TcpStream::connect(endpoint).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(tcp, "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut response = String::new();
    tcp.read_to_string(&mut response).expect("read /metrics");
    response.split_once("\r\n\r\n").map_or_else(String::new, |(_, body)| body.to_string())
}

/// `get big/ --prefix -w json` without the header: the kept keys with their revisions and values.
fn kept_keys(server: &Server) -> serde_json::Value {
    let out = server.etcdctl(&["get", "big/", "--prefix", "-w", "json"]);
    assert!(out.success(), "get: {}{}", out.stdout, out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("get json");
    assert_eq!(v["count"].as_u64(), Some((KEYS / KEEP) as u64), "kept keys");
    v["kvs"].clone()
}

/// A writer (put then get of its own key, one after the other) until `stop`; every failure recorded.
struct Load {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    failures: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Load {
    fn start(mut c: Client) -> Load {
        let (stop, done, failures) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)), Arc::default());
        let task = {
            let (stop, done, failures): (_, _, Arc<Mutex<Vec<String>>>) =
                (stop.clone(), done.clone(), Arc::clone(&failures));
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let (k, v) = (format!("live/{}", i % 64), format!("v{i}"));
                    match c.put(k.clone(), v.clone(), None).await {
                        Ok(_) => match c.get(k.clone(), None).await {
                            Ok(r) if r.kvs().first().map(|kv| kv.value()) == Some(v.as_bytes()) => {
                                done.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(r) => failures.lock().unwrap().push(format!("get {k}: {:?}", r.kvs())),
                            Err(e) => failures.lock().unwrap().push(format!("get {k}: {e}")),
                        },
                        Err(e) => failures.lock().unwrap().push(format!("put {k}: {e}")),
                    }
                    i += 1;
                }
            })
        };
        Load { stop, done, failures, task }
    }

    fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Waits until at least `more` further rounds succeeded (or 30 s passed).
    async fn wait_for(&self, more: u64) {
        let target = self.done() + more;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.done() < target && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn stop(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let done = self.done.clone();
        self.task.await.expect("load task");
        let failures = self.failures.lock().unwrap().clone();
        (done.load(Ordering::Relaxed), failures)
    }
}

/// What one server showed.
struct Observed {
    before: (i64, Option<i64>),
    after: (i64, Option<i64>),
    took: Duration,
    rounds_during: u64,
    rounds_total: u64,
}

/// The whole scenario on one server; returns what it measured.
async fn defragment_under_load(server: &mut Server) -> Observed {
    let label = server.kind.label();
    let mut c = server.client().await;
    fill_delete_compact(&mut c).await;
    let kept = kept_keys(server);
    let before = db_size(server);

    let mut watch = c.watch("watched/", Some(WatchOptions::new().with_prefix())).await.expect("watch");
    let created = watch.message().await.expect("watch stream").expect("created");
    assert!(created.created(), "{label}: {created:?}");

    let load = Load::start(server.client().await);
    load.wait_for(20).await;
    let at_start = load.done();
    let started = Instant::now();
    let defrag = {
        let endpoint = server.endpoint();
        tokio::task::spawn_blocking(move || common::etcdctl(&endpoint, &["--command-timeout=60s", "defrag"]))
            .await
            .unwrap()
    };
    let took = started.elapsed();
    let rounds_during = load.done() - at_start;
    assert!(defrag.success(), "{label}: defrag failed: {}{}", defrag.stdout, defrag.stderr);
    assert!(defrag.stdout.starts_with("Finished defragmenting etcd member["), "{label}: {}", defrag.stdout);
    load.wait_for(20).await;

    let after = db_size(server);
    let metrics = metrics_text(&server.endpoint());
    assert!(
        common::metric(&metrics, "etcd_disk_backend_defrag_duration_seconds_count") >= 1.0,
        "{label}: the defrag is timed"
    );
    assert_eq!(common::metric(&metrics, "etcd_disk_defrag_inflight"), 0.0, "{label}");
    assert_eq!(kept_keys(server), kept, "{label}: the kept keys, their revisions and values are unchanged");

    c.put("watched/after-defrag", "x", None).await.expect("put watched key");
    let event = tokio::time::timeout(Duration::from_secs(10), watch.message())
        .await
        .unwrap_or_else(|_| panic!("{label}: the watch opened before the defrag delivered nothing"))
        .expect("watch stream")
        .expect("watch response");
    let keys: Vec<&[u8]> = event.events().iter().filter_map(|e| e.kv().map(|kv| kv.key())).collect();
    assert_eq!(keys, [b"watched/after-defrag".as_slice()], "{label}: {event:?}");

    let (rounds_total, failures) = load.stop().await;
    assert!(failures.is_empty(), "{label}: requests failed around the defrag: {failures:?}");

    // The defragmented file is the member's database from now on.
    tokio::task::block_in_place(|| server.restart());
    assert_eq!(kept_keys(server), kept, "{label}: after a restart");
    let mut c = server.client().await;
    c.put("big/after-restart", "y", None).await.expect("put after restart");
    Observed { before, after, took, rounds_during, rounds_total }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn defrag_shrinks_the_file_keeps_every_key_and_serves_throughout() {
    let (mut etcd, mut keyward) = common::start_pair().await;
    let mut shown = Vec::new();
    for server in [&mut etcd, &mut keyward] {
        let seen = defragment_under_load(server).await;
        println!(
            "{}: dbSize {} -> {} bytes (in use {:?} -> {:?}), defrag took {:?}; load: {} rounds (put+get) during, {} \
             in all, none failed",
            server.kind.label(),
            seen.before.0,
            seen.after.0,
            seen.before.1,
            seen.after.1,
            seen.took,
            seen.rounds_during,
            seen.rounds_total
        );
        shown.push(seen);
    }
    for (seen, label) in shown.iter().zip(["etcd", "keyward"]) {
        let (before, after) = (seen.before.0, seen.after.0);
        assert!(after * 3 < before, "{label}: dbSize {before} -> {after}: the defrag gave back less than 2/3");
        if let (_, Some(in_use)) = seen.before {
            assert!(after <= in_use * 2, "{label}: the new file ({after}) is about what was in use ({in_use})");
        }
    }
    if keyward.kind == Kind::Keyward {
        let log = std::fs::read_to_string(keyward.log_path()).unwrap();
        assert!(log.contains("defragmented the kv database"), "keyward logs the defrag");
        let leftovers: Vec<_> = std::fs::read_dir(keyward.data_dir().join("member/kv"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name != "data.mdb" && name != "lock.mdb")
            .collect();
        assert!(leftovers.is_empty(), "nothing but LMDB's two files in kv/: {leftovers:?}");
    }
}

/// With auth on, only root defragments (etcd's `authMaintenanceServer`), and a refused defrag changes
/// nothing; root's goes through.
#[test]
fn with_auth_on_only_root_defragments() {
    let (etcd, keyward) = common::start_pair_blocking(&[]);
    let mut outputs = Vec::new();
    for server in [&etcd, &keyward] {
        for args in [
            &["user", "add", "root:rootpw"][..],
            &["user", "grant-role", "root", "root"],
            &["user", "add", "alice:alicepw"],
            &["auth", "enable"],
        ] {
            let out = server.etcdctl(args);
            assert!(out.success(), "{:?}: {}{}", args, out.stdout, out.stderr);
        }
        let refused = server.etcdctl(&["--user", "alice:alicepw", "defrag"]);
        let anonymous = server.etcdctl(&["defrag"]);
        let root = server.etcdctl(&["--user", "root:rootpw", "defrag"]);
        let mask = |s: &str| common::normalize(&s.replace(&server.endpoint(), "<EP>"));
        outputs.push((
            (refused.success(), mask(&refused.stderr)),
            (anonymous.success(), mask(&anonymous.stderr)),
            (root.success(), mask(&root.stdout)),
        ));
    }
    assert_eq!(outputs[0], outputs[1], "left etcd, right keyward");
    assert!(!(outputs[1].0).0 && (outputs[1].2).0, "{:?}", outputs[1]);
}
