//! The audit log (`--audit-log`, issue 13): one JSON line per auth decision, with who (user, how
//! identified, from where), what (operation, key range), the outcome and why, the auth revision and
//! the raft index of applied decisions. Also: denials in the main log are rate-limited per user.

use crate::common::{self, Kind, Server};
use serde_json::Value;

fn ok(server: &Server, args: &[&str]) -> String {
    let out = server.etcdctl(args);
    assert!(out.success(), "etcdctl {args:?}: {}{}", out.stdout, out.stderr);
    out.stdout
}

fn lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

fn find<'a>(lines: &'a [Value], what: &str, pred: impl Fn(&Value) -> bool) -> &'a Value {
    lines.iter().find(|l| pred(l)).unwrap_or_else(|| panic!("no audit line for {what} in:\n{lines:#?}"))
}

#[test]
fn every_auth_decision_is_an_audit_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.log");
    let server = Server::start_with(Kind::Keyward, &["--bcrypt-cost", "4", "--audit-log", path.to_str().unwrap()]);
    ok(&server, &["user", "add", "root:rootpw"]);
    ok(&server, &["auth", "enable"]);
    let root = ["--user", "root:rootpw"];
    for args in [
        &["user", "add", "alice:alicepw"][..],
        &["role", "add", "app"],
        &["role", "grant-permission", "app", "--prefix=true", "readwrite", "/app/"],
        &["user", "grant-role", "alice", "app"],
    ] {
        ok(&server, &[&root[..], args].concat());
    }
    ok(&server, &["--user", "alice:alicepw", "put", "/app/x", "1"]);
    let denied = server.etcdctl(&["--user", "alice:alicepw", "put", "/etc/x", "1"]);
    assert!(!denied.success());
    let wrong = server.etcdctl(&["--user", "alice:nope", "get", "/app/x"]);
    assert!(!wrong.success());
    for _ in 0..30 {
        assert!(!server.etcdctl(&["--user", "alice:alicepw", "get", "/etc/x"]).success());
    }

    let lines = lines(&path);
    let put_ok = find(&lines, "alice's put", |l| l["op"] == "put" && l["key"] == "/app/x");
    assert_eq!(put_ok["user"], "alice");
    assert_eq!(put_ok["allowed"], true);
    assert_eq!(put_ok["source"], "token");
    assert!(put_ok["client"].as_str().unwrap().starts_with("127.0.0.1:"), "{put_ok}");
    assert!(put_ok["raft_index"].as_u64().unwrap() > 0, "an applied decision carries its raft index: {put_ok}");
    assert!(put_ok["auth_revision"].as_u64().unwrap() > 1);
    assert!(put_ok["time"].as_str().unwrap().ends_with('Z'));
    assert!(put_ok["member"].is_string());
    let put_denied = find(&lines, "alice's denied put", |l| l["op"] == "put" && l["key"] == "/etc/x");
    assert_eq!(put_denied["allowed"], false);
    assert_eq!(put_denied["reason"], "etcdserver: permission denied");
    let read_denied = find(&lines, "alice's denied get", |l| l["op"] == "range" && l["key"] == "/etc/x");
    assert!(read_denied.get("raft_index").is_none(), "a read decision has no raft index: {read_denied}");
    let login =
        find(&lines, "alice's login", |l| l["op"] == "authenticate" && l["allowed"] == true && l["user"] == "alice");
    assert_eq!(login["source"], "password");
    let failed = find(&lines, "the wrong password", |l| l["op"] == "authenticate" && l["allowed"] == false);
    assert_eq!(failed["user"], "alice");
    assert!(failed["reason"].as_str().unwrap().contains("authentication failed"), "{failed}");
    let admin = find(&lines, "root's grant", |l| l["op"] == "role_grant_permission");
    assert_eq!((admin["user"].as_str(), admin["allowed"].as_bool()), (Some("root"), Some(true)));

    // 31 denials of alice in a few seconds: the main log has at most 5 lines for them (the audit log
    // and the metric have all).
    let log = std::fs::read_to_string(server.log_path()).unwrap();
    let warned = log.lines().filter(|l| l.contains("request denied") && l.contains("alice")).count();
    assert!((1..=5).contains(&warned), "{warned} denial lines for alice in the main log");
    let audited = lines.iter().filter(|l| l["user"] == "alice" && l["allowed"] == false && l["op"] != "authenticate");
    assert!(audited.count() >= 31);
}

