//! Issue 28, finding 1: identity is decided from verified sources only. A client may put keyward's
//! metadata names anywhere it controls — HTTP/2 headers and request trailers, `-bin` variants,
//! duplicates, mixed case, an HTTP/1.1 chunked body's trailer, the gateway's headers — and the member
//! still sees exactly who the client proved to be, at the address it really connects from.
//!
//! The requests are written by hand (hyper's HTTP/2 client with a trailers frame, raw HTTP/1.1 over
//! TLS) because no gRPC client sends request trailers. The oracle is the member's audit log
//! (`docs/audit-log.md`): each probe ranges over a key of its own, and the line the member writes for
//! it names the user, the credential's source and the client address the member acted on.
//!
//! Run alone: `cargo test --test it forged_identity:: -- --test-threads=2`.

use std::convert::Infallible;
use std::fs;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use proptest::prelude::*;
use prost::Message as _;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::pki::{Cert, Pki};
use crate::common::{self, grpc_frame};
use keyward::proto::etcdserverpb::{
    AuthUserListResponse, AuthenticateRequest, AuthenticateResponse, RangeRequest, RangeResponse,
};

/// How long a process gets to start, and one request to be answered.
const PATIENCE: Duration = Duration::from_secs(30);
const FORWARDED_CERT: &str = "keyward-forwarded-client-cert";
const FORWARDED_ADDR: &str = "keyward-forwarded-client-addr";
/// An address no client of these tests connects from.
const FORGED_ADDR: &str = "203.0.113.7:4242";
const CAROL_PASSWORD: &str = "carol-pw";

// ---------------------------------------------------------------------------
// the attack of the finding, plainly
// ---------------------------------------------------------------------------

/// alice (no permission on `/secret`, none on users) sends root's public certificate in her HTTP/2
/// request trailers through the forwarding proxy. Before the fix the member merged the trailers into
/// the metadata and served her as root.
#[test]
fn root_certificate_in_request_trailers_through_the_proxy_does_not_make_alice_root() {
    let setup = Setup::start();
    let root_cert = forwarded(&setup.pki.root);
    runtime().block_on(async {
        let trailers = [(FORWARDED_CERT.to_string(), root_cert.clone())];
        let range = RangeRequest { key: b"/secret".to_vec(), ..Default::default() }.encode_to_vec();
        let read = setup.proxy_h2(&setup.alice).call("/etcdserverpb.KV/Range", range.clone(), &[], &trailers).await;
        assert_eq!(read.status, Some(7), "alice reading /secret with root's certificate in trailers: {read:?}");
        assert_eq!(read.message, "etcdserver:%20permission%20denied", "{read:?}");
        let list = setup.proxy_h2(&setup.alice).call("/etcdserverpb.Auth/UserList", vec![], &[], &trailers).await;
        assert_eq!(list.status, Some(7), "alice listing users with root's certificate in trailers: {list:?}");
        // Twin: the same calls as root (his own certificate at the proxy) are served, so the refusals
        // above are about alice, not a broken path.
        let read = setup.proxy_h2(&setup.pki.root).call("/etcdserverpb.KV/Range", range, &[], &[]).await;
        assert_eq!(read.status, Some(0), "{read:?}");
        let kvs = RangeResponse::decode(read.message_bytes.as_slice()).expect("a RangeResponse").kvs;
        assert_eq!(kvs.len(), 1, "root reads /secret");
        let list = setup.proxy_h2(&setup.pki.root).call("/etcdserverpb.Auth/UserList", vec![], &[], &[]).await;
        assert_eq!(list.status, Some(0), "{list:?}");
        let users = AuthUserListResponse::decode(list.message_bytes.as_slice()).expect("a UserListResponse").users;
        assert!(users.contains(&"alice".to_string()), "{users:?}");
    });
}

/// The same trick on the address: a forged `keyward-forwarded-client-addr` in the trailers does not
/// choose the address the member records (and throttles failed logins under).
#[test]
fn a_forged_client_address_in_request_trailers_is_not_what_the_member_records() {
    let setup = Setup::start();
    runtime().block_on(async {
        let key = setup.probe_key();
        let trailers = [(FORWARDED_ADDR.to_string(), FORGED_ADDR.to_string())];
        let reply = setup.proxy_h2(&setup.alice).call("/etcdserverpb.KV/Range", range_of(&key), &[], &trailers).await;
        assert_eq!(reply.status, Some(7), "{reply:?}");
        let line = setup.audit_line(&key).expect("an audit line for the probe");
        assert_eq!(line.client, reply.local.to_string(), "{line:?}");
        assert_eq!(line.user, "alice", "{line:?}");
    });
}

