//! End-to-end test harness shared by the integration tests (`crate::common`).
//!
//! * [`Server`] starts a single-node keyward or etcd on free loopback ports in a
//!   fresh temp dir, waits until it is ready, and always kills it (SIGKILL by PID
//!   + wait) when dropped, also while a test panics.
//! * [`etcdctl`] / [`etcdctl_stdin`] run the real etcdctl (API v3) against an endpoint.
//! * [`normalize`] makes etcdctl output of two different servers comparable.
//! * [`same_output`] / [`Scenario`] run the same etcdctl steps against a real etcd
//!   and keyward and assert that the outputs match, step by step.
//! * [`Kind::under_test`], [`start_pair`], [`Server::client`], [`current_revision`] and
//!   [`assert_status`]: setup and checks of the tests that drive a server through the
//!   `etcd-client` crate.
//! * [`etcd_errors`]: etcd's error messages the tests expect.
//!
//! Its modules: [`auth`] (users, roles and tokens of the auth tests), [`cluster`] (multi-member
//! clusters), [`restore`] (members started on restored or migrated data dirs), [`pki`] (the test
//! PKI), [`forwarding`] (requests carrying a forwarded client certificate), [`faultfs`] (the FUSE
//! file system that loses unsynced writes at a power loss) and [`alone`] (tests that need the
//! process to themselves).
//!
//! Environment knobs:
//! * `KEYWARD_HARNESS_SELFTEST=1` — the "keyward" side of a scenario is a second
//!   real etcd (verifies the harness itself, e.g. while keyward does not build).
//! * `KEYWARD_HARNESS_VERBOSE=1` — print every step's normalized output (use with
//!   `cargo test -- --nocapture`).
//! * `KEYWARD_HARNESS_KEEP=1` — keep the servers' temp dirs (data + log) after the test.
//! * `KEYWARD_HARNESS_ETCD`, `KEYWARD_HARNESS_ETCDCTL` — paths of etcd / etcdctl
//!   (default `/usr/bin/etcd`, `/usr/bin/etcdctl`).

use std::fmt::Debug;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

pub(crate) mod alone;
pub(crate) mod auth;
pub(crate) mod cluster;
pub(crate) mod faultfs;
pub(crate) mod forwarding;
pub(crate) mod heap;
pub(crate) mod peer_front;
pub(crate) mod pki;
pub(crate) mod restore;

use etcd_client::Client;
use tempfile::TempDir;
use tonic::Code;

/// How long a server may take to become ready.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Hard wall-clock limit for one etcdctl invocation (its own timeouts are 5 s; `check perf` runs a minute).
pub(crate) const ETCDCTL_WALL_TIMEOUT: Duration = Duration::from_secs(150);
/// Member name given to every server (same on both sides so `member list` compares).
pub(crate) const MEMBER_NAME: &str = "node1";

/// etcd's client-visible error messages, spelled once for every test that expects them. They are
/// etcd 3.4's strings, written out here rather than taken from keyward's `error.rs`, so that a test
/// pins what etcd says and not what keyward happens to say.
pub(crate) mod etcd_errors {
    // kv and txn
    pub(crate) const EMPTY_KEY: &str = "etcdserver: key is not provided";
    pub(crate) const KEY_NOT_FOUND: &str = "etcdserver: key not found";
    pub(crate) const VALUE_PROVIDED: &str = "etcdserver: value is provided";
    pub(crate) const LEASE_PROVIDED: &str = "etcdserver: lease is provided";
    pub(crate) const TOO_MANY_OPS: &str = "etcdserver: too many operations in txn request";
    pub(crate) const DUPLICATE_KEY: &str = "etcdserver: duplicate key given in txn request";
    pub(crate) const TOO_LARGE: &str = "etcdserver: request is too large";
    pub(crate) const COMPACTED: &str = "etcdserver: mvcc: required revision has been compacted";
    pub(crate) const FUTURE_REV: &str = "etcdserver: mvcc: required revision is a future revision";
    pub(crate) const NO_SPACE: &str = "etcdserver: mvcc: database space exceeded";
    // leases
    pub(crate) const LEASE_NOT_FOUND: &str = "etcdserver: requested lease not found";
    pub(crate) const LEASE_EXISTS: &str = "etcdserver: lease already exists";
    pub(crate) const TTL_TOO_LARGE: &str = "etcdserver: too large lease TTL";
    // cluster and maintenance
    pub(crate) const MEMBER_NOT_FOUND: &str = "etcdserver: member not found";
    pub(crate) const BAD_TRANSFEREE: &str = "etcdserver: bad leader transferee";
    // auth
    pub(crate) const USER_EMPTY: &str = "etcdserver: user name is empty";
    pub(crate) const AUTH_FAILED: &str = "etcdserver: authentication failed, invalid user ID or password";
    pub(crate) const PERMISSION_DENIED: &str = "etcdserver: permission denied";
    pub(crate) const AUTH_OLD_REVISION: &str = "etcdserver: revision of auth store is old";
    pub(crate) const INVALID_AUTH_TOKEN: &str = "etcdserver: invalid auth token";
    pub(crate) const USER_NOT_FOUND: &str = "etcdserver: user name not found";
    pub(crate) const ROLE_NOT_FOUND: &str = "etcdserver: role name not found";
}

// ---------------------------------------------------------------------------
// binaries and environment
// ---------------------------------------------------------------------------

/// Path of the keyward binary under test: the one cargo built for the integration tests, or
/// `KEYWARD_HARNESS_KEYWARD` (e.g. a release build, for the tests that measure).
pub(crate) fn keyward_bin() -> PathBuf {
    PathBuf::from(std::env::var("KEYWARD_HARNESS_KEYWARD").unwrap_or_else(|_| env!("CARGO_BIN_EXE_keyward").into()))
}

pub(crate) fn etcd_bin() -> PathBuf {
    PathBuf::from(std::env::var("KEYWARD_HARNESS_ETCD").unwrap_or_else(|_| "/usr/bin/etcd".into()))
}

