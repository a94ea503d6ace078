//! Leases.
//!
//! * etcdctl differential tests: the same `etcdctl lease ...` / `put --lease` invocations run against
//!   etcd 3.4 and keyward. Lease ids are chosen by each server, so a granted id is parsed from the
//!   output, `{L<n>}` in later arguments stands for each server's own n-th lease id, and each server's
//!   ids are replaced by `<LEASE n>` in its output before comparing (the remaining TTL may differ by a
//!   second between the two runs).
//! * etcd-client tests: ids, errors, keep-alive, time-to-live, attachment rules (ignore_lease, moving a
//!   key to another lease, txn puts), expiry across a restart. Each body runs against etcd and keyward
//!   (or a second etcd under `KEYWARD_HARNESS_SELFTEST=1`) and the two transcripts are compared.

use std::fmt::Debug;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::etcd_errors::{KEY_NOT_FOUND, LEASE_EXISTS, LEASE_NOT_FOUND, LEASE_PROVIDED, TTL_TOO_LARGE};
use crate::common::{differences, line_diff, normalize, start_pair, Kind, Output, Scenario, Server};
use etcd_client::{
    Client, Error, GetOptions, LeaseGrantOptions, LeaseTimeToLiveOptions, PutOptions, Txn, TxnOp, TxnOpResponse,
};
use tonic::Code;

/// etcd's largest accepted TTL (seconds).
const MAX_TTL: i64 = 9_000_000_000;

// ---------------------------------------------------------------------------
// etcdctl differential tests with server-chosen lease ids
// ---------------------------------------------------------------------------

/// A scenario whose steps may name leases granted earlier (`{L0}`, `{L1}`, ...).
struct LeaseScenario {
    sc: Scenario,
    /// Granted lease ids: (etcd's, candidate's).
    ids: Vec<(i64, i64)>,
    steps: usize,
}

/// The lease id in `lease <hex> granted with TTL(..)` or in `"ID":<decimal>` (grant -w json).
fn granted_id(stdout: &str) -> Option<i64> {
    if let Some(rest) = stdout.strip_prefix("lease ") {
        let hex = rest.split_whitespace().next()?;
        if rest.contains(" granted with TTL(") {
            return u64::from_str_radix(hex, 16).ok().map(|v| v as i64);
        }
    }
    let pos = stdout.find("\"ID\":")?;
    let digits: String = stdout[pos + 5..].chars().take_while(|c| c.is_ascii_digit() || *c == '-').collect();
    digits.parse().ok()
}

/// Replaces each of `ids` (as 16-digit hex, short hex and decimal) by `<LEASE n>`.
fn replace_ids(text: &str, ids: &[i64]) -> String {
    let mut out = text.to_string();
    for (n, &id) in ids.iter().enumerate() {
        let ph = format!("<LEASE {n}>");
        out = out.replace(&format!("{:016x}", id as u64), &ph);
        out = out.replace(&format!("{:x}", id as u64), &ph);
        out = out.replace(&id.to_string(), &ph);
    }
    out
}

/// Sorts the words inside `attached keys([...])`: etcd lists a lease's keys in map order.
fn sort_attached_keys(text: &str) -> String {
    let marker = "attached keys([";
    let Some(start) = text.find(marker) else { return text.to_string() };
    let from = start + marker.len();
    let Some(len) = text[from..].find("])") else { return text.to_string() };
    let mut words: Vec<&str> = text[from..from + len].split(' ').collect();
    words.sort_unstable();
    format!("{}{}{}", &text[..from], words.join(" "), &text[from + len..])
}

/// Numbers following `prefix`, with their byte ranges.
fn numbers_after(text: &str, prefix: &str) -> Vec<(std::ops::Range<usize>, i64)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(pos) = text[from..].find(prefix) {
        let start = from + pos + prefix.len();
        let len = text[start..].chars().take_while(|c| c.is_ascii_digit() || *c == '-').count();
        if let Ok(v) = text[start..start + len].parse() {
            out.push((start..start + len, v));
        }
        from = start + len.max(1);
    }
    out
}

