//! An etcd operator's configuration, unchanged: `--config-file` with etcd's YAML keys (the same file
//! starts etcd and keyward), etcd's logging, metrics-listener, auto-compaction and v2 flags, and
//! start-up errors printed once, naming what is wrong.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{etcd_bin, etcdctl, free_port, http_get, keyward_bin, scrub_env};
use tempfile::TempDir;

/// The keys of etcd's `etcd.conf.yml.sample` (etcd 3.4) at the sample's values, with this test's ports
/// and data dir. `{DATA}`, `{CLIENT}` and `{PEER}` are filled in by `sample_config`.
const SAMPLE_SUPPORTED: &str = "\
name: 'default'
data-dir: {DATA}
snapshot-count: 10000
heartbeat-interval: 100
election-timeout: 1000
quota-backend-bytes: 0
listen-peer-urls: http://127.0.0.1:{PEER}
listen-client-urls: http://127.0.0.1:{CLIENT}
initial-advertise-peer-urls: http://127.0.0.1:{PEER}
advertise-client-urls: http://127.0.0.1:{CLIENT}
initial-cluster: default=http://127.0.0.1:{PEER}
initial-cluster-token: 'etcd-cluster'
initial-cluster-state: 'new'
client-transport-security:
  cert-file:
  key-file:
  client-cert-auth: false
  trusted-ca-file:
peer-transport-security:
  cert-file:
  key-file:
  client-cert-auth: false
  trusted-ca-file:
debug: false
logger: zap
log-outputs: [stderr]
auto-compaction-mode: periodic
auto-compaction-retention: \"1\"
";

/// The sample's keys keyward has no setting for, at the sample's values that are etcd's defaults.
const SAMPLE_AT_DEFAULTS: &str = "\
wal-dir:
max-snapshots: 5
max-wals: 5
cors:
discovery:
discovery-fallback: 'proxy'
discovery-proxy:
discovery-srv:
enable-v2: false
proxy: 'off'
proxy-failure-wait: 5000
proxy-refresh-interval: 30000
proxy-dial-timeout: 1000
proxy-write-timeout: 5000
proxy-read-timeout: 0
force-new-cluster: false
";

/// The sample's settings whose values change etcd's behaviour from its defaults, where keyward has no
/// such setting.
const SAMPLE_OTHER_VALUES: &str = "\
strict-reconfig-check: false
enable-v2: true
enable-pprof: true
client-transport-security:
  auto-tls: true
";

struct Files {
    dir: TempDir,
    client: u16,
    peer: u16,
}

impl Files {
    fn new() -> Files {
        Files { dir: tempfile::tempdir().unwrap(), client: free_port(), peer: free_port() }
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client)
    }

    /// `keyward serve` on this data dir and these ports, plus `extra`.
    fn member_args(&self, extra: &[&str]) -> Vec<String> {
        let (client, peer) = (format!("http://127.0.0.1:{}", self.client), format!("http://127.0.0.1:{}", self.peer));
        let mut args = keyward_args(&[
            &format!("--data-dir={}", self.data().display()),
            &format!("--listen-client-urls={client}"),
            &format!("--advertise-client-urls={client}"),
            &format!("--listen-peer-urls={peer}"),
            &format!("--initial-advertise-peer-urls={peer}"),
            &format!("--initial-cluster=default={peer}"),
        ]);
        args.extend(extra.iter().map(|a| a.to_string()));
        args
    }

    /// Writes `text` (with the placeholders filled in) as `name` and returns its path.
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let text = text
            .replace("{DATA}", self.data().to_str().unwrap())
            .replace("{CLIENT}", &self.client.to_string())
            .replace("{PEER}", &self.peer.to_string());
        let path = self.dir.path().join(name);
        fs::write(&path, text).unwrap();
        path
    }
}

/// A server process, killed by PID on drop, with its stdout and stderr in files.
struct Running {
    child: Child,
    stderr: PathBuf,
}

impl Running {
    fn start(program: &Path, args: &[String], dir: &Path) -> Running {
        let stderr = dir.join(format!("{}.stderr", program.file_name().unwrap().to_str().unwrap()));
        let mut cmd = Command::new(program);
        scrub_env(&mut cmd);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(fs::File::create(dir.join("stdout")).unwrap())
            .stderr(fs::File::create(&stderr).unwrap());
        Running { child: cmd.spawn().expect("spawn server"), stderr }
    }