pub(crate) fn etcdctl_bin() -> PathBuf {
    PathBuf::from(std::env::var("KEYWARD_HARNESS_ETCDCTL").unwrap_or_else(|_| "/usr/bin/etcdctl".into()))
}

fn env_flag(name: &str) -> bool {
    matches!(std::env::var(name).as_deref(), Ok("1") | Ok("true") | Ok("yes"))
}

/// `KEYWARD_HARNESS_SELFTEST=1`: scenarios compare etcd against etcd.
pub(crate) fn selftest() -> bool {
    env_flag("KEYWARD_HARNESS_SELFTEST")
}

fn verbose() -> bool {
    env_flag("KEYWARD_HARNESS_VERBOSE")
}

/// Drop ETCD_* / ETCDCTL_* variables inherited from the developer's shell: etcd and
/// etcdctl read them as flags, which would make runs machine-dependent.
///
/// Also turns keyward's login throttling (`auth/throttle.rs`) practically off: many tests log in
/// with wrong passwords on purpose and would otherwise wait. The throttling tests set the
/// `--login-throttle-*` flags themselves, which take precedence over this variable.
pub(crate) fn scrub_env(cmd: &mut Command) {
    for (k, _) in std::env::vars_os() {
        if let Some(k) = k.to_str() {
            if k.starts_with("ETCD_") || k.starts_with("ETCDCTL_") || k.starts_with("KEYWARD_LOGIN_THROTTLE") {
                cmd.env_remove(k);
            }
        }
    }
    cmd.env("KEYWARD_LOGIN_THROTTLE_FREE_FAILURES", "1000000");
}

// ---------------------------------------------------------------------------
// ports
// ---------------------------------------------------------------------------

/// Every port handed out by this process, so two calls never return the same port
/// (also not across tests running in parallel threads).
static HANDED_OUT: Mutex<Vec<u16>> = Mutex::new(Vec::new());

/// A currently free TCP port on 127.0.0.1 (bind to :0 and read the port back),
/// never one this process handed out before.
pub(crate) fn free_port() -> u16 {
    for _ in 0..1000 {
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
            l.local_addr().expect("local_addr").port()
        };
        let mut used = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
        if !used.contains(&port) {
            used.push(port);
            return port;
        }
    }
    panic!("free_port: no unused port found");
}

// ---------------------------------------------------------------------------
// servers
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Keyward,
    Etcd,
}

impl Kind {
    /// The server the tests run against: keyward, or a real etcd 3.4 under
    /// `KEYWARD_HARNESS_SELFTEST=1` (to check the expectations themselves).
    pub(crate) fn under_test() -> Kind {
        if selftest() {
            Kind::Etcd
        } else {
            Kind::Keyward
        }
    }

    pub(crate) fn label(self) -> &'static str {
        match self {
            Kind::Keyward => "keyward",
            Kind::Etcd => "etcd",
        }
    }

    /// The binary that runs a member of this kind and the arguments before its flags
    /// (`keyward serve`, `etcd`).
    pub(crate) fn program(self) -> (PathBuf, Vec<String>) {
        match self {
            Kind::Keyward => (keyward_bin(), vec!["serve".to_string()]),
            Kind::Etcd => (etcd_bin(), Vec::new()),
        }
    }
}

/// The flags of a fresh single-member cluster whose one member, [`MEMBER_NAME`], keeps its data in
/// `data_dir` and listens on `client_url` and `peer_url` (etcd's flag names, which keyward shares).
pub(crate) fn member_flags(data_dir: &Path, client_url: &str, peer_url: &str) -> Vec<String> {
    [
        "--name",
        MEMBER_NAME,
        "--data-dir",
        &data_dir.display().to_string(),
        "--listen-client-urls",
        client_url,
        "--advertise-client-urls",
        client_url,
        "--listen-peer-urls",
        peer_url,
        "--initial-advertise-peer-urls",
        peer_url,
        "--initial-cluster",
        &format!("{MEMBER_NAME}={peer_url}"),
    ]
    .map(String::from)
    .to_vec()
}

/// How a test server's client listener is served and how etcdctl reaches it. The default is what
/// every test used first: plain HTTP, endpoints written without a scheme.
#[derive(Clone, Debug, Default)]
pub(crate) struct ClientUrl {
    /// `None`: "127.0.0.1:PORT"; `Some("http")` / `Some("https")`: "SCHEME://127.0.0.1:PORT".
    pub etcdctl_scheme: Option<&'static str>,
    /// Serve TLS (`https://` listen URL); the certificate flags go in `server_flags`.
    pub tls: bool,
    /// Flags every server gets (e.g. `--cert-file`, `--key-file`).
    pub server_flags: Vec<String>,
    /// Flags every etcdctl call gets before its own (e.g. `--cacert`).
    pub etcdctl_flags: Vec<String>,
}

impl ClientUrl {
    /// Plain HTTP, etcdctl given `http://127.0.0.1:PORT`.
    pub(crate) fn http_scheme() -> ClientUrl {
        ClientUrl { etcdctl_scheme: Some("http"), ..ClientUrl::default() }
    }

    /// TLS with `server_flags`, etcdctl given `https://127.0.0.1:PORT` and `etcdctl_flags`.
    pub(crate) fn https(server_flags: Vec<String>, etcdctl_flags: Vec<String>) -> ClientUrl {
        ClientUrl { etcdctl_scheme: Some("https"), tls: true, server_flags, etcdctl_flags }
    }

    fn listen_scheme(&self) -> &'static str {
        if self.tls {
            "https"
        } else {
            "http"
        }
    }

    fn etcdctl_prefix(&self) -> String {
        self.etcdctl_scheme.map(|s| format!("{s}://")).unwrap_or_default()
    }

    fn with_flags<'a>(&'a self, args: &[&'a str]) -> Vec<&'a str> {
        self.etcdctl_flags.iter().map(String::as_str).chain(args.iter().copied()).collect()
    }
}

