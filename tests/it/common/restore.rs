//! Shared by `restore.rs` and `migrate.rs`: a member started on a data dir that
//! `keyward snapshot restore` or `keyward migrate` made (with the same member flags, so the peer URL
//! the restore recorded is the one it listens on), killed by PID on drop; and the one-shot commands.

use std::fs::File;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{etcdctl, free_port, keyward_bin, scrub_env, Output, Server, START_TIMEOUT};

pub(crate) const ROOT: &str = "root:rootpw";

/// One member of a restored cluster: its name and ports, chosen before the restore.
#[derive(Clone, Debug)]
pub(crate) struct Flags {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
}

impl Flags {
    pub(crate) fn new(name: &str) -> Flags {
        Flags { name: name.to_string(), client_port: free_port(), peer_port: free_port() }
    }

    pub(crate) fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }

    pub(crate) fn client_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }
}

/// `--initial-cluster` of these members.
pub(crate) fn initial_cluster(members: &[Flags]) -> String {
    members.iter().map(|m| format!("{}={}", m.name, m.peer_url())).collect::<Vec<_>>().join(",")
}

/// The member flags of `restore` / `migrate` (and of `serve`).
pub(crate) fn member_args(me: &Flags, cluster: &[Flags], data_dir: &Path) -> Vec<String> {
    vec![
        format!("--data-dir={}", data_dir.display()),
        format!("--name={}", me.name),
        format!("--initial-cluster={}", initial_cluster(cluster)),
        "--initial-cluster-token=restored".to_string(),
        format!("--initial-advertise-peer-urls={}", me.peer_url()),
    ]
}

