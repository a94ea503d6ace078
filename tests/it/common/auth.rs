//! Helpers shared by the auth tests (`auth_etcdctl.rs`, `auth_enforcement.rs`, `auth_client.rs`, and
//! the cluster, login-throttle and space tests).
//!
//! * [`JwtKeys`]: an RS256 key pair generated at test time with the openssl CLI into a temp dir (never
//!   committed), and the `--auth-token jwt,...` flag that both etcd 3.4 and keyward accept.
//! * [`AuthServer`]: a server with a root user (password [`ROOT_PW`]) and auth enabled, a root client,
//!   and one-call users with their own role and permissions.
//! * raw gRPC clients built from keyward's own generated protos, for requests that must carry a chosen
//!   token (an old one, a bogus one, or one in the `authorization` header).

use std::path::PathBuf;
use std::process::Command;

use etcd_client::{Client, ConnectOptions, Permission};
use tempfile::TempDir;
use tonic::transport::Channel;

use super::etcd_errors::PERMISSION_DENIED;
use super::{Kind, Server};

pub(crate) const ROOT_PW: &str = "rootpw";

/// Fast bcrypt for servers whose tests do not measure hashing (both etcd 3.4 and keyward take it).
pub(crate) const FAST_BCRYPT: [&str; 2] = ["--bcrypt-cost", "4"];

// ---------------------------------------------------------------------------
// JWT keys
// ---------------------------------------------------------------------------

/// An RSA key pair in a temp dir (removed on drop; keep it alive as long as the servers using it).
pub(crate) struct JwtKeys {
    _dir: TempDir,
    pub private_key: PathBuf,
    pub public_key: PathBuf,
}

fn openssl(args: &[&str]) {
    let out = Command::new("openssl").args(args).output().expect("run the openssl CLI");
    assert!(
        out.status.success(),
        "openssl {} failed: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl JwtKeys {
    /// A fresh 2048-bit RSA key pair (PKCS#8 private key, SubjectPublicKeyInfo public key).
    pub(crate) fn generate() -> JwtKeys {
        let dir = tempfile::Builder::new().prefix("auth-jwt-keys-").tempdir().expect("temp dir for JWT keys");
        let private_key = dir.path().join("jwt_rs256.key");
        let public_key = dir.path().join("jwt_rs256.pub");
        let (private_s, public_s) = (private_key.display().to_string(), public_key.display().to_string());
        openssl(&["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", &private_s]);
        openssl(&["pkey", "-in", &private_s, "-pubout", "-out", &public_s]);
        JwtKeys { _dir: dir, private_key, public_key }
    }

    /// The value of `--auth-token` for RS256 tokens with a 5 minute TTL.
    pub(crate) fn auth_token(&self) -> String {
        format!(
            "jwt,pub-key={},priv-key={},sign-method=RS256,ttl=5m",
            self.public_key.display(),
            self.private_key.display()
        )
    }

    /// `["--auth-token", "jwt,..."]`.
    pub(crate) fn args(&self) -> Vec<String> {
        vec!["--auth-token".to_string(), self.auth_token()]
    }
}

/// Which token provider a test runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TokenKind {
    Simple,
    Jwt,
}

/// Server flags for a token kind, plus the keys that must outlive the server (JWT only).
pub(crate) fn token_args(token: TokenKind) -> (Vec<String>, Option<JwtKeys>) {
    let mut args: Vec<String> = FAST_BCRYPT.iter().map(|s| s.to_string()).collect();
    match token {
        TokenKind::Simple => (args, None),
        TokenKind::Jwt => {
            let keys = JwtKeys::generate();
            args.extend(keys.args());
            (args, Some(keys))
        }
    }
}

// ---------------------------------------------------------------------------
// errors
// ---------------------------------------------------------------------------

/// The gRPC message of an etcd-client error (its Display for anything that is not a status).
pub(crate) fn msg(e: &etcd_client::Error) -> String {
    match e {
        etcd_client::Error::GRpcStatus(s) => s.message().to_string(),
        other => other.to_string(),
    }
}

/// Asserts the result is an error with exactly this etcd message.
#[track_caller]
pub(crate) fn assert_err<T: std::fmt::Debug>(what: &str, r: Result<T, etcd_client::Error>, expected: &str) {
    match r {
        Ok(v) => panic!("{what}: expected error {expected:?}, got success: {v:?}"),
        Err(e) => assert_eq!(msg(&e), expected, "{what}: wrong error ({e:?})"),
    }
}