/// One running single-node server. Killed (SIGKILL + wait) on drop.
///
/// Layout of its temp dir (`dir`): `dir/data` is the `--data-dir`, `dir/server.log`
/// collects the server's stdout and stderr (appended across restarts).
pub(crate) struct Server {
    pub kind: Kind,
    pub client_port: u16,
    pub peer_port: u16,
    /// How the client listener is served and how etcdctl names it.
    pub client: ClientUrl,
    /// Flags appended after the standard ones (kept for restarts).
    pub extra_args: Vec<String>,
    child: Option<Child>,
    /// Parent temp dir holding the data dir and the log. `Option` only so that
    /// [`Server::into_dir`] can move it out; it is always `Some` otherwise.
    dir: Option<TempDir>,
}

impl Server {
    /// Start a fresh server and wait until it is ready.
    pub(crate) fn start(kind: Kind) -> Server {
        Server::start_with(kind, &[])
    }

    /// Start a fresh server with `extra_args` appended to the standard flags.
    pub(crate) fn start_with(kind: Kind, extra_args: &[&str]) -> Server {
        start_all(&[(kind, extra_args)]).pop().unwrap()
    }

    /// Start a server on an existing dir (one returned by [`Server::into_dir`]),
    /// on new ports.
    pub(crate) fn start_in(kind: Kind, dir: TempDir, extra_args: &[&str]) -> Server {
        let extra: Vec<String> = extra_args.iter().map(|s| s.to_string()).collect();
        let mut s = Server::spawn(kind, dir, free_port(), free_port(), extra, ClientUrl::default());
        if let Err(e) = s.wait_ready() {
            s.fail_start(&e);
        }
        s
    }

    /// Spawn the process without waiting for readiness.
    fn spawn(
        kind: Kind,
        dir: TempDir,
        client_port: u16,
        peer_port: u16,
        extra_args: Vec<String>,
        client: ClientUrl,
    ) -> Server {
        let mut s = Server { kind, client_port, peer_port, client, extra_args, child: None, dir: Some(dir) };
        s.spawn_child();
        s
    }

    fn spawn_child(&mut self) {
        assert!(self.child.is_none(), "spawn_child while a child is running");
        let client_url = format!("{}://127.0.0.1:{}", self.client.listen_scheme(), self.client_port);
        let peer_url = format!("http://127.0.0.1:{}", self.peer_port);
        let (bin, mut args) = self.kind.program();
        args.extend(member_flags(&self.data_dir(), &client_url, &peer_url));
        args.extend(self.client.server_flags.iter().cloned());
        args.extend(self.extra_args.iter().cloned());

        let mut log = File::options().create(true).append(true).open(self.log_path()).expect("open server log");
        let _ = writeln!(log, "=== harness: starting {} {}", bin.display(), args.join(" "));
        let log_err = log.try_clone().expect("clone log handle");
        let mut cmd = Command::new(&bin);
        cmd.args(&args).stdin(Stdio::null()).stdout(log).stderr(log_err);
        scrub_env(&mut cmd);
        let child =
            cmd.spawn().unwrap_or_else(|e| panic!("cannot spawn {} ({}): {e}", self.kind.label(), bin.display()));
        self.child = Some(child);
    }

    /// Poll until the client port accepts TCP and `etcdctl endpoint health` succeeds.
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        let addr: SocketAddr = self.endpoint().parse().unwrap();
        let mut last = String::from("client port never accepted a connection");
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(format!("process exited during startup with {status}"));
                }
            } else {
                return Err("no process".into());
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                let mut args: Vec<&str> = self.client.etcdctl_flags.iter().map(String::as_str).collect();
                args.extend(["--command-timeout=2s", "endpoint", "health"]);
                let out = run_etcdctl(&self.etcdctl_endpoint(), &args, None, Duration::from_secs(10));
                if out.success() {
                    return Ok(());
                }
                last = format!("etcdctl endpoint health: {}{}", out.stdout, out.stderr);
            }
            if Instant::now() >= deadline {
                return Err(format!("not ready after {:?}; last: {}", START_TIMEOUT, last.trim()));
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    fn fail_start(&mut self, why: &str) -> ! {
        self.kill_9();
        panic!(
            "{} failed to start on {} ({}): {}\n--- last lines of {} ---\n{}",
            self.kind.label(),
            self.endpoint(),
            self.data_dir().display(),
            why,
            self.log_path().display(),
            self.log_tail(40)
        );
    }

    /// "127.0.0.1:PORT" of the client listener.
    pub(crate) fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// The temp dir holding `data/` and `server.log`.
    pub(crate) fn dir(&self) -> &TempDir {
        self.dir.as_ref().unwrap()
    }

    /// The `--data-dir` passed to the server.
    pub(crate) fn data_dir(&self) -> PathBuf {
        self.dir().path().join("data")
    }

    pub(crate) fn log_path(&self) -> PathBuf {
        self.dir().path().join("server.log")
    }

    /// Last `n` lines of the server log.
    pub(crate) fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read(self.log_path())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_else(|e| format!("<cannot read log: {e}>"));
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// SIGKILL the process (by PID) and wait for it to exit. Idempotent.
    pub(crate) fn kill_9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill(); // SIGKILL on unix
            let _ = child.wait();
        }
    }

    /// Kill (SIGKILL) and start again on the same data dir and the same ports; waits
    /// until ready.
    pub(crate) fn restart(&mut self) {
        self.kill_9();
        self.spawn_child();
        if let Err(e) = self.wait_ready() {
            self.fail_start(&e);
        }
    }

    /// The endpoint as etcdctl is given it: "127.0.0.1:PORT", or with the scheme when the server's
    /// `ClientUrl` says so.
    pub(crate) fn etcdctl_endpoint(&self) -> String {
        format!("{}{}", self.client.etcdctl_prefix(), self.endpoint())
    }

    /// Run etcdctl against this server (with the `ClientUrl`'s flags first).
    pub(crate) fn etcdctl(&self, args: &[&str]) -> Output {
        etcdctl(&self.etcdctl_endpoint(), &self.client.with_flags(args))
    }

    pub(crate) fn etcdctl_stdin(&self, args: &[&str], stdin: &str) -> Output {
        etcdctl_stdin(&self.etcdctl_endpoint(), &self.client.with_flags(args), stdin)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill_9();
        if env_flag("KEYWARD_HARNESS_KEEP") {
            if let Some(dir) = self.dir.take() {
                let path = dir.keep();
                eprintln!("harness: kept {} dir {}", self.kind.label(), path.display());
            }
        }
    }
}

