//! Backups in etcd's format, with etcd 3.4.23's own tools: `etcdctl snapshot save` from a keyward
//! member, `etcdctl snapshot status` of it (the same as `keyward snapshot status`, at keyward's
//! revision), `etcdctl snapshot restore` into a real etcd that answers as keyward did (keys with
//! their revisions and history, the compaction, the lease and its key, users logging in with their
//! passwords, roles and their grants enforced, auth enabled); that etcd's own backup restored by
//! `keyward snapshot restore` into a keyward member that answers the same again. A backup in
//! keyward's older format (an LMDB copy) still restores. Hostile files (a valid digest over damaged
//! pages) are refused with one error line, no panic, no data dir.
//!
//! Each would fail with the LMDB stream the Snapshot RPC sent before: `etcdctl snapshot status`
//! refused it ("invalid database").

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::common::etcd_errors::{AUTH_FAILED, COMPACTED, PERMISSION_DENIED};
use crate::common::restore::{
    keyward, leftovers, member_args, observations, ok, populate, same_status_as_etcdctl, strings, Flags, Member, ROOT,
};
use crate::common::{self, Kind, Output, Server};

fn etcdctl_restore(file: &Path, me: &Flags, data_dir: &Path) -> Output {
    let mut args = vec!["snapshot".to_string(), "restore".into(), file.display().to_string()];
    args.extend(member_args(me, std::slice::from_ref(me), data_dir));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    common::etcdctl("127.0.0.1:1", &args)
}

fn keyward_restore(file: &Path, me: &Flags, data_dir: &Path, extra: &[&str]) -> Output {
    let mut args = strings(&["snapshot", "restore", &file.display().to_string()]);
    args.extend(member_args(me, std::slice::from_ref(me), data_dir));
    args.extend(strings(extra));
    keyward(&args)
}

fn status_json(file: &Path) -> serde_json::Value {
    let out = ok(common::etcdctl("127.0.0.1:1", &["snapshot", "status", &file.display().to_string(), "-w", "json"]));
    serde_json::from_str(out.stdout.trim()).unwrap()
}

#[test]
fn keyward_backup_restored_by_etcdctl_serves_on_etcd_as_keyward_did_and_back() {
    let source = Server::start(Kind::Keyward);
    let lease = populate(&source);
    let before = observations(&|args| source.etcdctl(args), &lease);
    // The expectations hold on keyward itself, so the comparisons below compare something.
    assert!(before[0].2.contains("\"revision\":10"), "{:?}", before[0]);
    assert!(before[1].2.contains("\"mod_revision\":3"), "{:?}", before[1]);
    assert_eq!(before[2].2, format!("Error: {COMPACTED}"));
    assert_eq!(before[5].2, format!("Error: {PERMISSION_DENIED}"));
    assert_eq!(before[8].2, format!("Error: {AUTH_FAILED}"));
    assert!(before[13].2.contains("leased"), "{:?}", before[13]);

    let tmp = tempfile::tempdir().unwrap();
    let backup = tmp.path().join("keyward.db");
    let saved = ok(source.etcdctl(&["--user", ROOT, "snapshot", "save", &backup.display().to_string()]));
    assert!(saved.stdout.contains("Snapshot saved at"), "{saved:?}");
    same_status_as_etcdctl(&backup);
    let status = status_json(&backup);
    assert_eq!(status["revision"], 10, "etcdctl reads keyward's revision: {status}");
    // The database's length: the file without the digest.
    assert_eq!(status["totalSize"].as_u64().unwrap() + 32, std::fs::metadata(&backup).unwrap().len());

    let me = Flags::new("etcd-restored");
    let etcd_dir = tmp.path().join("etcd-restored.etcd");
    ok(etcdctl_restore(&backup, &me, &etcd_dir));
    let mut etcd = Member::spawn_etcd(&me, std::slice::from_ref(&me), &etcd_dir, &tmp.path().join("etcd.log"));
    etcd.wait_ready(ROOT);
    let on_etcd = observations(&|args| etcd.etcdctl(args), &lease);
    assert_eq!(before, on_etcd, "left: keyward, right: etcd restored from keyward's backup");

    // And back: etcd's own backup of that member restores into keyward, which answers the same.
    let etcds = tmp.path().join("etcd.db");
    ok(etcd.etcdctl(&["--user", ROOT, "snapshot", "save", &etcds.display().to_string()]));
    drop(etcd);
    let back = Flags::new("back");
    let back_dir = tmp.path().join("back.keyward");
    let out = ok(keyward_restore(&etcds, &back, &back_dir, &[]));
    assert!(out.stdout.contains("(revision 10,"), "{}", out.stdout);
    let mut member = Member::spawn(&back, std::slice::from_ref(&back), &back_dir, &tmp.path().join("back.log"));
    member.wait_ready(ROOT);
    let on_keyward = observations(&|args| member.etcdctl(args), &lease);
    assert_eq!(before, on_keyward, "left: keyward, right: keyward restored from etcd's backup");
}