/// Asserts the result is `etcdserver: permission denied`.
#[track_caller]
pub(crate) fn assert_denied<T: std::fmt::Debug>(what: &str, r: Result<T, etcd_client::Error>) {
    assert_err(what, r, PERMISSION_DENIED)
}

/// Unwraps a result that must succeed.
#[track_caller]
pub(crate) fn assert_ok<T>(what: &str, r: Result<T, etcd_client::Error>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{what}: expected success, got {e:?}"),
    }
}

// ---------------------------------------------------------------------------
// a server with auth enabled
// ---------------------------------------------------------------------------

pub(crate) async fn connect(ep: &str) -> Client {
    Client::connect([ep], None).await.unwrap_or_else(|e| panic!("connect to {ep}: {e}"))
}

pub(crate) async fn connect_as(ep: &str, user: &str, pw: &str) -> Client {
    try_connect_as(ep, user, pw).await.unwrap_or_else(|e| panic!("connect to {ep} as {user}: {e}"))
}

pub(crate) async fn try_connect_as(ep: &str, user: &str, pw: &str) -> Result<Client, etcd_client::Error> {
    Client::connect([ep], Some(ConnectOptions::new().with_user(user, pw))).await
}

/// Creates user `root` (password [`ROOT_PW`]) with role `root` and enables auth, as `etcdctl auth
/// enable` does; returns a client authenticated as root.
pub(crate) async fn enable_auth(ep: &str) -> Client {
    let mut c = connect(ep).await;
    assert_ok("user add root", c.user_add("root", ROOT_PW, None).await);
    assert_ok("role add root", c.role_add("root").await);
    assert_ok("grant root to root", c.user_grant_role("root", "root").await);
    assert_ok("auth enable", c.auth_enable().await);
    connect_as(ep, "root", ROOT_PW).await
}

/// A running server with auth enabled and a root client (the server is killed on drop).
pub(crate) struct AuthServer {
    pub server: Server,
    pub root: Client,
    /// The JWT key pair the server was started with, if any. Declared after `server`, so the key
    /// files outlive the process that reads them.
    pub keys: Option<JwtKeys>,
}

impl AuthServer {
    /// keyward (or etcd under self-test) with `--bcrypt-cost 4` and auth enabled.
    pub(crate) async fn start() -> AuthServer {
        AuthServer::start_with(Kind::under_test(), &FAST_BCRYPT).await
    }

    /// keyward (or etcd under self-test) with auth enabled and the flags of [`token_args`]: simple
    /// tokens, or JWTs signed with a fresh key pair of its own (kept in `keys` while it runs).
    pub(crate) async fn start_with_token(token: TokenKind) -> AuthServer {
        let (args, keys) = token_args(token);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut s = AuthServer::start_with(Kind::under_test(), &args).await;
        s.keys = keys;
        s
    }

    pub(crate) async fn start_with(kind: Kind, args: &[&str]) -> AuthServer {
        let server = Server::start_with(kind, args);
        let root = enable_auth(&server.endpoint()).await;
        AuthServer { server, root, keys: None }
    }

    pub(crate) fn ep(&self) -> String {
        self.server.endpoint()
    }

    /// Adds `name` (password `{name}pw`) holding a fresh role `{name}-role` with `perms`, and
    /// returns a client authenticated as that user.
    pub(crate) async fn user(&mut self, name: &str, perms: &[Permission]) -> Client {
        let pw = format!("{name}pw");
        self.add_user(name, &pw, perms).await;
        connect_as(&self.ep(), name, &pw).await
    }

    /// Adds `name` with password `pw` and a role `{name}-role` holding `perms`.
    pub(crate) async fn add_user(&mut self, name: &str, pw: &str, perms: &[Permission]) {
        let role = format!("{name}-role");
        assert_ok("user add", self.root.user_add(name, pw, None).await);
        assert_ok("role add", self.root.role_add(role.as_str()).await);
        for p in perms {
            self.grant(&role, p.clone()).await;
        }
        assert_ok("grant role", self.root.user_grant_role(name, role.as_str()).await);
    }

