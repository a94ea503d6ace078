//! The HTTP/JSON gateway end to end, driven by curl: etcd 3.4's paths and JSON on the client port,
//! with `Authorization: Basic`, etcd's `Authorization: <token>`, and a client certificate.
//!
//! - Basic credentials act as the user; a wrong password, an unknown user, malformed credentials are
//!   401 with etcd's error JSON; a cached login never admits another password and is verified again
//!   once the member refuses its token (password change, deleted user, any auth change).
//! - A client certificate's identity reaches the gRPC service (etcd's gateway lost it: CVE-2018-16886),
//!   and no HTTP header other than `Authorization` becomes gRPC metadata.
//! - The same requests against etcd 3.4's own gateway and keyward's give the same answers, ids that
//!   legitimately differ normalised (`gateway_answers_as_etcds_gateway`).
//!
//! Every certificate is generated at run time with rcgen. Processes are killed by PID on drop.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::common::etcd_errors::{AUTH_FAILED, AUTH_OLD_REVISION, INVALID_AUTH_TOKEN, PERMISSION_DENIED, USER_EMPTY};
use crate::common::{self, Kind, Server};
use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use serde_json::{json, Value};
use tempfile::TempDir;

/// How long a test waits for a line of a stream before failing (a bound against hanging, not a
/// timing assertion).
const STREAM_WAIT: Duration = Duration::from_secs(30);

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

// ---------------------------------------------------------------------------
// curl
// ---------------------------------------------------------------------------

/// A client certificate for curl.
#[derive(Clone)]
struct ClientCert {
    cert: PathBuf,
    key: PathBuf,
}

/// Where the gateway is, and how curl reaches it.
#[derive(Clone)]
struct Gateway {
    base: String,
    ca: Option<PathBuf>,
    cert: Option<ClientCert>,
}

/// The credentials a request carries.
#[derive(Clone)]
enum Creds {
    None,
    Basic(&'static str, &'static str),
    /// `Authorization: <value>`.
    Authorization(String),
    /// Other headers, verbatim.
    Headers(Vec<String>),
}

#[derive(Debug)]
struct Reply {
    status: u16,
    headers: String,
    json: Value,
}

impl Reply {
    #[track_caller]
    fn ok(self) -> Value {
        assert_eq!(self.status, 200, "{self:?}");
        self.json
    }

    /// etcd's gateway error: `{"error": message, "message": message, "code": code}` with `status`.
    #[track_caller]
    fn assert_error(&self, status: u16, code: i64, message: &str) {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(self.json, json!({"error": message, "message": message, "code": code}), "{self:?}");
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.eq_ignore_ascii_case(name).then(|| value.trim())
        })
    }
}

impl Gateway {
    fn plain(server: &Server) -> Gateway {
        Gateway { base: format!("http://{}", server.endpoint()), ca: None, cert: None }
    }

    fn with_cert(&self, cert: &ClientCert) -> Gateway {
        Gateway { cert: Some(cert.clone()), ..self.clone() }
    }

    fn curl(&self, path: &str, creds: &Creds) -> Command {
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "-X", "POST", "--data-binary", "@-"]);
        if let Some(ca) = &self.ca {
            cmd.arg("--cacert").arg(ca);
        }
        if let Some(cert) = &self.cert {
            cmd.arg("--cert").arg(&cert.cert).arg("--key").arg(&cert.key);
        }
        match creds {
            Creds::None => {}
            Creds::Basic(user, password) => {
                cmd.args(["-u", &format!("{user}:{password}")]);
            }
            Creds::Authorization(value) => {
                cmd.args(["-H", &format!("Authorization: {value}")]);
            }
            Creds::Headers(headers) => {
                for header in headers {
                    cmd.args(["-H", header]);
                }
            }
        }
        cmd.arg(format!("{}{path}", self.base));
        cmd
    }

    /// `POST path` with `body` as JSON.
    fn post(&self, path: &str, body: Value, creds: &Creds) -> Reply {
        self.post_raw(path, &body.to_string(), creds)
    }

    fn post_raw(&self, path: &str, body: &str, creds: &Creds) -> Reply {
        // Headers (and etcd's HTTP trailers) to a file of their own, the body to stdout.
        let headers = tempfile::NamedTempFile::new().unwrap();
        let mut cmd = self.curl(path, creds);
        cmd.arg("-D").arg(headers.path()).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("run curl");
        child.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let body = String::from_utf8(out.stdout).unwrap();
        assert!(out.status.success(), "curl {path} failed: {}{body}", String::from_utf8_lossy(&out.stderr));
        let headers = std::fs::read_to_string(headers.path()).unwrap();
        let status = headers.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let json = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {body:?}"))
        };
        Reply { status, headers, json }
    }

    /// A streaming request (`/v3/watch`) whose answers arrive line by line.
    fn stream(&self, path: &str, body: Value, creds: &Creds) -> Stream {
        let mut cmd = self.curl(path, creds);
        cmd.arg("-N").stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null());
        let mut child = cmd.spawn().expect("run curl");
        child.stdin.take().unwrap().write_all(body.to_string().as_bytes()).unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Stream { child, lines }
    }

    fn metric(&self, name_and_labels: &str) -> u64 {
        let out = Command::new("curl").args(["-sS", &format!("{}/metrics", self.base)]).output().unwrap();
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .find_map(|line| line.strip_prefix(name_and_labels)?.trim().parse().ok())
            .unwrap_or(0)
    }

    fn logins(&self, outcome: &str) -> u64 {
        self.metric(&format!("keyward_gateway_basic_logins_total{{outcome=\"{outcome}\"}}"))
    }
}

