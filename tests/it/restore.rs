//! `keyward snapshot save | restore | status`: a backup of a member with keys over several revisions,
//! a compaction, a deleted key, a lease with a key, and auth on (users, roles with range and prefix
//! grants) restored into a new member, and into a new 3-member cluster, that answer as the backed-up
//! member did; broken backups refused with one clear error and no data dir left.

use std::path::{Path, PathBuf};

use crate::common::etcd_errors::{AUTH_FAILED, COMPACTED, PERMISSION_DENIED};
use crate::common::restore::{
    comparable_get, keyward, leftovers, member_args, observations, ok, populate, strings, Flags, Member, ROOT,
};
use crate::common::{self, Kind, Output, Server};

fn save(server: &Server, file: &Path) -> Output {
    keyward(&strings(&[
        "snapshot",
        "save",
        &file.display().to_string(),
        "--endpoints",
        &server.endpoint(),
        "--user",
        ROOT,
    ]))
}

fn restore(file: &Path, me: &Flags, cluster: &[Flags], data_dir: &Path, extra: &[&str]) -> Output {
    let mut args = strings(&["snapshot", "restore", &file.display().to_string()]);
    args.extend(member_args(me, cluster, data_dir));
    args.extend(strings(extra));
    keyward(&args)
}

#[test]
fn restored_member_answers_as_the_backed_up_member() {
    let source = Server::start(Kind::Keyward);
    let lease = populate(&source);
    let tmp = tempfile::tempdir().unwrap();
    let backup = tmp.path().join("backup.db");
    let saved = ok(save(&source, &backup));
    assert!(saved.stdout.contains("Snapshot saved at"), "{}", saved.stdout);
    assert!(!tmp.path().join("backup.db.part").exists());
    // A backup is root's: anyone else gets etcd's error and no file, not even a partial one.
    let denied = tmp.path().join("denied.db");
    let out = keyward(&strings(&[
        "snapshot",
        "save",
        &denied.display().to_string(),
        "--endpoints",
        &source.endpoint(),
        "--user",
        "alice:alicepw",
    ]));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(out.stderr.trim().lines().count(), 1, "{out:?}");
    assert!(out.stderr.contains("auth: permission denied"), "{out:?}");
    assert!(!denied.exists() && !tmp.path().join("denied.db.part").exists());
    let before = observations(&|args| source.etcdctl(args), &lease);
    // The expectations hold on the source itself, so the comparison below compares something.
    assert!(before[0].2.contains("\"revision\":10"), "{:?}", before[0]);
    assert_eq!(before[2].2, format!("Error: {COMPACTED}"));
    assert_eq!(before[5].2, format!("Error: {PERMISSION_DENIED}"));
    assert_eq!(before[8].2, format!("Error: {AUTH_FAILED}"));
    assert!(before[13].2.contains("leased"), "{:?}", before[13]);

    let status = ok(keyward(&strings(&["snapshot", "status", &backup.display().to_string(), "-w", "json"])));
    let status: serde_json::Value = serde_json::from_str(status.stdout.trim()).unwrap();
    assert_eq!(status["revision"], 10, "{status}");
    assert_eq!(status["totalSize"].as_u64().unwrap() + 32, std::fs::metadata(&backup).unwrap().len());

    let me = Flags::new("restored");
    let data_dir = tmp.path().join("restored.keyward");
    let restored = ok(restore(&backup, &me, std::slice::from_ref(&me), &data_dir, &[]));
    assert!(restored.stdout.contains("restored snapshot"), "{}", restored.stdout);
    let mut member = Member::spawn(&me, std::slice::from_ref(&me), &data_dir, &tmp.path().join("member.log"));
    member.wait_ready(ROOT);
    let after = observations(&|args| member.etcdctl(args), &lease);
    assert_eq!(before, after, "left: the backed-up member, right: the restored one");

    // A new cluster: its own ids, the new member's URLs; writes continue after the backup's revision.
    let list = ok(member.etcdctl(&["--user", ROOT, "member", "list"])).stdout;
    assert!(list.contains(", started, restored, ") && list.contains(&me.peer_url()), "{list}");
    assert_eq!(list.lines().count(), 1, "{list}");
    let put = ok(member.etcdctl(&["--user", ROOT, "put", "new", "1", "-w", "json"])).stdout;
    assert_eq!(comparable_get(&put)["header"]["revision"], 11, "{put}");
    // The member keeps what it restored across a restart.
    drop(member);
    let mut member = Member::spawn(&me, std::slice::from_ref(&me), &data_dir, &tmp.path().join("member2.log"));
    member.wait_ready(ROOT);
    let again = ok(member.etcdctl(&["--user", ROOT, "get", "new", "-w", "json"])).stdout;
    assert_eq!(comparable_get(&again)["kvs"][0]["mod_revision"], 11, "{again}");
}