/// A log line as an attacker would forge it: a plausible timestamp and message.
const FORGED: &str = "1999-01-01T00:00:00.000000Z  INFO keyward: FORGED root logged in";

/// A key and a login name holding a newline and a fake log line (issue 28): each stays one quoted,
/// escaped field of its own line in the text log; no line of the log is the forged one.
#[test]
fn hostile_keys_and_login_names_cannot_forge_log_lines() {
    let server = Server::start_with(
        Kind::Keyward,
        &[
            "--bcrypt-cost",
            "4",
            // Throttled from the first failure; concurrent attempts are refused: the refusal is logged.
            "--login-throttle-free-failures",
            "0",
            "--login-throttle-base-delay",
            "300",
            "--login-throttle-max-delay",
            "400",
        ],
    );
    ok(&server, &["user", "add", "root:rootpw"]);
    ok(&server, &["auth", "enable"]);
    ok(&server, &["--user", "root:rootpw", "user", "add", "alice:alicepw"]);
    let hostile_key = format!("/k\n{FORGED}");
    let denied = server.etcdctl(&["--user", "alice:alicepw", "put", &hostile_key, "v"]);
    assert!(!denied.success(), "alice has no permission: {}", denied.stdout);
    let hostile_user = format!("mallory\n{FORGED}\r\u{2028}x:pw");
    // One failure, then attempts at once: they queue behind it, and those that would wait past the
    // cap are refused.
    assert!(!server.etcdctl(&["--user", &hostile_user, "get", "k"]).success());
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| assert!(!server.etcdctl(&["--user", &hostile_user, "get", "k"]).success()));
        }
    });

    let log = std::fs::read_to_string(server.log_path()).unwrap();
    let forged: Vec<&str> = log.lines().filter(|l| l.starts_with("1999-") || l.contains("\r")).collect();
    assert!(forged.is_empty(), "forged log lines: {forged:#?}\n--- log ---\n{log}");
    let escaped = format!("\\n{}", &FORGED[..10]);
    assert!(
        log.lines().any(|l| l.contains("request denied") && l.contains(&format!("\"/k{escaped}"))),
        "the denied key, quoted and escaped:\n{log}"
    );
    assert!(
        log.lines().any(|l| l.contains("authentication") && l.contains(&format!("\"mallory{escaped}"))),
        "the login name, quoted and escaped:\n{log}"
    );
}

/// The audit log and a `--log-outputs` file are owner-only under umask 0 (issue 28): a new file is
/// created 0600, an existing wider one narrowed to 0600. The data dir is 0700 with owner-only files.
#[test]
fn log_files_and_the_data_dir_are_owner_only_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.log");
    let log_file = dir.path().join("keyward.log");
    std::fs::write(&log_file, "").unwrap();
    std::fs::set_permissions(&log_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let outputs = format!("stderr,{}", log_file.display());
    let server = common::under_umask(0, || {
        Server::start_with(
            Kind::Keyward,
            &["--bcrypt-cost", "4", "--audit-log", audit.to_str().unwrap(), "--log-outputs", &outputs],
        )
    });
    ok(&server, &["user", "add", "root:rootpw"]);
    ok(&server, &["auth", "enable"]);
    ok(&server, &["--user", "root:rootpw", "put", "k", "v"]);
    assert!(!lines(&audit).is_empty(), "the audit log is written");
    assert!(std::fs::read_to_string(&log_file).unwrap().contains("INFO"), "the log file is written");
    assert_eq!(common::mode_of(&audit), 0o600, "audit log");
    assert_eq!(common::mode_of(&log_file), 0o600, "an existing 0644 log file");
    let mut wide = Vec::new();
    let mut pending = vec![server.data_dir()];
    while let Some(path) = pending.pop() {
        let mode = common::mode_of(&path);
        if path.is_dir() {
            pending.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        }
        if mode & 0o077 != 0 {
            wide.push(format!("{} {mode:o}", path.display()));
        }
    }
    assert!(wide.is_empty(), "readable by others under umask 0: {wide:#?}");
}