/// Runs `keyward ARGS...` to completion.
pub(crate) fn keyward(args: &[String]) -> Output {
    let mut cmd = Command::new(keyward_bin());
    cmd.args(args).stdin(Stdio::null());
    scrub_env(&mut cmd);
    let out = cmd.output().expect("run keyward");
    Output {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

pub(crate) fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// A running `keyward serve` on a restored data dir; SIGKILLed by PID and awaited on drop.
pub(crate) struct Member {
    pub flags: Flags,
    child: Child,
    pub log: PathBuf,
}

impl Member {
    /// Spawns the member without waiting (members of one cluster start together).
    pub(crate) fn spawn(me: &Flags, cluster: &[Flags], data_dir: &Path, log: &Path) -> Member {
        Member::spawn_with(me, cluster, data_dir, log, &me.client_url(), &[])
    }

    /// A real etcd on a data dir `etcdctl snapshot restore` made (etcd takes the same flags).
    pub(crate) fn spawn_etcd(me: &Flags, cluster: &[Flags], data_dir: &Path, log: &Path) -> Member {
        Member::spawn_program(super::etcd_bin(), &[], me, cluster, data_dir, log, &me.client_url(), &[])
    }

    /// `spawn` with another client URL (`https://`) and more flags.
    pub(crate) fn spawn_with(
        me: &Flags,
        cluster: &[Flags],
        data_dir: &Path,
        log: &Path,
        client_url: &str,
        extra: &[String],
    ) -> Member {
        Member::spawn_program(keyward_bin(), &["serve"], me, cluster, data_dir, log, client_url, extra)
    }

    #[allow(clippy::too_many_arguments)]
    fn spawn_program(
        program: PathBuf,
        command: &[&str],
        me: &Flags,
        cluster: &[Flags],
        data_dir: &Path,
        log: &Path,
        client_url: &str,
        extra: &[String],
    ) -> Member {
        let mut args = strings(command);
        args.extend(member_args(me, cluster, data_dir));
        args.extend(extra.iter().cloned());
        args.extend([
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={}", me.peer_url()),
            "--heartbeat-interval=50".to_string(),
            "--election-timeout=500".to_string(),
        ]);
        let out = File::create(log).expect("member log");
        let err = out.try_clone().expect("member log");
        let mut cmd = Command::new(&program);
        cmd.args(&args).stdin(Stdio::null()).stdout(out).stderr(err);
        scrub_env(&mut cmd);
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {}: {e}", program.display()));
        Member { flags: me.clone(), child, log: log.to_path_buf() }
    }

    pub(crate) fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.flags.client_port)
    }

    /// Waits until a linearizable `get` as `user` (who may read any key) succeeds through this member.
    pub(crate) fn wait_ready(&mut self, user: &str) {
        let deadline = Instant::now() + START_TIMEOUT;
        let addr: SocketAddr = self.endpoint().parse().unwrap();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("member {} exited with {status}:\n{}", self.flags.name, self.log_text());
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                let out = self.etcdctl(&["--user", user, "--command-timeout=2s", "get", "ready-probe"]);
                if out.success() {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "member {} not ready:\n{}", self.flags.name, self.log_text());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub(crate) fn etcdctl(&self, args: &[&str]) -> Output {
        etcdctl(&self.endpoint(), args)
    }

    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `etcdctl get -w json` output without what differs between two clusters (cluster and member
/// ids, raft term): the header's revision and every key-value with its revisions, version, lease.
pub(crate) fn comparable_get(json: &str) -> serde_json::Value {
    let mut value: serde_json::Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("not JSON ({e}): {json}"));
    if let Some(header) = value.get_mut("header").and_then(|h| h.as_object_mut()) {
        header.remove("cluster_id");
        header.remove("member_id");
        header.remove("raft_term");
    }
    value
}

/// The names of the entries of `dir` that a failed restore must not leave (the data dir and its
/// temp dirs).
pub(crate) fn leftovers(dir: &Path, data_dir_name: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name == data_dir_name || name.contains(".restoring-"))
        .collect()
}

#[track_caller]
pub(crate) fn ok(out: Output) -> Output {
    assert!(out.success(), "failed: {}{}", out.stdout, out.stderr);
    out
}

/// Writes the data every test backs up, through etcdctl (so on etcd or keyward alike): keys over
/// several revisions, a deleted key, a lease with a key, a compaction, users with passwords, a role
/// with a prefix and a range grant, auth enabled. Returns the lease id (hex).
pub(crate) fn populate(server: &Server) -> String {
    let ctl = |args: &[&str]| ok(server.etcdctl(args));
    for (k, v) in [("a", "1"), ("a", "2"), ("b", "x"), ("a", "3"), ("/app/x", "1"), ("gone", "soon")] {
        ctl(&["put", k, v]);
    }
    ctl(&["del", "gone"]);
    let lease = ctl(&["lease", "grant", "600"]).stdout.split_whitespace().nth(1).unwrap().to_string();
    ctl(&["put", "--lease", &lease, "leased", "v"]);
    ctl(&["compact", "3"]);
    ctl(&["put", "k", "after-compaction"]);
    for (user, password) in [("root", "rootpw"), ("alice", "alicepw"), ("bob", "bobpw")] {
        ctl(&["user", "add", &format!("{user}:{password}")]);
    }
    ctl(&["role", "add", "reader"]);
    ctl(&["role", "grant-permission", "reader", "read", "/app/", "--prefix"]);
    ctl(&["role", "grant-permission", "reader", "readwrite", "a", "b"]);
    ctl(&["user", "grant-role", "alice", "reader"]);
    ctl(&["user", "grant-role", "root", "root"]);
    ctl(&["auth", "enable"]);
    lease
}

/// What a client sees, as comparable text: each entry is (command, exit status, output).
pub(crate) fn observations(run: &dyn Fn(&[&str]) -> Output, lease: &str) -> Vec<(String, bool, String)> {
    let commands: Vec<Vec<&str>> = vec![
        vec!["--user", ROOT, "get", "", "--from-key", "-w", "json"],
        vec!["--user", ROOT, "get", "a", "--rev", "4", "-w", "json"],
        vec!["--user", ROOT, "get", "a", "--rev", "2"],
        vec!["--user", "alice:alicepw", "get", "/app/", "--prefix", "-w", "json"],
        vec!["--user", "alice:alicepw", "get", "a", "-w", "json"],
        vec!["--user", "alice:alicepw", "get", "k"],
        vec!["--user", "alice:alicepw", "put", "/app/x", "2"],
        vec!["--user", "bob:bobpw", "get", "a"],
        vec!["--user", "alice:wrong", "get", "a"],
        vec!["--user", ROOT, "user", "list"],
        vec!["--user", ROOT, "role", "get", "reader"],
        vec!["--user", ROOT, "user", "get", "alice"],
        vec!["--user", ROOT, "lease", "list"],
    ];
    let mut seen = Vec::new();
    for args in commands {
        // Each command logs in (a bcrypt check): on a machine busy with the whole suite, the
        // harness's 5 s can run out (seen once, on the migrated keyward), so these allow more.
        let out = run(&[&["--command-timeout=30s"], args.as_slice()].concat());
        let text = if args.contains(&"json") && out.success() {
            comparable_get(&out.stdout).to_string()
        } else if out.success() {
            out.stdout.clone()
        } else {
            // etcdctl's last line is the error.
            out.stderr.lines().last().unwrap_or_default().to_string()
        };
        seen.push((args.join(" "), out.success(), text));
    }
    // The lease's remaining TTL differs by the time passed: only its keys are compared.
    let ttl = run(&["--user", ROOT, "lease", "timetolive", lease, "--keys"]);
    let keys = ttl.stdout.split("attached keys").nth(1).unwrap_or_default().trim().to_string();
    seen.push(("lease timetolive --keys".into(), ttl.success(), keys));
    seen
}

/// `keyward snapshot status` of an etcd-format backup (etcd's or keyward's) prints what `etcdctl
/// snapshot status` prints, in each of its formats.
#[track_caller]
pub(crate) fn same_status_as_etcdctl(file: &Path) {
    let file = file.display().to_string();
    for format in ["simple", "table", "json", "fields"] {
        let ours = ok(keyward(&strings(&["snapshot", "status", &file, "-w", format]))).stdout;
        let etcds = ok(etcdctl("127.0.0.1:1", &["snapshot", "status", &file, "-w", format])).stdout;
        assert_eq!(ours, etcds, "-w {format}");
    }
}