/// Start several fresh servers concurrently (all spawned first, then each awaited).
/// A server whose start fails because a port got taken in the meantime is retried
/// on new ports in a new dir (up to 3 tries).
pub(crate) fn start_all(specs: &[(Kind, &[&str])]) -> Vec<Server> {
    start_all_on(&ClientUrl::default(), specs)
}

/// [`start_all`] with every server's client listener as `client` says.
pub(crate) fn start_all_on(client: &ClientUrl, specs: &[(Kind, &[&str])]) -> Vec<Server> {
    let fresh = |kind: Kind, extra: &[&str]| {
        let dir =
            tempfile::Builder::new().prefix(&format!("harness-{}-", kind.label())).tempdir().expect("create temp dir");
        let extra = extra.iter().map(|s| s.to_string()).collect();
        Server::spawn(kind, dir, free_port(), free_port(), extra, client.clone())
    };
    let mut servers: Vec<Server> = specs.iter().map(|(k, e)| fresh(*k, e)).collect();
    for (i, (kind, extra)) in specs.iter().enumerate() {
        let mut tries = 1;
        loop {
            match servers[i].wait_ready() {
                Ok(()) => break,
                Err(e) => {
                    let clash = servers[i].log_tail(200).contains("address already in use");
                    if clash && tries < 3 {
                        tries += 1;
                        servers[i].kill_9();
                        servers[i] = fresh(*kind, extra);
                    } else {
                        servers[i].fail_start(&e);
                    }
                }
            }
        }
    }
    servers
}

/// Starts a reference etcd and the server under test ([`Kind::under_test`]) concurrently, both with
/// `extra_args`: `(etcd, candidate)`. Blocks the calling thread; async tests use [`start_pair`].
pub(crate) fn start_pair_blocking(extra_args: &[&str]) -> (Server, Server) {
    start_pair_on(&ClientUrl::default(), extra_args)
}

/// [`start_pair_blocking`] with both client listeners as `client` says.
pub(crate) fn start_pair_on(client: &ClientUrl, extra_args: &[&str]) -> (Server, Server) {
    let mut v = start_all_on(client, &[(Kind::Etcd, extra_args), (Kind::under_test(), extra_args)]);
    let candidate = v.pop().unwrap();
    (v.pop().unwrap(), candidate)
}

/// [`start_pair_blocking`] without extra flags, off the async runtime's threads.
pub(crate) async fn start_pair() -> (Server, Server) {
    start_pair_with(&[]).await
}

/// [`start_pair_blocking`] with `extra_args`, off the async runtime's threads.
pub(crate) async fn start_pair_with(extra_args: &[&str]) -> (Server, Server) {
    let args: Vec<String> = extra_args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        start_pair_blocking(&args)
    })
    .await
    .expect("start servers")
}

// ---------------------------------------------------------------------------
// etcd-client
// ---------------------------------------------------------------------------

impl Server {
    /// An `etcd-client` connected to this server, without credentials.
    pub(crate) async fn client(&self) -> Client {
        Client::connect([self.endpoint()], None)
            .await
            .unwrap_or_else(|e| panic!("connect to {} {}: {e}", self.kind.label(), self.endpoint()))
    }
}

/// The store's current revision: the header of a read of a key nobody writes.
pub(crate) async fn current_revision(c: &mut Client) -> i64 {
    c.get("\u{1}revision-probe", None).await.expect("revision probe").header().expect("header").revision()
}

/// Asserts that `res` failed with gRPC status `code` and exactly `message`.
#[track_caller]
pub(crate) fn assert_status<T: Debug>(res: Result<T, etcd_client::Error>, code: Code, message: &str) {
    match res {
        Err(etcd_client::Error::GRpcStatus(status)) => {
            assert_eq!((status.code(), status.message()), (code, message), "unexpected gRPC status: {status:?}");
        }
        Err(other) => panic!("expected gRPC status {code:?} {message:?}, got error {other:?}"),
        Ok(v) => panic!("expected gRPC status {code:?} {message:?}, got success {v:?}"),
    }
}

// ---------------------------------------------------------------------------
// etcdctl
// ---------------------------------------------------------------------------

#[derive(Debug)]
pub(crate) struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub(crate) fn success(&self) -> bool {
        self.status.success()
    }

    /// Panic with both streams unless the command succeeded.
    #[track_caller]
    pub(crate) fn assert_ok(&self) -> &Self {
        assert!(
            self.success(),
            "etcdctl failed ({}):\nstdout:\n{}\nstderr:\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
        self
    }

    /// The same run with stdout and stderr passed through `f` (e.g. [`normalize`]).
    pub(crate) fn map_text(&self, f: impl Fn(&str) -> String) -> Output {
        Output { status: self.status, stdout: f(&self.stdout), stderr: f(&self.stderr) }
    }
}

/// How `candidate`'s run of an etcdctl step differs from `reference`'s, one message per difference:
/// exit status (success or failure), stdout, stderr. The texts are compared as given, so callers
/// normalize them first. Empty when the runs agree.
pub(crate) fn differences(ref_label: &str, reference: &Output, cand_label: &str, candidate: &Output) -> Vec<String> {
    let (a, b) = (reference, candidate);
    let mut diffs = Vec::new();
    if a.success() != b.success() {
        diffs.push(format!("exit status: {ref_label} {} vs {cand_label} {}", a.status, b.status));
    }
    if a.stdout != b.stdout {
        diffs.push(format!("stdout (- {ref_label}, + {cand_label}):\n{}", line_diff(&a.stdout, &b.stdout)));
    }
    if a.stderr != b.stderr {
        diffs.push(format!("stderr (- {ref_label}, + {cand_label}):\n{}", line_diff(&a.stderr, &b.stderr)));
    }
    diffs
}