/// The member holds on its own, whatever the proxy in front of it (an older one, say) passes on: on a
/// connection of the trusted proxy, request trailers do not override the certificate and address in
/// its headers.
#[test]
fn a_trusted_proxys_request_trailers_do_not_override_its_headers() {
    let setup = Setup::start();
    runtime().block_on(async {
        let key = setup.probe_key();
        let headers = [
            (FORWARDED_CERT.to_string(), forwarded(&setup.alice)),
            (FORWARDED_ADDR.to_string(), "192.0.2.10:1000".to_string()),
        ];
        let trailers = [
            (FORWARDED_CERT.to_string(), forwarded(&setup.pki.root)),
            (FORWARDED_ADDR.to_string(), FORGED_ADDR.to_string()),
        ];
        let reply = setup
            .direct_h2(&setup.proxy_cert)
            .call("/etcdserverpb.KV/Range", range_of(&key), &headers, &trailers)
            .await;
        assert_eq!(reply.status, Some(7), "{reply:?}");
        let line = setup.audit_line(&key).expect("an audit line for the probe");
        let want = AuditLine {
            user: "alice".into(),
            source: "forwarded_certificate".into(),
            client: "192.0.2.10:1000".into(),
        };
        assert_eq!(line, want);
        // Twin: the trusted proxy naming root in its headers is root (that is what trusting it means).
        let key = setup.probe_key();
        let root_headers = [(FORWARDED_CERT.to_string(), forwarded(&setup.pki.root))];
        let reply =
            setup.direct_h2(&setup.proxy_cert).call("/etcdserverpb.KV/Range", range_of(&key), &root_headers, &[]).await;
        assert_eq!(reply.status, Some(0), "{reply:?}");
        assert_eq!(setup.audit_line(&key).map(|l| l.user), Some("root".to_string()));
    });
}

// ---------------------------------------------------------------------------
// the proxy alone: what reaches a member
// ---------------------------------------------------------------------------

/// What a stand-in member saw of one forwarded request.
#[derive(Debug)]
struct Arrived {
    path: String,
    /// Every `keyward-` header, as `name=value`.
    keyward_headers: Vec<String>,
    /// The names of any request trailers.
    trailers: Vec<String>,
}

/// A stand-in member (HTTP/2, plain text) that records what each request carried, headers and
/// trailers, and answers gRPC OK with no message. `/health` is healthy.
fn recording_member(rt: &tokio::runtime::Runtime) -> (SocketAddr, std::sync::mpsc::Receiver<Arrived>) {
    use http_body_util::Full;
    let (seen_tx, seen_rx) = std::sync::mpsc::channel();
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            let seen_tx = seen_tx.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                    let seen_tx = seen_tx.clone();
                    async move {
                        let path = request.uri().path().to_string();
                        if path == "/health" {
                            let body = Full::new(Bytes::from_static(b"{\"health\":\"true\"}"));
                            return Ok::<_, Infallible>(http::Response::new(body));
                        }
                        let keyward_headers = request
                            .headers()
                            .iter()
                            .filter(|(name, _)| name.as_str().starts_with("keyward-"))
                            .map(|(name, value)| format!("{name}={}", value.to_str().unwrap_or("?")))
                            .collect();
                        let collected = request.into_body().collect().await.ok();
                        let trailers = collected
                            .and_then(|c| c.trailers().cloned())
                            .map(|t| t.keys().map(|k| k.to_string()).collect())
                            .unwrap_or_default();
                        let _ = seen_tx.send(Arrived { path, keyward_headers, trailers });
                        let mut response = http::Response::new(Full::new(Bytes::new()));
                        response.headers_mut().insert("content-type", HeaderValue::from_static("application/grpc"));
                        response.headers_mut().insert("grpc-status", HeaderValue::from_static("0"));
                        Ok(response)
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    (addr, seen_rx)
}

/// A forwarding proxy (`--client-cert-auth`) in front of `member_url`, with `upstream` flags for its
/// connection to the member, listening on a free loopback port once it accepts connections.
fn forwarding_proxy(pki: &Pki, member_url: &str, upstream: &[String]) -> (Process, SocketAddr) {
    let port = common::free_port();
    let mut args: Vec<String> = [
        "grpc-proxy",
        "start",
        "--endpoints",
        member_url,
        "--listen-addr",
        &format!("127.0.0.1:{port}"),
        "--cert-file",
        pki.server.cert_str(),
        "--key-file",
        pki.server.key_str(),
        "--client-cert-auth",
        "--trusted-ca-file",
        &pki.ca_str(),
    ]
    .map(String::from)
    .to_vec();
    args.extend_from_slice(upstream);
    let mut proxy = Process::spawn(temp_dir("proxy"), &args);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    proxy.wait_until("proxy", || {
        std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).map(drop).map_err(|e| e.to_string())
    });
    (proxy, addr)
}

