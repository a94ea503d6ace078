//! `deploy/` checked by the tools that consume it: `systemd-analyze verify` for the units,
//! `docker compose config` for the compose file, `kubernetes-validate` (the Kubernetes JSON schemas,
//! strict) for the manifests; and `deploy/local-cluster.sh` run end to end: it starts three members and
//! the proxy, etcdctl puts and gets directly and through the proxy, and `stop` or Ctrl-C
//! ends every process it started. `certs/README.md`'s walkthrough is run as written.
//!
//! Each check has a twin that feeds the tool a broken copy and expects it to complain, so a tool that
//! silently accepts everything cannot make the check pass. The tools are installed by
//! `tests/run-all.sh`; a missing one fails the test with the command that installs it.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::common;

/// How long the script may take to report ready (a bound against hanging, not a timing assertion).
const SCRIPT_WAIT: Duration = Duration::from_secs(120);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn deploy(path: &str) -> PathBuf {
    repo().join("deploy").join(path)
}

/// Runs a tool; a missing tool fails with how to get it.
fn run(cmd: &mut Command, install: &str) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?} ({e}); {install} (tests/run-all.sh does)"))
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

// ---------------------------------------------------------------------------
// systemd
// ---------------------------------------------------------------------------

/// `systemd-analyze verify` on copies of the units whose ExecStart names the binary cargo built
/// (verify refuses a unit whose binary does not exist). Returns its exit status and output.
fn verify_units(edit: impl Fn(&str) -> String) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut units = Vec::new();
    for unit in ["keyward.service", "keyward-proxy.service"] {
        let text = std::fs::read_to_string(deploy("systemd").join(unit)).unwrap();
        assert!(text.contains("ExecStart=/usr/local/bin/keyward "), "{unit} runs /usr/local/bin/keyward");
        let text = text.replace("/usr/local/bin/keyward", common::keyward_bin().to_str().unwrap());
        let path = dir.path().join(unit);
        std::fs::write(&path, edit(&text)).unwrap();
        units.push(path);
    }
    let out = run(Command::new("systemd-analyze").arg("verify").args(&units), "install systemd");
    (out.status.success(), text(&out))
}

#[test]
fn systemd_units_verify_clean() {
    let (ok, output) = verify_units(|unit| unit.to_string());
    assert!(ok && output.trim().is_empty(), "systemd-analyze verify:\n{output}");
    // Twin: a misspelt key and a bad value are reported.
    let (_, output) = verify_units(|unit| unit.replace("Restart=on-failure", "Restart=sometimes\nLimitNOFLIE=1"));
    assert!(output.contains("LimitNOFLIE") && output.contains("sometimes"), "verify missed the errors:\n{output}");
}

// ---------------------------------------------------------------------------
// docker compose
// ---------------------------------------------------------------------------

/// `docker compose config -q` (the Docker CLI plugin) or `docker-compose config -q`, on `file`.
fn compose_config(file: &Path) -> Output {
    let plugin = Command::new("docker").args(["compose", "version"]).output().is_ok_and(|o| o.status.success());
    let mut cmd = if plugin {
        let mut cmd = Command::new("docker");
        cmd.arg("compose");
        cmd
    } else {
        Command::new("docker-compose")
    };
    // The project directory is deploy/, so relative paths resolve as for the real file.
    cmd.arg("--project-directory").arg(deploy("")).arg("-f").arg(file).args(["config", "-q"]);
    run(&mut cmd, "install docker-compose")
}