/// `ETCDCTL_API=3 etcdctl --endpoints=EP --command-timeout=5s --dial-timeout=5s ARGS...`
pub(crate) fn etcdctl(endpoint: &str, args: &[&str]) -> Output {
    let mut all = vec!["--command-timeout=5s"];
    all.extend_from_slice(args);
    run_etcdctl(endpoint, &all, None, ETCDCTL_WALL_TIMEOUT)
}

/// Like [`etcdctl`], with `stdin` fed to the process (then closed).
pub(crate) fn etcdctl_stdin(endpoint: &str, args: &[&str], stdin: &str) -> Output {
    let mut all = vec!["--command-timeout=5s"];
    all.extend_from_slice(args);
    run_etcdctl(endpoint, &all, Some(stdin), ETCDCTL_WALL_TIMEOUT)
}

fn run_etcdctl(endpoint: &str, args: &[&str], stdin: Option<&str>, wall: Duration) -> Output {
    let mut cmd = Command::new(etcdctl_bin());
    scrub_env(&mut cmd);
    cmd.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        .arg("--dial-timeout=5s")
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot spawn etcdctl: {e}"));
    let writer = stdin.map(|input| {
        let mut pipe = child.stdin.take().unwrap();
        let input = input.to_string();
        thread::spawn(move || {
            let _ = pipe.write_all(input.as_bytes()); // etcdctl may exit early: ignore EPIPE
        })
    });
    let read_all = |mut r: Box<dyn Read + Send>| {
        thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out_t = read_all(Box::new(child.stdout.take().unwrap()));
    let err_t = read_all(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + wall;
    let mut timed_out = false;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait etcdctl") {
            break st;
        }
        if Instant::now() >= deadline {
            timed_out = true;
            let _ = child.kill();
            break child.wait().expect("wait etcdctl");
        }
        thread::sleep(Duration::from_millis(5));
    };
    if let Some(w) = writer {
        let _ = w.join();
    }
    let stdout = out_t.join().unwrap();
    let mut stderr = err_t.join().unwrap();
    if timed_out {
        stderr.push_str(&format!("\n[harness: etcdctl killed after {wall:?}]\n"));
    }
    Output { status, stdout, stderr }
}

// ---------------------------------------------------------------------------
// normalize
// ---------------------------------------------------------------------------

#[derive(Clone, Copy)]
enum Val {
    /// Decimal integer (optional '-'); replaced whatever its value.
    Num,
    /// Decimal integer; "0" is kept (etcd prints 0 ids/terms in txn sub-response headers).
    NonZero,
    /// Double-quoted string, replaced including its quotes by `"<PH>"`.
    Str,
    /// Run of characters up to whitespace or one of `,"}]`.
    Token,
    /// Run of characters up to '/'.
    UpToSlash,
}

/// (text before the value, kind of value, placeholder)
#[rustfmt::skip]
const RULES: &[(&str, Val, &str)] = &[
    ("127.0.0.1:", Val::Num, "<PORT>"),                 // client/peer ports of the server under test
    ("localhost:", Val::Num, "<PORT>"),                 // same, when written with a host name
    ("endpoint://client-", Val::UpToSlash, "<UUID>"),   // random client id in etcdctl's grpc target (warn logs)
    ("\"ts\":", Val::Str, "<TS>"),                      // timestamp of etcdctl's JSON warn log lines
    ("\"cluster_id\":", Val::NonZero, "<CLUSTER_ID>"),  // -w json response header cluster id
    ("\"member_id\":", Val::NonZero, "<MEMBER_ID>"),    // -w json response header member id
    ("\"memberID\":", Val::NonZero, "<MEMBER_ID>"),     // alarm list/disarm -w json member id
    ("memberID:", Val::NonZero, "<MEMBER_ID>"),         // alarm list/disarm, endpoint status errors (Go text)
    ("\"raft_term\":", Val::NonZero, "<TERM>"),         // -w json response header raft term
    ("\"leader\":", Val::NonZero, "<MEMBER_ID>"),       // endpoint status -w json leader id
    ("\"ID\":", Val::NonZero, "<ID>"),                  // member list / lease grant -w json id
    ("\"raftTerm\":", Val::NonZero, "<TERM>"),          // endpoint status -w json raft term
    ("\"raftIndex\":", Val::Num, "<INDEX>"),            // endpoint status -w json raft index
    ("\"raftAppliedIndex\":", Val::Num, "<INDEX>"),     // endpoint status -w json applied index
    ("\"dbSize\":", Val::Num, "<SIZE>"),                // endpoint status -w json db size
    ("\"dbSizeInUse\":", Val::Num, "<SIZE>"),           // endpoint status -w json db size in use
    ("\"version\":", Val::Str, "<VERSION>"),            // server version string (numeric kv "version":N is kept)
    ("\"took\":", Val::Str, "<DURATION>"),              // endpoint health -w json duration
    ("\"ClusterID\" : ", Val::NonZero, "<CLUSTER_ID>"), // -w fields header cluster id
    ("\"MemberID\" : ", Val::NonZero, "<MEMBER_ID>"),   // -w fields header member id
    ("\"RaftTerm\" : ", Val::NonZero, "<TERM>"),        // -w fields header / endpoint status raft term
    ("\"Leader\" : ", Val::NonZero, "<MEMBER_ID>"),     // endpoint status -w fields leader id
    ("\"ID\" : ", Val::NonZero, "<ID>"),                // member list / lease grant -w fields id
    ("\"RaftIndex\" : ", Val::Num, "<INDEX>"),          // endpoint status -w fields raft index
    ("\"RaftAppliedIndex\" : ", Val::Num, "<INDEX>"),   // endpoint status -w fields applied index
    ("\"DBSize\" : ", Val::Num, "<SIZE>"),              // endpoint status -w fields db size
    ("\"DBSizeInUse\" : ", Val::Num, "<SIZE>"),         // endpoint status -w fields db size in use
    ("\"Version\" : ", Val::Str, "<VERSION>"),          // endpoint status -w fields version string (kv "Version" : N kept)
    ("\"Took\" : ", Val::Token, "<DURATION>"),          // endpoint health -w fields duration
    ("took = ", Val::Token, "<DURATION>"),              // endpoint health simple output duration
];