/// Remaining TTLs ("remaining(Ns)", `"ttl":N`) of the candidate may be one second off the reference's
/// (the two servers are driven one after the other); such values are replaced by the reference's.
fn align_remaining(reference: &str, cand: &str) -> String {
    let mut cand = cand.to_string();
    for prefix in ["remaining(", "\"ttl\":", "\"TTL\" : "] {
        let (a, b) = (numbers_after(reference, prefix), numbers_after(&cand, prefix));
        if a.len() != b.len() || a.iter().zip(&b).any(|(x, y)| (x.1 - y.1).abs() > 1) {
            continue;
        }
        for (x, y) in a.iter().zip(&b).rev() {
            cand.replace_range(y.0.clone(), &x.1.to_string());
        }
    }
    cand
}

impl LeaseScenario {
    fn start() -> LeaseScenario {
        LeaseScenario { sc: Scenario::start(), ids: Vec::new(), steps: 0 }
    }

    fn args_for(&self, args: &[&str], pick: impl Fn(&(i64, i64)) -> i64) -> Vec<String> {
        args.iter()
            .map(|a| {
                let mut a = a.to_string();
                for (n, pair) in self.ids.iter().enumerate() {
                    a = a.replace(&format!("{{L{n}}}"), &format!("{:x}", pick(pair) as u64));
                }
                a
            })
            .collect()
    }

    /// Runs one etcdctl step on both servers and compares; a successful `lease grant` records the ids.
    #[track_caller]
    fn step(&mut self, args: &[&str]) -> Output {
        let idx = self.steps;
        self.steps += 1;
        let run = |s: &Server, args: Vec<String>| {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            s.etcdctl(&args)
        };
        let a = run(&self.sc.reference, self.args_for(args, |p| p.0));
        let b = run(&self.sc.candidate, self.args_for(args, |p| p.1));
        let grant = args.len() >= 2 && args[0] == "lease" && args[1] == "grant";
        let mut ids_a: Vec<i64> = self.ids.iter().map(|p| p.0).collect();
        let mut ids_b: Vec<i64> = self.ids.iter().map(|p| p.1).collect();
        if grant && a.success() && b.success() {
            let ia = granted_id(&a.stdout).unwrap_or_else(|| panic!("no lease id in etcd output {:?}", a.stdout));
            let ib = granted_id(&b.stdout).unwrap_or_else(|| panic!("no lease id in candidate output {:?}", b.stdout));
            self.ids.push((ia, ib));
            ids_a.push(ia);
            ids_b.push(ib);
        }
        let clean = |o: &Output, ids: &[i64]| o.map_text(|t| normalize(&sort_attached_keys(&replace_ids(t, ids))));
        let (ca, cb) = (clean(&a, &ids_a), clean(&b, &ids_b));
        let cb = Output {
            status: cb.status,
            stdout: align_remaining(&ca.stdout, &cb.stdout),
            stderr: align_remaining(&ca.stderr, &cb.stderr),
        };
        let label = self.sc.candidate.kind.label();
        let diffs = differences("etcd", &ca, label, &cb);
        if !diffs.is_empty() {
            panic!(
                "step {idx}: `etcdctl {}` differs\n\n{}\n=== etcd stdout:\n{}=== etcd stderr:\n{}\n\
                 === last lines of {label} log:\n{}",
                args.join(" "),
                diffs.join("\n"),
                ca.stdout,
                ca.stderr,
                self.sc.candidate.log_tail(15)
            );
        }
        a
    }

    #[track_caller]
    fn run(&mut self, steps: &[&[&str]]) {
        for st in steps {
            self.step(st);
        }
    }
}