    /// Grants `perm` to `role` (as root).
    pub(crate) async fn grant(&mut self, role: &str, perm: Permission) {
        assert_ok("grant permission", self.root.role_grant_permission(role, perm).await);
    }
}

// ---------------------------------------------------------------------------
// raw gRPC (keyward's own generated clients): requests with a chosen token
// ---------------------------------------------------------------------------

pub(crate) use keyward::proto::etcdserverpb as pb;

pub(crate) async fn channel(ep: &str) -> Channel {
    Channel::from_shared(format!("http://{ep}"))
        .expect("endpoint uri")
        .connect()
        .await
        .unwrap_or_else(|e| panic!("raw channel to {ep}: {e}"))
}

/// `msg` with the token in metadata header `header` (`token` as etcd 3.4 clients send it,
/// `authorization` as newer ones do).
pub(crate) fn with_token<T>(msg: T, header: &'static str, token: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut().insert(header, token.parse().expect("token is ASCII"));
    req
}

/// A token for `user` from a raw Authenticate call (no client-side caching or re-authentication).
pub(crate) async fn raw_token(ep: &str, user: &str, pw: &str) -> Result<String, tonic::Status> {
    let mut auth = pb::auth_client::AuthClient::new(channel(ep).await);
    let req = pb::AuthenticateRequest { name: user.to_string(), password: pw.to_string() };
    Ok(auth.authenticate(req).await?.into_inner().token)
}

/// A raw Range of one key with `token` in the `token` header.
pub(crate) async fn raw_get(ch: &Channel, token: &str, key: &str) -> Result<pb::RangeResponse, tonic::Status> {
    let mut kv = pb::kv_client::KvClient::new(ch.clone());
    let req = pb::RangeRequest { key: key.as_bytes().to_vec(), ..Default::default() };
    Ok(kv.range(with_token(req, "token", token)).await?.into_inner())
}

/// A raw Put with `token` in the `token` header.
pub(crate) async fn raw_put(
    ch: &Channel,
    token: &str,
    key: &str,
    value: &str,
) -> Result<pb::PutResponse, tonic::Status> {
    let mut kv = pb::kv_client::KvClient::new(ch.clone());
    let req = pb::PutRequest { key: key.as_bytes().to_vec(), value: value.as_bytes().to_vec(), ..Default::default() };
    Ok(kv.put(with_token(req, "token", token)).await?.into_inner())
}

// ---------------------------------------------------------------------------
// clients from another loopback address
// ---------------------------------------------------------------------------

/// Dials `target` from the loopback address `from` (the server still listens on 127.0.0.1 only):
/// another client address on the same machine.
#[derive(Clone)]
pub(crate) struct DialFrom {
    pub from: std::net::Ipv4Addr,
    pub target: std::net::SocketAddr,
}

pub(crate) type Dialed = std::pin::Pin<
    Box<dyn std::future::Future<Output = std::io::Result<hyper_util::rt::TokioIo<tokio::net::TcpStream>>> + Send>,
>;

impl tonic::codegen::Service<tonic::transport::Uri> for DialFrom {
    type Response = hyper_util::rt::TokioIo<tokio::net::TcpStream>;
    type Error = std::io::Error;
    type Future = Dialed;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: tonic::transport::Uri) -> Dialed {
        let DialFrom { from, target } = self.clone();
        Box::pin(async move {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind((from, 0).into())?;
            socket.set_nodelay(true)?;
            Ok(hyper_util::rt::TokioIo::new(socket.connect(target).await?))
        })
    }
}

pub(crate) async fn channel_from(ep: &str, from: std::net::Ipv4Addr) -> tonic::transport::Channel {
    let target = ep.parse().expect("host:port");
    tonic::transport::Endpoint::from_shared(format!("http://{ep}"))
        .unwrap()
        .connect_with_connector(DialFrom { from, target })
        .await
        .expect("connect from another loopback address")
}

pub(crate) async fn login_on(
    ch: &tonic::transport::Channel,
    user: &str,
    pw: &str,
) -> (Result<String, tonic::Status>, std::time::Duration) {
    let mut auth = pb::auth_client::AuthClient::new(ch.clone());
    let started = std::time::Instant::now();
    let req = pb::AuthenticateRequest { name: user.to_string(), password: pw.to_string() };
    let result = auth.authenticate(req).await.map(|r| r.into_inner().token);
    (result, started.elapsed())
}