#[test]
fn three_member_restore_serves_the_backup_from_every_member() {
    let source = Server::start(Kind::Keyward);
    let lease = populate(&source);
    let tmp = tempfile::tempdir().unwrap();
    let backup = tmp.path().join("backup.db");
    ok(save(&source, &backup));
    let before = observations(&|args| source.etcdctl(args), &lease);
    drop(source);
    let cluster: Vec<Flags> = ["m1", "m2", "m3"].iter().map(|n| Flags::new(n)).collect();
    let dirs: Vec<PathBuf> = cluster.iter().map(|m| tmp.path().join(format!("{}.keyward", m.name))).collect();
    for (me, dir) in cluster.iter().zip(&dirs) {
        ok(restore(&backup, me, &cluster, dir, &[]));
    }
    let mut members: Vec<Member> = cluster
        .iter()
        .zip(&dirs)
        .map(|(me, dir)| Member::spawn(me, &cluster, dir, &tmp.path().join(format!("{}.log", me.name))))
        .collect();
    for member in &mut members {
        member.wait_ready(ROOT);
    }
    for member in &members {
        let after = observations(&|args| member.etcdctl(args), &lease);
        assert_eq!(before, after, "member {}: left the backed-up member, right the restored one", member.flags.name);
    }
    ok(members[1].etcdctl(&["--user", ROOT, "put", "through-m2", "x"]));
    for member in &members {
        let got = ok(member.etcdctl(&["--user", ROOT, "get", "through-m2", "-w", "json"])).stdout;
        assert_eq!(comparable_get(&got)["kvs"][0]["mod_revision"], 11, "{}: {got}", member.flags.name);
        let list = ok(member.etcdctl(&["--user", ROOT, "member", "list"])).stdout;
        assert_eq!(list.lines().count(), 3, "{list}");
    }
    let ids: Vec<String> = members
        .iter()
        .map(|m| {
            let got = ok(m.etcdctl(&["--user", ROOT, "get", "a", "-w", "json"])).stdout;
            serde_json::from_str::<serde_json::Value>(&got).unwrap()["header"]["cluster_id"].to_string()
        })
        .collect();
    assert!(ids.iter().all(|id| id == &ids[0]), "{ids:?}");
}

