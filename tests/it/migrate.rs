//! `keyward migrate`: a snapshot of a real etcd 3.4 (keys over several revisions, a compaction, a
//! deleted key, a lease with a key, users with passwords, a role with range and prefix grants, auth
//! enabled) migrated into a new keyward member that answers as that etcd did: the same `get` output
//! with revisions, an older revision, the compacted one refused, users logging in with their etcd
//! passwords and their permissions enforced (a denied read denied on both). Broken files are refused,
//! never a panic or a half-written data dir.

use std::path::Path;

use crate::common::etcd_errors::{AUTH_FAILED, COMPACTED, PERMISSION_DENIED};
use crate::common::restore::{
    comparable_get, keyward, leftovers, member_args, observations, ok, populate, same_status_as_etcdctl, strings,
    Flags, Member, ROOT,
};
use crate::common::{Kind, Output, Server};

fn migrate(file: &Path, me: &Flags, data_dir: &Path, extra: &[&str]) -> Output {
    let mut args = strings(&["migrate", "--etcd-snapshot", &file.display().to_string()]);
    args.extend(member_args(me, std::slice::from_ref(me), data_dir));
    args.extend(strings(extra));
    keyward(&args)
}

/// A snapshot of a populated etcd, as `etcdctl snapshot save` writes it, and what etcd answered.
fn etcd_snapshot(dir: &Path) -> (std::path::PathBuf, String, Vec<(String, bool, String)>) {
    let etcd = Server::start(Kind::Etcd);
    let lease = populate(&etcd);
    let file = dir.join("etcd.db");
    ok(etcd.etcdctl(&["--user", ROOT, "snapshot", "save", &file.display().to_string()]));
    let answers = observations(&|args| etcd.etcdctl(args), &lease);
    (file, lease, answers)
}

#[test]
fn migrated_etcd_snapshot_answers_as_that_etcd() {
    let tmp = tempfile::tempdir().unwrap();
    let (file, lease, before) = etcd_snapshot(tmp.path());
    // The expectations hold on etcd itself, so the comparison below compares something.
    assert!(before[0].2.contains("\"revision\":10"), "{:?}", before[0]);
    assert!(before[1].2.contains("\"mod_revision\":3"), "{:?}", before[1]);
    assert_eq!(before[2].2, format!("Error: {COMPACTED}"));
    assert_eq!(before[5].2, format!("Error: {PERMISSION_DENIED}"));
    assert_eq!(before[6].2, format!("Error: {PERMISSION_DENIED}"));
    assert_eq!(before[8].2, format!("Error: {AUTH_FAILED}"));
    assert!(before[13].2.contains("leased"), "{:?}", before[13]);

    same_status_as_etcdctl(&file);
    let me = Flags::new("migrated");
    let data_dir = tmp.path().join("migrated.keyward");
    let out = ok(migrate(&file, &me, &data_dir, &[]));
    assert!(out.stdout.contains("revision 10 (compacted 3)"), "{}", out.stdout);
    let mut member = Member::spawn(&me, std::slice::from_ref(&me), &data_dir, &tmp.path().join("member.log"));
    member.wait_ready(ROOT);
    let after = observations(&|args| member.etcdctl(args), &lease);
    assert_eq!(before, after, "left: etcd, right: the migrated keyward");

    // It goes on as a keyward member: writes after etcd's revision, the lease still expires by id.
    let put = ok(member.etcdctl(&["--user", "alice:alicepw", "put", "a", "4", "-w", "json"])).stdout;
    assert_eq!(comparable_get(&put)["header"]["revision"], 11, "{put}");
    ok(member.etcdctl(&["--user", ROOT, "lease", "revoke", &lease]));
    let gone = ok(member.etcdctl(&["--user", ROOT, "get", "leased", "-w", "json"])).stdout;
    assert_eq!(comparable_get(&gone)["kvs"], serde_json::Value::Null, "revoking the lease deleted its key: {gone}");
}