    fn stderr(&self) -> String {
        fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits until `etcdctl endpoint health` succeeds at `endpoint`.
    fn wait_ready(&mut self, endpoint: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("server exited during start-up with {status}:\n{}", self.stderr());
            }
            if etcdctl(endpoint, &["--command-timeout=2s", "endpoint", "health"]).success() {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
        panic!("server not ready at {endpoint}:\n{}", self.stderr());
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `keyward serve ARGS` to completion (for start-ups that must fail), at most 20 s.
fn keyward_exits(args: &[&str]) -> Output {
    let mut cmd = Command::new(keyward_bin());
    scrub_env(&mut cmd);
    let mut child =
        cmd.arg("serve").args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("keyward serve {args:?} did not exit");
        }
        thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn keyward_args(args: &[&str]) -> Vec<String> {
    std::iter::once("serve").chain(args.iter().copied()).map(String::from).collect()
}

#[test]
fn etcds_sample_configuration_starts_etcd_and_keyward_alike() {
    let text = format!("{SAMPLE_SUPPORTED}{SAMPLE_AT_DEFAULTS}");
    for (program, args) in [(etcd_bin(), Vec::<String>::new()), (keyward_bin(), keyward_args(&[]))] {
        let files = Files::new();
        let config = files.write("etcd.conf.yml", &text);
        let mut args = args;
        args.push(format!("--config-file={}", config.display()));
        let mut server = Running::start(&program, &args, files.dir.path());
        server.wait_ready(&files.endpoint());
        etcdctl(&files.endpoint(), &["put", "configured", "by-file"]).assert_ok();
        let got = etcdctl(&files.endpoint(), &["get", "configured", "--print-value-only"]);
        assert_eq!(got.assert_ok().stdout, "by-file\n", "{}", program.display());
        assert!(files.data().is_dir(), "{} used data-dir from the file", program.display());
        if program == keyward_bin() {
            let log = server.stderr();
            // logger: zap, log-outputs: [stderr]: every line is a JSON object with etcd's keys.
            for line in log.lines() {
                let entry: serde_json::Value =
                    serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
                for key in ["level", "ts", "caller", "msg"] {
                    assert!(entry.get(key).is_some(), "no {key} in {line}");
                }
            }
            let warning = log.lines().find(|l| l.contains("ignoring etcd settings")).expect("one warning");
            for key in ["wal-dir", "max-wals", "proxy-read-timeout", "discovery-fallback", "enable-v2"] {
                assert!(warning.contains(key), "{key} named in {warning}");
            }
            assert_eq!(log.matches("ignoring etcd settings").count(), 1, "{log}");
            let ready = log.lines().find(|l| l.contains("member ready")).expect("start-up summary");
            assert!(ready.contains("Periodic(3600s)"), "auto-compaction-retention \"1\" is one hour: {ready}");
        }
    }
}

#[test]
fn unsupported_settings_and_unknown_keys_are_named_in_one_message() {
    let files = Files::new();
    let text = format!("{SAMPLE_SUPPORTED}{SAMPLE_OTHER_VALUES}listen-clients-urls: http://127.0.0.1:1\n")
        .replace("client-transport-security:\n  cert-file:\n", "client-transport-security-unused:\n  cert-file:\n");
    let config = files.write("etcd.conf.yml", &text);
    let out = keyward_exits(&[&format!("--config-file={}", config.display())]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one message: {stderr}");
    for named in [
        "strict-reconfig-check: false",
        "enable-v2: true",
        "enable-pprof: true",
        "client-transport-security.auto-tls: true",
        "listen-clients-urls",
        "client-transport-security-unused",
    ] {
        assert!(stderr.contains(named), "{named} named in: {stderr}");
    }
    assert!(stderr.contains(&config.display().to_string()), "the file is named: {stderr}");
    assert!(!files.data().exists(), "nothing created");
}

#[test]
fn the_file_wins_over_flags_and_variables_as_in_etcd() {
    let files = Files::new();
    let config = files.write("etcd.conf.yml", SAMPLE_SUPPORTED);
    let other_dir = files.dir.path().join("from-flag");
    let args =
        keyward_args(&[&format!("--config-file={}", config.display()), &format!("--data-dir={}", other_dir.display())]);
    let env_dir = files.dir.path().join("from-env");
    let mut server = {
        let stderr = files.dir.path().join("keyward.stderr");
        let mut cmd = Command::new(keyward_bin());
        scrub_env(&mut cmd);
        cmd.args(&args)
            .env("ETCD_NAME", "from-env")
            .env("ETCD_DATA_DIR", &env_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&stderr).unwrap());
        Running { child: cmd.spawn().unwrap(), stderr }
    };
    server.wait_ready(&files.endpoint());
    assert!(files.data().is_dir());
    assert!(!other_dir.exists() && !env_dir.exists(), "flag and variable ignored");
    let members = etcdctl(&files.endpoint(), &["member", "list"]);
    assert!(members.assert_ok().stdout.contains(", default, "), "name from the file: {}", members.stdout);
}

#[test]
fn metrics_listener_serves_only_metrics_and_health() {
    let files = Files::new();
    let metrics_port = free_port();
    let args = files.member_args(&[&format!("--listen-metrics-urls=http://127.0.0.1:{metrics_port}")]);
    let mut server = Running::start(&keyward_bin(), &args, files.dir.path());
    server.wait_ready(&files.endpoint());
    let metrics = format!("127.0.0.1:{metrics_port}");
    let (code, body) = http_get(&metrics, "/metrics");
    assert_eq!(code, 200);
    assert!(body.contains("etcd_server_health_checks_total") || body.contains("etcd_"), "{body}");
    let (code, body) = http_get(&metrics, "/health");
    assert_eq!((code, body.trim()), (200, r#"{"health":"true"}"#));
    assert_eq!(http_get(&metrics, "/version").0, 404, "only /metrics and /health");
    assert!(!etcdctl(&metrics, &["--command-timeout=2s", "get", "x"]).success(), "no gRPC on the metrics port");
}

#[test]
fn periodic_auto_compaction_keeps_the_retention_and_compacts_behind_it() {
    let files = Files::new();
    let args = files.member_args(&["--auto-compaction-mode=periodic", "--auto-compaction-retention=2s"]);
    let mut server = Running::start(&keyward_bin(), &args, files.dir.path());
    server.wait_ready(&files.endpoint());
    let ep = files.endpoint();
    for i in 0..5 {
        etcdctl(&ep, &["put", "k", &i.to_string()]).assert_ok(); // revisions 2..=6
    }
    // Revision 2 stays readable until it is 2 s old, then is compacted away; 6 stays the newest.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let old = etcdctl(&ep, &["get", "k", "--rev=2"]);
        if !old.success() {
            assert!(old.stderr.contains("required revision has been compacted"), "{}", old.stderr);
            break;
        }
        assert!(Instant::now() < deadline, "revision 2 never compacted:\n{}", server.stderr());
        thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(etcdctl(&ep, &["get", "k", "--print-value-only"]).assert_ok().stdout, "4\n");
    assert!(server.stderr().contains("auto compaction done"), "{}", server.stderr());
}

#[test]
fn start_up_errors_are_printed_once_naming_the_path_or_flag() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    fs::write(&file, "").unwrap();
    let data_dir = file.join("data");
    let out =
        keyward_exits(&[&format!("--data-dir={}", data_dir.display()), "--listen-client-urls=http://127.0.0.1:0"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("ERROR") || l.starts_with("keyward:")).collect();
    assert_eq!(errors.len(), 1, "one error line: {stderr}");
    assert!(errors[0].contains(&data_dir.display().to_string()), "names the path: {}", errors[0]);
    assert_eq!(errors[0].matches("Not a directory").count(), 1, "cause once: {}", errors[0]);

    let out = keyward_exits(&["--enable-v2=true"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr.trim(),
        "keyward: --enable-v2: keyward serves only etcd's v3 API; remove the flag or set it to false"
    );

    let out = keyward_exits(&["--log-outputs=/nonexistent-dir/keyward.log"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--log-outputs /nonexistent-dir/keyward.log"));

    let out = keyward_exits(&[&format!("--config-file={}", dir.path().join("missing.yml").display())]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.yml: No such file"));
}

#[test]
fn log_outputs_to_a_file_leave_stderr_for_the_one_fatal_error() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("keyward.log");
    let file = dir.path().join("a-file");
    fs::write(&file, "").unwrap();
    let out = keyward_exits(&[
        &format!("--data-dir={}", file.join("data").display()),
        &format!("--log-outputs={}", log.display()),
        "--logger=zap",
        "--listen-client-urls=http://127.0.0.1:0",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "only the fatal error on stderr: {stderr}");
    let logged = fs::read_to_string(&log).unwrap();
    let last: serde_json::Value = serde_json::from_str(logged.lines().last().unwrap()).unwrap();
    assert_eq!(last["level"], "error");
    assert!(last["msg"].as_str().unwrap().contains("cannot lock data dir"), "{logged}");
}