#[test]
fn compose_file_is_valid() {
    let out = compose_config(&deploy("docker-compose.yml"));
    assert!(out.status.success(), "compose config:\n{}", text(&out));
    let compose = std::fs::read_to_string(deploy("docker-compose.yml")).unwrap();
    for member in ["member1", "member2", "member3"] {
        assert!(compose.contains(&format!("ETCD_NAME: {member}")), "{member} is in the compose file");
    }
    // Twin: a port that is not a port is refused.
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("docker-compose.yml");
    std::fs::write(&broken, compose.replace(r#"ports: ["12379:2379"]"#, "ports: {bad: true}")).unwrap();
    assert!(!compose_config(&broken).status.success(), "compose config accepted a broken file");
}

// ---------------------------------------------------------------------------
// Kubernetes
// ---------------------------------------------------------------------------

/// `kubernetes-validate --strict` (from PATH, or the venv tests/run-all.sh makes in target/).
fn kubernetes_validate(files: &[PathBuf]) -> Output {
    let venv = repo().join("target/tools-venv/bin/kubernetes-validate");
    let program = if venv.exists() { venv } else { PathBuf::from("kubernetes-validate") };
    run(Command::new(program).args(["--strict", "--quiet"]).args(files), "pip install kubernetes-validate")
}

#[test]
fn kubernetes_manifests_validate_against_the_schemas() {
    let manifests = [deploy("kubernetes/statefulset.yaml"), deploy("kubernetes/sidecar-pod.yaml")];
    let out = kubernetes_validate(&manifests);
    assert!(out.status.success(), "kubernetes-validate:\n{}", text(&out));
    let statefulset = std::fs::read_to_string(&manifests[0]).unwrap();
    for needed in ["kind: StatefulSet", "replicas: 3", "--initial-cluster-state=new", "--peer-client-cert-auth"] {
        assert!(statefulset.contains(needed), "statefulset.yaml has {needed}");
    }
    // Twin: a misspelt field is refused (strict).
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("statefulset.yaml");
    std::fs::write(&broken, statefulset.replace("serviceName:", "serviceNme:")).unwrap();
    assert!(!kubernetes_validate(&[broken]).status.success(), "kubernetes-validate accepted a misspelt field");
}

// ---------------------------------------------------------------------------
// peer certificates of their own kind
// ---------------------------------------------------------------------------

/// Every peer CA and peer certificate setting in `text` (a flag, an `ETCD_*` variable, a YAML key):
/// what is wrong with each, empty when each trusts the peer CA and presents a peer certificate.
fn peer_setting_problems(text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut seen = 0;
    for line in text.lines().map(str::trim).filter(|l| !l.starts_with('#')) {
        let lower = line.to_ascii_lowercase().replace('_', "-");
        let value = line.split(['=', ' ']).skip(1).collect::<Vec<_>>().join(" ");
        if lower.contains("peer-trusted-ca-file") {
            seen += 1;
            if !(value.contains("peer-ca.pem") || value.contains("/peer-tls/")) {
                problems.push(format!("peers trust another CA than the peer CA: {line}"));
            }
        } else if lower.contains("peer-cert-file") || lower.contains("peer-key-file") {
            seen += 1;
            if !(value.contains("/peer") || value.contains("/peer-tls/")) {
                problems.push(format!("a member presents another certificate than its peer certificate: {line}"));
            }
        }
    }
    if seen == 0 {
        problems.push("no peer TLS setting found".into());
    }
    problems
}

/// The deploy files give peers certificates of their own CA (`certs/gen.sh`'s `peer-ca.pem`, the
/// Kubernetes Secret `keyward-peer-tls`): a client's or the proxy's certificate, signed by the client
/// CA, can never be a member. And the dev PKI is what they expect: peer certificates chain to the peer
/// CA only, are server and client certificates, and no client or proxy certificate chains to it.
/// Twin: a file whose peers trust the client CA is caught.
#[test]
fn deploy_gives_peers_certificates_of_their_own_ca() {
    for file in ["local-cluster.sh", "docker-compose.yml", "kubernetes/statefulset.yaml", "systemd/keyward.env.example"]
    {
        let text = std::fs::read_to_string(deploy(file)).unwrap();
        assert_eq!(peer_setting_problems(&text), Vec::<String>::new(), "deploy/{file}");
        if file.starts_with("kubernetes") {
            assert!(text.contains("secretName: keyward-peer-tls"), "the peer Secret is mounted");
        }
    }
    let compose = std::fs::read_to_string(deploy("docker-compose.yml")).unwrap();
    let shared = compose.replace("tls/peer-ca.pem", "tls/ca.pem").replace("tls/peer1", "tls/member1");
    assert_eq!(peer_setting_problems(&shared).len(), 3, "the twin (one CA for all) is caught");

    let dir = tempfile::tempdir().unwrap();
    let out = Command::new("bash").arg(repo().join("certs/gen.sh")).arg(dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let verify = |ca: &str, cert: &str| {
        let mut verify = Command::new("openssl");
        verify.arg("verify").arg("-CAfile").arg(dir.path().join(ca)).arg(dir.path().join(cert));
        verify.output().unwrap().status.success()
    };
    for peer in ["peer1.pem", "peer2.pem", "peer3.pem"] {
        assert!(verify("peer-ca.pem", peer) && !verify("ca.pem", peer), "{peer} is of the peer CA only");
        let ext = Command::new("openssl")
            .args(["x509", "-noout", "-ext", "extendedKeyUsage,subjectAltName", "-in"])
            .arg(dir.path().join(peer))
            .output()
            .unwrap();
        let ext = String::from_utf8_lossy(&ext.stdout).into_owned();
        assert!(
            ext.contains("TLS Web Server Authentication") && ext.contains("TLS Web Client Authentication"),
            "{ext}"
        );
        assert!(ext.contains("IP Address:127.0.0.1") && ext.contains("*.keyward-peer.default.svc"), "{ext}");
    }
    for other in ["proxy.pem", "root.pem", "alice.pem", "member1.pem"] {
        assert!(verify("ca.pem", other) && !verify("peer-ca.pem", other), "{other} is no peer certificate");
    }
}

// ---------------------------------------------------------------------------
// deploy/local-cluster.sh
// ---------------------------------------------------------------------------

/// A base port whose three members' ports (base + 10 × i and the port after it) and the proxy's
/// (base + 30) are free.
///
/// Drawn below the kernel's ephemeral range (`ip_local_port_range`), where the ports of other tests
/// (bound to port 0) and of outgoing connections come from: a port checked free there could be taken
/// before the script binds it (seen: "Address already in use").
fn free_base_port() -> u16 {
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let below = ephemeral_start.saturating_sub(40).max(10_040);
    for _ in 0..50 {
        let base = rand::random_range(10_000..below);
        // Three members (client port, peer port after it, every 10) and the proxy after them.
        let free = [0u16, 1, 10, 11, 20, 21, 30]
            .iter()
            .all(|offset| base.checked_add(*offset).is_some_and(|port| TcpListener::bind(("127.0.0.1", port)).is_ok()));
        if free {
            return base;
        }
    }
    panic!("no free port range for the local cluster");
}

/// The script's ready report.
struct Ready {
    members: String,
    /// The proxy's URL, or why there is none.
    proxy: String,
}

/// `deploy/local-cluster.sh start --members 3 ...` until it reports ready; returns its child (still
/// running unless `--detach`) and the report.
fn start_script(dir: &Path, detach: bool) -> (std::process::Child, Ready) {
    // With SIGINT's default action: a shell that starts with it ignored (a test run started in the
    // background, `cmd &`, passes that on) can never trap it, and the Ctrl-C test would hang.
    let mut cmd = Command::new("env");
    cmd.args(["--default-signal=INT", "bash"])
        .arg(deploy("local-cluster.sh"))
        .args(["start", "--members", "3", "--base-port", &free_base_port().to_string()])
        .arg("--dir")
        .arg(dir)
        .arg("--bin")
        .arg(common::keyward_bin())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if detach {
        cmd.arg("--detach");
    }
    common::scrub_env(&mut cmd);
    let mut child = cmd.spawn().expect("run deploy/local-cluster.sh");
    let (tx, lines) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let stderr = child.stderr.take().unwrap();
    let (etx, errors) = mpsc::channel();
    std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            all.push_str(&line);
            all.push('\n');
            let _ = etx.send(all.clone());
        }
    });
    let (mut members, mut proxy) = (None, None);
    loop {
        let line = lines.recv_timeout(SCRIPT_WAIT).unwrap_or_else(|_| {
            let _ = child.kill();
            panic!("local-cluster.sh never reported ready; stderr:\n{}", errors.try_iter().last().unwrap_or_default())
        });
        if let Some(urls) = line.strip_prefix("members:") {
            members = Some(urls.trim().to_string());
        }
        if let Some(url) = line.strip_prefix("proxy:") {
            proxy = Some(url.trim().to_string());
        }
        if line.starts_with("try:") {
            break;
        }
    }
    (child, Ready { members: members.expect("members line"), proxy: proxy.expect("proxy line") })
}

