//! The details of issue 32 that clients and tools trip on, each run against etcd 3.4.23 and keyward
//! in the same test where etcd 3.4.23 has the behaviour (same steps, same output), else checked
//! against etcd's source (etcd 3.5.11+ for `/livez` and `/readyz`, 3.4.25+ for the TLS version flags):
//! - which maintenance and cluster answers carry a header (Defragment and MoveLeader: none);
//! - what a path no route takes is answered over HTTP (404/405 with etcd's text, not gRPC's 12), and
//!   `/v3beta/` paths served as `/v3/`;
//! - the `ready to serve client requests` log line, in text and zap JSON;
//! - every member of `--initial-cluster` named in `member list` before it has started;
//! - `--tls-min-version`, `--tls-max-version`, `--cipher-suites` at the handshake (openssl as the
//!   client) on the client and peer listeners and the proxy, and bad values refused at start;
//! - `/livez` and `/readyz`: bodies, `?verbose`, `?exclude=`, one check's path, a failing check.
//!
//! Processes are killed by PID on drop.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::cluster::{Cluster, Options};
use crate::common::pki::Pki;
use crate::common::{self, Kind, Server};

/// A bound against hanging, not a timing assertion.
const WAIT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------
// plain HTTP
// ---------------------------------------------------------------------------

/// One HTTP/1.1 request: (status, content type, body).
fn http(endpoint: &str, method: &str, path: &str, body: &str) -> (u16, String, String) {
    let mut tcp = TcpStream::connect(endpoint).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    tcp.write_all(request.as_bytes()).unwrap();
    // A server may answer and close without reading the body (an unknown path), which resets the
    // connection after its answer: what was read before the reset is the answer.
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match tcp.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => bytes.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && !bytes.is_empty() => break,
            Err(e) => panic!("read response to {method} {path}: {e}"),
        }
    }
    let response = String::from_utf8_lossy(&bytes).into_owned();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let content_type = head
        .lines()
        .find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("content-type")).map(|(_, v)| v.trim()))
        .unwrap_or("")
        .to_string();
    let body =
        if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { unchunk(body) } else { body.into() };
    (status, content_type, body)
}

fn unchunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