/// grant / timetolive (--keys, json) / put --lease / list / keep-alive --once / revoke, and what is left
/// after a revoke.
#[test]
fn etcdctl_lease_lifecycle() {
    let mut ls = LeaseScenario::start();
    ls.run(&[
        &["lease", "grant", "60"],               // L0
        &["lease", "grant", "90", "-w", "json"], // L1
        &["lease", "timetolive", "{L0}"],
        &["lease", "timetolive", "{L0}", "--keys"],
        &["lease", "timetolive", "{L0}", "-w", "json"],
        &["put", "k1", "v1", "--lease={L0}"],
        &["put", "k2", "v2", "--lease={L0}"],
        &["put", "k3", "v3", "--lease={L1}"],
        &["get", "k1", "-w", "json"],
        &["get", "k", "--prefix", "-w", "fields"],
        &["lease", "timetolive", "{L0}", "--keys"],
        &["lease", "timetolive", "{L1}", "--keys", "-w", "json"],
        &["lease", "list"],
        &["lease", "list", "-w", "json"],
        &["lease", "keep-alive", "--once", "{L0}"],
        &["lease", "keep-alive", "--once", "{L1}", "-w", "json"],
        &["lease", "revoke", "{L0}"],
        &["get", "k", "--prefix"],
        &["get", "k", "--prefix", "-w", "json"], // header revision: the revoke deleted two keys at one revision
        &["lease", "timetolive", "{L0}"],
        &["lease", "timetolive", "{L0}", "-w", "json"],
        &["lease", "revoke", "{L0}"],
        &["lease", "keep-alive", "--once", "{L0}"],
        &["put", "k4", "v4", "--lease={L0}"],
        &["lease", "list"],
        &["lease", "revoke", "{L1}", "-w", "json"],
        &["lease", "list"],
    ]);
}

/// TTL limits and unknown leases: minimum TTL, too large, revoke / timetolive / keep-alive / put of a
/// lease that does not exist (error texts and exit codes).
#[test]
fn etcdctl_lease_errors_and_limits() {
    let mut ls = LeaseScenario::start();
    ls.run(&[
        &["lease", "grant", "1"], // raised to the minimum TTL
        &["lease", "grant", "0"],
        &["lease", "grant", "9000000001"],
        &["lease", "grant", "9000000000"],
        &["lease", "timetolive", "{L2}"],
        &["lease", "revoke", "1234abcd"],
        &["lease", "timetolive", "1234abcd"],
        &["lease", "timetolive", "1234abcd", "-w", "json"],
        &["lease", "keep-alive", "--once", "1234abcd"],
        &["put", "x", "y", "--lease=1234abcd"],
        &["lease", "revoke", "{L2}"],
    ]);
}

/// A 2 s lease expires by itself: its keys are deleted (at one revision) and it disappears.
#[test]
fn etcdctl_lease_expiry_removes_keys() {
    let mut ls = LeaseScenario::start();
    ls.run(&[
        &["lease", "grant", "2"],
        &["put", "e/1", "a", "--lease={L0}"],
        &["put", "e/2", "b", "--lease={L0}"],
        &["put", "e/3", "not leased"],
        &["get", "e/", "--prefix", "--keys-only"],
    ]);
    thread::sleep(Duration::from_secs(4));
    ls.run(&[
        &["get", "e/", "--prefix", "-w", "json"],
        &["lease", "timetolive", "{L0}"],
        &["lease", "list"],
        &["lease", "keep-alive", "--once", "{L0}"],
    ]);
}

/// `lease list` is sorted by expiry in etcd (soonest first), whatever the ids.
#[test]
fn etcdctl_lease_list_order() {
    let mut ls = LeaseScenario::start();
    ls.run(&[
        &["lease", "grant", "100"],
        &["lease", "grant", "50"],
        &["lease", "grant", "70"],
        &["lease", "list"],
        &["lease", "list", "-w", "json"],
    ]);
}

// ---------------------------------------------------------------------------
// etcd-client helpers
// ---------------------------------------------------------------------------

/// (code, message) of a gRPC error, or the Debug form of anything else.
fn err_of<T: Debug, E: std::borrow::Borrow<Error>>(res: &Result<T, E>) -> String {
    match res {
        Ok(v) => format!("ok {v:?}"),
        Err(e) => match e.borrow() {
            Error::GRpcStatus(s) => format!("{:?}: {}", s.code(), s.message()),
            other => format!("other error: {other:?}"),
        },
    }
}

