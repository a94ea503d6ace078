//! `keyward grpc-proxy start` end to end (issue 12): the forwarding proxy keeps each client's
//! certificate identity, the sidecar presents the workload's, SAN identities, failover across
//! the members of a cluster (and the HTTP/JSON gateway on the proxy's listener), and cancellation and deadlines reaching the member.
//!
//! Driven by the real `etcdctl` 3.4, the `etcd-client` crate, and tonic where a request must carry
//! metadata etcdctl cannot send. Certificates are generated at run time (`common::pki`). Every
//! process is started on free loopback ports and killed by PID on drop.

use std::fs;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::common;
use crate::common::cluster::{Cluster, Options};
use crate::common::etcd_errors::PERMISSION_DENIED;
use crate::common::forwarding::{assert_denied, forwarded, put, FORWARDED_CERT, NOT_TRUSTED_PROXY};
use crate::common::pki::{uri_san, Cert, Pki};
use crate::common::Output;
use base64::Engine as _;
use keyward::proto::etcdserverpb::kv_client::KvClient;
use tempfile::TempDir;

/// How long a process gets to start, and a condition polled for to come true.
const PATIENCE: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// processes
// ---------------------------------------------------------------------------

/// A keyward process (member or proxy) with its log in its own temp dir; SIGKILLed on drop.
struct Process {
    child: Option<Child>,
    dir: TempDir,
}

impl Process {
    fn spawn(label: &str, args: &[String]) -> Process {
        Process::spawn_in(temp_dir(label), args)
    }