fn json(endpoint: &str, path: &str, body: &str) -> (u16, Value) {
    let (status, _, text) = http(endpoint, "POST", path, body);
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

// ---------------------------------------------------------------------------
// headers
// ---------------------------------------------------------------------------

/// Fails with the old answers: Defragment and MoveLeader carried a header.
#[test]
fn maintenance_and_cluster_answers_have_a_header_exactly_where_etcds_do() {
    let (etcd, keyward) = common::start_pair_blocking(&[]);
    let shape = |server: &Server| {
        let endpoint = server.endpoint();
        let (_, members) = json(&endpoint, "/v3/cluster/member/list", "{}");
        let me = members["header"]["member_id"].as_str().expect("member id").to_string();
        let calls = [
            ("/v3/maintenance/status", "{}".to_string()),
            ("/v3/maintenance/alarm", "{}".to_string()),
            ("/v3/maintenance/hash", "{}".to_string()),
            ("/v3/maintenance/defragment", "{}".to_string()),
            // To itself, the leader: a success with nothing to do on both.
            ("/v3/maintenance/transfer-leadership", format!(r#"{{"targetID":"{me}"}}"#)),
            ("/v3/cluster/member/list", "{}".to_string()),
            ("/v3/kv/range", r#"{"key":"YQ=="}"#.to_string()),
        ];
        calls
            .iter()
            .map(|(path, body)| {
                let (status, answer) = json(&endpoint, path, body);
                format!("{path}: {status} header={}", answer.get("header").is_some())
            })
            .collect::<Vec<_>>()
    };
    let (expected, got) = (shape(&etcd), shape(&keyward));
    assert_eq!(got, expected, "keyward (left) vs etcd 3.4 (right)");
    assert!(expected.contains(&"/v3/maintenance/defragment: 200 header=false".to_string()), "{expected:?}");
}

// ---------------------------------------------------------------------------
// unknown paths
// ---------------------------------------------------------------------------

/// Fails with the old fallback: every one of these but the routed methods' 405 was HTTP 200 with
/// `grpc-status: 12`.
#[test]
fn unknown_paths_and_methods_are_answered_as_etcds_http_mux() {
    let (etcd, keyward) = common::start_pair_blocking(&[]);
    let requests = [
        ("POST", "/v3/nonexistent"),
        ("GET", "/v3/nonexistent"),
        ("POST", "/v3/lock/nonexistent"),
        ("POST", "/v3/kv/range/"),
        ("GET", "/v3/kv/range"),
        ("DELETE", "/v3/kv/put"),
        ("GET", "/v3/watch"),
        ("GET", "/nonexistent"),
        ("GET", "/health/"),
        ("POST", "/health"),
        ("POST", "/version"),
        ("OPTIONS", "/v3/kv/range"),
        // etcd 3.4 serves /v3beta/ as /v3/.
        ("POST", "/v3beta/kv/range"),
        ("POST", "/v3beta/nonexistent"),
    ];
    let answers = |server: &Server| {
        requests
            .iter()
            .map(|(method, path)| {
                let (status, content_type, body) = http(&server.endpoint(), method, path, "{}");
                format!("{method} {path}: {status} [{content_type}] {body:?}")
            })
            .collect::<Vec<_>>()
    };
    let (expected, got) = (answers(&etcd), answers(&keyward));
    assert_eq!(got, expected, "keyward (left) vs etcd 3.4 (right)");
}

// ---------------------------------------------------------------------------
// the ready line
// ---------------------------------------------------------------------------

/// Waits until `log` has a line that `wanted` accepts; the log's text otherwise.
fn wait_for_line(log: &Path, wanted: impl Fn(&str) -> bool) -> Result<String, String> {
    let deadline = Instant::now() + WAIT;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| wanted(l)) {
            return Ok(line.to_string());
        }
        if Instant::now() > deadline {
            return Err(text);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Fails without the line (tools such as pifpaf waited for it forever).
#[test]
fn the_ready_line_is_logged_once_the_member_serves_in_text_and_zap_json() {
    let (etcd, keyward) = common::start_pair_blocking(&[]);
    for server in [&etcd, &keyward] {
        let found = wait_for_line(&server.log_path(), |l| l.contains("ready to serve client requests"));
        assert!(found.is_ok(), "{}: no ready line:\n{}", server.kind.label(), server.log_tail(30));
    }
    // zap: one JSON object with that `msg` (etcd 3.5's form; 3.4 logs none with --logger zap).
    let zap = Server::start_with(Kind::under_test(), &["--logger", "zap"]);
    let line = wait_for_line(&zap.log_path(), |l| {
        serde_json::from_str::<Value>(l).is_ok_and(|v| v["msg"] == "ready to serve client requests")
    });
    let line = line.unwrap_or_else(|log| panic!("no zap ready line:\n{log}"));
    let parsed: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(parsed["level"], "info", "{line}");
}

// ---------------------------------------------------------------------------
// member names
// ---------------------------------------------------------------------------

/// A process killed (and reaped) on drop.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(program: &Path, args: &[String], log: &Path) -> Process {
    let log = std::fs::File::create(log).expect("log file");
    let mut command = Command::new(program);
    command.args(args).stdin(Stdio::null()).stdout(log.try_clone().unwrap()).stderr(log);
    common::scrub_env(&mut command);
    Process(command.spawn().unwrap_or_else(|e| panic!("spawn {}: {e}", program.display())))
}

/// `member list -w json` of a 3-member cluster of which only `a` and `b` run: (name, peer URLs,
/// whether it published client URLs) per member, sorted.
fn members_with_one_never_started(kind: Kind) -> Vec<(String, Vec<String>, bool)> {
    let dir = tempfile::tempdir().unwrap();
    let (clients, peers): (Vec<u16>, Vec<u16>) = (0..3).map(|_| (common::free_port(), common::free_port())).unzip();
    let names = ["a", "b", "c"];
    let initial: Vec<String> = names.iter().zip(&peers).map(|(n, p)| format!("{n}=http://127.0.0.1:{p}")).collect();
    let (bin, prefix) = kind.program();
    let _running: Vec<Process> = (0..2)
        .map(|i| {
            let client = format!("http://127.0.0.1:{}", clients[i]);
            let peer = format!("http://127.0.0.1:{}", peers[i]);
            let mut args = prefix.clone();
            args.extend(
                [
                    "--name",
                    names[i],
                    "--data-dir",
                    &dir.path().join(names[i]).display().to_string(),
                    "--listen-client-urls",
                    &client,
                    "--advertise-client-urls",
                    &client,
                    "--listen-peer-urls",
                    &peer,
                    "--initial-advertise-peer-urls",
                    &peer,
                    "--initial-cluster",
                    &initial.join(","),
                ]
                .map(String::from),
            );
            spawn(&bin, &args, &dir.path().join(format!("{}.log", names[i])))
        })
        .collect();
    let endpoint = format!("127.0.0.1:{}", clients[0]);
    let deadline = Instant::now() + WAIT;
    loop {
        let out = common::etcdctl(&endpoint, &["member", "list", "-w", "json"]);
        // Both running members published: etcd's answer is settled (and keyward's).
        let listed: Option<Vec<(String, Vec<String>, bool)>> =
            serde_json::from_str::<Value>(&out.stdout).ok().map(|v| {
                let mut members: Vec<_> = v["members"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .iter()
                    .map(|m| {
                        let peers = m["peerURLs"].as_array().cloned().unwrap_or_default();
                        (
                            m["name"].as_str().unwrap_or("").to_string(),
                            peers.iter().filter_map(|p| p.as_str().map(str::to_string)).collect(),
                            m.get("clientURLs").is_some(),
                        )
                    })
                    .collect();
                members.sort();
                members
            });
        if let Some(members) = listed.filter(|m| m.iter().filter(|(_, _, published)| *published).count() == 2) {
            return members;
        }
        assert!(Instant::now() < deadline, "{}: member list never settled: {}", kind.label(), out.stdout);
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Fails with the old bootstrap: member `c` had no name until it started and published one.
#[test]
fn every_initial_member_is_named_before_it_starts() {
    let expected = members_with_one_never_started(Kind::Etcd);
    let got = members_with_one_never_started(Kind::under_test());
    // Ports differ between the runs: compare names, the number of peer URLs, publication.
    let shape =
        |m: &[(String, Vec<String>, bool)]| m.iter().map(|(n, p, c)| (n.clone(), p.len(), *c)).collect::<Vec<_>>();
    assert_eq!(shape(&got), shape(&expected), "keyward (left) vs etcd 3.4 (right)");
    assert_eq!(shape(&expected), [("a".into(), 1, true), ("b".into(), 1, true), ("c".into(), 1, false)]);
}

// ---------------------------------------------------------------------------
// TLS versions and cipher suites
// ---------------------------------------------------------------------------

/// Whether `openssl s_client` completes a handshake with `port` using `options` (e.g. `-tls1_2`).
fn handshake(port: u16, ca: &Path, options: &[&str]) -> bool {
    let output = Command::new("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{port}"), "-CAfile"])
        .arg(ca)
        .args(options)
        .stdin(Stdio::null())
        .output()
        .expect("run openssl (apt-get install openssl)");
    output.status.success()
}

fn wait_for_port(port: u16) {
    let deadline = Instant::now() + WAIT;
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A single member of `kind` serving https on its client port and, for keyward, its peer port, with
/// `extra` flags. (client port, peer port, the process, its dir).
fn tls_member(kind: Kind, pki: &Pki, tls_peer: bool, extra: &[&str]) -> (u16, u16, Process, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let (client_port, peer_port) = (common::free_port(), common::free_port());
    let client = format!("https://127.0.0.1:{client_port}");
    let peer = format!("{}://127.0.0.1:{peer_port}", if tls_peer { "https" } else { "http" });
    let (cert, key) = (pki.path("server.pem").display().to_string(), pki.path("server-key.pem").display().to_string());
    let (bin, mut args) = kind.program();
    let mut flags = common::member_flags(&dir.path().join("data"), &client, &peer);
    flags.extend(["--cert-file", &cert, "--key-file", &key].map(String::from));
    if tls_peer {
        let ca = pki.ca_file().display().to_string();
        flags.extend(
            ["--peer-cert-file", &cert, "--peer-key-file", &key, "--peer-trusted-ca-file", &ca].map(String::from),
        );
    }
    flags.extend(extra.iter().map(|s| s.to_string()));
    args.extend(flags);
    let process = spawn(&bin, &args, &dir.path().join("server.log"));
    // etcd accepts before it serves: wait for a handshake the policy allows.
    let deadline = Instant::now() + WAIT;
    while !handshake(client_port, &pki.ca_file(), &[]) {
        let log = std::fs::read(dir.path().join("server.log")).map(|b| String::from_utf8_lossy(&b).into_owned());
        let log = log.unwrap_or_default();
        assert!(Instant::now() < deadline, "{} never completed a TLS handshake:\n{log}", kind.label());
        std::thread::sleep(Duration::from_millis(100));
    }
    (client_port, peer_port, process, dir)
}

/// Fails without the flags (unknown flags refuse to start) or without their policy (TLS 1.2 and the
/// excluded suite would be accepted).
#[test]
fn tls_versions_and_cipher_suites_are_enforced_at_the_handshake_as_etcds() {
    let pki = Pki::new();
    let ca = pki.ca_file();
    // --cipher-suites: etcd 3.4.23 has it; TLS 1.2 with another suite is refused by both. (etcd's
    // HTTP/2 needs an AES-128-GCM suite in the list: without one it fails to serve.)
    let suite = ["--cipher-suites", "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"];
    let tls12_handshakes = |port| {
        [
            handshake(port, &ca, &["-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256"]),
            handshake(port, &ca, &["-tls1_2", "-cipher", "ECDHE-ECDSA-AES256-GCM-SHA384"]),
            handshake(port, &ca, &["-tls1_3"]),
        ]
    };
    let (etcd_port, _, _etcd, _etcd_dir) = tls_member(Kind::Etcd, &pki, false, &suite);
    let (port, _, _keyward, _dir) = tls_member(Kind::under_test(), &pki, false, &suite);
    assert_eq!(tls12_handshakes(port), tls12_handshakes(etcd_port), "keyward (left) vs etcd 3.4 (right)");
    assert_eq!(tls12_handshakes(etcd_port), [true, false, true]);

    // --tls-min-version TLS1.3 (etcd 3.5): no TLS 1.2, on the client and the peer listener.
    let (port, peer_port, _member, _dir) = tls_member(Kind::under_test(), &pki, true, &["--tls-min-version", "TLS1.3"]);
    wait_for_port(peer_port);
    // The peer listener wants a certificate of its CA (`--peer-trusted-ca-file`).
    let (cert, key) = (pki.path("root.pem").display().to_string(), pki.path("root-key.pem").display().to_string());
    for p in [port, peer_port] {
        assert!(!handshake(p, &ca, &["-tls1_2", "-cert", &cert, "-key", &key]), "TLS 1.2 accepted on {p}");
        assert!(handshake(p, &ca, &["-tls1_3", "-cert", &cert, "-key", &key]), "TLS 1.3 refused on {p}");
    }
    // --tls-max-version TLS1.2: no TLS 1.3.
    let (port, _, _member, _dir) = tls_member(Kind::under_test(), &pki, false, &["--tls-max-version", "TLS1.2"]);
    assert!(!handshake(port, &ca, &["-tls1_3"]));
    assert!(handshake(port, &ca, &["-tls1_2"]));

    // The proxy's listener.
    let proxy_port = common::free_port();
    let (cert, key) = (pki.path("server.pem"), pki.path("server-key.pem"));
    let args: Vec<String> = [
        "grpc-proxy",
        "start",
        "--listen-addr",
        &format!("127.0.0.1:{proxy_port}"),
        "--endpoints",
        &format!("127.0.0.1:{}", common::free_port()),
        "--cert-file",
        &cert.display().to_string(),
        "--key-file",
        &key.display().to_string(),
        "--tls-min-version",
        "TLS1.3",
    ]
    .map(String::from)
    .to_vec();
    let dir = tempfile::tempdir().unwrap();
    let _proxy = spawn(&common::keyward_bin(), &args, &dir.path().join("proxy.log"));
    wait_for_port(proxy_port);
    assert!(!handshake(proxy_port, &ca, &["-tls1_2"]), "the proxy accepted TLS 1.2");
    assert!(handshake(proxy_port, &ca, &["-tls1_3"]), "the proxy refused TLS 1.3");
}

/// Runs `kind` with `extra` flags and expects it to refuse to start: its output.
fn refused_at_start(kind: Kind, extra: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let client = format!("http://127.0.0.1:{}", common::free_port());
    let peer = format!("http://127.0.0.1:{}", common::free_port());
    let (bin, mut args) = kind.program();
    args.extend(common::member_flags(&dir.path().join("data"), &client, &peer));
    args.extend(extra.iter().map(|s| s.to_string()));
    let log = dir.path().join("server.log");
    let mut process = spawn(&bin, &args, &log);
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = process.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "{} started with {extra:?}", kind.label());
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success(), "{} exited 0 with {extra:?}", kind.label());
    std::fs::read_to_string(log).unwrap_or_default()
}

#[test]
fn bad_tls_flag_values_are_refused_at_start_in_etcds_words() {
    let etcd = refused_at_start(Kind::Etcd, &["--cipher-suites", "FOO"]);
    let keyward = refused_at_start(Kind::under_test(), &["--cipher-suites", "FOO"]);
    let words = r#"unexpected TLS cipher suite "FOO""#;
    assert!(etcd.contains(words), "etcd: {etcd}");
    assert!(keyward.contains(words), "keyward: {keyward}");
    // etcd 3.5's messages for the version flags (3.4.23 has no such flags).
    for (flags, words) in [
        (&["--tls-min-version", "TLS1.1"][..], r#"unexpected TLS version "TLS1.1" (must be one of: TLS1.2, TLS1.3)"#),
        (
            &["--tls-min-version", "TLS1.3", "--tls-max-version", "TLS1.2"][..],
            "min version (TLS1.3) is greater than max version (TLS1.2)",
        ),
        (
            &["--tls-min-version", "TLS1.3", "--cipher-suites", "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"][..],
            "cipher suites cannot be configured when only TLS1.3 is enabled",
        ),
    ] {
        let out = refused_at_start(Kind::under_test(), flags);
        assert!(out.contains(words), "{flags:?}: {out}");
    }
}

// ---------------------------------------------------------------------------
// /livez and /readyz
// ---------------------------------------------------------------------------

#[test]
fn livez_and_readyz_answer_as_etcd_3_5s_on_the_client_and_metrics_urls() {
    let metrics_port = common::free_port();
    let metrics = format!("http://127.0.0.1:{metrics_port}");
    let server = Server::start_with(Kind::under_test(), &["--listen-metrics-urls", &metrics]);
    for endpoint in [server.endpoint(), format!("127.0.0.1:{metrics_port}")] {
        let get = |path: &str| http(&endpoint, "GET", path, "");
        let plain = "text/plain; charset=utf-8".to_string();
        assert_eq!(get("/livez"), (200, plain.clone(), "ok\n".into()));
        assert_eq!(get("/livez?verbose"), (200, plain.clone(), "[+]serializable_read ok\nok\n".into()));
        assert_eq!(
            get("/readyz?verbose"),
            (
                200,
                plain.clone(),
                "[+]data_corruption ok\n[+]serializable_read ok\n[+]linearizable_read ok\nok\n".into()
            )
        );
        assert_eq!(
            get("/readyz?verbose&exclude=linearizable_read&exclude=no_such_check"),
            (200, plain.clone(), "[+]data_corruption ok\n[+]serializable_read ok\nok\n".into())
        );
        assert_eq!(
            get("/readyz/linearizable_read?verbose"),
            (200, plain.clone(), "[+]linearizable_read ok\nok\n".into())
        );
        assert_eq!(get("/readyz/no_such_check"), (404, plain.clone(), "404 page not found\n".into()));
        assert_eq!(http(&endpoint, "POST", "/readyz", ""), (405, plain.clone(), "Method Not Allowed\n".into()));
        let (_, metrics_text) = common::http_get(&endpoint, "/metrics");
        assert_eq!(
            common::metric(&metrics_text, r#"etcd_server_healthcheck{name="linearizable_read",type="readyz"}"#),
            1.0
        );
    }
}

/// Without a quorum a member is alive but not ready, and says which check failed.
#[test]
fn readyz_fails_its_linearizable_read_without_a_quorum_while_livez_passes() {
    let mut cluster = Cluster::start(Options::new(3));
    let endpoint = cluster.members[0].addr();
    assert_eq!(http(&endpoint, "GET", "/readyz", "").0, 200);
    cluster.members[1].kill_9();
    cluster.members[2].kill_9();
    let deadline = Instant::now() + WAIT;
    let (status, content_type, body) = loop {
        let answer = http(&endpoint, "GET", "/readyz", "");
        if answer.0 != 200 || Instant::now() > deadline {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!((status, content_type.as_str()), (503, "text/plain; charset=utf-8"), "{body}");
    assert!(
        body.starts_with("[+]data_corruption ok\n[+]serializable_read ok\n[-]linearizable_read failed: "),
        "{body}"
    );
    assert!(body.ends_with("\n\n"), "{body:?}");
    assert_eq!(http(&endpoint, "GET", "/livez", ""), (200, "text/plain; charset=utf-8".into(), "ok\n".into()));
    assert_eq!(http(&endpoint, "GET", "/readyz?exclude=linearizable_read", "").0, 200);
}