#[test]
fn a_snapshot_without_its_hash_needs_skip_hash_check() {
    let tmp = tempfile::tempdir().unwrap();
    let (file, _, before) = etcd_snapshot(tmp.path());
    let bytes = std::fs::read(&file).unwrap();
    let bare = tmp.path().join("bare.db");
    std::fs::write(&bare, &bytes[..bytes.len() - 32]).unwrap();
    let me = Flags::new("m");
    let data_dir = tmp.path().join("m.keyward");
    let out = migrate(&bare, &me, &data_dir, &[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stderr.contains("--skip-hash-check") && out.stderr.contains("bare.db"), "{}", out.stderr);
    assert!(!data_dir.exists());
    ok(migrate(&bare, &me, &data_dir, &["--skip-hash-check"]));
    let mut member = Member::spawn(&me, std::slice::from_ref(&me), &data_dir, &tmp.path().join("member.log"));
    member.wait_ready(ROOT);
    let got = ok(member.etcdctl(&["--user", ROOT, "get", "", "--from-key", "-w", "json"])).stdout;
    assert_eq!(comparable_get(&got).to_string(), before[0].2);
}

/// Every page of the file damaged in turn, and the file cut at many lengths: each run ends with a
/// data dir or with one error line (exit status 1) and nothing left behind; never a panic (status 101)
/// or a signal.
#[test]
fn damaged_etcd_files_give_an_error_never_a_panic_or_a_partial_data_dir() {
    let tmp = tempfile::tempdir().unwrap();
    let (file, _, _) = etcd_snapshot(tmp.path());
    let bytes = std::fs::read(&file).unwrap();
    let db = &bytes[..bytes.len() - 32];
    let me = Flags::new("d");
    let data_dir = tmp.path().join("d.keyward");
    let flipped = {
        let mut b = bytes.clone();
        b[4096 * 3 + 100] ^= 0xff;
        tmp.path().join("flipped.db").tap_write(&b)
    };
    let out = migrate(&flipped, &me, &data_dir, &[]);
    assert!(out.stderr.contains("expected sha256"), "{out:?}");
    let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
    for page in 0..db.len() / 4096 {
        for at in [0, 8, 10, 12, 16, 40, 100, 2000, 4000] {
            let mut b = db.to_vec();
            b[page * 4096 + at] ^= 0xa5;
            cases.push((format!("page {page} byte {at} flipped"), b));
        }
    }
    let mut must_refuse = Vec::new();
    for len in [0, 10, 100, 4096, 8192, 8200, db.len() / 2, db.len() - 4096, db.len() - 1] {
        must_refuse.push(format!("cut at {len}"));
        cases.push((format!("cut at {len}"), db[..len].to_vec()));
    }
    let mut both_metas = db.to_vec();
    both_metas[16] ^= 1;
    both_metas[4096 + 16] ^= 1;
    must_refuse.push("both meta pages damaged".to_string());
    cases.push(("both meta pages damaged".to_string(), both_metas));
    let mut refused = Vec::new();
    for (name, bytes) in &cases {
        let damaged = tmp.path().join("damaged.db").tap_write(bytes);
        let out = migrate(&damaged, &me, &data_dir, &["--skip-hash-check"]);
        match out.status.code() {
            Some(0) => {
                std::fs::remove_dir_all(&data_dir).unwrap();
            }
            Some(1) => {
                refused.push(name.clone());
                let message = out.stderr.trim();
                assert!(message.lines().count() == 1 && message.starts_with("keyward migrate: "), "{name}: {message}");
                assert_eq!(leftovers(tmp.path(), "d.keyward"), Vec::<String>::new(), "{name}");
            }
            _ => panic!("{name}: {out:?}"),
        }
    }
    // Without the digest, damage inside a value goes unnoticed (as with etcd); a file cut short or
    // without a valid meta page never passes.
    for name in &must_refuse {
        assert!(refused.contains(name), "{name} was accepted");
    }
    eprintln!("{} of {} damaged files refused", refused.len(), cases.len());
}

trait TapWrite {
    fn tap_write(self, bytes: &[u8]) -> Self;
}

impl TapWrite for std::path::PathBuf {
    fn tap_write(self, bytes: &[u8]) -> Self {
        std::fs::write(&self, bytes).unwrap();
        self
    }
}

/// A store large enough for bbolt's branch pages (thousands of revisions), overflow pages (values
/// larger than a page) and long keys: every key, every older version still readable, equal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_etcd_store_with_branch_and_overflow_pages_migrates_whole() {
    use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
    let tmp = tempfile::tempdir().unwrap();
    let etcd = Server::start(Kind::Etcd);
    let mut client = etcd.client().await;
    for batch in 0..60 {
        // Several puts per revision (a txn), as a workload of txns has.
        let ops: Vec<TxnOp> =
            (0..50).map(|i| TxnOp::put(format!("k/{batch:03}/{i:03}"), vec![b'v'; 100 + i], None)).collect();
        client.txn(Txn::new().when(Vec::<Compare>::new()).and_then(ops)).await.unwrap();
    }
    for i in 0..20 {
        client.put(format!("big/{i}"), vec![i as u8; 20_000], None).await.unwrap();
        client.put(format!("{}/{i}", "L".repeat(3000)), "long key", None).await.unwrap();
    }
    for batch in (0..60).step_by(3) {
        client.delete(format!("k/{batch:03}/"), Some(etcd_client::DeleteOptions::new().with_prefix())).await.unwrap();
    }
    let middle = client.get("k", None).await.unwrap().header().unwrap().revision();
    for i in 0..500 {
        let key = format!("k/001/{:03}", i % 50);
        let cmp = Compare::version(key.clone(), CompareOp::Greater, 0);
        client.txn(Txn::new().when([cmp]).and_then([TxnOp::put(key, format!("again {i}"), None)])).await.unwrap();
    }
    client.compact(middle - 10, None).await.unwrap();
    let all = |rev: i64| GetOptions::new().with_from_key().with_revision(rev);
    let current = client.get("\0", Some(all(0))).await.unwrap();
    let at_middle = client.get("\0", Some(all(middle))).await.unwrap();
    let file = tmp.path().join("large.db");
    ok(etcd.etcdctl(&["snapshot", "save", &file.display().to_string()]));
    drop(etcd);

    same_status_as_etcdctl(&file);
    let me = Flags::new("large");
    let data_dir = tmp.path().join("large.keyward");
    ok(migrate(&file, &me, &data_dir, &[]));
    let mut member = Member::spawn(&me, std::slice::from_ref(&me), &data_dir, &tmp.path().join("member.log"));
    tokio::task::block_in_place(|| member.wait_ready(ROOT));
    let mut migrated = etcd_client::Client::connect([member.endpoint()], None).await.unwrap();
    let now = migrated.get("\0", Some(all(0))).await.unwrap();
    assert!(current.kvs().len() > 1000, "{}", current.kvs().len());
    assert_eq!(now.header().unwrap().revision(), current.header().unwrap().revision());
    assert_eq!(plain(now.kvs()), plain(current.kvs()), "current keys");
    let then = migrated.get("\0", Some(all(middle))).await.unwrap();
    assert_eq!(plain(then.kvs()), plain(at_middle.kvs()), "keys at revision {middle}");
    let compacted = migrated.get("\0", Some(all(middle - 11))).await.unwrap_err().to_string();
    assert!(compacted.contains(COMPACTED), "{compacted}");
}

