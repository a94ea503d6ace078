//! Client connection bounds (issue 13, `frontend/connection_limits.rs`): a connection that never
//! speaks, or goes silent, is closed after the configured time; a listener holds at most
//! `--max-client-connections`; etcd's keepalive and stream flags are taken and validated.
//!
//! No timing is asserted: a connection is required to close within a generous bound, and the
//! metrics say why it closed.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{Kind, Server};

/// HTTP/2's client preface and an empty SETTINGS frame: what a gRPC client sends first.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

fn metric(server: &Server, name: &str) -> f64 {
    let (_, text) = common::http_get(&server.endpoint(), "/metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

/// Reads until the server closes the connection (EOF or reset); false if it is still open after
/// `within`.
fn closed_within(conn: &mut TcpStream, within: Duration) -> bool {
    conn.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match conn.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue, // the server's SETTINGS and pings
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => continue,
            Err(_) => return true,
        }
    }
    false
}

#[test]
fn silent_connections_are_closed_and_one_that_keeps_talking_is_not() {
    let server = Server::start_with(Kind::Keyward, &["--client-idle-timeout", "2s", "--grpc-keepalive-interval", "0"]);
    let before = metric(&server, "keyward_client_connections_idle_closed_total");
    // Never a byte: closed.
    let mut mute = TcpStream::connect(server.endpoint()).unwrap();
    // The preface, then silence: closed after the idle timeout.
    let mut quiet = TcpStream::connect(server.endpoint()).unwrap();
    quiet.write_all(PREFACE).unwrap();
    // The preface, then a PING every 500 ms: kept open past several idle timeouts.
    let mut talking = TcpStream::connect(server.endpoint()).unwrap();
    talking.write_all(PREFACE).unwrap();
    talking.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let ping = b"\x00\x00\x08\x06\x00\x00\x00\x00\x00keyward!";
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    while started.elapsed() < Duration::from_secs(6) {
        talking.write_all(ping).expect("the talking connection stays open");
        let _ = talking.read(&mut buf);
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(closed_within(&mut mute, Duration::from_secs(30)), "a connection that never spoke stayed open");
    assert!(closed_within(&mut quiet, Duration::from_secs(30)), "a silent connection stayed open");
    talking.write_all(ping).expect("still open after 6 s of pings with a 2 s idle timeout");
    assert!(!closed_within(&mut talking, Duration::from_millis(500)), "the talking connection was closed");
    assert!(metric(&server, "keyward_client_connections_idle_closed_total") >= before + 2.0);
    // etcdctl is unaffected.
    assert!(server.etcdctl(&["put", "k", "v"]).success());
}

#[test]
fn a_listener_holds_at_most_max_client_connections() {
    let server = Server::start_with(Kind::Keyward, &["--max-client-connections", "3"]);
    // The harness's readiness check has come and gone; three connections hold the listener full.
    std::thread::sleep(Duration::from_millis(300));
    let mut held: Vec<TcpStream> = (0..3)
        .map(|_| {
            let mut c = TcpStream::connect(server.endpoint()).unwrap();
            c.write_all(PREFACE).unwrap();
            c
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut fourth = TcpStream::connect(server.endpoint()).unwrap();
    let _ = fourth.write_all(PREFACE);
    assert!(closed_within(&mut fourth, Duration::from_secs(10)), "a fourth connection was served");
    let refused = server.etcdctl(&["--dial-timeout=1s", "--command-timeout=2s", "put", "k", "v"]);
    assert!(!refused.success(), "etcdctl got a fifth connection: {}", refused.stdout);
    // One closes: there is room again.
    held.pop();
    std::thread::sleep(Duration::from_millis(300));
    let out = server.etcdctl(&["put", "k", "v"]);
    assert!(out.success(), "{}", out.stderr);
    drop(held);
    std::thread::sleep(Duration::from_millis(300));
    assert!(metric(&server, "keyward_client_connections_refused_total") >= 2.0);
}

#[test]
fn connection_flags_are_validated_as_durations() {
    let bin = common::keyward_bin();
    for (flags, message) in [
        (vec!["--grpc-keepalive-interval", "soon"], "--grpc-keepalive-interval"),
        (vec!["--grpc-keepalive-min-time", "5"], "--grpc-keepalive-min-time"),
        (vec!["--client-idle-timeout", "1m"], "--client-idle-timeout"),
        (vec!["--max-concurrent-streams", "0"], "--max-concurrent-streams"),
        (vec!["--max-client-connections", "0"], "--max-client-connections"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = std::process::Command::new(&bin);
        common::scrub_env(&mut cmd);
        let out = cmd.arg("serve").arg("--data-dir").arg(dir.path()).args(&flags).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {stderr}");
        assert!(stderr.contains(message), "{flags:?}: {stderr}");
    }
}