#[test]
fn broken_backups_are_refused_once_naming_the_file_and_leave_no_data_dir() {
    let source = Server::start(Kind::Keyward);
    ok(source.etcdctl(&["put", "k", "v"]));
    let tmp = tempfile::tempdir().unwrap();
    let backup = tmp.path().join("backup.db");
    ok(keyward(&strings(&["snapshot", "save", &backup.display().to_string(), "--endpoints", &source.endpoint()])));
    let good = std::fs::read(&backup).unwrap();
    let me = Flags::new("r");
    let data_dir = tmp.path().join("r.keyward");
    let cases: Vec<(&str, Vec<u8>, Vec<&str>, &str)> = vec![
        (
            "flipped",
            {
                let mut b = good.clone();
                b[5000] ^= 0x40;
                b
            },
            vec![],
            "expected sha256",
        ),
        ("truncated", good[..good.len() - 100].to_vec(), vec![], "no trailing sha256"),
        ("truncated-skip", good[..good.len() / 2].to_vec(), vec!["--skip-hash-check"], "is truncated"),
        ("empty", Vec::new(), vec!["--skip-hash-check"], "too short"),
        ("garbage", vec![0x5a; 8192], vec!["--skip-hash-check"], "is not a backup"),
    ];
    for (name, bytes, extra, expected) in cases {
        let file = tmp.path().join(format!("{name}.db"));
        std::fs::write(&file, bytes).unwrap();
        let out = restore(&file, &me, std::slice::from_ref(&me), &data_dir, &extra);
        assert_eq!(out.status.code(), Some(1), "{name}: {out:?}");
        let message = out.stderr.trim();
        assert_eq!(message.lines().count(), 1, "{name}: one error line: {message}");
        assert!(message.starts_with("keyward snapshot: "), "{name}: {message}");
        assert!(message.contains(expected) && message.contains(&file.display().to_string()), "{name}: {message}");
        assert_eq!(leftovers(tmp.path(), "r.keyward"), Vec::<String>::new(), "{name}");
    }
    // A data dir that exists is never touched.
    std::fs::create_dir(&data_dir).unwrap();
    std::fs::write(data_dir.join("keep"), b"x").unwrap();
    let out = restore(&backup, &me, std::slice::from_ref(&me), &data_dir, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(out.stderr.trim(), format!("keyward snapshot: data dir {} already exists", data_dir.display()));
    assert_eq!(std::fs::read(data_dir.join("keep")).unwrap(), b"x");
    // Member flags are checked before anything is written.
    let out = keyward(&strings(&[
        "snapshot",
        "restore",
        &backup.display().to_string(),
        "--data-dir",
        &tmp.path().join("other").display().to_string(),
        "--name",
        "nobody",
        "--initial-cluster",
        "r=http://127.0.0.1:1",
    ]));
    assert!(out.stderr.contains("--initial-cluster has no member named \"nobody\""), "{out:?}");
    assert!(!tmp.path().join("other").exists());
    // One backup format, etcd's: `keyward migrate` reads a keyward backup as `snapshot restore` does.
    let migrated = Flags::new("migrated");
    let mut args = strings(&["migrate", "--etcd-snapshot", &backup.display().to_string()]);
    args.extend(member_args(&migrated, std::slice::from_ref(&migrated), &tmp.path().join("migrated.keyward")));
    ok(keyward(&args));
    // The untouched backup restores: the failures above were the files'.
    let fresh = Flags::new("fresh");
    ok(restore(&backup, &fresh, std::slice::from_ref(&fresh), &tmp.path().join("fresh.keyward"), &[]));
    assert!(tmp.path().join("fresh.keyward/member/kv/data.mdb").exists());
}

/// etcdctl's TLS client flags: an `https://` member with `--client-cert-auth` is backed up with
/// `--cacert/--cert/--key`; a CA that did not sign the server's certificate is refused.
#[test]
fn snapshot_save_over_tls_with_a_client_certificate() {
    let pki = common::pki::Pki::new();
    let tmp = tempfile::tempdir().unwrap();
    let me = Flags::new("tls");
    let url = format!("https://127.0.0.1:{}", me.client_port);
    let tls_flags: Vec<String> = [
        "--cert-file",
        pki.server.cert_str(),
        "--key-file",
        pki.server.key_str(),
        "--trusted-ca-file",
        pki.ca_file().to_str().unwrap(),
        "--client-cert-auth",
    ]
    .map(String::from)
    .to_vec();
    let data_dir = tmp.path().join("tls.keyward");
    let _member =
        Member::spawn_with(&me, std::slice::from_ref(&me), &data_dir, &tmp.path().join("member.log"), &url, &tls_flags);
    let backup = tmp.path().join("tls.db");
    let save = |ca: &Path| {
        keyward(&strings(&[
            "snapshot",
            "save",
            &backup.display().to_string(),
            "--endpoints",
            &url,
            "--cacert",
            &ca.display().to_string(),
            "--cert",
            pki.root.cert_str(),
            "--key",
            pki.root.key_str(),
        ]))
    };
    let deadline = std::time::Instant::now() + common::START_TIMEOUT;
    loop {
        let out = save(&pki.ca_file());
        if out.success() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no backup over TLS: {out:?}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let status = ok(keyward(&strings(&["snapshot", "status", &backup.display().to_string()])));
    // A fresh member's backup has no key: etcd's status reads the revision of the last one, 0 (as for
    // a fresh etcd's backup).
    assert!(status.stdout.contains(", 0, "), "a fresh member's backup: {}", status.stdout);
    let other = common::pki::Pki::new();
    std::fs::remove_file(&backup).unwrap();
    let out = save(&other.ca_file());
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stderr.to_lowercase().contains("certificate"), "{out:?}");
    assert!(!backup.exists());
}

/// Alarms are replicated state and come with the backup, as etcd's restore keeps its alarm bucket: a
/// NOSPACE alarm raised before the backup refuses puts on the restored member until disarmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_active_nospace_alarm_comes_with_the_backup_until_disarmed() {
    use common::etcd_errors::NO_SPACE;
    use etcd_client::{AlarmAction, AlarmOptions, AlarmType};
    let source = Server::start(Kind::Keyward);
    let mut client = source.client().await;
    client.put("k", "v", None).await.unwrap();
    let member_id = client.member_list().await.unwrap().members()[0].id();
    let mut options = AlarmOptions::new();
    options.with_member(member_id);
    client.alarm(AlarmAction::Activate, AlarmType::Nospace, Some(options)).await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let backup = tmp.path().join("alarm.db");
    let saved = tokio::task::block_in_place(|| {
        keyward(&strings(&["snapshot", "save", &backup.display().to_string(), "--endpoints", &source.endpoint()]))
    });
    ok(saved);
    let me = Flags::new("alarmed");
    let data_dir = tmp.path().join("alarmed.keyward");
    ok(restore(&backup, &me, std::slice::from_ref(&me), &data_dir, &[]));
    let member = tokio::task::block_in_place(|| {
        let mut member = Member::spawn(&me, std::slice::from_ref(&me), &data_dir, &tmp.path().join("member.log"));
        member.wait_ready(ROOT);
        member
    });
    let list = ok(member.etcdctl(&["alarm", "list"])).stdout;
    assert_eq!(list.trim(), format!("memberID:{member_id} alarm:NOSPACE"));
    let refused = member.etcdctl(&["put", "k", "w"]);
    assert!(!refused.success() && refused.stderr.contains(NO_SPACE), "{refused:?}");
    ok(member.etcdctl(&["alarm", "disarm"]));
    ok(member.etcdctl(&["put", "k", "w"]));
    assert_eq!(ok(member.etcdctl(&["get", "k", "--print-value-only"])).stdout.trim(), "w");
}