/// A running curl stream; killed by PID on drop.
struct Stream {
    child: Child,
    lines: mpsc::Receiver<std::io::Result<String>>,
}

impl Stream {
    #[track_caller]
    fn next(&self) -> Value {
        let line = self.lines.recv_timeout(STREAM_WAIT).expect("a stream line").expect("read the stream");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"))
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------
// users
// ---------------------------------------------------------------------------

/// Through the gateway, without auth: root (password rootpw), alice (alicepw) with read-write on
/// ["a", "b"), bob (bobpw) with read-write on ["b", "c"); then auth enable.
fn users_and_auth(gw: &Gateway) {
    let none = Creds::None;
    let steps = [
        ("/v3/auth/user/add", json!({"name": "root", "password": "rootpw"})),
        ("/v3/auth/user/grant", json!({"user": "root", "role": "root"})),
        ("/v3/auth/user/add", json!({"name": "alice", "password": "alicepw"})),
        ("/v3/auth/role/add", json!({"name": "alice-role"})),
        (
            "/v3/auth/role/grant",
            json!({"name": "alice-role", "perm": {"permType": "READWRITE", "key": b64("a"), "range_end": b64("b")}}),
        ),
        ("/v3/auth/user/grant", json!({"user": "alice", "role": "alice-role"})),
        ("/v3/auth/user/add", json!({"name": "bob", "password": "bobpw"})),
        ("/v3/auth/role/add", json!({"name": "bob-role"})),
        (
            "/v3/auth/role/grant",
            json!({"name": "bob-role", "perm": {"permType": "READWRITE", "key": b64("b"), "range_end": b64("c")}}),
        ),
        ("/v3/auth/user/grant", json!({"user": "bob", "role": "bob-role"})),
        ("/v3/auth/enable", json!({})),
    ];
    for (path, body) in steps {
        gw.post(path, body, &none).ok();
    }
}

fn put(key: &str, value: &str) -> Value {
    json!({"key": b64(key), "value": b64(value)})
}

fn get(key: &str) -> Value {
    json!({"key": b64(key)})
}

fn keyward() -> Server {
    Server::start_with(Kind::Keyward, &["--bcrypt-cost", "4"])
}

fn token(gw: &Gateway, user: &str, password: &str) -> String {
    let answer = gw.post("/v3/auth/authenticate", json!({"name": user, "password": password}), &Creds::None).ok();
    answer["token"].as_str().expect("a token").to_string()
}

// ---------------------------------------------------------------------------
// Basic credentials
// ---------------------------------------------------------------------------

#[test]
fn basic_credentials_act_as_the_user() {
    let server = keyward();
    let gw = Gateway::plain(&server);
    users_and_auth(&gw);
    let alice = Creds::Basic("alice", "alicepw");
    gw.post("/v3/kv/put", put("a1", "v"), &alice).ok();
    let read = gw.post("/v3/kv/range", get("a1"), &alice).ok();
    assert_eq!(read["kvs"][0]["value"], b64("v"));
    // Outside her range: 403 with etcd's error JSON; bob's own range is his.
    gw.post("/v3/kv/put", put("b1", "v"), &alice).assert_error(403, 7, PERMISSION_DENIED);
    gw.post("/v3/kv/put", put("b1", "v"), &Creds::Basic("bob", "bobpw")).ok();
    // Without credentials the request has no user, exactly as etcd's gateway answers it.
    gw.post("/v3/kv/range", get("a1"), &Creds::None).assert_error(400, 3, USER_EMPTY);
}

#[test]
fn bad_basic_credentials_are_401_json_with_a_challenge() {
    let server = keyward();
    let gw = Gateway::plain(&server);
    users_and_auth(&gw);
    let wrong = gw.post("/v3/kv/range", get("a1"), &Creds::Basic("alice", "wrong"));
    wrong.assert_error(401, 3, AUTH_FAILED);
    assert!(wrong.header("www-authenticate").is_some_and(|c| c.starts_with("Basic ")), "{wrong:?}");
    gw.post("/v3/kv/range", get("a1"), &Creds::Basic("nobody", "x")).assert_error(401, 3, AUTH_FAILED);
    // Not base64, no colon: refused, never treated as "no credentials".
    for malformed in ["Basic !!!", &format!("Basic {}", b64("alice"))] {
        gw.post("/v3/kv/range", get("a1"), &Creds::Authorization(malformed.to_string())).assert_error(
            401,
            3,
            AUTH_FAILED,
        );
    }
}

#[test]
fn a_verified_login_is_reused_but_never_admits_another_password() {
    let server = keyward();
    let gw = Gateway::plain(&server);
    users_and_auth(&gw);
    let alice = Creds::Basic("alice", "alicepw");
    for _ in 0..3 {
        gw.post("/v3/kv/range", get("a1"), &alice).ok();
    }
    assert_eq!((gw.logins("verified"), gw.logins("cached")), (1, 2), "one Authenticate, then the cache");
    // After the right password was cached, a wrong one still runs (and fails) Authenticate every time.
    for attempt in 1..=2 {
        gw.post("/v3/kv/range", get("a1"), &Creds::Basic("alice", "alicepw2")).assert_error(401, 3, AUTH_FAILED);
        gw.post("/v3/kv/range", get("a1"), &Creds::Basic("alice", "alicep")).assert_error(401, 3, AUTH_FAILED);
        assert_eq!(gw.logins("refused"), 2 * attempt);
    }
    assert_eq!(gw.logins("verified"), 1);
}

#[test]
fn a_password_change_or_a_deleted_user_ends_a_cached_login() {
    let server = keyward();
    let gw = Gateway::plain(&server);
    users_and_auth(&gw);
    let (alice, bob, root) =
        (Creds::Basic("alice", "alicepw"), Creds::Basic("bob", "bobpw"), Creds::Basic("root", "rootpw"));
    gw.post("/v3/kv/range", get("a1"), &alice).ok();
    gw.post("/v3/kv/range", get("b1"), &bob).ok();
    gw.post("/v3/auth/user/changepw", json!({"name": "alice", "password": "new"}), &root).ok();
    gw.post("/v3/kv/range", get("a1"), &alice).assert_error(401, 3, AUTH_FAILED);
    gw.post("/v3/kv/range", get("a1"), &Creds::Basic("alice", "new")).ok();
    gw.post("/v3/auth/user/delete", json!({"name": "bob"}), &root).ok();
    gw.post("/v3/kv/range", get("b1"), &bob).assert_error(401, 3, AUTH_FAILED);
}

#[test]
fn an_unrelated_auth_change_keeps_a_cached_login() {
    let server = keyward();
    let gw = Gateway::plain(&server);
    users_and_auth(&gw);
    let alice = Creds::Basic("alice", "alicepw");
    gw.post("/v3/kv/put", put("a1", "1"), &alice).ok();
    // The auth revision moves, but not alice's credentials: her cached token still stands.
    gw.post("/v3/auth/role/add", json!({"name": "other"}), &Creds::Basic("root", "rootpw")).ok();
    let (verified, cached) = (gw.logins("verified"), gw.logins("cached"));
    gw.post("/v3/kv/put", put("a1", "2"), &alice).ok();
    assert_eq!(gw.logins("verified"), verified, "no bcrypt for an unrelated change");
    assert_eq!(gw.logins("cached"), cached + 1);
    let read = gw.post("/v3/kv/range", get("a1"), &alice).ok();
    assert_eq!((read["kvs"][0]["value"].clone(), read["kvs"][0]["version"].clone()), (json!(b64("2")), json!("2")));
}

#[test]
fn a_watch_with_basic_credentials_opens_after_an_unrelated_auth_change() {
    let server = keyward();
    let gw = Gateway::plain(&server);
    users_and_auth(&gw);
    let alice = Creds::Basic("alice", "alicepw");
    gw.post("/v3/kv/range", get("a1"), &alice).ok();
    gw.post("/v3/auth/role/add", json!({"name": "other"}), &Creds::Basic("root", "rootpw")).ok();
    let watch = gw.stream("/v3/watch", json!({"create_request": {"key": b64("a1")}}), &alice);
    let created = watch.next();
    assert_eq!(created["result"]["created"], json!(true), "{created}");
    assert_eq!(created["result"].get("canceled"), None, "{created}");
    gw.post("/v3/kv/put", put("a1", "x"), &alice).ok();
    let event = watch.next();
    assert_eq!(event["result"]["events"][0]["kv"]["value"], b64("x"), "{event}");
    // bob may not watch alice's keys: etcd's canceled answer.
    let denied = gw.stream("/v3/watch", json!({"create_request": {"key": b64("a1")}}), &Creds::Basic("bob", "bobpw"));
    let refused = denied.next();
    assert_eq!(refused["result"]["canceled"], json!(true), "{refused}");
    assert!(refused["result"]["cancel_reason"].as_str().unwrap().contains(PERMISSION_DENIED), "{refused}");
}

// ---------------------------------------------------------------------------
// tokens and headers
// ---------------------------------------------------------------------------

#[test]
fn an_etcd_token_in_the_authorization_header_acts_as_its_user() {
    let server = keyward();
    let gw = Gateway::plain(&server);
    users_and_auth(&gw);
    let alice = Creds::Authorization(token(&gw, "alice", "alicepw"));
    gw.post("/v3/kv/put", put("a1", "v"), &alice).ok();
    gw.post("/v3/kv/put", put("b1", "v"), &alice).assert_error(403, 7, PERMISSION_DENIED);
    let bogus = gw.post("/v3/kv/put", put("a1", "v"), &Creds::Authorization("bogus.1".into()));
    bogus.assert_error(401, 16, INVALID_AUTH_TOKEN);
}

#[test]
fn no_header_but_authorization_reaches_the_grpc_call() {
    let server = keyward();
    let gw = Gateway::plain(&server);
    users_and_auth(&gw);
    let root = token(&gw, "root", "rootpw");
    // gRPC metadata names as headers, and grpc-gateway's metadata prefix: all ignored, so the request
    // has no user. (Were they forwarded, root's token would make this succeed.)
    let smuggled = Creds::Headers(vec![format!("token: {root}"), format!("Grpc-Metadata-Token: {root}")]);
    gw.post("/v3/kv/range", get("a1"), &smuggled).assert_error(400, 3, USER_EMPTY);
    gw.post("/v3/kv/range", get("a1"), &Creds::Authorization(root)).ok();
}

// ---------------------------------------------------------------------------
// client certificates
// ---------------------------------------------------------------------------

/// A CA and leaves in a temp dir, made with rcgen.
struct Pki {
    dir: TempDir,
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::Builder::new().prefix("gateway-pki-").tempdir().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, "gateway test CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().unwrap();
        std::fs::write(dir.path().join("ca.pem"), params.self_signed(&key).unwrap().pem()).unwrap();
        Pki { dir, issuer: Issuer::new(params, key) }
    }

    fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    fn issue(&self, name: &str, cn: &str, server: bool) -> ClientCert {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        params.distinguished_name = dn;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        if server {
            params.extended_key_usages.push(ExtendedKeyUsagePurpose::ServerAuth);
            params.subject_alt_names = vec![SanType::IpAddress("127.0.0.1".parse().unwrap())];
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let paths = ClientCert {
            cert: self.dir.path().join(format!("{name}.pem")),
            key: self.dir.path().join(format!("{name}-key.pem")),
        };
        std::fs::write(&paths.cert, cert.pem()).unwrap();
        std::fs::write(&paths.key, key.serialize_pem()).unwrap();
        paths
    }
}

/// keyward on `https://` with `--client-cert-auth`; killed by PID on drop.
struct TlsMember {
    child: Child,
    port: u16,
    _dir: TempDir,
}

impl TlsMember {
    fn start(pki: &Pki, ready: &ClientCert) -> TlsMember {
        let dir = tempfile::Builder::new().prefix("gateway-tls-").tempdir().unwrap();
        let server = pki.issue("server", "server", true);
        let port = common::free_port();
        let client_url = format!("https://127.0.0.1:{port}");
        let peer_url = format!("http://127.0.0.1:{}", common::free_port());
        let (bin, mut args) = Kind::Keyward.program();
        args.extend(common::member_flags(&dir.path().join("data"), &client_url, &peer_url));
        let path = |p: &Path| p.to_str().unwrap().to_string();
        args.extend(["--bcrypt-cost".into(), "4".into(), "--client-cert-auth".into()]);
        args.extend(["--cert-file".into(), path(&server.cert), "--key-file".into(), path(&server.key)]);
        args.extend(["--trusted-ca-file".into(), path(&pki.ca())]);
        let log = std::fs::File::create(dir.path().join("server.log")).unwrap();
        let mut cmd = Command::new(bin);
        cmd.args(&args).stdin(Stdio::null()).stdout(log.try_clone().unwrap()).stderr(log);
        common::scrub_env(&mut cmd);
        let mut member = TlsMember { child: cmd.spawn().unwrap(), port, _dir: dir };
        let gw = member.gateway(&pki.ca()).with_cert(ready);
        let deadline = Instant::now() + common::START_TIMEOUT;
        loop {
            let health = Command::new("curl")
                .args(["-s", "--cacert", &path(&pki.ca()), "--cert", &path(&ready.cert), "--key", &path(&ready.key)])
                .arg(format!("{}/health", gw.base))
                .output()
                .unwrap();
            if String::from_utf8_lossy(&health.stdout).contains("true") {
                return member;
            }
            assert!(matches!(member.child.try_wait(), Ok(None)), "keyward exited during startup");
            assert!(Instant::now() < deadline, "keyward not ready on {}", gw.base);
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn gateway(&self, ca: &Path) -> Gateway {
        Gateway { base: format!("https://127.0.0.1:{}", self.port), ca: Some(ca.to_path_buf()), cert: None }
    }
}

impl Drop for TlsMember {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_client_certificate_is_the_user_through_the_gateway() {
    let pki = Pki::new();
    let (root_cert, alice_cert, carol_cert) =
        (pki.issue("root", "root", false), pki.issue("alice", "alice", false), pki.issue("carol", "carol", false));
    let member = TlsMember::start(&pki, &root_cert);
    let gw = member.gateway(&pki.ca());
    users_and_auth(&gw.with_cert(&root_cert));
    let alice = gw.with_cert(&alice_cert);
    // Her CN is her identity: her range is permitted, bob's is not. (Were the connection's identity
    // lost on the way to the gRPC service, as in etcd's gateway, both would be "user name is empty".)
    alice.post("/v3/kv/put", put("a1", "v"), &Creds::None).ok();
    alice.post("/v3/kv/put", put("b1", "v"), &Creds::None).assert_error(403, 7, PERMISSION_DENIED);
    // A certificate naming no user is not anyone.
    let carol = gw.with_cert(&carol_cert).post("/v3/kv/range", get("a1"), &Creds::None);
    assert_ne!(carol.status, 200, "{carol:?}");
    // Credentials win over the certificate, as a token does in etcd: as bob over alice's connection.
    alice.post("/v3/kv/put", put("b1", "v"), &Creds::Basic("bob", "bobpw")).ok();
    alice.post("/v3/kv/put", put("a2", "v"), &Creds::Basic("bob", "bobpw")).assert_error(403, 7, PERMISSION_DENIED);
    // Forwarding metadata sent as a header does not reach the member: alice stays alice.
    let root_der = std::fs::read_to_string(&root_cert.cert).unwrap();
    let forged = Creds::Headers(vec![format!("keyward-forwarded-client-cert: {}", b64(&root_der))]);
    alice.post("/v3/kv/put", put("b2", "v"), &forged).assert_error(403, 7, PERMISSION_DENIED);
    // The watch stream is hers too.
    let watch = alice.stream("/v3/watch", json!({"create_request": {"key": b64("a1")}}), &Creds::None);
    assert_eq!(watch.next()["result"]["created"], json!(true));
    alice.post("/v3/kv/put", put("a1", "w"), &Creds::None).ok();
    assert_eq!(watch.next()["result"]["events"][0]["kv"]["value"], b64("w"));
}

// ---------------------------------------------------------------------------
// the same answers as etcd's gateway
// ---------------------------------------------------------------------------

/// One differential step: a path, a body, the credentials (a user whose token the driver fetched from
/// each server's own /v3/auth/authenticate), and whether the error text is Go's or serde's own.
struct Step {
    path: &'static str,
    body: Value,
    user: Option<(&'static str, &'static str)>,
    foreign_message: bool,
    raw: Option<&'static str>,
}

fn step(path: &'static str, body: Value) -> Step {
    Step { path, body, user: None, foreign_message: false, raw: None }
}

impl Step {
    fn by(mut self, user: &'static str, password: &'static str) -> Step {
        self.user = Some((user, password));
        self
    }
}

/// Replaces what legitimately differs between two servers: member and cluster ids, terms, tokens,
/// storage sizes and hashes, the version, URLs (other ports), a lease's remaining TTL. Ids the steps
/// choose themselves (lease 1234) are short and compared; server-chosen ones (member ids) are not.
fn normalize(value: &mut Value) {
    const OPAQUE: [&str; 13] = [
        "cluster_id",
        "member_id",
        "raft_term",
        "leader",
        "token",
        "raftIndex",
        "raftTerm",
        "raftAppliedIndex",
        "dbSize",
        "dbSizeInUse",
        "hash",
        "peerURLs",
        "clientURLs",
    ];
    match value {
        Value::Object(map) => {
            let status = map.contains_key("dbSize");
            let time_to_live = map.contains_key("grantedTTL");
            for (key, field) in map.iter_mut() {
                let opaque = OPAQUE.contains(&key.as_str())
                    || (key == "ID" && field.as_str().is_none_or(|id| id.len() >= 10))
                    || (status && key == "version")
                    || (time_to_live && key == "TTL");
                if opaque {
                    *field = json!("<opaque>");
                } else {
                    normalize(field);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalize),
        _ => {}
    }
}

fn differential_steps() -> Vec<Step> {
    let mut bad_json = step("/v3/kv/range", Value::Null);
    bad_json.raw = Some("{not json");
    bad_json.foreign_message = true;
    vec![
        step("/v3/kv/put", put("foo", "bar")),
        step("/v3/kv/put", json!({"key": b64("foo"), "value": b64("bar2"), "prev_kv": true})),
        step("/v3/kv/range", get("foo")),
        step("/v3/kv/range", json!({"key": b64("foo"), "rangeEnd": b64("fop"), "count_only": true})),
        step(
            "/v3/kv/range",
            json!({"key": b64("f"), "range_end": b64("g"), "sort_order": "DESCEND", "limit": "5", "unknown": 1}),
        ),
        step("/v3/kv/range", json!({"key": b64("foo"), "keys_only": true, "serializable": true})),
        step("/v3/kv/range", get("")),
        bad_json,
        step("/v3/kv/put", put("foo2", "x")),
        step(
            "/v3/kv/txn",
            json!({
                "compare": [{"key": b64("foo"), "result": "EQUAL", "target": "VALUE", "value": b64("bar2")}],
                "success": [{"request_range": {"key": b64("foo")}}, {"request_put": put("t", "1")}],
                "failure": [{"request_delete_range": {"key": b64("foo")}}]
            }),
        ),
        step(
            "/v3/kv/txn",
            json!({"compare": [{"key": b64("foo"), "target": "VERSION", "result": "GREATER", "version": "9"}]}),
        ),
        step("/v3/kv/deleterange", json!({"key": b64("foo2"), "prev_kv": true})),
        step("/v3/kv/compaction", json!({"revision": "3"})),
        step("/v3/kv/range", json!({"key": b64("foo"), "revision": "2"})),
        step("/v3/kv/range", json!({"key": b64("foo"), "revision": "99"})),
        step("/v3/lease/grant", json!({"TTL": "60", "ID": "1234"})),
        step("/v3/lease/grant", json!({"TTL": 60, "ID": 1234})),
        step("/v3/kv/put", json!({"key": b64("leased"), "value": b64("v"), "lease": "1234"})),
        step("/v3/lease/timetolive", json!({"ID": "1234", "keys": true})),
        step("/v3/kv/lease/timetolive", json!({"ID": "1234"})),
        step("/v3/lease/leases", json!({})),
        step("/v3/lease/revoke", json!({"ID": "1234"})),
        step("/v3/kv/lease/revoke", json!({"ID": "1234"})),
        step("/v3/kv/range", get("leased")),
        step("/v3/cluster/member/list", json!({})),
        step("/v3/maintenance/status", json!({})),
        step("/v3/maintenance/alarm", json!({"action": "GET"})),
        step("/v3/auth/user/add", json!({"name": "root", "password": "rootpw"})),
        step("/v3/auth/user/grant", json!({"user": "root", "role": "root"})),
        step("/v3/auth/user/add", json!({"name": "alice", "password": "alicepw"})),
        step("/v3/auth/user/add", json!({"name": "alice", "password": "alicepw"})),
        step("/v3/auth/role/add", json!({"name": "reader"})),
        step(
            "/v3/auth/role/grant",
            json!({"name": "reader", "perm": {"permType": "READWRITE", "key": b64("a"), "range_end": b64("b")}}),
        ),
        step("/v3/auth/user/grant", json!({"user": "alice", "role": "reader"})),
        step("/v3/auth/enable", json!({})),
        step("/v3/kv/range", get("a1")),
        step("/v3/auth/authenticate", json!({"name": "alice", "password": "nope"})),
        step("/v3/auth/authenticate", json!({"name": "alice", "password": "alicepw"})),
        step("/v3/kv/put", put("a1", "v")).by("alice", "alicepw"),
        step("/v3/kv/range", get("a1")).by("alice", "alicepw"),
        step("/v3/kv/put", put("z", "v")).by("alice", "alicepw"),
        step("/v3/auth/user/get", json!({"name": "alice"})).by("alice", "alicepw"),
        step("/v3/auth/role/get", json!({"role": "reader"})).by("alice", "alicepw"),
        step("/v3/auth/user/list", json!({})).by("alice", "alicepw"),
        step("/v3/auth/user/list", json!({})).by("root", "rootpw"),
        step("/v3/auth/role/list", json!({})).by("root", "rootpw"),
        step("/v3/auth/role/revoke", json!({"role": "reader", "key": b64("a"), "range_end": b64("b")}))
            .by("root", "rootpw"),
        step("/v3/auth/role/get", json!({"role": "reader"})).by("root", "rootpw"),
        step("/v3/auth/user/revoke", json!({"name": "alice", "role": "reader"})).by("root", "rootpw"),
        step("/v3/auth/role/delete", json!({"role": "reader"})).by("root", "rootpw"),
        step("/v3/auth/user/delete", json!({"name": "alice"})).by("root", "rootpw"),
        step("/v3/auth/disable", json!({})).by("root", "rootpw"),
    ]
}

/// Runs `step` on one server and returns `(status, normalised JSON)`.
fn run_step(gw: &Gateway, step: &Step) -> (u16, Value) {
    let creds = match step.user {
        Some((user, password)) => Creds::Authorization(token(gw, user, password)),
        None => Creds::None,
    };
    let reply = match step.raw {
        Some(raw) => gw.post_raw(step.path, raw, &creds),
        None => gw.post(step.path, step.body.clone(), &creds),
    };
    let mut json = reply.json;
    if step.foreign_message {
        // Go's and serde's parse errors are worded differently; the shape and code must agree.
        for key in ["error", "message"] {
            if let Some(field) = json.get_mut(key) {
                *field = json!("<parse error>");
            }
        }
    }
    normalize(&mut json);
    (reply.status, json)
}

#[test]
fn gateway_answers_as_etcds_gateway() {
    let (etcd, candidate) = common::start_pair_blocking(&["--bcrypt-cost", "4"]);
    let (reference, under_test) = (Gateway::plain(&etcd), Gateway::plain(&candidate));
    let mut differences = Vec::new();
    for step in differential_steps() {
        let expected = run_step(&reference, &step);
        let got = run_step(&under_test, &step);
        if expected != got {
            differences.push(format!(
                "POST {} {}\n  etcd:    {} {}\n  keyward: {} {}",
                step.path, step.body, expected.0, expected.1, got.0, got.1
            ));
        }
    }
    // The watch stream: the created answer and one event, line for line.
    let watch = |gw: &Gateway| {
        let stream =
            gw.stream("/v3/watch", json!({"create_request": {"key": b64("w"), "prev_kv": true}}), &Creds::None);
        let created = stream.next();
        gw.post("/v3/kv/put", put("w", "1"), &Creds::None).ok();
        gw.post("/v3/kv/put", put("w", "2"), &Creds::None).ok();
        let mut lines = vec![created, stream.next(), stream.next()];
        lines.iter_mut().for_each(normalize);
        lines
    };
    let (expected, got) = (watch(&reference), watch(&under_test));
    if expected != got {
        differences.push(format!("watch\n  etcd:    {expected:?}\n  keyward: {got:?}"));
    }
    assert!(differences.is_empty(), "{} differences:\n{}", differences.len(), differences.join("\n"));
}

// ---------------------------------------------------------------------------
// streams end with their credentials
// ---------------------------------------------------------------------------

/// A gateway stream whose request body stays open (a keep-alive stream sends as it goes): raw HTTP/1.1
/// with a chunked body, since curl reads all of its input before sending a body it must frame.
struct OpenStream {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
    headers_read: bool,
    /// Answer lines read but not yet returned, and the start of one not complete yet.
    lines: std::collections::VecDeque<String>,
    partial: String,
    /// The response's last chunk was read.
    ended: bool,
}

impl OpenStream {
    fn open(server: &Server, path: &str, creds: (&str, &str)) -> OpenStream {
        let writer = TcpStream::connect(server.endpoint()).expect("connect to the gateway");
        writer.set_read_timeout(Some(STREAM_WAIT)).unwrap();
        let reader = BufReader::new(writer.try_clone().unwrap());
        let mut stream = OpenStream {
            writer,
            reader,
            headers_read: false,
            lines: Default::default(),
            partial: String::new(),
            ended: false,
        };
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Basic {}\r\nContent-Type: application/json\r\n\
             Transfer-Encoding: chunked\r\n\r\n",
            server.endpoint(),
            b64(&format!("{}:{}", creds.0, creds.1)),
        );
        stream.writer.write_all(head.as_bytes()).unwrap();
        stream
    }

    /// Sends one request of the stream, as one chunk of the body.
    fn send(&mut self, request: Value) {
        let data = request.to_string();
        write!(self.writer, "{:x}\r\n{data}\r\n", data.len()).unwrap();
        self.writer.flush().unwrap();
    }

    /// The next answer (`None`: the response ended). Fails the test if nothing comes in `STREAM_WAIT`.
    #[track_caller]
    fn next(&mut self) -> Option<Value> {
        if !self.headers_read {
            let mut status = String::new();
            self.reader.read_line(&mut status).expect("the response's status in time");
            assert!(status.starts_with("HTTP/1.1 200"), "{status:?}");
            loop {
                let mut line = String::new();
                self.reader.read_line(&mut line).expect("a response header");
                if line == "\r\n" || line.is_empty() {
                    break;
                }
            }
            self.headers_read = true;
        }
        loop {
            if let Some(line) = self.lines.pop_front() {
                return Some(serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}")));
            }
            if self.ended {
                return None;
            }
            let mut size = String::new();
            self.reader.read_line(&mut size).expect("the next chunk in time");
            let size = usize::from_str_radix(size.trim(), 16).unwrap_or_else(|_| panic!("a chunk size: {size:?}"));
            if size == 0 {
                // The last answer (an error) may end without a newline.
                self.ended = true;
                let last = std::mem::take(&mut self.partial);
                self.lines.extend((!last.trim().is_empty()).then(|| last.trim().to_string()));
                continue;
            }
            let mut data = vec![0; size + 2]; // and its CRLF
            self.reader.read_exact(&mut data).unwrap();
            self.partial.push_str(std::str::from_utf8(&data[..size]).unwrap());
            while let Some(end) = self.partial.find('\n') {
                let line: String = self.partial.drain(..=end).collect();
                self.lines.push_back(line.trim().to_string());
            }
        }
    }
}

/// A watch and a keep-alive opened with Basic credentials end at the apply that changes the password
/// (nothing is sent or written after it): the watch is canceled with etcd's reason, the keep-alive
/// stream ends with etcd's error. The gateway logged in with the password; its token is void.
#[test]
fn streams_opened_with_basic_credentials_end_when_the_password_changes() {
    let server = keyward();
    let gw = Gateway::plain(&server);
    users_and_auth(&gw);
    let (alice, root) = (Creds::Basic("alice", "alicepw"), Creds::Basic("root", "rootpw"));
    let watch = gw.stream("/v3/watch", json!({"create_request": {"key": b64("a1")}}), &alice);
    let created = watch.next();
    assert_eq!(created["result"]["created"], json!(true), "{created}");
    let lease = gw.post("/v3/lease/grant", json!({"TTL": 60}), &alice).ok();
    let mut keep_alive = OpenStream::open(&server, "/v3/lease/keepalive", ("alice", "alicepw"));
    keep_alive.send(json!({"ID": lease["ID"]}));
    let kept = keep_alive.next().expect("a keep-alive answer");
    assert_eq!(kept["result"]["ID"], lease["ID"], "{kept}");
    // An unrelated change leaves both open (the twin).
    gw.post("/v3/auth/user/changepw", json!({"name": "bob", "password": "new"}), &root).ok();
    gw.post("/v3/kv/put", put("a1", "x"), &alice).ok();
    let event = watch.next();
    assert_eq!(event["result"]["events"][0]["kv"]["value"], b64("x"), "{event}");
    keep_alive.send(json!({"ID": lease["ID"]}));
    assert_eq!(keep_alive.next().expect("a keep-alive answer")["result"]["ID"], lease["ID"]);

    gw.post("/v3/auth/user/changepw", json!({"name": "alice", "password": "new"}), &root).ok();
    let canceled = watch.next();
    assert_eq!(canceled["result"]["canceled"], json!(true), "{canceled}");
    let reason = canceled["result"]["cancel_reason"].as_str().unwrap_or_default();
    assert!(reason.contains(AUTH_OLD_REVISION), "{canceled}");
    let ended = keep_alive.next().expect("the keep-alive stream's error");
    assert_eq!(ended["error"]["message"], json!(AUTH_OLD_REVISION), "{ended}");
    assert_eq!(keep_alive.next(), None, "the keep-alive stream ended");
}

/// A watch opened with a client certificate is judged by its user's permissions now: a change of
/// that user's password does not end it (the certificate, not a password, is its credential).
#[test]
fn a_watch_opened_with_a_certificate_outlives_a_password_change() {
    let pki = Pki::new();
    let (root_cert, alice_cert) = (pki.issue("root", "root", false), pki.issue("alice", "alice", false));
    let member = TlsMember::start(&pki, &root_cert);
    let gw = member.gateway(&pki.ca());
    let root = gw.with_cert(&root_cert);
    users_and_auth(&root);
    let alice = gw.with_cert(&alice_cert);
    let watch = alice.stream("/v3/watch", json!({"create_request": {"key": b64("a1")}}), &Creds::None);
    assert_eq!(watch.next()["result"]["created"], json!(true));
    root.post("/v3/auth/user/changepw", json!({"name": "alice", "password": "new"}), &Creds::None).ok();
    alice.post("/v3/kv/put", put("a1", "w"), &Creds::None).ok();
    let event = watch.next();
    assert_eq!(event["result"]["events"][0]["kv"]["value"], b64("w"), "{event}");
}