/// The proxy itself passes no request trailers and no client-sent `keyward-` header on, over
/// HTTP/2, HTTP/1.1 (chunked trailer section, mixed case) and its gateway, whatever the member would
/// make of them: observed at a stand-in member that records everything it receives.
#[test]
fn the_proxy_forwards_no_request_trailers_and_no_client_keyward_names() {
    let pki = Pki::new();
    let rt = runtime();
    let (member, arrived) = recording_member(&rt);
    let (_proxy, proxy_addr) = forwarding_proxy(&pki, &format!("http://{member}"), &[]);
    let root_cert = forwarded(&pki.root);
    let alice_cert = forwarded(&pki.alice);
    let forged = |prefix: &str| -> Vec<(String, String)> {
        vec![
            (format!("{prefix}eyward-forwarded-client-cert"), root_cert.clone()),
            (format!("{prefix}eyward-forwarded-client-addr"), FORGED_ADDR.to_string()),
            (format!("{prefix}eyward-cluster-id"), "1".to_string()),
            (format!("{prefix}eyward-forwarded-client-cert-bin"), root_cert.clone()),
        ]
    };
    let next = || arrived.recv_timeout(PATIENCE).expect("the stand-in member saw the call");
    rt.block_on(async {
        let expect_clean = |seen: Arrived, local: SocketAddr, what: &str| {
            assert!(seen.trailers.is_empty(), "{what}: trailers reached the member: {seen:?}");
            let mut headers = seen.keyward_headers.clone();
            headers.sort();
            assert_eq!(
                headers,
                [format!("{FORWARDED_ADDR}={local}"), format!("{FORWARDED_CERT}={alice_cert}")],
                "{what}: {seen:?}"
            );
        };
        let h2 = H2 { addr: proxy_addr, tls: tls_config(&pki, &pki.alice, b"h2") };
        // HTTP/2: the names in headers and in trailers.
        let reply = h2.call("/etcdserverpb.KV/Range", range_of("/k"), &forged("k"), &forged("k")).await;
        assert_eq!(reply.status, Some(0), "{reply:?}");
        expect_clean(next(), reply.local, "HTTP/2");
        // HTTP/1.1: mixed-case names in headers and in the chunked body's trailer section.
        let tls = tls_config(&pki, &pki.alice, b"http/1.1");
        let (raw, local) =
            h1_call(proxy_addr, &tls, "/etcdserverpb.KV/Range", &range_of("/k"), &forged("K"), &forged("K")).await;
        assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
        expect_clean(next(), local, "HTTP/1.1");
        // The gateway on the proxy's listener, names in the HTTP headers and trailers.
        let reply = h2.post_json("/v3/kv/range", r#"{"key":"Lw=="}"#.to_string(), &forged("k"), &forged("k")).await;
        let seen = next();
        assert_eq!(seen.path, "/etcdserverpb.KV/Range", "{seen:?} {reply:?}");
        expect_clean(seen, reply.local, "gateway");
    });
}

// ---------------------------------------------------------------------------
// every name in every position
// ---------------------------------------------------------------------------

/// How a probe reaches the member.
#[derive(Clone, Copy, Debug)]
enum Route {
    /// gRPC over HTTP/2 through the forwarding proxy.
    ProxyH2,
    /// gRPC over HTTP/1.1 (chunked, trailer section) through the forwarding proxy.
    ProxyH1,
    /// gRPC over HTTP/2 straight to the member's client listener.
    DirectH2,
    /// gRPC over HTTP/1.1 straight to the member's client listener.
    DirectH1,
    /// The HTTP/JSON gateway on the proxy's listener.
    GatewayProxy,
    /// The HTTP/JSON gateway on the member's client listener.
    GatewayDirect,
}

impl Route {
    fn through_proxy(self) -> bool {
        matches!(self, Route::ProxyH2 | Route::ProxyH1 | Route::GatewayProxy)
    }
}

/// Every metadata name keyward reads (`src/identity/metadata.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Name {
    ForwardedCert,
    ForwardedAddr,
    Token,
    Authorization,
    ClusterId,
    MemberId,
}