/// etcdctl over TLS with the dev PKI's root certificate.
fn etcdctl(pki: &Path, endpoint: &str, args: &[&str]) -> common::Output {
    let (ca, cert, key) = (pki.join("ca.pem"), pki.join("root.pem"), pki.join("root-key.pem"));
    let mut all =
        vec!["--cacert", ca.to_str().unwrap(), "--cert", cert.to_str().unwrap(), "--key", key.to_str().unwrap()];
    all.extend_from_slice(args);
    common::etcdctl(endpoint, &all)
}

fn put_and_get(pki: &Path, endpoint: &str, key: &str) {
    etcdctl(pki, endpoint, &["put", key, "through-the-script"]).assert_ok();
    let got = etcdctl(pki, endpoint, &["get", key, "--print-value-only"]);
    assert_eq!(got.assert_ok().stdout.trim(), "through-the-script", "get {key} from {endpoint}");
}

/// The PIDs the script recorded.
fn started_pids(dir: &Path) -> Vec<u32> {
    let pids = std::fs::read_to_string(dir.join("pids")).unwrap_or_default();
    pids.lines().filter_map(|line| line.split_whitespace().next()?.parse().ok()).collect()
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z ")
}

#[test]
fn local_cluster_script_serves_put_and_get_and_stop_ends_it() {
    let dir = tempfile::Builder::new().prefix("local-cluster-").tempdir().unwrap();
    let (mut script, ready) = start_script(dir.path(), true);
    assert!(script.wait().unwrap().success(), "--detach returns once ready");
    let pki = dir.path().join("pki");
    let pids = started_pids(dir.path());
    assert!(!pids.is_empty() && pids.iter().all(|pid| alive(*pid)), "started {pids:?}");
    put_and_get(&pki, &ready.members, "/deploy/direct");
    assert!(ready.proxy.starts_with("https://"), "proxy: {}", ready.proxy);
    put_and_get(&pki, &ready.proxy, "/deploy/through-proxy");
    let stop = Command::new("bash").arg(deploy("local-cluster.sh")).arg("stop").arg("--dir").arg(dir.path()).output();
    assert!(stop.unwrap().status.success());
    assert!(pids.iter().all(|pid| !alive(*pid)), "stop ended every process: {pids:?}");
}