    /// Spawns in `dir`, which holds the log (and whatever else the caller put there).
    fn spawn_in(dir: TempDir, args: &[String]) -> Process {
        let log = fs::File::create(dir.path().join("log")).unwrap();
        let mut cmd = Command::new(common::keyward_bin());
        cmd.args(args).stdin(Stdio::null()).stdout(log.try_clone().unwrap()).stderr(log);
        common::scrub_env(&mut cmd);
        let child = cmd.spawn().expect("spawn keyward");
        Process { child: Some(child), dir }
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    fn alive(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Polls `ready` until it passes; panics with the log if the process exits or time runs out.
    fn wait_until(&mut self, what: &str, ready: impl Fn() -> Result<(), String>) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if !self.alive() {
                panic!("{what} exited during startup:\n{}", self.log());
            }
            let why = match ready() {
                Ok(()) => return,
                Err(why) => why,
            };
            if Instant::now() > deadline {
                panic!("{what} not ready: {why}\n{}", self.log());
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
}

fn temp_dir(label: &str) -> TempDir {
    tempfile::Builder::new().prefix(&format!("proxy-test-{label}-")).tempdir().expect("temp dir")
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A member serving `https://127.0.0.1:PORT` with `--client-cert-auth`, auth enabled, root by the
/// certificate `root` (CN root).
struct Member {
    process: Process,
    port: u16,
    ca: String,
    root: Cert,
}

impl Member {
    /// Starts a TLS member with `extra` flags and enables auth through root's certificate.
    fn start(pki: &Pki, extra: &[&str]) -> Member {
        let root = pki.client("root", Some("root"));
        let member = Member::start_without_auth(pki, extra, root);
        member.ok(&member.root, &["user", "add", "root", "--no-password"]);
        member.ok(&member.root, &["auth", "enable"]);
        member
    }

    fn start_without_auth(pki: &Pki, extra: &[&str], root: Cert) -> Member {
        let (port, peer_port) = (common::free_port(), common::free_port());
        let dir = temp_dir("member");
        let mut args = vec!["serve".to_string()];
        args.extend(common::member_flags(
            &dir.path().join("data"),
            &format!("https://127.0.0.1:{port}"),
            &format!("http://127.0.0.1:{peer_port}"),
        ));
        let server = &pki.server;
        args.extend(
            [
                "--bcrypt-cost",
                "4",
                "--ballast-bytes",
                "0",
                "--cert-file",
                server.cert_str(),
                "--key-file",
                server.key_str(),
            ]
            .map(String::from),
        );
        args.extend(["--trusted-ca-file".into(), pki.ca_str(), "--client-cert-auth".into()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut member = Member { process: Process::spawn_in(dir, &args), port, ca: pki.ca_str(), root };
        let url = member.url();
        let (ca, root) = (member.ca.clone(), member.root.clone());
        member.process.wait_until("member", || {
            let out = ctl(&url, &ca, Some(&root), &["endpoint", "health"]);
            if out.success() {
                Ok(())
            } else {
                Err(out.stderr)
            }
        });
        member
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    #[track_caller]
    fn ok(&self, cert: &Cert, args: &[&str]) -> String {
        ok(ctl(&self.url(), &self.ca, Some(cert), args), args)
    }

    /// A user `name` (with `password`, or none) holding readwrite on the prefix `/name/`.
    fn user_with_prefix(&self, name: &str, password: Option<&str>) {
        match password {
            Some(pw) => self.ok(&self.root, &["user", "add", &format!("{name}:{pw}"), "--interactive=false"]),
            None => self.ok(&self.root, &["user", "add", name, "--no-password"]),
        };
        let role = format!("{name}-role");
        self.ok(&self.root, &["role", "add", &role]);
        self.ok(&self.root, &["role", "grant-permission", &role, "--prefix=true", "readwrite", &format!("/{name}/")]);
        self.ok(&self.root, &["user", "grant-role", name, &role]);
    }
}

/// A running `keyward grpc-proxy start`.
struct Proxy {
    process: Process,
    /// `https://…`, `http://…` or `unix://…` as etcdctl takes it.
    url: String,
}

impl Proxy {
    /// A forwarding proxy in front of `member`: TLS listener with `--client-cert-auth`, the proxy's own
    /// certificate `proxy` towards the member.
    fn forwarding(pki: &Pki, member: &Member, proxy: &Cert, extra: &[&str]) -> Proxy {
        let port = common::free_port();
        let mut args = proxy_args(&[&member.url()], &format!("127.0.0.1:{port}"), pki, proxy);
        args.extend(
            ["--cert-file", pki.server.cert_str(), "--key-file", pki.server.key_str(), "--client-cert-auth"]
                .map(String::from),
        );
        args.extend(["--trusted-ca-file".into(), pki.ca_str()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        Proxy::start(args, format!("https://127.0.0.1:{port}"))
    }

    /// A sidecar for `member`: plain text on `listen` (`127.0.0.1:PORT` or `unix://PATH`), presenting
    /// `workload` to the member.
    fn sidecar(pki: &Pki, member: &Member, workload: &Cert, listen: &str) -> Proxy {
        let args = proxy_args(&[&member.url()], listen, pki, workload);
        let url = if listen.starts_with("unix://") { listen.to_string() } else { format!("http://{listen}") };
        Proxy::start(args, url)
    }

    fn start(args: Vec<String>, url: String) -> Proxy {
        let mut process = Process::spawn("proxy", &args);
        let probe = url.clone();
        process.wait_until("proxy", move || listening(&probe));
        Proxy { process, url }
    }

    /// Stops the proxy with SIGTERM, as systemd or Kubernetes stop it, and waits for it to exit.
    fn terminate(&mut self) {
        let child = self.process.child.as_mut().expect("running");
        let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("run kill");
        assert!(status.success());
        let exit = child.wait().unwrap();
        assert!(exit.success(), "exit status after SIGTERM: {exit}");
        self.process.child = None;
    }

    /// etcdctl through the proxy as `cert` (if the listener is TLS).
    fn ctl(&self, ca: &str, cert: Option<&Cert>, args: &[&str]) -> Output {
        match self.url.strip_prefix("unix://") {
            // etcd 3.4's etcdctl sends an absolute socket path as the HTTP/2 authority, which
            // HTTP/2 servers other than Go's refuse; a relative path is a valid authority.
            Some(path) => {
                let path = Path::new(path);
                let name = path.file_name().unwrap().to_str().unwrap();
                etcdctl_in(path.parent().unwrap(), &format!("unix://{name}"), args)
            }
            None => ctl(&self.url, ca, cert, args),
        }
    }
}

/// `grpc-proxy start` towards `endpoints` over TLS as `identity`, listening on `listen`.
fn proxy_args(endpoints: &[&str], listen: &str, pki: &Pki, identity: &Cert) -> Vec<String> {
    let mut args: Vec<String> = ["grpc-proxy", "start", "--debug"].map(String::from).to_vec();
    args.extend(["--endpoints".into(), endpoints.join(","), "--listen-addr".into(), listen.into()]);
    args.extend(["--cacert".into(), pki.ca_str()]);
    args.extend(["--cert", identity.cert_str(), "--key", identity.key_str()].map(String::from));
    args
}

/// Whether something accepts connections at `url`.
fn listening(url: &str) -> Result<(), String> {
    if let Some(path) = url.strip_prefix("unix://") {
        return std::os::unix::net::UnixStream::connect(path).map(drop).map_err(|e| e.to_string());
    }
    let addr: SocketAddr = url.split_once("://").map_or(url, |(_, rest)| rest).parse().unwrap();
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).map(drop).map_err(|e| e.to_string())
}

/// `etcdctl --endpoints URL [--cacert CA --cert C --key K] ARGS`.
fn ctl(url: &str, ca: &str, cert: Option<&Cert>, args: &[&str]) -> Output {
    let mut all: Vec<&str> = Vec::new();
    if url.starts_with("https://") {
        all.extend(["--cacert", ca]);
    }
    if let Some(cert) = cert {
        all.extend(["--cert", cert.cert_str(), "--key", cert.key_str()]);
    }
    all.extend_from_slice(args);
    common::etcdctl(url, &all)
}

/// etcdctl run in `dir` (for a Unix socket named relative to it).
fn etcdctl_in(dir: &Path, endpoint: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new(common::etcdctl_bin());
    common::scrub_env(&mut cmd);
    let out = cmd
        .current_dir(dir)
        .env("ETCDCTL_API", "3")
        .args([&format!("--endpoints={endpoint}"), "--dial-timeout=5s", "--command-timeout=5s"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run etcdctl");
    Output {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[track_caller]
fn ok(out: Output, args: &[&str]) -> String {
    assert!(out.success(), "etcdctl {args:?} failed:\nstdout: {}\nstderr: {}", out.stdout, out.stderr);
    out.stdout
}

#[track_caller]
fn fails_with(out: Output, message: &str, what: &str) {
    assert!(
        !out.success() && out.stderr.contains(message),
        "{what}: expected a failure with {message:?}, got {}:\nstdout: {}\nstderr: {}",
        out.status,
        out.stdout,
        out.stderr
    );
}

/// Polls `condition` until it holds (a rotation takes a reload interval to be noticed).
#[track_caller]
fn eventually(what: &str, condition: impl Fn() -> Result<(), String>) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match condition() {
            Ok(()) => return,
            Err(why) if Instant::now() > deadline => panic!("{what}: never happened; last: {why}"),
            Err(_) => thread::sleep(Duration::from_millis(200)),
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// A KV client (tonic) to `url`, over TLS as `cert` when the URL is https.
async fn kv_client(url: &str, ca: &str, cert: Option<&Cert>) -> KvClient<tonic::transport::Channel> {
    use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
    let mut endpoint = Channel::from_shared(url.to_string()).unwrap();
    if url.starts_with("https://") {
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(fs::read(ca).unwrap()))
            .domain_name("localhost");
        if let Some(cert) = cert {
            tls = tls.identity(Identity::from_pem(fs::read(&cert.cert).unwrap(), fs::read(&cert.key).unwrap()));
        }
        endpoint = endpoint.tls_config(tls).unwrap();
    }
    KvClient::new(endpoint.connect().await.expect("connect"))
}

/// A member trusting the proxy CN `proxy`, with users alice (no password) and bob (password
/// `bob-pw`), each with readwrite on their own prefix. There is no user `proxy`: a request the
/// member took for the proxy's own could do nothing.
fn member_behind_a_proxy(pki: &Pki) -> Member {
    let member = Member::start(pki, &["--trusted-proxy-cn", "proxy"]);
    member.user_with_prefix("alice", None);
    member.user_with_prefix("bob", Some("bob-pw"));
    member
}

// ---------------------------------------------------------------------------
// the forwarding proxy
// ---------------------------------------------------------------------------

#[test]
fn through_the_forwarding_proxy_a_client_is_its_own_certificate() {
    let pki = Pki::new();
    let member = member_behind_a_proxy(&pki);
    let proxy = Proxy::forwarding(&pki, &member, &pki.client("proxy", Some("proxy")), &[]);
    let ca = pki.ca_str();
    let alice = pki.client("alice", Some("alice"));
    // alice: her permitted put succeeds (as the proxy, which is no user, it could not)...
    ok(proxy.ctl(&ca, Some(&alice), &["put", "/alice/k", "v1"]), &["put"]);
    assert_eq!(member.ok(&member.root, &["get", "/alice/k", "--print-value-only"]).trim(), "v1");
    assert_eq!(ok(proxy.ctl(&ca, Some(&alice), &["get", "/alice/k", "--print-value-only"]), &["get"]).trim(), "v1");
    // A per-endpoint etcdctl command: its :authority is the whole https:// URL (vendor/h2).
    let status = ok(proxy.ctl(&ca, Some(&alice), &["endpoint", "status"]), &["endpoint", "status"]);
    assert!(status.starts_with("https://"), "{status}");
    // ...and a put outside her range is denied.
    fails_with(proxy.ctl(&ca, Some(&alice), &["put", "/bob/k", "v"]), PERMISSION_DENIED, "alice outside her range");
    // A certificate without a CN names nobody through the proxy, as it does directly.
    let no_cn = pki.client("no-cn", None);
    fails_with(proxy.ctl(&ca, Some(&no_cn), &["put", "/alice/k", "v"]), PERMISSION_DENIED, "no CN through the proxy");
    // Tokens pass through untouched: bob's password login wins over alice's certificate.
    let as_bob = ["--user", "bob:bob-pw", "put", "/bob/k", "from-bob"];
    ok(proxy.ctl(&ca, Some(&alice), &as_bob), &as_bob);
    assert_eq!(member.ok(&member.root, &["get", "/bob/k", "--print-value-only"]).trim(), "from-bob");
    // The client-facing listener verifies certificates: one from another CA is refused there.
    let stranger = Pki::new().client("alice", Some("alice"));
    assert!(!proxy.ctl(&ca, Some(&stranger), &["--dial-timeout=2s", "put", "/alice/k", "v"]).success());
}

#[test]
fn alices_watch_through_the_proxy_sees_events_and_ends_when_her_role_is_revoked() {
    use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions, WatchOptions};
    let pki = Pki::new();
    let member = member_behind_a_proxy(&pki);
    let proxy = Proxy::forwarding(&pki, &member, &pki.client("proxy", Some("proxy")), &[]);
    let alice = pki.client("alice", Some("alice"));
    runtime().block_on(async {
        let tls = TlsOptions::new()
            .ca_certificate(Certificate::from_pem(fs::read(pki.ca_file()).unwrap()))
            .identity(Identity::from_pem(fs::read(&alice.cert).unwrap(), fs::read(&alice.key).unwrap()))
            .domain_name("localhost");
        let options = ConnectOptions::new().with_tls(tls).with_timeout(Duration::from_secs(5));
        let mut client = etcd_client::Client::connect([proxy.url.as_str()], Some(options)).await.expect("connect");
        let mut stream = client.watch("/alice/", Some(WatchOptions::new().with_prefix())).await.expect("alice's watch");
        async fn next(
            stream: &mut etcd_client::WatchStream,
        ) -> Result<Option<etcd_client::WatchResponse>, etcd_client::Error> {
            tokio::time::timeout(PATIENCE, stream.message()).await.expect("a watch response in time")
        }
        let created = next(&mut stream).await.expect("watch stream").expect("created");
        assert!(created.created() && !created.canceled(), "{created:?}");
        member.ok(&member.root, &["put", "/alice/w", "1"]);
        let event = next(&mut stream).await.expect("watch stream").expect("an event");
        assert_eq!(event.events().len(), 1, "{event:?}");
        assert_eq!(event.events()[0].kv().unwrap().key(), b"/alice/w");
        member.ok(&member.root, &["user", "revoke-role", "alice", "alice-role"]);
        member.ok(&member.root, &["put", "/alice/w", "2"]);
        loop {
            let response = next(&mut stream).await.expect("watch stream").expect("a cancel");
            assert!(response.events().is_empty(), "delivered after the revoke: {response:?}");
            if response.canceled() {
                assert!(response.cancel_reason().contains(PERMISSION_DENIED), "{response:?}");
                break;
            }
        }
    });
}

#[test]
fn forwarded_identity_cannot_be_forged_directly_or_through_the_proxy() {
    let pki = Pki::new();
    let member = member_behind_a_proxy(&pki);
    let proxy = Proxy::forwarding(&pki, &member, &pki.client("proxy", Some("proxy")), &[]);
    let (alice, bob) = (pki.client("alice", Some("alice")), pki.client("bob-cert", Some("bob")));
    let ca = pki.ca_str();
    runtime().block_on(async {
        // Directly to the member with a valid certificate of his own, bob naming alice is refused.
        let mut direct = kv_client(&member.url(), &ca, Some(&bob)).await;
        assert_denied(
            put(&mut direct, "/alice/k", Some(&forwarded(&alice))).await,
            NOT_TRUSTED_PROXY,
            "bob forging alice",
        );
        put(&mut direct, "/bob/k", None).await.expect("bob as himself, directly");
        // Through the proxy the forged metadata is replaced: bob is still bob.
        let mut through = kv_client(&proxy.url, &ca, Some(&bob)).await;
        assert_denied(put(&mut through, "/alice/k", Some(&forwarded(&alice))).await, PERMISSION_DENIED, "bob as alice");
        put(&mut through, "/bob/k", Some(&forwarded(&alice))).await.expect("bob as himself, through the proxy");
    });
}

// ---------------------------------------------------------------------------
// the sidecar
// ---------------------------------------------------------------------------

#[test]
fn a_sidecar_presents_the_workload_certificate_and_switches_identity_when_it_rotates() {
    let pki = Pki::new();
    let member = member_behind_a_proxy(&pki);
    member.user_with_prefix("web", None);
    let workload = pki.client("workload", Some("web"));
    let listen = format!("127.0.0.1:{}", common::free_port());
    let sidecar = Proxy::sidecar(&pki, &member, &workload, &listen);
    let ca = pki.ca_str();
    // The application speaks plain text to 127.0.0.1 and is "web" at the member.
    ok(sidecar.ctl(&ca, None, &["put", "/web/k", "v"]), &["put"]);
    fails_with(sidecar.ctl(&ca, None, &["put", "/alice/k", "v"]), PERMISSION_DENIED, "web in alice's range");
    // Metadata the application sends is dropped, not passed on (the member would refuse it: the
    // workload is no trusted proxy), so the application is still web.
    runtime().block_on(async {
        let mut kv = kv_client(&sidecar.url, &ca, None).await;
        put(&mut kv, "/web/k2", Some(&forwarded(&pki.client("alice", Some("alice"))))).await.expect("still web");
    });
    // The mesh rotates the workload's certificate to one naming alice: without a restart, new
    // requests are alice's.
    pki.rotate(&workload, "alice");
    eventually("the rotated certificate is the identity", || {
        let out = sidecar.ctl(&ca, None, &["put", "/alice/k", "rotated"]);
        if out.success() {
            Ok(())
        } else {
            Err(out.stderr)
        }
    });
    fails_with(sidecar.ctl(&ca, None, &["put", "/web/k", "v"]), PERMISSION_DENIED, "after rotation, no longer web");
    assert_eq!(member.ok(&member.root, &["get", "/alice/k", "--print-value-only"]).trim(), "rotated");
}

#[test]
fn a_sidecar_on_a_unix_socket_is_the_workload() {
    let pki = Pki::new();
    let member = member_behind_a_proxy(&pki);
    member.user_with_prefix("web", None);
    let socket_dir = tempfile::tempdir().unwrap();
    let socket = socket_dir.path().join("keyward.sock");
    let sidecar =
        Proxy::sidecar(&pki, &member, &pki.client("workload", Some("web")), &format!("unix://{}", socket.display()));
    let ca = pki.ca_str();
    ok(sidecar.ctl(&ca, None, &["put", "/web/k", "over-unix"]), &["put"]);
    // etcdctl's per-endpoint clients send the socket path as the HTTP/2 :authority (vendor/h2).
    let status = ok(sidecar.ctl(&ca, None, &["endpoint", "status"]), &["endpoint", "status"]);
    assert!(status.starts_with("unix://"), "{status}");
    fails_with(sidecar.ctl(&ca, None, &["put", "/alice/k", "v"]), PERMISSION_DENIED, "web in alice's range");
    assert_eq!(member.ok(&member.root, &["get", "/web/k", "--print-value-only"]).trim(), "over-unix");
    // Killed, it leaves its socket file behind; the next sidecar on that path replaces it, and
    // removes it when it stops (SIGTERM).
    drop(sidecar);
    assert!(socket.exists());
    let listen = format!("unix://{}", socket.display());
    let mut sidecar = Proxy::sidecar(&pki, &member, &pki.client("workload", Some("web")), &listen);
    ok(sidecar.ctl(&ca, None, &["get", "/web/k"]), &["get"]);
    sidecar.terminate();
    assert!(!socket.exists(), "the socket file is removed when the sidecar stops");
}

/// Whoever can connect to the sidecar's socket acts with the workload's certificate: the socket is
/// 0600 even when the sidecar starts under umask 0 (issue 28), and still serves its owner.
#[test]
fn a_sidecars_unix_socket_is_owner_only_whatever_the_umask() {
    let pki = Pki::new();
    let member = member_behind_a_proxy(&pki);
    member.user_with_prefix("web", None);
    let socket_dir = tempfile::tempdir().unwrap();
    let socket = socket_dir.path().join("keyward.sock");
    let listen = format!("unix://{}", socket.display());
    let sidecar =
        common::under_umask(0, || Proxy::sidecar(&pki, &member, &pki.client("workload", Some("web")), &listen));
    use std::os::unix::fs::FileTypeExt;
    assert!(fs::symlink_metadata(&socket).unwrap().file_type().is_socket());
    assert_eq!(common::mode_of(&socket), 0o600, "owner read and write only");
    let leftovers: Vec<_> = fs::read_dir(socket_dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers, ["keyward.sock"], "nothing but the socket beside it");
    ok(sidecar.ctl(&pki.ca_str(), None, &["put", "/web/k", "owner"]), &["put"]);
}

// ---------------------------------------------------------------------------
// mesh identities
// ---------------------------------------------------------------------------

const WEB: &str = "spiffe://example.org/ns/app/sa/web";
const PROXY_ID: &str = "spiffe://example.org/ns/infra/sa/proxy";

#[test]
fn with_uri_san_identity_the_spiffe_id_is_the_user_directly_and_through_the_proxy() {
    let pki = Pki::new();
    // Under uri-san, root too is named by a URI SAN.
    let root = pki.client_with_sans("root", Some("root"), vec![uri_san("root")]);
    let member =
        Member::start_without_auth(&pki, &["--client-cert-identity", "uri-san", "--trusted-proxy-cn", PROXY_ID], root);
    member.ok(&member.root, &["user", "add", "root", "--no-password"]);
    member.ok(&member.root, &["auth", "enable"]);
    member.user_with_prefix("alice", None);
    // A SPIFFE ID as a user name; its role grants a prefix of its own.
    member.ok(&member.root, &["user", "add", WEB, "--no-password"]);
    member.ok(&member.root, &["role", "add", "web-role"]);
    member.ok(&member.root, &["role", "grant-permission", "web-role", "--prefix=true", "readwrite", "/web/"]);
    member.ok(&member.root, &["user", "grant-role", WEB, "web-role"]);
    let ca = pki.ca_str();
    // CN alice, URI SAN web: web, not alice.
    let web = pki.client_with_sans("web", Some("alice"), vec![uri_san(WEB)]);
    ok(ctl(&member.url(), &ca, Some(&web), &["put", "/web/direct", "v"]), &["put"]);
    fails_with(ctl(&member.url(), &ca, Some(&web), &["put", "/alice/k", "v"]), PERMISSION_DENIED, "web directly");
    // Through a proxy named by its own SPIFFE ID.
    let proxy_cert = pki.client_with_sans("proxy", Some("proxy"), vec![uri_san(PROXY_ID)]);
    let proxy = Proxy::forwarding(&pki, &member, &proxy_cert, &["--client-cert-identity", "uri-san"]);
    ok(proxy.ctl(&ca, Some(&web), &["put", "/web/proxied", "v"]), &["put"]);
    fails_with(proxy.ctl(&ca, Some(&web), &["put", "/alice/k", "v"]), PERMISSION_DENIED, "web through the proxy");
    // Two URI SANs, or none (whatever the CN says): nobody.
    let two =
        pki.client_with_sans("two", Some("alice"), vec![uri_san(WEB), uri_san("spiffe://example.org/ns/app/sa/db")]);
    fails_with(proxy.ctl(&ca, Some(&two), &["put", "/web/k", "v"]), PERMISSION_DENIED, "two URI SANs");
    let plain_alice = pki.client("alice", Some("alice"));
    fails_with(
        proxy.ctl(&ca, Some(&plain_alice), &["put", "/alice/k", "v"]),
        PERMISSION_DENIED,
        "CN only under uri-san",
    );
}

// ---------------------------------------------------------------------------
// failover, cancellation, deadlines
// ---------------------------------------------------------------------------

/// A forwarding proxy in front of a 3-member cluster (client mTLS, the members trusting the proxy's
/// CN): alice writes through it while the member it uses is killed. The proxy moves to the others,
/// every write it acknowledged is on the surviving members, and its HTTP/JSON gateway is alice too.
#[test]
fn the_proxy_keeps_serving_while_a_member_is_killed() {
    let mut cluster = Cluster::start(Options::new(3).client_tls().flags(&["--trusted-proxy-cn", "proxy"]));
    let admin = &cluster.members[1];
    admin.ctl(&["user", "add", "root", "--no-password"]);
    admin.ctl(&["user", "add", "alice", "--no-password"]);
    admin.ctl(&["role", "add", "alice-role"]);
    admin.ctl(&["role", "grant-permission", "alice-role", "--prefix=true", "readwrite", "/alice/"]);
    admin.ctl(&["user", "grant-role", "alice", "alice-role"]);
    admin.ctl(&["auth", "enable"]);
    let pki = &cluster.pki;
    let (ca, alice) = (pki.ca_str(), cluster.client_cert("alice"));
    let port = common::free_port();
    let endpoints: Vec<&str> = cluster.members.iter().map(|m| m.client_url.as_str()).collect();
    let mut args = proxy_args(&endpoints, &format!("127.0.0.1:{port}"), pki, &cluster.client_cert("proxy"));
    args.extend(["--cert-file", pki.server.cert_str(), "--key-file", pki.server.key_str()].map(String::from));
    args.extend(["--client-cert-auth".into(), "--trusted-ca-file".into(), ca.clone()]);
    let proxy = Proxy::start(args, format!("https://127.0.0.1:{port}"));

    // Each put is retried until it is acknowledged, as a client retries Unavailable.
    let mut failures = Vec::new();
    for i in 0..30 {
        if i == 10 {
            // The first endpoint is the one the proxy has been using.
            cluster.members[0].kill_9();
        }
        let (key, value) = (format!("/alice/k{i:02}"), format!("v{i}"));
        let deadline = Instant::now() + PATIENCE;
        loop {
            let out = proxy.ctl(&ca, Some(&alice), &["put", &key, &value]);
            if out.success() {
                break;
            }
            assert!(!out.stderr.contains(PERMISSION_DENIED), "alice lost her identity: {}", out.stderr);
            failures.push(out.stderr);
            assert!(Instant::now() < deadline, "put {key} never acknowledged: {failures:?}\n{}", proxy.process.log());
        }
    }
    for member in &cluster.members[1..] {
        let values = member.ctl(&["get", "/alice/", "--prefix", "--print-value-only"]);
        let expected: Vec<String> = (0..30).map(|i| format!("v{i}")).collect();
        assert_eq!(values.lines().map(str::to_string).collect::<Vec<_>>(), expected, "on {}", member.name);
    }
    // Still alice after the failover, through gRPC and through the gateway.
    fails_with(proxy.ctl(&ca, Some(&alice), &["put", "/bob/k", "v"]), PERMISSION_DENIED, "alice outside her range");
    let curl = |path: &str, body: &str| {
        let out = Command::new("curl")
            .args(["-s", "-w", "\n%{http_code}", "--cacert", &ca, "--cert", alice.cert_str(), "--key", alice.key_str()])
            .args(["-d", body, &format!("https://127.0.0.1:{port}{path}")])
            .output()
            .expect("run curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let b64 = |text: &str| base64::engine::general_purpose::STANDARD.encode(text);
    let range = curl("/v3/kv/range", &format!(r#"{{"key":"{}"}}"#, b64("/alice/k29")));
    assert!(range.ends_with("\n200") && range.contains(&b64("v29")), "gateway range as alice: {range}");
    let denied = curl("/v3/kv/put", &format!(r#"{{"key":"{}","value":"{}"}}"#, b64("/bob/k"), b64("v")));
    assert!(
        denied.ends_with("\n403") && denied.contains("permission denied"),
        "gateway put outside her range: {denied}"
    );
    // The proxy's /health follows its checks of the members (every 2 s); right after a leader's death
    // the survivors may report no leader for a moment, so it may take a check or two.
    eventually("the proxy reports healthy", || {
        let health = Command::new("curl")
            .args(["-s", "--cacert", &ca, "--cert", alice.cert_str(), "--key", alice.key_str()])
            .arg(format!("https://127.0.0.1:{port}/health"))
            .output()
            .unwrap();
        let body = String::from_utf8_lossy(&health.stdout).into_owned();
        if body == r#"{"health":"true"}"# {
            Ok(())
        } else {
            Err(body)
        }
    });
}

/// What a stand-in member saw of one call.
#[derive(Debug)]
enum Seen {
    Call {
        path: String,
        grpc_timeout: Option<String>,
        forwarded: bool,
    },
    /// The response stream was dropped: the proxy reset the member's stream.
    Dropped {
        path: String,
    },
}

/// Reports `Dropped` when the stand-in member's side of a call is dropped.
struct DropReport(mpsc::Sender<Seen>, String);

impl Drop for DropReport {
    fn drop(&mut self) {
        let _ = self.0.send(Seen::Dropped { path: std::mem::take(&mut self.1) });
    }
}

/// A stand-in member (HTTP/2 without TLS), reporting what it saw: `/health` is healthy; a Range
/// never answers at all; any other call gets response headers and then nothing.
fn stand_in_member(rt: &tokio::runtime::Runtime) -> (SocketAddr, mpsc::Receiver<Seen>) {
    use http_body_util::{Either, Full, StreamBody};
    use hyper::body::Frame;
    type Frame_ = Result<Frame<bytes::Bytes>, std::convert::Infallible>;
    type Body = Either<Full<bytes::Bytes>, StreamBody<tokio_stream::wrappers::ReceiverStream<Frame_>>>;
    let (seen_tx, seen_rx) = mpsc::channel();
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let seen_tx = seen_tx.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                    let seen_tx = seen_tx.clone();
                    async move {
                        let path = request.uri().path().to_string();
                        if path == "/health" {
                            let body: Body =
                                Either::Left(Full::new(bytes::Bytes::from_static(b"{\"health\":\"true\"}")));
                            return Ok::<_, std::convert::Infallible>(http::Response::new(body));
                        }
                        let grpc_timeout =
                            request.headers().get("grpc-timeout").map(|v| v.to_str().unwrap().to_string());
                        let forwarded = request.headers().contains_key(FORWARDED_CERT);
                        let _ = seen_tx.send(Seen::Call { path: path.clone(), grpc_timeout, forwarded });
                        let report = DropReport(seen_tx, path.clone());
                        if path.ends_with("/Range") {
                            let _report = report;
                            std::future::pending::<()>().await;
                            unreachable!("a pending future never completes");
                        }
                        let (frames, rx) = tokio::sync::mpsc::channel::<Frame_>(1);
                        tokio::spawn(async move {
                            frames.closed().await;
                            drop(report);
                        });
                        let body: Body =
                            Either::Right(StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx)));
                        let mut response = http::Response::new(body);
                        response.headers_mut().insert("content-type", "application/grpc".parse().unwrap());
                        Ok(response)
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    (addr, seen_rx)
}

/// A `grpc-timeout` value as a duration.
fn grpc_duration(value: &str) -> Duration {
    let (digits, unit) = value.split_at(value.len() - 1);
    let n: u64 = digits.parse().expect("grpc-timeout digits");
    match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        other => panic!("grpc-timeout unit {other:?}"),
    }
}

#[track_caller]
fn next_seen(seen: &mpsc::Receiver<Seen>) -> Seen {
    seen.recv_timeout(PATIENCE).expect("the stand-in member saw nothing")
}

#[test]
fn a_clients_deadline_and_cancellation_reach_the_member() {
    let rt = runtime();
    let (member, seen) = stand_in_member(&rt);
    let port = common::free_port();
    let args = [
        "grpc-proxy",
        "start",
        "--endpoints",
        &format!("http://{member}"),
        "--listen-addr",
        &format!("127.0.0.1:{port}"),
    ];
    let _proxy = Proxy::start(args.map(String::from).to_vec(), format!("http://127.0.0.1:{port}"));
    let url = format!("http://127.0.0.1:{port}");
    rt.block_on(async {
        // A unary call with a deadline the member does not meet: the member gets the deadline, and
        // once it passes the member's stream is reset (by the proxy's deadline or the client's).
        let mut kv = kv_client(&url, "", None).await;
        let mut request = tonic::Request::new(keyward::proto::etcdserverpb::RangeRequest {
            key: b"k".to_vec(),
            ..Default::default()
        });
        request.set_timeout(Duration::from_millis(500));
        request.metadata_mut().insert(FORWARDED_CERT, "Zm9yZ2Vk".parse().unwrap());
        let status = kv.range(request).await.expect_err("the stand-in never answers");
        assert!(matches!(status.code(), tonic::Code::Cancelled | tonic::Code::DeadlineExceeded), "{status:?}");
        match next_seen(&seen) {
            Seen::Call { path, grpc_timeout, forwarded } => {
                assert_eq!(path, "/etcdserverpb.KV/Range");
                let timeout = grpc_timeout.expect("grpc-timeout reaches the member");
                assert!(
                    grpc_duration(&timeout) <= Duration::from_millis(500),
                    "the member's deadline is no later than the client's: {timeout}"
                );
                assert!(!forwarded, "a sidecar passes no client-sent forwarded certificate");
            }
            other => panic!("expected the call, saw {other:?}"),
        }
        assert!(matches!(next_seen(&seen), Seen::Dropped { path } if path == "/etcdserverpb.KV/Range"));
        // A watch stream: the client goes away, the member's stream is reset.
        let channel = tonic::transport::Channel::from_shared(url.clone()).unwrap().connect().await.unwrap();
        let mut watch = keyward::proto::etcdserverpb::watch_client::WatchClient::new(channel);
        let (requests, rx) = tokio::sync::mpsc::channel(1);
        let responses = watch.watch(tokio_stream::wrappers::ReceiverStream::new(rx)).await.expect("watch stream open");
        assert!(matches!(next_seen(&seen), Seen::Call { path, .. } if path == "/etcdserverpb.Watch/Watch"));
        drop((responses, requests, watch));
        assert!(matches!(next_seen(&seen), Seen::Dropped { path } if path == "/etcdserverpb.Watch/Watch"));
    });
}

/// A configuration the proxy cannot honour stops it at startup with status 2.
#[test]
fn bad_proxy_flags_exit_with_status_2() {
    let status = Command::new(common::keyward_bin())
        .args(["grpc-proxy", "start", "--endpoints", "https://127.0.0.1:1"])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(status.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&status.stderr).contains("need --cacert"));
}

// ---------------------------------------------------------------------------
// connection bounds
// ---------------------------------------------------------------------------

/// Whether the proxy closed `conn` (end of stream or reset) within `within`; `false` if it is still
/// open then.
fn closed_within(conn: &mut TcpStream, within: Duration) -> bool {
    use std::io::Read;
    conn.set_read_timeout(Some(within)).unwrap();
    match conn.read(&mut [0u8; 64]) {
        Ok(0) => true,
        Ok(n) => panic!("the proxy sent {n} bytes to a client that never spoke"),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => false,
        Err(_) => true,
    }
}

/// The proxy's client listener has a member's bounds: past `--max-client-connections` a newcomer
/// takes the place of a connection that had no request answered; one that stays silent is closed
/// after `--client-idle-timeout`; a quiet live client (an idle watch) answers the keepalive pings
/// and keeps its stream.
#[test]
fn the_proxy_caps_client_connections_and_closes_silent_ones() {
    use etcd_client::WatchOptions;
    let pki = Pki::new();
    let member = member_behind_a_proxy(&pki);
    member.user_with_prefix("web", None);
    let listen = format!("127.0.0.1:{}", common::free_port());
    let mut args = proxy_args(&[&member.url()], &listen, &pki, &pki.client("workload", Some("web")));
    let bounds = ["--max-client-connections", "2", "--client-idle-timeout", "6s"];
    args.extend(
        bounds
            .into_iter()
            .chain(["--grpc-keepalive-interval", "1s", "--grpc-keepalive-timeout", "2s"])
            .map(String::from),
    );
    let sidecar = Proxy::start(args, format!("http://{listen}"));
    let addr: SocketAddr = listen.parse().unwrap();
    runtime().block_on(async {
        // Place 1: a watch that sees no event for longer than the idle timeout.
        let mut client = etcd_client::Client::connect([sidecar.url.as_str()], None).await.expect("connect");
        let mut stream = client.watch("/web/", Some(WatchOptions::new().with_prefix())).await.expect("watch");
        let created = tokio::time::timeout(PATIENCE, stream.message()).await.expect("in time").unwrap().unwrap();
        assert!(created.created(), "{created:?}");
        // Place 2: a client that never speaks.
        let mut silent = TcpStream::connect(addr).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        // Past the cap: the newcomer takes the place of the connection that had no answer (closed at
        // once, long before its idle timeout); the watch, answered, keeps its place.
        let mut third = TcpStream::connect(addr).unwrap();
        assert!(closed_within(&mut silent, Duration::from_secs(3)), "the unanswered connection kept its place");
        assert!(!closed_within(&mut third, Duration::from_millis(200)), "the newcomer was closed");
        // The third connection, silent too, goes after its idle timeout...
        assert!(closed_within(&mut third, PATIENCE), "the silent connection was never closed");
        let ca = pki.ca_str();
        ok(sidecar.ctl(&ca, None, &["put", "/web/k", "after"]), &["put"]);
        // ...while the watch, quiet for longer than the idle timeout, answered the pings and still
        // delivers (the put above is its first event).
        let event =
            tokio::time::timeout(PATIENCE, stream.message()).await.expect("in time").unwrap().expect("an event");
        assert_eq!(event.events()[0].kv().unwrap().key(), b"/web/k");
    });
}