#[track_caller]
fn assert_status<T: Debug>(label: &str, res: Result<T, Error>, code: Code, message: &str) {
    match res {
        Err(Error::GRpcStatus(s)) => {
            assert_eq!((s.code(), s.message()), (code, message), "{label}: unexpected status {s:?}")
        }
        other => panic!("{label}: expected {code:?} {message:?}, got {}", err_of(&other)),
    }
}

async fn grant(c: &mut Client, ttl: i64, id: Option<i64>) -> i64 {
    let opts = id.map(|id| LeaseGrantOptions::new().with_id(id));
    c.lease_grant(ttl, opts).await.unwrap_or_else(|e| panic!("grant ttl {ttl} id {id:?}: {e}")).id()
}

async fn put_lease(c: &mut Client, key: &str, value: &str, lease: i64) -> i64 {
    let opts = PutOptions::new().with_lease(lease);
    c.put(key, value, Some(opts)).await.unwrap_or_else(|e| panic!("put {key}: {e}")).header().unwrap().revision()
}

/// (value, lease) of a key, if it exists.
async fn key_state(c: &mut Client, key: &str) -> Option<(String, i64)> {
    let resp = c.get(key, None).await.unwrap_or_else(|e| panic!("get {key}: {e}"));
    resp.kvs().first().map(|kv| (String::from_utf8_lossy(kv.value()).into_owned(), kv.lease()))
}