/// The older format: an LMDB copy of the kv environment with its SHA-256, as the Snapshot RPC sent
/// it before it sent etcd's format. It still restores; `keyward migrate` points to `snapshot restore`.
#[test]
fn a_backup_in_keywards_older_format_still_restores() {
    let mut source = Server::start(Kind::Keyward);
    ok(source.etcdctl(&["put", "old", "format"]));
    ok(source.etcdctl(&["put", "old", "format2"]));
    source.kill_9();
    let mut old = std::fs::read(source.data_dir().join("member/kv/data.mdb")).unwrap();
    assert_eq!(old.len() % 512, 0);
    let digest = Sha256::digest(&old);
    old.extend_from_slice(&digest);
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("old.db");
    std::fs::write(&file, &old).unwrap();

    let me = Flags::new("old");
    let data_dir = tmp.path().join("old.keyward");
    let mut args = strings(&["migrate", "--etcd-snapshot", &file.display().to_string()]);
    args.extend(member_args(&me, std::slice::from_ref(&me), &data_dir));
    let out = keyward(&args);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stderr.contains("keyward's older format (LMDB)"), "{out:?}");
    assert!(!data_dir.exists());

    ok(keyward_restore(&file, &me, &data_dir, &[]));
    let mut member = Member::spawn(&me, std::slice::from_ref(&me), &data_dir, &tmp.path().join("member.log"));
    member.wait_ready(ROOT);
    let got = ok(member.etcdctl(&["get", "old", "-w", "json"])).stdout;
    let got: serde_json::Value = serde_json::from_str(&got).unwrap();
    assert_eq!(got["kvs"][0]["version"], 2, "{got}");
    assert_eq!(got["header"]["revision"], 3, "{got}");
}

/// A hostile backup: a digest that matches, over pages that do not hold what they claim. Each is
/// refused by `keyward snapshot restore` with one error line naming the file and no data dir left,
/// and by etcd's own `snapshot status` too (so the damage is real, not something only keyward minds).
#[test]
fn damaged_pages_under_a_valid_digest_are_refused() {
    let source = Server::start(Kind::Keyward);
    // One txn of 100 puts (one etcdctl run): a `key` bucket of several leaf pages under a branch page.
    let puts: String = (0..100).map(|i| format!("put key-{i:03} {}\n", "v".repeat(200))).collect();
    ok(source.etcdctl_stdin(&["txn"], &format!("\n{puts}\n\n")));
    let tmp = tempfile::tempdir().unwrap();
    let backup = tmp.path().join("good.db");
    ok(source.etcdctl(&["snapshot", "save", &backup.display().to_string()]));
    let good = std::fs::read(&backup).unwrap();
    let db = &good[..good.len() - 32];
    let pages = db.len() / 4096;
    assert!(pages > 5, "branch and leaf pages: {pages}");
    let with_digest = |mut bytes: Vec<u8>| {
        let digest = Sha256::digest(&bytes);
        bytes.extend_from_slice(&digest);
        bytes
    };
    let page = |n: usize| n * 4096..(n + 1) * 4096;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "meta-pages",
            {
                let mut b = db.to_vec();
                b[16 + 20] ^= 1;
                b[4096 + 16 + 20] ^= 1;
                b
            },
            "checksum mismatch",
        ),
        (
            "page-flags",
            {
                let mut b = db.to_vec();
                for n in 3..pages {
                    b[page(n)][8] = 0xff;
                }
                b
            },
            "corrupt bbolt database",
        ),
        (
            "element-offsets",
            {
                let mut b = db.to_vec();
                for n in 3..pages {
                    for at in (16..64).step_by(16) {
                        b[page(n)][at + 4..at + 8].copy_from_slice(&u32::MAX.to_le_bytes());
                    }
                }
                b
            },
            "corrupt bbolt database",
        ),
        ("cut-under-its-high-water-mark", db[..db.len() - 4096].to_vec(), "is truncated"),
    ];
    let me = Flags::new("r");
    let data_dir = tmp.path().join("r.keyward");
    for (name, bytes, expected) in cases {
        let file = tmp.path().join(format!("{name}.db"));
        std::fs::write(&file, with_digest(bytes)).unwrap();
        let out = keyward_restore(&file, &me, &data_dir, &[]);
        assert_eq!(out.status.code(), Some(1), "{name}: {out:?}");
        let message = out.stderr.trim();
        assert_eq!(message.lines().count(), 1, "{name}: one error line: {message}");
        assert!(message.contains(expected) && message.contains(&file.display().to_string()), "{name}: {message}");
        assert_eq!(leftovers(tmp.path(), "r.keyward"), Vec::<String>::new(), "{name}");
        let etcds = common::etcdctl("127.0.0.1:1", &["snapshot", "status", &file.display().to_string()]);
        assert!(!etcds.success(), "{name}: etcdctl snapshot status took it: {etcds:?}");
    }
    // The undamaged file restores: the failures were the damage's.
    ok(keyward_restore(&backup, &me, &data_dir, &[]));
}