impl Name {
    fn wire(self) -> &'static str {
        match self {
            Name::ForwardedCert => FORWARDED_CERT,
            Name::ForwardedAddr => FORWARDED_ADDR,
            Name::Token => "token",
            Name::Authorization => "authorization",
            Name::ClusterId => "keyward-cluster-id",
            Name::MemberId => "keyward-member-id",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Position {
    Header,
    Trailer,
}

/// One name a client sends, where and how.
#[derive(Clone, Debug)]
struct Injection {
    name: Name,
    position: Position,
    /// The name with `-bin` appended (binary metadata, a different key to tonic).
    bin: bool,
    /// Spelled in mixed case (`Keyward-Forwarded-Client-Cert`); HTTP/2 lowercases, HTTP/1.1 sends it as is.
    mixed_case: bool,
    /// Sent once or twice.
    copies: usize,
}

impl Injection {
    fn spelled(&self) -> String {
        let mut name = self.name.wire().to_string();
        if self.bin {
            name.push_str("-bin");
        }
        if self.mixed_case {
            name = name
                .split('-')
                .map(|part| {
                    let mut chars = part.chars();
                    chars.next().map(|c| c.to_ascii_uppercase().to_string() + chars.as_str()).unwrap_or_default()
                })
                .collect::<Vec<_>>()
                .join("-");
        }
        name
    }

    /// The value an attacker would choose: root's certificate, an address of someone else's, a
    /// valid token of carol's (a token is the client's own choice: in a header it legitimately
    /// names carol), an id.
    fn value(&self, setup: &Setup, root_cert: &str) -> String {
        match self.name {
            Name::ForwardedCert => root_cert.to_string(),
            Name::ForwardedAddr => FORGED_ADDR.to_string(),
            Name::Token | Name::Authorization => setup.carol_token.clone(),
            Name::ClusterId | Name::MemberId => "1".to_string(),
        }
    }
}

/// What the member must make of the caller.
#[derive(Debug, PartialEq, Eq)]
enum Expected {
    /// Acts as `user` (credential `source`), at the client's real address.
    Acts { user: &'static str, source: &'static str },
    /// Refuses the request before any decision (no audit line).
    Refused,
}

/// The trust rules, restated independently of the code: only headers count; a forwarded
/// certificate counts only from the proxy (which replaces the client's); an address is always the
/// real one; a token in a header is the caller's own choice; the gateway reads only `Authorization`.
fn expected(route: Route, injections: &[Injection]) -> Expected {
    let headers = |name: Name| -> usize {
        injections.iter().filter(|i| i.position == Position::Header && !i.bin && i.name == name).map(|i| i.copies).sum()
    };
    let alice_source = if route.through_proxy() { "forwarded_certificate" } else { "certificate" };
    match route {
        Route::GatewayProxy | Route::GatewayDirect => match headers(Name::Authorization) {
            0 => Expected::Acts { user: "alice", source: alice_source },
            1 => Expected::Acts { user: "carol", source: "token" },
            _ => Expected::Refused,
        },
        Route::DirectH2 | Route::DirectH1 if headers(Name::ForwardedCert) > 0 => Expected::Refused,
        _ if headers(Name::Token) + headers(Name::Authorization) > 0 => {
            Expected::Acts { user: "carol", source: "token" }
        }
        _ => Expected::Acts { user: "alice", source: alice_source },
    }
}

fn route_strategy() -> impl Strategy<Value = Route> {
    prop_oneof![
        Just(Route::ProxyH2),
        Just(Route::ProxyH1),
        Just(Route::DirectH2),
        Just(Route::DirectH1),
        Just(Route::GatewayProxy),
        Just(Route::GatewayDirect),
    ]
}

fn injection_strategy() -> impl Strategy<Value = Injection> {
    let name = prop_oneof![
        3 => Just(Name::ForwardedCert),
        3 => Just(Name::ForwardedAddr),
        2 => Just(Name::Token),
        2 => Just(Name::Authorization),
        1 => Just(Name::ClusterId),
        1 => Just(Name::MemberId),
    ];
    let position = prop_oneof![1 => Just(Position::Header), 2 => Just(Position::Trailer)];
    (name, position, proptest::bool::weighted(0.15), any::<bool>(), 1..=2usize)
        .prop_map(|(name, position, bin, mixed_case, copies)| Injection { name, position, bin, mixed_case, copies })
}

/// Sends one probe with the injections along `route`; the member's audit line for it (or `None`)
/// and the client's address.
async fn probe(
    setup: &Setup,
    route: Route,
    injections: &[Injection],
    root_cert: &str,
) -> (Option<AuditLine>, SocketAddr, String) {
    let key = setup.probe_key();
    let mut headers = Vec::new();
    let mut trailers = Vec::new();
    for injection in injections {
        let pair = (injection.spelled(), injection.value(setup, root_cert));
        let list = if injection.position == Position::Header { &mut headers } else { &mut trailers };
        for _ in 0..injection.copies {
            list.push(pair.clone());
        }
    }
    let (addr, alpn) = match route {
        Route::ProxyH2 | Route::GatewayProxy => (setup.proxy_addr, &b"h2"[..]),
        Route::ProxyH1 => (setup.proxy_addr, &b"http/1.1"[..]),
        Route::DirectH2 | Route::GatewayDirect => (setup.member_addr, &b"h2"[..]),
        Route::DirectH1 => (setup.member_addr, &b"http/1.1"[..]),
    };
    let tls = tls_config(&setup.pki, &setup.alice, alpn);
    let (local, answer) = match route {
        Route::ProxyH2 | Route::DirectH2 => {
            let reply = H2 { addr, tls }.call("/etcdserverpb.KV/Range", range_of(&key), &headers, &trailers).await;
            (reply.local, format!("{reply:?}"))
        }
        Route::ProxyH1 | Route::DirectH1 => {
            let (raw, local) =
                h1_call(addr, &tls, "/etcdserverpb.KV/Range", &range_of(&key), &headers, &trailers).await;
            (local, raw)
        }
        Route::GatewayProxy | Route::GatewayDirect => {
            let json = format!(r#"{{"key":"{}"}}"#, base64::engine::general_purpose::STANDARD.encode(&key));
            let reply = H2 { addr, tls }.post_json("/v3/kv/range", json, &headers, &trailers).await;
            (reply.local, format!("{reply:?} {}", String::from_utf8_lossy(&reply.message_bytes)))
        }
    };
    (setup.audit_line(&key), local, answer)
}

/// The property: whatever a client puts wherever it can, the member acts as the client's verified
/// identity (or the token it presented in a header), at the client's real address, or refuses.
/// Never root, never the forged address. One member and one proxy serve every case.
#[test]
fn every_keyward_name_in_every_position_leaves_the_member_seeing_the_real_caller() {
    let setup = Setup::start();
    let root_cert = forwarded(&setup.pki.root);
    let rt = runtime();
    let config = ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let strategy = (route_strategy(), proptest::collection::vec(injection_strategy(), 1..=3));
    let result = runner.run(&strategy, |(route, injections)| {
        let (line, local, answer) = rt.block_on(probe(&setup, route, &injections, &root_cert));
        let seen = line.map(|l| (l.user, l.source, l.client));
        let want = match expected(route, &injections) {
            Expected::Acts { user, source } => Some((user.to_string(), source.to_string(), local.to_string())),
            Expected::Refused => None,
        };
        prop_assert_eq!(seen, want, "route {:?}, injections {:?}; answer: {}", route, injections, answer);
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{failure}\n{}", setup.logs());
    }
}

// ---------------------------------------------------------------------------
// the setup: a TLS member trusting the proxy CN "proxy", and a forwarding proxy in front of it
// ---------------------------------------------------------------------------

struct Setup {
    pki: Pki,
    alice: Cert,
    /// The proxy's own certificate (CN proxy, in the member's `--trusted-proxy-cn`).
    proxy_cert: Cert,
    member: Process,
    member_addr: SocketAddr,
    proxy: Process,
    proxy_addr: SocketAddr,
    audit: PathBuf,
    carol_token: String,
    probes: AtomicU64,
}

impl Setup {
    /// Users: root (by certificate), alice (certificate only, readwrite on `/alice/`), carol (password,
    /// no roles). `/secret` holds a value only root may read. Probe keys (`/probe/N`) are readable by
    /// root only, so every probe is decided and written to the audit log.
    fn start() -> Setup {
        let pki = Pki::new();
        let alice = pki.alice.clone();
        let (port, peer_port) = (common::free_port(), common::free_port());
        let dir = temp_dir("member");
        let audit = dir.path().join("audit.log");
        let mut args = vec!["serve".to_string()];
        args.extend(common::member_flags(
            &dir.path().join("data"),
            &format!("https://127.0.0.1:{port}"),
            &format!("http://127.0.0.1:{peer_port}"),
        ));
        args.extend(
            [
                "--bcrypt-cost",
                "4",
                "--ballast-bytes",
                "0",
                "--cert-file",
                pki.server.cert_str(),
                "--key-file",
                pki.server.key_str(),
                "--trusted-ca-file",
                &pki.ca_str(),
                "--client-cert-auth",
                "--trusted-proxy-cn",
                "proxy",
                "--audit-log",
                audit.to_str().unwrap(),
            ]
            .map(String::from),
        );
        let mut member = Process::spawn(dir, &args);
        let member_url = format!("https://127.0.0.1:{port}");
        let ca = pki.ca_str();
        let ctl = |args: &[&str]| {
            let mut all = vec!["--cacert", ca.as_str(), "--cert", pki.root.cert_str(), "--key", pki.root.key_str()];
            all.extend_from_slice(args);
            common::etcdctl(&member_url, &all)
        };
        member.wait_until("member", || {
            let out = ctl(&["endpoint", "health"]);
            if out.success() {
                Ok(())
            } else {
                Err(out.stderr)
            }
        });
        for step in [
            &["user", "add", "root", "--no-password"][..],
            &["auth", "enable"],
            &["user", "add", "alice", "--no-password"],
            &["role", "add", "alice-role"],
            &["role", "grant-permission", "alice-role", "--prefix=true", "readwrite", "/alice/"],
            &["user", "grant-role", "alice", "alice-role"],
            &["user", "add", &format!("carol:{CAROL_PASSWORD}"), "--interactive=false"],
            &["put", "/secret", "root-only"],
        ] {
            let out = ctl(step);
            assert!(out.success(), "etcdctl {step:?}: {}", out.stderr);
        }

        let proxy_cert = pki.client("proxy", Some("proxy"));
        let upstream = ["--cacert", &pki.ca_str(), "--cert", proxy_cert.cert_str(), "--key", proxy_cert.key_str()]
            .map(String::from);
        let (proxy, proxy_addr) = forwarding_proxy(&pki, &member_url, &upstream);
        let mut setup = Setup {
            alice,
            proxy_cert,
            member,
            member_addr: format!("127.0.0.1:{port}").parse().unwrap(),
            proxy,
            proxy_addr,
            audit,
            carol_token: String::new(),
            probes: AtomicU64::new(0),
            pki,
        };
        setup.carol_token = runtime().block_on(setup.carol_token());
        setup
    }

    /// A token of carol's, from Authenticate directly at the member.
    async fn carol_token(&self) -> String {
        let request = AuthenticateRequest { name: "carol".into(), password: CAROL_PASSWORD.into() };
        let reply = self
            .direct_h2(&self.alice)
            .call("/etcdserverpb.Auth/Authenticate", request.encode_to_vec(), &[], &[])
            .await;
        assert_eq!(reply.status, Some(0), "carol's login: {reply:?}");
        AuthenticateResponse::decode(reply.message_bytes.as_slice()).expect("an AuthenticateResponse").token
    }

    fn proxy_h2(&self, cert: &Cert) -> H2 {
        H2 { addr: self.proxy_addr, tls: tls_config(&self.pki, cert, b"h2") }
    }

    fn direct_h2(&self, cert: &Cert) -> H2 {
        H2 { addr: self.member_addr, tls: tls_config(&self.pki, cert, b"h2") }
    }

    fn probe_key(&self) -> String {
        format!("/probe/{}", self.probes.fetch_add(1, Ordering::Relaxed))
    }

    /// The audit line of the probe `key`, if the member wrote one (it writes it before it answers).
    fn audit_line(&self, key: &str) -> Option<AuditLine> {
        let text = fs::read_to_string(&self.audit).unwrap_or_default();
        text.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).find_map(|v| {
            (v["key"].as_str() == Some(key)).then(|| AuditLine {
                user: v["user"].as_str().unwrap_or_default().to_string(),
                source: v["source"].as_str().unwrap_or_default().to_string(),
                client: v["client"].as_str().unwrap_or_default().to_string(),
            })
        })
    }

    fn logs(&self) -> String {
        format!("member log:\n{}\nproxy log:\n{}", self.member.log(), self.proxy.log())
    }
}

#[derive(Debug, PartialEq, Eq)]
struct AuditLine {
    user: String,
    source: String,
    client: String,
}

fn range_of(key: &str) -> Vec<u8> {
    RangeRequest { key: key.as_bytes().to_vec(), ..Default::default() }.encode_to_vec()
}

/// `cert`'s leaf as a proxy forwards it: DER, standard base64.
fn forwarded(cert: &Cert) -> String {
    let der = CertificateDer::from_pem_file(&cert.cert).unwrap();
    base64::engine::general_purpose::STANDARD.encode(der)
}

// ---------------------------------------------------------------------------
// hand-written requests
// ---------------------------------------------------------------------------

/// A gRPC reply as the client saw it.
#[derive(Debug)]
struct Reply {
    /// The client's own address on the connection the call went over.
    local: SocketAddr,
    /// `grpc-status` (headers of a trailers-only reply, or trailers).
    status: Option<u32>,
    message: String,
    /// The first gRPC message's bytes (without the 5-byte prefix), or the HTTP body.
    message_bytes: Vec<u8>,
}

/// Where a hand-written call goes: a TLS listener, as one client certificate. Each call opens a
/// connection of its own.
struct H2 {
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
}

/// A TLS connection to `addr` and the client's own address on it.
async fn connect(
    addr: SocketAddr,
    tls: &Arc<rustls::ClientConfig>,
) -> (tokio_rustls::client::TlsStream<tokio::net::TcpStream>, SocketAddr) {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let local = tcp.local_addr().unwrap();
    let connector = tokio_rustls::TlsConnector::from(tls.clone());
    (connector.connect(ServerName::try_from("localhost").unwrap(), tcp).await.expect("TLS handshake"), local)
}

impl H2 {
    /// A unary gRPC call with `headers` added and `trailers` (if any) sent after the message.
    async fn call(
        &self,
        path: &str,
        message: Vec<u8>,
        headers: &[(String, String)],
        trailers: &[(String, String)],
    ) -> Reply {
        let mut request = http::Request::post(format!("https://localhost{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        for (name, value) in headers {
            request = request.header(HeaderName::from_bytes(name.as_bytes()).unwrap(), value);
        }
        self.send(request, grpc_frame(&message), trailers).await
    }

    /// A gateway (HTTP/JSON) POST.
    async fn post_json(
        &self,
        path: &str,
        json: String,
        headers: &[(String, String)],
        trailers: &[(String, String)],
    ) -> Reply {
        let mut request =
            http::Request::post(format!("https://localhost{path}")).header("content-type", "application/json");
        for (name, value) in headers {
            request = request.header(HeaderName::from_bytes(name.as_bytes()).unwrap(), value);
        }
        self.send(request, Bytes::from(json), trailers).await
    }

    async fn send(&self, request: http::request::Builder, body: Bytes, trailers: &[(String, String)]) -> Reply {
        let mut frames: Vec<Result<Frame<Bytes>, Infallible>> = vec![Ok(Frame::data(body))];
        if !trailers.is_empty() {
            let mut map = HeaderMap::new();
            for (name, value) in trailers {
                map.append(HeaderName::from_bytes(name.as_bytes()).unwrap(), HeaderValue::from_str(value).unwrap());
            }
            frames.push(Ok(Frame::trailers(map)));
        }
        let request = request.body(StreamBody::new(futures::stream::iter(frames))).unwrap();
        let (stream, local) = connect(self.addr, &self.tls).await;
        let io = TokioIo::new(stream);
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await.expect("HTTP/2 handshake");
        tokio::spawn(connection);
        let exchange = async {
            let response = sender.send_request(request).await.expect("a response");
            let (parts, body) = response.into_parts();
            let collected = body.collect().await.expect("the response body");
            let trailers = collected.trailers().cloned().unwrap_or_default();
            let bytes = collected.to_bytes();
            let header = |name: &str| {
                trailers.get(name).or_else(|| parts.headers.get(name)).and_then(|v| v.to_str().ok()).map(String::from)
            };
            Reply {
                local,
                status: header("grpc-status").and_then(|s| s.parse().ok()),
                message: header("grpc-message").unwrap_or_default(),
                message_bytes: if bytes.len() >= 5 && is_grpc(&parts.headers) {
                    bytes[5..].to_vec()
                } else {
                    bytes.to_vec()
                },
            }
        };
        tokio::time::timeout(PATIENCE, exchange).await.expect("answered in time")
    }
}

fn is_grpc(headers: &HeaderMap) -> bool {
    headers.get("content-type").and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("application/grpc"))
}

/// A gRPC call over HTTP/1.1 written byte by byte: header names exactly as given (mixed case
/// survives), the message as one chunk, then a chunked trailer section. Returns the raw response and
/// the client's address.
async fn h1_call(
    addr: SocketAddr,
    tls: &Arc<rustls::ClientConfig>,
    path: &str,
    message: &[u8],
    headers: &[(String, String)],
    trailers: &[(String, String)],
) -> (String, SocketAddr) {
    let (mut stream, local) = connect(addr, tls).await;
    let frame = grpc_frame(message);
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/grpc\r\nTE: trailers\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n"
    )
    .into_bytes();
    for (name, value) in headers {
        write!(request, "{name}: {value}\r\n").unwrap();
    }
    write!(request, "\r\n{:x}\r\n", frame.len()).unwrap();
    request.extend_from_slice(&frame);
    request.extend_from_slice(b"\r\n0\r\n");
    for (name, value) in trailers {
        write!(request, "{name}: {value}\r\n").unwrap();
    }
    request.extend_from_slice(b"\r\n");
    let exchange = async {
        stream.write_all(&request).await.expect("send");
        let mut response = Vec::new();
        // A server may close without close_notify; what arrived is the answer.
        let _ = stream.read_to_end(&mut response).await;
        String::from_utf8_lossy(&response).into_owned()
    };
    (tokio::time::timeout(PATIENCE, exchange).await.expect("answered in time"), local)
}

fn tls_config(pki: &Pki, cert: &Cert, alpn: &[u8]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(pki.ca_file()).unwrap() {
        roots.add(ca.unwrap()).unwrap();
    }
    let chain = vec![CertificateDer::from_pem_file(&cert.cert).unwrap()];
    let key = PrivateKeyDer::from_pem_file(&cert.key).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    config.alpn_protocols = vec![alpn.to_vec()];
    Arc::new(config)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

// ---------------------------------------------------------------------------
// processes
// ---------------------------------------------------------------------------

/// A keyward process with its log in its own temp dir; SIGKILLed on drop.
struct Process {
    child: Option<Child>,
    dir: TempDir,
}

impl Process {
    fn spawn(dir: TempDir, args: &[String]) -> Process {
        let log = fs::File::create(dir.path().join("log")).unwrap();
        let mut cmd = Command::new(common::keyward_bin());
        cmd.args(args).stdin(Stdio::null()).stdout(log.try_clone().unwrap()).stderr(log);
        common::scrub_env(&mut cmd);
        Process { child: Some(cmd.spawn().expect("spawn keyward")), dir }
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    fn wait_until(&mut self, what: &str, ready: impl Fn() -> Result<(), String>) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("{what} exited during startup ({status}):\n{}", self.log());
            }
            match ready() {
                Ok(()) => return,
                Err(why) if Instant::now() > deadline => panic!("{what} not ready: {why}\n{}", self.log()),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn temp_dir(label: &str) -> TempDir {
    tempfile::Builder::new().prefix(&format!("forged-identity-{label}-")).tempdir().expect("temp dir")
}