/// Make etcdctl output comparable across two servers: ids, raft terms/indexes,
/// versions, db sizes, durations, timestamps and ports become placeholders; table
/// padding is removed. Revisions, keys, values, counts and all other text are kept.
pub(crate) fn normalize(s: &str) -> String {
    let mut out = normalize_lines(s);
    for (prefix, val, ph) in RULES {
        out = replace_values(&out, prefix, *val, ph);
    }
    out
}

/// Replace the value that follows each occurrence of `prefix` by `ph`.
fn replace_values(s: &str, prefix: &str, val: Val, ph: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(pos) = rest.find(prefix) {
        out.push_str(&rest[..pos + prefix.len()]);
        let after = &rest[pos + prefix.len()..];
        let (len, replace) = value_extent(after, val);
        if replace {
            match val {
                Val::Str => {
                    out.push('"');
                    out.push_str(ph);
                    out.push('"');
                }
                _ => out.push_str(ph),
            }
            rest = &after[len..];
        } else {
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// (byte length of the value at the start of `s`, whether to replace it)
fn value_extent(s: &str, val: Val) -> (usize, bool) {
    let b = s.as_bytes();
    match val {
        Val::Num | Val::NonZero => {
            let start = usize::from(b.first() == Some(&b'-'));
            let digits = b[start..].iter().take_while(|c| c.is_ascii_digit()).count();
            let len = start + digits;
            let zero = b[start..len].iter().all(|&c| c == b'0');
            (len, digits > 0 && !(matches!(val, Val::NonZero) && zero))
        }
        Val::Str => {
            if b.first() != Some(&b'"') {
                return (0, false);
            }
            let mut i = 1;
            while i < b.len() {
                match b[i] {
                    b'\\' => i += 2,
                    b'"' => return (i + 1, true),
                    _ => i += 1,
                }
            }
            (0, false)
        }
        Val::Token => {
            let len =
                b.iter().take_while(|c| !c.is_ascii_whitespace() && !matches!(c, b',' | b'"' | b'}' | b']')).count();
            (len, len > 0)
        }
        Val::UpToSlash => match s.find('/') {
            Some(n) if n > 0 && !s[..n].contains(char::is_whitespace) => (n, true),
            _ => (0, false),
        },
    }
}

fn is_hex_id(s: &str) -> bool {
    !s.is_empty() && s.len() <= 16 && s.bytes().all(|c| c.is_ascii_hexdigit())
}

fn is_bool(s: &str) -> bool {
    s == "true" || s == "false"
}

/// Placeholder for a table cell, by column header (None = keep the cell).
fn table_cell_placeholder(column: &str) -> Option<&'static str> {
    match column {
        "ID" => Some("<MEMBER_ID>"),    // endpoint status / member list member id (hex)
        "VERSION" => Some("<VERSION>"), // endpoint status server version
        "DB SIZE" => Some("<SIZE>"),    // endpoint status db size ("20 kB")
        "RAFT TERM" => Some("<TERM>"),  // endpoint status raft term
        "RAFT INDEX" | "RAFT APPLIED INDEX" => Some("<INDEX>"), // endpoint status raft indexes
        "TOOK" => Some("<DURATION>"),   // endpoint health duration
        _ => None,
    }
}

/// Line-structured rules: tables (-w table) and the comma-separated simple output of
/// `endpoint status` and `member list`.
fn normalize_lines(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut header: Option<Vec<String>> = None;
    let mut expect_header = false;
    for line in s.split_inclusive('\n') {
        let (body, nl) = match line.strip_suffix('\n') {
            Some(b) => (b, "\n"),
            None => (line, ""),
        };
        let t = body.trim_end();
        // table separator "+----+---+": padding removed, so column widths do not matter
        if t.len() > 1 && t.starts_with('+') && t.bytes().all(|c| c == b'+' || c == b'-') {
            if header.is_none() {
                expect_header = true;
            }
            let mut collapsed = String::new();
            for c in t.chars() {
                if !(c == '-' && collapsed.ends_with('-')) {
                    collapsed.push(c);
                }
            }
            out.push_str(&collapsed);
            out.push_str(nl);
            continue;
        }
        // table row "| a |  b |": cells trimmed; cells of volatile columns replaced
        if t.len() > 1 && t.starts_with('|') && t.ends_with('|') {
            let cells: Vec<String> = t[1..t.len() - 1].split('|').map(|c| c.trim().to_string()).collect();
            let cells = if expect_header {
                expect_header = false;
                header = Some(cells.clone());
                cells
            } else {
                cells
                    .iter()
                    .enumerate()
                    .map(|(i, c)| {
                        let col = header.as_ref().and_then(|h| h.get(i)).map(String::as_str).unwrap_or("");
                        match table_cell_placeholder(col) {
                            Some(ph) if !c.is_empty() => ph.to_string(),
                            _ => c.clone(),
                        }
                    })
                    .collect()
            };
            out.push_str("| ");
            out.push_str(&cells.join(" | "));
            out.push_str(" |");
            out.push_str(nl);
            continue;
        }
        header = None;
        expect_header = false;
        let mut f: Vec<String> = body.split(", ").map(str::to_string).collect();
        // `endpoint status`: "EP, ID, VERSION, SIZE, leader, learner, TERM, INDEX, APPLIED, errors"
        if f.len() >= 10 && is_hex_id(&f[1]) && is_bool(&f[4]) && is_bool(&f[5]) {
            f[1] = "<MEMBER_ID>".into();
            f[2] = "<VERSION>".into();
            f[3] = "<SIZE>".into();
            f[6] = "<TERM>".into();
            f[7] = "<INDEX>".into();
            f[8] = "<INDEX>".into();
            out.push_str(&f.join(", "));
        // `member list`: "ID, started|unstarted, name, peer urls, client urls, learner"
        } else if f.len() == 6 && is_hex_id(&f[0]) && (f[1] == "started" || f[1] == "unstarted") && is_bool(&f[5]) {
            f[0] = "<MEMBER_ID>".into();
            out.push_str(&f.join(", "));
        } else {
            out.push_str(body);
        }
        out.push_str(nl);
    }
    out
}

// ---------------------------------------------------------------------------
// scenarios: same etcdctl steps against etcd and keyward
// ---------------------------------------------------------------------------

/// One etcdctl invocation: arguments (after the harness's global flags) and
/// optional standard input.
#[derive(Clone, Debug)]
pub(crate) struct Step {
    pub args: Vec<String>,
    pub stdin: Option<String>,
}

impl Step {
    pub(crate) fn new(args: &[&str]) -> Step {
        Step { args: args.iter().map(|s| s.to_string()).collect(), stdin: None }
    }

    pub(crate) fn with_stdin(mut self, stdin: &str) -> Step {
        self.stdin = Some(stdin.to_string());
        self
    }

    /// Shell-like rendering for messages.
    pub(crate) fn display(&self) -> String {
        let quote = |a: &String| {
            if a.is_empty() || a.contains(|c: char| c.is_whitespace() || "\"'\\$`|&;<>()*?".contains(c)) {
                format!("'{}'", a.replace('\'', "'\\''"))
            } else {
                a.clone()
            }
        };
        let mut s = format!("etcdctl {}", self.args.iter().map(quote).collect::<Vec<_>>().join(" "));
        if let Some(input) = &self.stdin {
            s.push_str(&format!("  <<< {input:?}"));
        }
        s
    }
}

/// `step(&["put", "a", "1"])`
pub(crate) fn step(args: &[&str]) -> Step {
    Step::new(args)
}

/// `step_stdin(&["txn"], "...")`
pub(crate) fn step_stdin(args: &[&str], stdin: &str) -> Step {
    Step::new(args).with_stdin(stdin)
}

/// A reference etcd and the server under test (keyward, or a second etcd in
/// self-test mode), driven in lockstep.
pub(crate) struct Scenario {
    pub reference: Server,
    pub candidate: Server,
    steps_run: usize,
}

impl Scenario {
    /// Start both servers (concurrently).
    pub(crate) fn start() -> Scenario {
        Scenario::start_with(&[])
    }

    pub(crate) fn start_with(extra_args: &[&str]) -> Scenario {
        Scenario::start_on(&ClientUrl::default(), extra_args)
    }

    /// Both servers with their client listeners as `client` says (e.g. https, scheme endpoints).
    pub(crate) fn start_on(client: &ClientUrl, extra_args: &[&str]) -> Scenario {
        let (reference, candidate) = start_pair_on(client, extra_args);
        Scenario { reference, candidate, steps_run: 0 }
    }

    /// Run one step on both servers (reference first) and assert equal results.
    /// Returns the reference's output.
    #[track_caller]
    pub(crate) fn step(&mut self, st: &Step) -> Output {
        let idx = self.steps_run;
        self.steps_run += 1;
        let args: Vec<&str> = st.args.iter().map(String::as_str).collect();
        let run = |s: &Server| match &st.stdin {
            Some(input) => s.etcdctl_stdin(&args, input),
            None => s.etcdctl(&args),
        };
        let a = run(&self.reference);
        let b = run(&self.candidate);
        let (na, nb) = (a.map_text(normalize), b.map_text(normalize));
        let ref_label = "etcd";
        let cand_label = match self.candidate.kind {
            Kind::Etcd => "etcd#2 (selftest)",
            Kind::Keyward => "keyward",
        };
        if verbose() {
            eprintln!(
                "--- step {idx}: {}\n[{ref_label} {}] stdout:\n{}[{ref_label}] stderr:\n{}",
                st.display(),
                a.status,
                na.stdout,
                na.stderr
            );
        }
        let diffs = differences(ref_label, &na, cand_label, &nb);
        if !diffs.is_empty() {
            let show = |s: &str| {
                if s.is_empty() {
                    "(empty)\n".to_string()
                } else {
                    s.to_string()
                }
            };
            panic!(
                "step {idx}: `{}` differs\n\n{}\n\
                 === {ref_label} ({}) normalized stdout:\n{}=== {ref_label} normalized stderr:\n{}\n\
                 === {cand_label} ({}) normalized stdout:\n{}=== {cand_label} normalized stderr:\n{}\n\
                 === last lines of {cand_label} log ({}):\n{}\n",
                st.display(),
                diffs.join("\n"),
                a.status,
                show(&na.stdout),
                show(&na.stderr),
                b.status,
                show(&nb.stdout),
                show(&nb.stderr),
                self.candidate.log_path().display(),
                self.candidate.log_tail(20),
            );
        }
        a
    }

    #[track_caller]
    pub(crate) fn run(&mut self, steps: &[Step]) {
        for st in steps {
            self.step(st);
        }
    }

    /// Restart both servers (SIGKILL, same dirs and ports).
    pub(crate) fn restart_both(&mut self) {
        self.reference.restart();
        self.candidate.restart();
    }
}

/// Start one etcd and one keyward (or two etcds under `KEYWARD_HARNESS_SELFTEST=1`),
/// run `steps` against both in order, and assert after each step that success,
/// normalized stdout and normalized stderr are the same.
#[track_caller]
pub(crate) fn same_output(steps: &[Step]) {
    Scenario::start().run(steps);
}

/// Minimal line diff (LCS) for panic messages: "  " same, "- " only left, "+ " only right.
pub(crate) fn line_diff(a: &str, b: &str) -> String {
    let x: Vec<&str> = a.lines().collect();
    let y: Vec<&str> = b.lines().collect();
    if x.len() * y.len() > 4_000_000 {
        return format!("(outputs too large for a diff: {} vs {} lines)", x.len(), y.len());
    }
    let (n, m) = (x.len(), y.len());
    let mut lcs = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if x[i] == y[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    let mut out = String::new();
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && x[i] == y[j] {
            out.push_str(&format!("  {}\n", x[i]));
            i += 1;
            j += 1;
        } else if j < m && (i == n || lcs[i][j + 1] >= lcs[i + 1][j]) {
            out.push_str(&format!("+ {}\n", y[j]));
            j += 1;
        } else {
            out.push_str(&format!("- {}\n", x[i]));
            i += 1;
        }
    }
    if !a.is_empty() && !b.is_empty() && a.ends_with('\n') != b.ends_with('\n') {
        out.push_str("(trailing newline differs)\n");
    }
    out
}

// ---------------------------------------------------------------------------
// self-checks of the pure helpers
// ---------------------------------------------------------------------------

#[test]
fn harness_normalize_rules() {
    let json = r#"{"header":{"cluster_id":324952591200643719,"member_id":3319814642761637952,"revision":3,"raft_term":2},"kvs":[{"key":"YQ==","create_revision":2,"mod_revision":3,"version":2,"value":"Mg=="}],"count":1}"#;
    assert_eq!(
        normalize(json),
        r#"{"header":{"cluster_id":<CLUSTER_ID>,"member_id":<MEMBER_ID>,"revision":3,"raft_term":<TERM>},"kvs":[{"key":"YQ==","create_revision":2,"mod_revision":3,"version":2,"value":"Mg=="}],"count":1}"#
    );
    let fields = "\"ClusterID\" : 0\n\"MemberID\" : 33\n\"Revision\" : 9\n\"RaftTerm\" : 2\n\"Version\" : 2\n\"Version\" : \"3.4.23\"\n";
    assert_eq!(
        normalize(fields),
        "\"ClusterID\" : 0\n\"MemberID\" : <MEMBER_ID>\n\"Revision\" : 9\n\"RaftTerm\" : <TERM>\n\"Version\" : 2\n\"Version\" : \"<VERSION>\"\n"
    );
    assert_eq!(
        normalize("127.0.0.1:23790 is healthy: successfully committed proposal: took = 1.540565ms\n"),
        "127.0.0.1:<PORT> is healthy: successfully committed proposal: took = <DURATION>\n"
    );
    assert_eq!(
        normalize("127.0.0.1:23790, 2e1259d415f2a040, 3.4.23, 20 kB, true, false, 2, 4, 4, \n"),
        "127.0.0.1:<PORT>, <MEMBER_ID>, <VERSION>, <SIZE>, true, false, <TERM>, <INDEX>, <INDEX>, \n"
    );
    let a = "+-----------------+------------+\n|    ENDPOINT     |    TOOK    |\n+-----------------+------------+\n| 127.0.0.1:23790 | 1.226119ms |\n+-----------------+------------+\n";
    let b = "+-----------------+---------+\n|    ENDPOINT     |  TOOK   |\n+-----------------+---------+\n| 127.0.0.1:41234 | 993.1µs |\n+-----------------+---------+\n";
    assert_eq!(normalize(a), normalize(b));
    assert_eq!(normalize(a), "+-+-+\n| ENDPOINT | TOOK |\n+-+-+\n| 127.0.0.1:<PORT> | <DURATION> |\n+-+-+\n");
    assert_eq!(
        normalize("memberID:3319814642761637952 alarm:NOSPACE \n{\"alarms\":[{\"memberID\":3319814642761637952,\"alarm\":1}]}\n"),
        "memberID:<MEMBER_ID> alarm:NOSPACE \n{\"alarms\":[{\"memberID\":<MEMBER_ID>,\"alarm\":1}]}\n"
    );
    let warn = r#"{"level":"warn","ts":"2026-11-22T03:49:10.578Z","caller":"x.go:62","target":"endpoint://client-3c1d7b5b-85e4/127.0.0.1:23790","attempt":0}"#;
    assert_eq!(
        normalize(warn),
        r#"{"level":"warn","ts":"<TS>","caller":"x.go:62","target":"endpoint://client-<UUID>/127.0.0.1:<PORT>","attempt":0}"#
    );
}

#[test]
fn harness_free_port_distinct() {
    let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
    let mut sorted = ports.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), ports.len());
}

