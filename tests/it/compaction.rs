//! Compaction through the real listener while puts go on (`mvcc/compaction.rs`,
//! `node/jobs/compaction.rs`): `etcdctl compact` makes older revisions unreadable at once,
//! `etcdctl compact --physical` answers once the member removed every version the compaction made
//! unreachable (etcd's `etcd_debugging_mvcc_db_compaction_keys_total` counts them), and no concurrent
//! put fails.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use etcd_client::{GetOptions, Txn, TxnOp};

use crate::common::{self, Kind, Server};

/// Keys overwritten `ROUNDS` times each, `TXN_OPS` puts per txn.
const KEYS: usize = 200;
const ROUNDS: usize = 5;
const TXN_OPS: usize = 100;

fn key(i: usize) -> String {
    format!("k/{i:04}")
}

/// `GET /metrics` over HTTP/1.0, so that no server answers in chunks.
fn metric(endpoint: &str, name: &str) -> Option<f64> {
    use std::io::{Read, Write};
    let mut tcp = std::net::TcpStream::connect(endpoint).expect("connect");
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    write!(tcp, "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut response = String::new();
    tcp.read_to_string(&mut response).expect("read /metrics");
    let body = response.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    body.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

fn etcdctl(server: &Server, args: &[&str]) -> common::Output {
    let out = server.etcdctl(args);
    assert!(out.success(), "etcdctl {args:?}: {}{}", out.stdout, out.stderr);
    out
}

#[tokio::test]
async fn etcdctl_compact_and_physical_compact_while_puts_continue() {
    let server = Server::start(Kind::under_test());
    let mut c = server.client().await;
    let mut after_round = Vec::new();
    for round in 0..ROUNDS {
        for chunk in (0..KEYS).collect::<Vec<_>>().chunks(TXN_OPS) {
            let ops: Vec<TxnOp> = chunk.iter().map(|&i| TxnOp::put(key(i), format!("{round}"), None)).collect();
            c.txn(Txn::new().and_then(ops)).await.expect("load txn");
        }
        after_round.push(common::current_revision(&mut c).await);
    }
    let loaded = after_round[ROUNDS - 1];

    // A writer of new keys throughout: they add no version a compaction below them could remove.
    let stop = Arc::new(AtomicBool::new(false));
    let (written, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let writer = {
        let (stop, written, failed, mut w) = (stop.clone(), written.clone(), failed.clone(), server.client().await);
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) || i < 20 {
                match w.put(format!("live/{i:08}"), "x", None).await {
                    Ok(_) => written.fetch_add(1, Ordering::Relaxed),
                    Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                };
                i += 1;
            }
        })
    };

    let middle = after_round[1];
    let out = etcdctl(&server, &["compact", &middle.to_string()]);
    assert_eq!(out.stdout.trim(), format!("compacted revision {middle}"));
    let below = etcdctl_fails(&server, &["get", &key(0), "--rev", &(middle - 1).to_string()]);
    assert!(below.contains("required revision has been compacted"), "{below}");

    let out = etcdctl(&server, &["compact", &loaded.to_string(), "--physical"]);
    assert_eq!(out.stdout.trim(), format!("compacted revision {loaded}"));
    // Every version but each key's newest is gone by the time `--physical` answers.
    let removed = metric(&server.endpoint(), "etcd_debugging_mvcc_db_compaction_keys_total");
    assert_eq!(removed, Some(((ROUNDS - 1) * KEYS) as f64), "versions removed when --physical answered");
    let at = c.get("k/", Some(GetOptions::new().with_prefix().with_revision(loaded))).await.expect("get");
    assert_eq!(at.count(), KEYS as i64);
    assert!(at.kvs().iter().all(|kv| kv.value() == format!("{}", ROUNDS - 1).as_bytes()));

    stop.store(true, Ordering::Relaxed);
    writer.await.expect("writer");
    assert_eq!(failed.load(Ordering::Relaxed), 0, "puts failed during compaction");
    assert!(written.load(Ordering::Relaxed) >= 20);
}

/// etcdctl's stderr for a command that must fail.
fn etcdctl_fails(server: &Server, args: &[&str]) -> String {
    let out = server.etcdctl(args);
    assert!(!out.success(), "etcdctl {args:?} succeeded: {}", out.stdout);
    out.stderr
}