#[test]
fn local_cluster_script_stops_everything_on_ctrl_c() {
    let dir = tempfile::Builder::new().prefix("local-cluster-").tempdir().unwrap();
    let (mut script, ready) = start_script(dir.path(), false);
    let pids = started_pids(dir.path());
    assert!(!pids.is_empty() && pids.iter().all(|pid| alive(*pid)), "started {pids:?}");
    put_and_get(&dir.path().join("pki"), &ready.members, "/deploy/foreground");
    let interrupted = Command::new("kill").args(["-INT", &script.id().to_string()]).status().unwrap();
    assert!(interrupted.success());
    assert!(script.wait().unwrap().success(), "Ctrl-C is a clean stop");
    assert!(pids.iter().all(|pid| !alive(*pid)), "Ctrl-C ended every process: {pids:?}");
}

// ---------------------------------------------------------------------------
// certs/README.md
// ---------------------------------------------------------------------------

/// The shell blocks of `certs/README.md`, run as written: the first makes the dev PKI and starts the
/// member, the second drives etcdctl; a line commented `# Error: MESSAGE` must fail with that message,
/// every other line must succeed. Only the PKI dir, the client port and `cargo run` are substituted,
/// and the member gets a temp data dir and a free peer port.
#[test]
fn certs_readme_walkthrough_runs_as_written() {
    let readme = std::fs::read_to_string(repo().join("certs/README.md")).unwrap();
    let blocks: Vec<&str> =
        readme.split("```sh\n").skip(1).map(|rest| rest.split("```").next().unwrap_or_default()).collect();
    assert!(blocks.len() >= 2, "certs/README.md has its two shell blocks");
    let dir = tempfile::Builder::new().prefix("certs-readme-").tempdir().unwrap();
    let pki = dir.path().join("dev");
    let (port, peer) = (common::free_port(), common::free_port());
    let rewrite = |text: &str| {
        text.replace("certs/dev", pki.to_str().unwrap())
            .replace("127.0.0.1:2379", &format!("127.0.0.1:{port}"))
            .replace("cargo run --release --", common::keyward_bin().to_str().unwrap())
    };
    // Block 1: certs/gen.sh, then the member (its command joined over the line continuations).
    let first = rewrite(blocks[0]).replace("\\\n", " ");
    let mut lines = first.lines().filter(|l| !l.trim().is_empty());
    let gen = lines.next().unwrap();
    assert!(gen.starts_with("certs/gen.sh"), "{gen}");
    let out = Command::new("bash").arg(repo().join("certs/gen.sh")).arg(&pki).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let serve: Vec<String> = lines.next().unwrap().split_whitespace().map(String::from).collect();
    let mut member = Command::new(&serve[0]);
    common::scrub_env(&mut member);
    let peer_url = format!("http://127.0.0.1:{peer}");
    member
        .args(&serve[1..])
        .args(["--data-dir", dir.path().join("data").to_str().unwrap()])
        .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", &format!("default={peer_url}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut member = KillOnDrop(member.spawn().expect("start the member"));
    // Block 2: each line, in one shell, checked as its comment says (`ok` retries while the member
    // starts).
    let mut script = String::from(
        "set -u\nexport ETCDCTL_API=3\n\
         ok() { for i in $(seq 50); do out=$(\"$@\" 2>&1) && return 0; sleep 0.2; done; echo \"$*: $out\"; exit 1; }\n\
         fails_with() { msg=$1; shift; if out=$(\"$@\" 2>&1); then echo \"unexpectedly OK: $*\"; exit 1; fi; \
         case \"$out\" in *\"$msg\"*) ;; *) echo \"$*: $out\"; exit 1;; esac; }\n",
    );
    for line in rewrite(blocks[1]).lines().filter(|l| !l.trim().is_empty()) {
        let (command, comment) = line.split_once(" #").unwrap_or((line, ""));
        let command = command.trim();
        let is_assignment =
            command.split_once('=').is_some_and(|(name, _)| name.chars().all(|c| c.is_ascii_uppercase()));
        match comment.trim().strip_prefix("Error: ") {
            _ if is_assignment => script.push_str(&format!("{command}\n")),
            Some(message) => script.push_str(&format!("fails_with \"{message}\" {command}\n")),
            None => script.push_str(&format!("ok {command}\n")),
        }
    }
    let out = Command::new("bash").arg("-c").arg(&script).current_dir(repo()).output().unwrap();
    assert!(out.status.success(), "certs/README.md walkthrough:\n{}\nscript:\n{script}", text(&out));
    let _ = member.0.kill();
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