// ---------------------------------------------------------------------------
// /health and /metrics
// ---------------------------------------------------------------------------

/// `GET path` over plain HTTP: (status code, body).
pub(crate) fn http_get(endpoint: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut tcp = std::net::TcpStream::connect(endpoint).expect("connect");
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    write!(tcp, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").unwrap();
    let mut response = String::new();
    tcp.read_to_string(&mut response).expect("read response");
    let code = response.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string();
    (code, body)
}

/// The value of a metric in `/metrics` text; `name` includes its labels, if any
/// (`name{label="value"}`).
pub(crate) fn metric(text: &str, name: &str) -> f64 {
    metric_if_any(text, name).unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
}

/// [`metric`], `None` while the series does not exist yet (a counter never incremented).
pub(crate) fn metric_if_any(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .map(|value| value.trim().parse().unwrap())
}

// ---------------------------------------------------------------------------
// file modes
// ---------------------------------------------------------------------------

/// Runs `start` (which spawns processes) with the process umask set to `mask`, then restores it:
/// the processes keep the umask they were spawned with. Serialised, as the umask is the whole test
/// process's: meanwhile, files and processes of the tests running beside get it too (umask 0 only
/// widens their modes, which only the tests that call this check).
pub(crate) fn under_umask<T>(mask: u32, start: impl FnOnce() -> T) -> T {
    use rustix::fs::Mode;
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let before = rustix::process::umask(Mode::from_raw_mode(mask));
    let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(start));
    rustix::process::umask(before);
    started.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// A file's permission bits.
pub(crate) fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).permissions().mode() & 0o7777
}

/// A gRPC length-prefixed message, uncompressed.
pub(crate) fn grpc_frame(message: &[u8]) -> bytes::Bytes {
    let mut framed = Vec::with_capacity(message.len() + 5);
    framed.push(0);
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(message);
    bytes::Bytes::from(framed)
}