/// (ttl, granted_ttl, sorted keys) of a lease.
async fn ttl_of(c: &mut Client, id: i64) -> (i64, i64, Vec<String>) {
    let r = c
        .lease_time_to_live(id, Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
        .unwrap_or_else(|e| panic!("time_to_live {id}: {e}"));
    assert_eq!(r.id(), id);
    let mut keys: Vec<String> = r.keys().iter().map(|k| String::from_utf8_lossy(k).into_owned()).collect();
    keys.sort();
    (r.ttl(), r.granted_ttl(), keys)
}

async fn lease_ids(c: &mut Client) -> Vec<i64> {
    let mut ids: Vec<i64> = c.leases().await.expect("leases").leases().iter().map(|l| l.id()).collect();
    ids.sort();
    ids
}

/// Polls until `key` is gone; returns how long that took (panics after `limit`).
async fn wait_deleted(c: &mut Client, key: &str, limit: Duration) -> Duration {
    let t0 = Instant::now();
    while key_state(c, key).await.is_some() {
        assert!(t0.elapsed() < limit, "{key} still exists after {limit:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    t0.elapsed()
}

#[track_caller]
fn assert_same<T: Debug + PartialEq>(what: &str, etcd: &T, cand: &T) {
    if etcd != cand {
        let (a, b) = (format!("{etcd:#?}\n"), format!("{cand:#?}\n"));
        let label = Kind::under_test().label();
        panic!("{what}: {label} differs from etcd (- etcd, + {label}):\n{}", line_diff(&a, &b));
    }
}

// ---------------------------------------------------------------------------
// etcd-client tests
// ---------------------------------------------------------------------------

async fn grant_scenario(server: &Server) -> Vec<String> {
    let label = server.kind.label();
    let mut c = server.client().await;
    let mut t = Vec::new();

    // server-chosen id
    let r = c.lease_grant(30, None).await.expect("grant");
    assert!(r.id() > 0, "{label}: server-chosen lease id {} is not positive", r.id());
    t.push(format!(
        "server-chosen: ttl {} error {:?} header rev {}",
        r.ttl(),
        r.error(),
        r.header().unwrap().revision()
    ));
    let auto = r.id();

    // client-chosen id
    let r = c.lease_grant(40, Some(LeaseGrantOptions::new().with_id(12345))).await.expect("grant 12345");
    assert_eq!((r.id(), r.ttl()), (12345, 40), "{label}");
    t.push(format!("client-chosen: id {} ttl {}", r.id(), r.ttl()));
    let dup = c.lease_grant(50, Some(LeaseGrantOptions::new().with_id(12345))).await;
    t.push(format!("duplicate: {}", err_of(&dup)));
    assert_status(label, dup, Code::FailedPrecondition, LEASE_EXISTS);
    assert_eq!(ttl_of(&mut c, 12345).await.1, 40, "{label}: a refused duplicate grant changed the lease");

    // TTL limits
    let big = c.lease_grant(MAX_TTL + 1, None).await;
    t.push(format!("ttl max+1: {}", err_of(&big)));
    assert_status(label, big, Code::OutOfRange, TTL_TOO_LARGE);
    let max = c.lease_grant(MAX_TTL, Some(LeaseGrantOptions::new().with_id(777))).await;
    t.push(format!("ttl max: {}", err_of(&max.as_ref().map(|r| (r.id(), r.ttl())))));
    let (ttl, granted, _) = ttl_of(&mut c, 777).await;
    t.push(format!("ttl max time_to_live: granted {granted}, remaining within 2 s of it: {}", granted - ttl <= 2));
    for ttl in [1, 0, -5] {
        let r = c.lease_grant(ttl, None).await;
        t.push(format!("ttl {ttl}: {}", err_of(&r.as_ref().map(|r| r.ttl()))));
    }

    // negative client-chosen id
    let neg = c.lease_grant(60, Some(LeaseGrantOptions::new().with_id(-7))).await;
    t.push(format!("id -7: {}", err_of(&neg.as_ref().map(|r| (r.id(), r.ttl())))));

    // unknown leases
    let rv = c.lease_revoke(999).await;
    t.push(format!("revoke unknown: {}", err_of(&rv)));
    assert_status(label, rv, Code::NotFound, LEASE_NOT_FOUND);
    let ttl = c.lease_time_to_live(999, Some(LeaseTimeToLiveOptions::new().with_keys())).await.expect("ttl unknown");
    assert_eq!((ttl.id(), ttl.ttl(), ttl.granted_ttl(), ttl.keys().len()), (999, -1, 0, 0), "{label}");
    t.push(format!(
        "time_to_live unknown: ttl {} granted {} header rev {}",
        ttl.ttl(),
        ttl.granted_ttl(),
        ttl.header().unwrap().revision()
    ));
    let put = c.put("k", "v", Some(PutOptions::new().with_lease(999))).await;
    t.push(format!("put with unknown lease: {}", err_of(&put.as_ref().map(|_| ()))));
    assert_status(label, put, Code::NotFound, LEASE_NOT_FOUND);

    // list
    let ids = lease_ids(&mut c).await;
    assert!(ids.contains(&auto) && ids.contains(&12345) && ids.contains(&777), "{label}: leases {ids:?}");
    t.push(format!("list has {} leases", ids.len()));

    // revoke: the header carries the revision
    let before = c.get("k", None).await.unwrap().header().unwrap().revision();
    let r = c.lease_revoke(12345).await.expect("revoke");
    t.push(format!("revoke (no keys): header rev {} (before {before})", r.header().unwrap().revision()));
    assert_eq!(ttl_of(&mut c, 12345).await.0, -1, "{label}: revoked lease still has a TTL");
    let again = c.lease_revoke(12345).await;
    assert_status(label, again, Code::NotFound, LEASE_NOT_FOUND);
    t
}

/// Server-chosen and client-chosen ids, duplicate id, TTL limits (minimum, too large, the maximum),
/// unknown leases (revoke NotFound, time_to_live TTL -1, put), list, revoke.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grant_ids_limits_and_unknown_leases() {
    let (etcd, cand) = start_pair().await;
    let (a, b) = tokio::join!(grant_scenario(&etcd), grant_scenario(&cand));
    assert_same("grant transcript", &a, &b);
}

async fn keep_alive_scenario(server: &Server) -> Vec<String> {
    let label = server.kind.label();
    let mut c = server.client().await;
    let mut t = Vec::new();
    let id = grant(&mut c, 3, None).await;
    put_lease(&mut c, "ka", "v", id).await;
    let (mut keeper, mut stream) = c.lease_keep_alive(id).await.expect("keep_alive");
    let t0 = Instant::now();
    // ~6 s, twice the TTL, renewed every second
    for i in 0..6 {
        keeper.keep_alive().await.expect("send keep-alive");
        let r = tokio::time::timeout(Duration::from_secs(5), stream.message())
            .await
            .expect("keep-alive response in time")
            .expect("keep-alive stream")
            .expect("keep-alive response");
        assert_eq!((r.id(), r.ttl()), (id, 3), "{label}: keep-alive response {i}");
        if i == 0 {
            t.push(format!("keep-alive response: ttl {}, header revision {}", r.ttl(), r.header().unwrap().revision()));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(t0.elapsed() > Duration::from_secs(5));
    assert!(key_state(&mut c, "ka").await.is_some(), "{label}: key of a kept-alive lease was deleted");
    let (ttl, granted, keys) = ttl_of(&mut c, id).await;
    assert!((1..=3).contains(&ttl) && granted == 3 && keys == ["ka"], "{label}: {ttl} {granted} {keys:?}");
    drop(keeper);
    drop(stream);
    // no more renewals: gone within TTL + expiry check period (+ slack)
    let took = wait_deleted(&mut c, "ka", Duration::from_secs(10)).await;
    t.push(format!("deleted after the keep-alives stopped: {}", took <= Duration::from_secs(8)));
    assert_eq!(ttl_of(&mut c, id).await.0, -1, "{label}: expired lease still known");

    // keep-alive of an unknown lease: answered with TTL 0 (which the client reports as "lease not found")
    let r = c.lease_keep_alive(4242).await;
    t.push(format!("keep-alive unknown: {}", err_of(&r.as_ref().map(|_| ()))));
    // keep-alive of a lease revoked while its keep-alive stream is open: TTL 0 on that stream
    let id2 = grant(&mut c, 30, None).await;
    let (mut keeper, mut stream) = c.lease_keep_alive(id2).await.expect("keep_alive");
    c.lease_revoke(id2).await.unwrap();
    keeper.keep_alive().await.unwrap();
    let r = stream.message().await.expect("stream").expect("response");
    assert_eq!((r.id(), r.ttl()), (id2, 0), "{label}: keep-alive of a revoked lease");
    t.push(format!("keep-alive revoked: ttl {}", r.ttl()));
    t
}

/// The keep-alive stream answers with the granted TTL and keeps a 3 s lease (and its key) alive for 6 s;
/// once renewals stop it expires. Unknown and revoked leases are answered with TTL 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keep_alive_keeps_lease_past_its_ttl() {
    let (etcd, cand) = start_pair().await;
    let (a, b) = tokio::join!(keep_alive_scenario(&etcd), keep_alive_scenario(&cand));
    assert_same("keep-alive transcript", &a, &b);
}

async fn attachment_scenario(server: &Server) -> Vec<String> {
    let label = server.kind.label();
    let mut c = server.client().await;
    let mut t = Vec::new();
    let a = grant(&mut c, 60, None).await;
    let b = grant(&mut c, 60, None).await;
    let a2 = grant(&mut c, 60, None).await;
    let name = |id: i64| match id {
        0 => "none".to_string(),
        x if x == a => "A".into(),
        x if x == b => "B".into(),
        x if x == a2 => "A2".into(),
        other => format!("other {other}"),
    };

    // ignore_lease keeps the key's lease
    put_lease(&mut c, "keep", "v1", a).await;
    c.put("keep", "v2", Some(PutOptions::new().with_ignore_lease())).await.expect("put ignore_lease");
    let st = key_state(&mut c, "keep").await.unwrap();
    assert_eq!(st, ("v2".to_string(), a), "{label}: ignore_lease changed the lease");
    t.push(format!("after ignore_lease: {} lease {}", st.0, name(st.1)));
    let r = c.put("absent", "v", Some(PutOptions::new().with_ignore_lease())).await;
    t.push(format!("ignore_lease on a missing key: {}", err_of(&r.as_ref().map(|_| ()))));
    assert_status(label, r, Code::InvalidArgument, KEY_NOT_FOUND);
    let r = c.put("keep", "v", Some(PutOptions::new().with_ignore_lease().with_lease(b))).await;
    t.push(format!("ignore_lease with a lease: {}", err_of(&r.as_ref().map(|_| ()))));
    assert_status(label, r, Code::InvalidArgument, LEASE_PROVIDED);

    // a key moved from A to B
    put_lease(&mut c, "moved", "1", a).await;
    put_lease(&mut c, "moved", "2", b).await;
    // a key detached from A2 by a put without lease
    put_lease(&mut c, "detached", "1", a2).await;
    c.put("detached", "2", None).await.unwrap();
    // a leased key deleted before the revoke
    put_lease(&mut c, "gone", "1", a).await;
    c.delete("gone", None).await.unwrap();
    // a leased key deleted, then created again without a lease
    put_lease(&mut c, "again", "1", a).await;
    c.delete("again", None).await.unwrap();
    c.put("again", "2", None).await.unwrap();
    t.push(format!("A keys {:?}", ttl_of(&mut c, a).await.2));
    t.push(format!("B keys {:?}", ttl_of(&mut c, b).await.2));
    t.push(format!("A2 keys {:?}", ttl_of(&mut c, a2).await.2));
    assert_eq!(ttl_of(&mut c, a).await.2, ["keep"], "{label}: keys of A");
    assert_eq!(ttl_of(&mut c, b).await.2, ["moved"], "{label}: keys of B");
    assert!(ttl_of(&mut c, a2).await.2.is_empty(), "{label}: keys of A2");

    let rev_before = c.get("x", None).await.unwrap().header().unwrap().revision();
    let r = c.lease_revoke(a).await.expect("revoke A");
    t.push(format!("revoke A: header rev {} (before {rev_before})", r.header().unwrap().revision()));
    assert_eq!(key_state(&mut c, "keep").await, None, "{label}: key of revoked lease A survived");
    let again = key_state(&mut c, "again").await;
    assert_eq!(again, Some(("2".to_string(), 0)), "{label}: key re-created without lease deleted by revoking A");
    let moved = key_state(&mut c, "moved").await;
    assert_eq!(moved, Some(("2".to_string(), b)), "{label}: key moved to B was deleted or changed by revoking A");
    c.lease_revoke(a2).await.expect("revoke A2");
    let detached = key_state(&mut c, "detached").await;
    assert_eq!(detached, Some(("2".to_string(), 0)), "{label}: key detached from A2 was deleted by revoking A2");
    c.lease_revoke(b).await.expect("revoke B");
    assert_eq!(key_state(&mut c, "moved").await, None, "{label}: key of revoked lease B survived");
    let rev = c.get("x", None).await.unwrap().header().unwrap().revision();
    t.push(format!("final revision {rev}"));
    t
}

/// put with ignore_lease keeps the key's lease (and refuses a missing key or a lease); a key moved from
/// lease A to lease B survives revoking A; a put without lease detaches; a deleted key is not attached.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn attachment_rules_ignore_lease_and_moves() {
    let (etcd, cand) = start_pair().await;
    let (a, b) = tokio::join!(attachment_scenario(&etcd), attachment_scenario(&cand));
    assert_same("attachment transcript", &a, &b);
}

async fn txn_scenario(server: &Server) -> Vec<String> {
    let label = server.kind.label();
    let mut c = server.client().await;
    let mut t = Vec::new();
    let id = grant(&mut c, 60, None).await;
    let txn = Txn::new().and_then(vec![
        TxnOp::put("t1", "a", Some(PutOptions::new().with_lease(id))),
        TxnOp::put("t2", "b", None),
        TxnOp::txn(Txn::new().and_then(vec![TxnOp::put("t3", "c", Some(PutOptions::new().with_lease(id)))])),
    ]);
    let r = c.txn(txn).await.expect("txn with lease");
    assert!(r.succeeded());
    t.push(format!("txn: rev {}", r.header().unwrap().revision()));
    assert_eq!(key_state(&mut c, "t1").await.map(|s| s.1), Some(id), "{label}");
    let keys = ttl_of(&mut c, id).await.2;
    assert_eq!(keys, ["t1", "t3"], "{label}: keys attached by the txn");
    t.push(format!("attached {keys:?}"));

    // an unknown lease anywhere in the txn refuses the whole txn
    let bad = Txn::new()
        .and_then(vec![TxnOp::put("t4", "d", None), TxnOp::put("t5", "e", Some(PutOptions::new().with_lease(31337)))]);
    let r = c.txn(bad).await;
    t.push(format!("txn with unknown lease: {}", err_of(&r.as_ref().map(|_| ()))));
    assert_status(label, r, Code::NotFound, LEASE_NOT_FOUND);
    assert_eq!(key_state(&mut c, "t4").await, None, "{label}: refused txn wrote t4");
    // in the branch not taken: etcd still checks it
    let untaken = Txn::new()
        .when(vec![etcd_client::Compare::version("t1", etcd_client::CompareOp::Equal, 1)])
        .and_then(vec![TxnOp::get("t1", None)])
        .or_else(vec![TxnOp::put("t6", "f", Some(PutOptions::new().with_lease(31337)))]);
    let r = c.txn(untaken).await;
    t.push(format!("unknown lease in the branch not taken: {}", err_of(&r.as_ref().map(|r| r.succeeded()))));
    if let Ok(r) = &r {
        assert!(matches!(r.op_responses().first(), Some(TxnOpResponse::Get(_))));
    }

    let r = c.lease_revoke(id).await.expect("revoke");
    t.push(format!("revoke: rev {}", r.header().unwrap().revision()));
    let left: Vec<String> = c
        .get("t", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap()
        .kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect();
    assert_eq!(left, ["t2"], "{label}: keys left after revoking the txn's lease");
    t
}

/// Puts with a lease inside a txn (also nested) attach the keys; a txn naming an unknown lease is
/// refused as a whole; revoking deletes exactly the attached keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn txn_put_with_lease() {
    let (etcd, cand) = start_pair().await;
    let (a, b) = tokio::join!(txn_scenario(&etcd), txn_scenario(&cand));
    assert_same("txn transcript", &a, &b);
}

async fn restart_scenario(server: &mut Server) -> Vec<String> {
    let label = server.kind.label();
    let mut t = Vec::new();
    let (long, short) = {
        let mut c = server.client().await;
        let long = grant(&mut c, 30, None).await;
        put_lease(&mut c, "long", "v", long).await;
        let short = grant(&mut c, 3, None).await;
        put_lease(&mut c, "short", "v", short).await;
        (long, short)
    };
    tokio::task::block_in_place(|| server.restart());
    let mut c = server.client().await;
    let (ttl, granted, keys) = ttl_of(&mut c, long).await;
    assert!(ttl > 0 && ttl <= 30, "{label}: remaining TTL {ttl} of a 30 s lease after a restart");
    assert_eq!((granted, keys.as_slice()), (30, &["long".to_string()][..]), "{label}");
    t.push(format!("long after restart: granted {granted}, keys {keys:?}"));
    assert!(lease_ids(&mut c).await.contains(&long));
    // the short lease still expires (it may already have)
    let took = wait_deleted(&mut c, "short", Duration::from_secs(15)).await;
    t.push(format!("short lease's key deleted within 8 s of the restart: {}", took <= Duration::from_secs(8)));
    assert_eq!(ttl_of(&mut c, short).await.0, -1, "{label}: expired lease still known after restart");
    assert!(key_state(&mut c, "long").await.is_some(), "{label}: key of the 30 s lease deleted");
    let ids = lease_ids(&mut c).await;
    assert!(ids.contains(&long) && !ids.contains(&short), "{label}: leases after expiry {ids:?}");
    // the lease is still usable
    put_lease(&mut c, "long2", "v", long).await;
    c.lease_revoke(long).await.expect("revoke long");
    assert_eq!(key_state(&mut c, "long2").await, None);
    let rev = c.get("x", None).await.unwrap().header().unwrap().revision();
    t.push(format!("revision {rev}"));
    t
}

/// Leases survive a SIGKILL restart: a 30 s lease still exists with 0 < TTL <= 30 and its key; a 3 s
/// lease granted before the restart expires after it and its key is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leases_survive_restart_and_expire_after_it() {
    let (mut etcd, mut cand) = start_pair().await;
    let (a, b) = tokio::join!(restart_scenario(&mut etcd), restart_scenario(&mut cand));
    assert_same("restart transcript", &a, &b);
}