/// Key, value, create and mod revision, version, lease.
type PlainKv = (Vec<u8>, Vec<u8>, i64, i64, i64, i64);

/// Each key-value as comparable fields.
fn plain(kvs: &[etcd_client::KeyValue]) -> Vec<PlainKv> {
    kvs.iter()
        .map(|kv| {
            (kv.key().to_vec(), kv.value().to_vec(), kv.create_revision(), kv.mod_revision(), kv.version(), kv.lease())
        })
        .collect()
}

/// An etcd lease keeps running on the migrated member: it expires there and its key is deleted at
/// the next revision (the key was there at the migrated revision, whatever the timing).
#[test]
fn an_etcd_lease_expires_on_the_migrated_member() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("lease.db");
    {
        let etcd = Server::start(Kind::Etcd);
        ok(etcd.etcdctl(&["put", "a", "1"]));
        let grant = ok(etcd.etcdctl(&["lease", "grant", "3"])).stdout;
        let lease = grant.split_whitespace().nth(1).unwrap().to_string();
        ok(etcd.etcdctl(&["put", "--lease", &lease, "short", "lived"]));
        ok(etcd.etcdctl(&["snapshot", "save", &file.display().to_string()]));
    }
    let me = Flags::new("lease");
    let data_dir = tmp.path().join("lease.keyward");
    ok(migrate(&file, &me, &data_dir, &[]));
    let mut member = Member::spawn(&me, std::slice::from_ref(&me), &data_dir, &tmp.path().join("member.log"));
    member.wait_ready(ROOT);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !ok(member.etcdctl(&["lease", "list"])).stdout.contains("found 0 leases") {
        assert!(std::time::Instant::now() < deadline, "the lease never expired:\n{}", member.log_text());
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let now = ok(member.etcdctl(&["get", "short", "-w", "json"])).stdout;
    let now = comparable_get(&now);
    assert_eq!(now["kvs"], serde_json::Value::Null, "{now}");
    assert_eq!(now["header"]["revision"], 4, "deleted by the expiry at the next revision: {now}");
    let then = ok(member.etcdctl(&["get", "short", "--rev", "3", "--print-value-only"])).stdout;
    assert_eq!(then.trim(), "lived");
}
