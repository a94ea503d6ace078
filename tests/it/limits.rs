//! Keys and names of every size etcd accepts (issue 10), differential against etcd 3.4.
//!
//! etcd stores keys of any bytes up to `--max-request-bytes` (1.5 MiB by default); LMDB refuses keys
//! over 511 bytes. Every scenario here runs the same steps on a fresh etcd 3.4 and a fresh keyward (or a
//! second etcd under `KEYWARD_HARNESS_SELFTEST=1`) and requires the same observable output, with only
//! what legitimately differs normalized (cluster and member ids, raft terms, ports, timings):
//!
//! * [`long_keys_through_etcdctl`]: keys of 493, 494, 511, 512, 600 bytes, 4 KiB and 64 KiB, each
//!   a prefix of the next (so a bounded-key layout meets keys that agree on its whole bound): put, get
//!   in every output format, history (`--rev`) after overwrites and deletes, txn compares, prefix and
//!   range reads across them; a 1 MiB key through `etcdctl txn` (argv cannot carry it); compaction;
//!   `snapshot save`.
//! * [`long_shared_prefix_ranges_through_etcdctl`]: 50 keys of 1,000+ bytes whose first 900 bytes are
//!   equal, plus short keys sorting before, between and after them: `get --prefix` with `--limit`,
//!   `--sort-by`, `--keys-only`, `--count-only`, `--from-key`, explicit ranges, history, compaction.
//! * [`long_user_role_and_permission_names_through_etcdctl`]: users and roles named with 600 bytes and
//!   4 KiB, permissions on a 600-byte key, a 700-byte prefix, a range and a from-key; with auth
//!   enabled the long-named user writes inside its long prefix and is denied outside it.
//! * [`binary_and_megabyte_keys_through_the_client`] (the `etcd-client` crate, because argv cannot carry
//!   `\0` or 1 MiB): keys of `\0` and `\xff` bytes and of every size above up to 1 MiB through put, get,
//!   range, delete, txn compares, lease attach and revoke, watch (live and replayed from revision 1),
//!   compaction and a snapshot.
//!
//! Each scenario ends with a SIGKILL restart of both members and checks that everything is intact:
//! a full `get "" --from-key` (headers dropped) and the SHA-256 of every range result are the same
//! before and after, on each side, and still the same as etcd's.
//!
//! A differing step does not end an etcdctl scenario: every difference is listed at the end. After
//! [`GIVE_UP_AFTER`] differing steps in a row the scenario stops early (a member that stopped answers
//! every later step with the same error, and a dead one would cost etcdctl's dial timeout per step).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use crate::common::{self, normalize, Kind, Output, Scenario, Server};
use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, GetOptions, KeyValue, KvClient, LeaseGrantOptions,
    LeaseTimeToLiveOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, WatchOptions, WatchResponse,
    WatchStream,
};

/// Consecutive differing steps after which an etcdctl scenario stops.
const GIVE_UP_AFTER: usize = 8;

/// Key sizes around LMDB's 511-byte limit and well past it (the 1 MiB one is added where a transport
/// can carry it).
const LONG_SIZES: [usize; 7] = [493, 494, 511, 512, 600, 4 << 10, 64 << 10];
const MIB: usize = 1 << 20;

/// `len` bytes of `tag` followed by a repeating `a..z` pattern. Names made from one tag nest: a shorter
/// one is a prefix of every longer one.
fn long_name(tag: &str, len: usize) -> String {
    let mut name = format!("{tag}/");
    let mut i = 0u8;
    while name.len() < len {
        name.push(char::from(b'a' + i % 26));
        i = i.wrapping_add(1);
    }
    name.truncate(len);
    name
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A short, exact stand-in for a long text: its length, its SHA-256 prefix, and its ends.
fn fingerprint(text: &str) -> String {
    format!("[{} bytes, sha256 {}]", text.len(), &hex(&sha256(text.as_bytes()))[..16])
}

/// `text` cut to at most `max` bytes (on a char boundary), with the length when cut.
fn abbreviate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…({} bytes)", &text[..end], text.len())
}

/// Where two texts first differ: the line number and a window of each line around the first
/// differing column (long keys make whole outputs unreadable in a failure message).
fn first_difference(a: &str, b: &str) -> String {
    let (la, lb): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let line = (0..la.len().max(lb.len())).find(|&i| la.get(i) != lb.get(i)).unwrap_or(0);
    let (x, y) = (la.get(line).copied().unwrap_or("<no line>"), lb.get(line).copied().unwrap_or("<no line>"));
    let col = x.bytes().zip(y.bytes()).take_while(|(p, q)| p == q).count();
    let window = |s: &str| {
        if s == "<no line>" {
            return s.to_string();
        }
        let mut start = col.saturating_sub(60);
        while !s.is_char_boundary(start) {
            start -= 1;
        }
        let rest = &s[start..];
        format!("{}{} (line of {} bytes)", if start > 0 { "…" } else { "" }, abbreviate(rest, 160), s.len())
    };
    format!(
        "line {} (of {} vs {}), column {col}:\n      etcd:      {}\n      candidate: {}",
        line + 1,
        la.len(),
        lb.len(),
        window(x),
        window(y)
    )
}

/// The first error lines and the last lines of a server's log, each cut short (they quote whole
/// requests, long keys included; a stopped member repeats its error on every request).
fn log_tail(server: &Server) -> String {
    let log = std::fs::read(server.log_path()).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
    let first_errors: Vec<&str> = log.lines().filter(|l| l.contains("ERROR") || l.contains(" E | ")).take(5).collect();
    let lines: Vec<&str> = log.lines().collect();
    let last = &lines[lines.len().saturating_sub(10)..];
    let cut = |l: &&str| abbreviate(l, 300);
    format!(
        "first errors:\n{}\nlast lines:\n{}",
        first_errors.iter().map(cut).collect::<Vec<_>>().join("\n"),
        last.iter().map(cut).collect::<Vec<_>>().join("\n")
    )
}

fn panic_text(panic: Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "<non-string panic>".into())
}

// ---------------------------------------------------------------------------
// etcdctl on both servers, differences collected
// ---------------------------------------------------------------------------

/// How the text of one side is compared (after `common::normalize`).
type View<'a> = &'a dyn Fn(&Server, &str) -> String;

fn as_is(_: &Server, text: &str) -> String {
    text.to_string()
}

/// `-w json` output without its response header (for whole-store dumps).
fn without_header(_: &Server, text: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(mut fields)) => {
            fields.remove("header");
            serde_json::Value::Object(fields).to_string()
        }
        _ => text.to_string(),
    }
}

/// etcdctl's arguments with 30 s to dial (which logs in) and to run, before `args` (whose own
/// timeouts come later and win): a debug build reading megabytes of long keys on a busy machine took
/// more than etcdctl's 5 s, and how long is not what is compared.
fn with_patience(args: &[&str]) -> Vec<String> {
    ["--command-timeout=30s", "--dial-timeout=30s"].iter().chain(args).map(|a| a.to_string()).collect()
}

/// etcd and the candidate, driven through etcdctl in lockstep.
struct Pair {
    name: &'static str,
    sc: Scenario,
    steps: usize,
    failures: Vec<String>,
    consecutive: usize,
}

impl Pair {
    fn start(name: &'static str, extra_args: &[&str]) -> Pair {
        Pair { name, sc: Scenario::start_with(extra_args), steps: 0, failures: Vec::new(), consecutive: 0 }
    }

    fn candidate_label(&self) -> &'static str {
        match self.sc.candidate.kind {
            Kind::Etcd => "etcd#2 (selftest)",
            Kind::Keyward => "keyward",
        }
    }

    /// Same arguments on both sides; returns etcd's output.
    fn step(&mut self, args: &[&str]) -> Output {
        let args = with_patience(args);
        let [etcd, _] = self.compare(&|_| args.clone(), None, &as_is);
        etcd
    }

    fn step_stdin(&mut self, args: &[&str], stdin: &str) -> Output {
        let args = with_patience(args);
        let [etcd, _] = self.compare(&|_| args.clone(), Some(stdin), &as_is);
        etcd
    }

    /// Runs one step on both sides and compares exit status and `view` of the normalized stdout and
    /// stderr; returns both outputs with the viewed texts, `[etcd, candidate]`.
    fn compare(&mut self, args: &dyn Fn(&Server) -> Vec<String>, stdin: Option<&str>, view: View<'_>) -> [Output; 2] {
        let index = self.steps;
        self.steps += 1;
        let run = |s: &Server| {
            let args = args(s);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = match stdin {
                Some(input) => s.etcdctl_stdin(&args, input),
                None => s.etcdctl(&args),
            };
            Output {
                status: out.status,
                stdout: view(s, &normalize(&out.stdout)),
                stderr: view(s, &normalize(&out.stderr)),
            }
        };
        let a = run(&self.sc.reference);
        let b = run(&self.sc.candidate);
        if std::env::var("KEYWARD_HARNESS_VERBOSE").is_ok_and(|v| v == "1") {
            let shown: Vec<String> = args(&self.sc.reference).iter().map(|a| abbreviate(a, 32)).collect();
            eprintln!(
                "--- {} #{index}: etcdctl {} [{}]\n{}\n{}",
                self.name,
                shown.join(" "),
                a.status,
                abbreviate(&a.stdout, 400),
                abbreviate(&a.stderr, 400)
            );
        }
        let mut diffs = Vec::new();
        if a.success() != b.success() {
            diffs.push(format!("    etcd: {}, candidate: {}", a.status, b.status));
        }
        // etcdctl's verdict is its last line ("Error: ..."), after the retry warnings: shown first, as
        // a report cut short (a CI excerpt) must still say why a step failed.
        if a.stderr != b.stderr {
            let last = |s: &str| abbreviate(s.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or(""), 200);
            diffs.push(format!(
                "    last stderr lines:\n      etcd:      {}\n      candidate: {}",
                last(&a.stderr),
                last(&b.stderr)
            ));
        }
        for (stream, x, y) in [("stdout", &a.stdout, &b.stdout), ("stderr", &a.stderr, &b.stderr)] {
            if x != y {
                diffs.push(format!("    {stream} differs at {}", first_difference(x, y)));
            }
        }
        if diffs.is_empty() {
            self.consecutive = 0;
        } else {
            let shown: Vec<String> = args(&self.sc.reference).iter().map(|a| abbreviate(a, 48)).collect();
            let input = stdin.map(|s| format!(" <<< {:?}", abbreviate(s, 120))).unwrap_or_default();
            self.fail(format!("#{index} etcdctl {}{input}\n{}", shown.join(" "), diffs.join("\n")));
        }
        [a, b]
    }

    /// Records a difference; gives up (panics with the report) after too many in a row.
    fn fail(&mut self, what: String) {
        self.failures.push(what);
        self.consecutive += 1;
        if self.consecutive >= GIVE_UP_AFTER {
            panic!("{}", self.report(&format!("stopped after {GIVE_UP_AFTER} differing steps in a row")));
        }
    }

    fn report(&self, ending: &str) -> String {
        format!(
            "{}: {} of {} steps differ between etcd and {} ({ending}):\n\n{}\n\n=== last lines of the candidate's log ({}):\n{}\n",
            self.name,
            self.failures.len(),
            self.steps,
            self.candidate_label(),
            self.failures.join("\n\n"),
            self.sc.candidate.log_path().display(),
            log_tail(&self.sc.candidate),
        )
    }

    /// The header revision in etcd's `-w json` output of a step.
    #[track_caller]
    fn revision(out: &Output) -> i64 {
        let at = out.stdout.find("\"revision\":").map(|i| i + "\"revision\":".len());
        let digits = at.map(|i| out.stdout[i..].bytes().take_while(u8::is_ascii_digit).count());
        match (at, digits) {
            (Some(i), Some(n)) if n > 0 => out.stdout[i..i + n].parse().expect("a revision"),
            _ => panic!("no revision in etcd's output: {}", abbreviate(&out.stdout, 300)),
        }
    }

    /// SIGKILLs and restarts both members, then runs `queries` again: on each side every answer must
    /// be what it was before (compared by SHA-256), as well as equal to etcd's. The first query
    /// should be the whole-store dump, compared without its header.
    fn restart_and_compare(&mut self, queries: &[(Vec<String>, View<'_>)]) {
        let answers = |p: &mut Pair| -> Vec<[String; 2]> {
            queries
                .iter()
                .map(|(args, view)| {
                    let [a, b] = p.compare(&|_| args.clone(), None, *view);
                    [format!("{}{}", a.stdout, a.stderr), format!("{}{}", b.stdout, b.stderr)]
                })
                .collect()
        };
        let before = answers(self);
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| self.sc.restart_both())) {
            self.failures.push(format!("restart: {}", panic_text(panic)));
            panic!("{}", self.report("a member did not come back after the restart"));
        }
        let after = answers(self);
        for (i, (args, _)) in queries.iter().enumerate() {
            for (side, label) in [(0, "etcd"), (1, self.candidate_label())] {
                let (x, y) = (&before[i][side], &after[i][side]);
                if x != y {
                    let shown: Vec<String> = args.iter().map(|a| abbreviate(a, 48)).collect();
                    self.fail(format!(
                        "after the restart {label} answers `etcdctl {}` differently: before {}, after {}\n    {}",
                        shown.join(" "),
                        fingerprint(x),
                        fingerprint(y),
                        first_difference(x, y)
                    ));
                }
            }
        }
    }

    #[track_caller]
    fn finish(self) {
        assert!(self.failures.is_empty(), "{}", self.report("ran to the end"));
    }
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|a| a.to_string()).collect()
}

// ---------------------------------------------------------------------------
// scenario 1: long keys through etcdctl
// ---------------------------------------------------------------------------

/// Masks what `etcdctl snapshot save` prints that legitimately differs: the file's path, and the
/// timestamps, durations and sizes of its log lines (whose order varies: they are sorted).
fn snapshot_log(server: &Server, text: &str) -> String {
    let dir = server.dir().path().display().to_string();
    let mut lines: Vec<String> = text
        .lines()
        .map(|line| match serde_json::from_str::<serde_json::Value>(line) {
            Ok(serde_json::Value::Object(mut fields)) => {
                for volatile in ["ts", "took", "size"] {
                    if fields.contains_key(volatile) {
                        fields.insert(volatile.into(), "<VOLATILE>".into());
                    }
                }
                serde_json::Value::Object(fields).to_string().replace(&dir, "<DIR>")
            }
            _ => line.replace(&dir, "<DIR>"),
        })
        .collect();
    lines.sort();
    lines.join("\n")
}

/// The checks on a saved snapshot file that hold for both servers' formats: etcdctl's layout (512·n
/// bytes, then their SHA-256), and room for at least the live keys it must hold.
fn snapshot_file_problems(path: &std::path::Path, live_key_bytes: usize) -> Option<String> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) => return Some(format!("cannot read {}: {e}", path.display())),
    };
    if bytes.len() < 32 || bytes.len() % 512 != 32 {
        return Some(format!("{} bytes: not 512·n + 32", bytes.len()));
    }
    let (db, digest) = bytes.split_at(bytes.len() - 32);
    if sha256(db) != digest {
        return Some("the trailing SHA-256 does not match".into());
    }
    if db.len() < live_key_bytes {
        return Some(format!("{} bytes cannot hold the {live_key_bytes} bytes of live keys", db.len()));
    }
    None
}

#[test]
fn long_keys_through_etcdctl() {
    let mut p = Pair::start("long keys through etcdctl", &[]);
    let mut live_key_bytes = 0;
    for len in LONG_SIZES {
        let k = long_name("k", len);
        let k = k.as_str();
        let r1 = Pair::revision(&p.step(&["put", k, "v1", "-w", "json"]));
        p.step(&["get", k]);
        p.step(&["get", k, "-w", "json"]);
        p.step(&["get", k, "-w", "fields"]);
        p.step(&["get", k, "--keys-only", "--hex"]);
        let r2 = Pair::revision(&p.step(&["put", k, "v2", "--prev-kv", "-w", "json"]));
        p.step(&["get", k, &format!("--rev={r1}"), "-w", "json"]);
        // every compare target, then a failing compare that takes the other branch
        let compares = format!(
            "value(\"{k}\") = \"v2\"\nversion(\"{k}\") = \"2\"\ncreate(\"{k}\") = \"{r1}\"\nmod(\"{k}\") = \"{r2}\"\n"
        );
        p.step_stdin(&["txn", "-w", "json"], &format!("{compares}\nput {k} v3\nget {k}\n\nget {k}\n\n"));
        p.step_stdin(&["txn"], &format!("value(\"{k}\") = \"nope\"\n\nput {k} never\n\nget {k}\n\n"));
        let r_del = Pair::revision(&p.step(&["del", k, "--prev-kv", "-w", "json"]));
        p.step(&["get", k, "-w", "json"]);
        p.step(&["get", k, &format!("--rev={}", r_del - 1), "-w", "json"]);
        p.step(&["put", k, "v4"]);
        p.step(&["get", k, "-w", "json"]);
        live_key_bytes += len;
    }
    let mid = Pair::revision(&p.step(&["get", "probe", "-w", "json"]));

    // 1 MiB: too long for an argument (Linux caps one at 128 KiB), so it goes through txn's stdin and
    // is read back by a prefix one byte longer than the 64 KiB key.
    let big = long_name("k", MIB);
    let big_prefix = &big[..(64 << 10) + 1];
    p.step_stdin(&["txn", "-w", "json"], &format!("\nput {big} v1\n\n\n"));
    p.step(&["get", big_prefix, "--prefix", "-w", "json"]);
    p.step(&["get", big_prefix, "--prefix", "--keys-only"]);
    // (a compare on the 1 MiB key with short ops: repeating the key in the ops would pass etcd's 2 MiB
    // gRPC message limit)
    p.step_stdin(&["txn"], &format!("value(\"{big}\") = \"v1\"\n\nput after-big yes\n\nget after-big\n\n"));
    p.step_stdin(&["txn"], &format!("value(\"{big}\") = \"v0\"\n\nput after-big no\n\nget after-big\n\n"));
    p.step_stdin(&["txn", "-w", "json"], &format!("\ndel {big}\n\n\n"));
    p.step(&["get", big_prefix, "--prefix", "--count-only"]);
    p.step(&["get", big_prefix, "--prefix", "-w", "json"]);
    let r_big = Pair::revision(&p.step_stdin(&["txn", "-w", "json"], &format!("\nput {big} v3\n\n\n")));
    p.step(&["get", big_prefix, "--prefix", &format!("--rev={}", r_big - 2), "-w", "json"]);
    live_key_bytes += MIB;

    // ranges across the nested keys
    let k493 = long_name("k", 493);
    let (k494, k600) = (long_name("k", 494), long_name("k", 600));
    p.step(&["get", &k493, "--prefix", "--keys-only"]);
    p.step(&["get", &k493, "--prefix", "--limit", "3", "-w", "json"]);
    p.step(&["get", &k494, &k600, "--keys-only"]);
    p.step(&["get", &k600, "--from-key", "--keys-only", "--limit", "2"]);
    p.step(&["get", &k493, "--prefix", "--sort-by=KEY", "--order=DESCEND", "--keys-only", "--limit", "2"]);
    p.step(&["get", "", "--from-key", "--keys-only"]);

    // compaction: history before `mid` is gone, reads at `mid` still work
    p.step(&["compaction", &mid.to_string()]);
    p.step(&["compaction", &mid.to_string()]);
    p.step(&["get", &k600, &format!("--rev={}", mid - 1)]);
    p.step(&["get", &k493, "--prefix", &format!("--rev={mid}"), "--keys-only"]);

    // snapshot save
    let path = |s: &Server| s.dir().path().join("limits.db");
    p.compare(&|s| vec!["snapshot".into(), "save".into(), path(s).display().to_string()], None, &snapshot_log);
    for (label, server) in [("etcd", &p.sc.reference), ("candidate", &p.sc.candidate)] {
        if let Some(problem) = snapshot_file_problems(&path(server), live_key_bytes) {
            p.failures.push(format!("snapshot save: {label}'s file: {problem}"));
        }
    }

    p.restart_and_compare(&[
        (args(&["get", "", "--from-key", "-w", "json"]), &without_header),
        (args(&["get", &k493, "--prefix", "-w", "json"]), &as_is),
        (args(&["get", &k493, "--prefix", &format!("--rev={mid}"), "-w", "json"]), &as_is),
        (args(&["get", big_prefix, "--prefix", &format!("--rev={}", r_big - 2), "-w", "json"]), &as_is),
        (args(&["get", &k600, &format!("--rev={}", mid - 1)]), &as_is),
    ]);
    // and the store takes writes where it left off
    p.step(&["put", &k600, "after-restart", "-w", "json"]);
    p.step(&["get", &k600, "-w", "json"]);
    p.finish();
}

// ---------------------------------------------------------------------------
// scenario 2: a long shared prefix
// ---------------------------------------------------------------------------

/// 50 keys of 1,003 to 1,202 bytes whose first 900 bytes are `prefix`; written in an order that is
/// neither key order nor length order. `(key, value)`, values distinct and in yet another order.
fn shared_prefix_keys(prefix: &str) -> Vec<(String, String)> {
    (0..50)
        .map(|i| {
            let id = (i * 17) % 50;
            let filler = "x".repeat(100 + (i * 37) % 200);
            (format!("{prefix}{id:02}/{filler}"), format!("v{:03}", (i * 29) % 50))
        })
        .collect()
}

#[test]
fn long_shared_prefix_ranges_through_etcdctl() {
    let mut p = Pair::start("long shared prefix through etcdctl", &[]);
    let prefix = long_name("shared", 900);
    let pre = prefix.as_str();
    let long = shared_prefix_keys(pre);
    for (k, v) in &long {
        p.step(&["put", k, v]);
    }
    // short keys before, between and after the long ones
    let after_prefix = {
        let mut s = pre[..899].to_string();
        s.push(char::from(pre.as_bytes()[899] + 1));
        s
    };
    let between = format!("{pre}25");
    let beyond = format!("{pre}5");
    for (k, v) in [
        ("a", "s1"),
        (&pre[..450], "s2"),
        (pre, "s3"),
        (between.as_str(), "s4"),
        (beyond.as_str(), "s5"),
        (after_prefix.as_str(), "s6"),
        ("zz", "s7"),
    ] {
        p.step(&["put", k, v]);
    }

    p.step(&["get", pre, "--prefix", "--keys-only"]);
    p.step(&["get", pre, "--prefix", "-w", "json"]);
    p.step(&["get", pre, "--prefix", "--limit", "5", "-w", "json"]);
    p.step(&["get", pre, "--prefix", "--limit", "5", "--keys-only"]);
    p.step(&["get", pre, "--prefix", "--sort-by=KEY", "--order=DESCEND", "--limit", "3", "--keys-only"]);
    p.step(&["get", pre, "--prefix", "--sort-by=CREATE", "--order=DESCEND", "--limit", "7", "--keys-only"]);
    p.step(&["get", pre, "--prefix", "--sort-by=VALUE", "--order=ASCEND", "--limit", "10"]);
    p.step(&["get", pre, "--prefix", "--sort-by=MODIFY", "--order=DESCEND", "--limit", "4", "-w", "json"]);
    p.step(&["get", pre, "--prefix", "--count-only"]); // etcdctl 3.4 has no --count-only: usage error on both
    p.step(&["get", &between, "--from-key", "--limit", "4", "--keys-only"]);
    p.step(&["get", &between, "--prefix", "--keys-only"]);
    p.step(&["get", &format!("{pre}10"), &format!("{pre}30"), "--keys-only"]);
    p.step(&["get", &format!("{pre}10"), &format!("{pre}30"), "--limit", "2", "-w", "json"]);
    p.step(&["get", &pre[..450], "--prefix", "--limit", "1", "-w", "json"]);
    p.step(&["get", &pre[..450], &format!("{pre}00"), "--keys-only"]);
    p.step(&["get", "", "--from-key", "--keys-only", "--limit", "3"]);
    p.step(&["get", &beyond, "--from-key", "--keys-only"]);

    // history: overwrite ten long keys, delete ten others, read as of before and in between
    let before = Pair::revision(&p.step(&["get", "a", "-w", "json"]));
    for (i, (k, _)) in long.iter().take(10).enumerate() {
        p.step(&["put", k, &format!("w{i}")]);
    }
    let overwritten = before + 10;
    p.step(&["del", &format!("{pre}3"), "--prefix", "--prev-kv", "-w", "json"]);
    p.step(&["get", pre, "--prefix", &format!("--rev={before}"), "--keys-only"]);
    p.step(&["get", pre, "--prefix", &format!("--rev={before}"), "--limit", "2", "-w", "json"]);
    p.step(&[
        "get",
        pre,
        "--prefix",
        &format!("--rev={}", before + 5),
        "--sort-by=MODIFY",
        "--order=DESCEND",
        "--limit",
        "6",
        "-w",
        "json",
    ]);
    p.step(&["get", &format!("{pre}3"), "--prefix", &format!("--rev={overwritten}"), "--keys-only"]);
    p.step(&["get", &format!("{pre}3"), "--prefix", "--keys-only"]);
    p.step(&["get", pre, "--prefix", "--sort-by=MODIFY", "--order=DESCEND", "--limit", "12", "--keys-only"]);

    // compaction at the middle of the overwrites
    let mid = before + 5;
    p.step(&["compaction", &mid.to_string()]);
    p.step(&["get", pre, "--prefix", &format!("--rev={before}"), "--keys-only"]);
    p.step(&["get", pre, "--prefix", &format!("--rev={mid}"), "-w", "json"]);
    p.step(&["get", &format!("{pre}3"), "--prefix", &format!("--rev={mid}"), "--keys-only"]);

    let (from_10, to_30) = (format!("{pre}10"), format!("{pre}30"));
    p.restart_and_compare(&[
        (args(&["get", "", "--from-key", "-w", "json"]), &without_header),
        (args(&["get", pre, "--prefix", "-w", "json"]), &as_is),
        (args(&["get", pre, "--prefix", &format!("--rev={mid}"), "-w", "json"]), &as_is),
        (args(&["get", pre, "--prefix", "--sort-by=VALUE", "--order=DESCEND", "--limit", "9", "-w", "json"]), &as_is),
        (args(&["get", &from_10, &to_30, "-w", "json"]), &as_is),
        (args(&["get", &between, "--from-key", "--limit", "4", "-w", "json"]), &as_is),
    ]);
    p.step(&["put", &between, "after-restart", "-w", "json"]);
    p.step(&["get", pre, "--prefix", "--sort-by=MODIFY", "--order=DESCEND", "--limit", "2", "--keys-only"]);
    p.finish();
}

// ---------------------------------------------------------------------------
// scenario 3: long user, role and permission names
// ---------------------------------------------------------------------------

/// `etcdctl --user=USER:PASSWORD ARGS...`
fn as_user(p: &mut Pair, user: &str, password: &str, list: &[&str]) -> Output {
    let login = format!("--user={user}:{password}");
    let mut all = vec![login.as_str()];
    all.extend_from_slice(list);
    p.step(&all)
}

#[test]
fn long_user_role_and_permission_names_through_etcdctl() {
    let mut p = Pair::start("long user, role and permission names through etcdctl", &["--bcrypt-cost", "4"]);
    let (u600, u4k) = (long_name("user", 600), long_name("user", 4 << 10)); // u600 is a prefix of u4k
    let (r700, r4k) = (long_name("role", 700), long_name("role", 4 << 10));
    let k600 = long_name("key", 600);
    let p700 = format!("{}/", long_name("pfx", 699)); // a 700-byte prefix
    let (lo, hi) = (format!("{}a", long_name("rng", 600)), format!("{}m", long_name("rng", 600)));
    let (u600, u4k, r700, r4k, k600, p700, lo, hi) = (&*u600, &*u4k, &*r700, &*r4k, &*k600, &*p700, &*lo, &*hi);
    let in_prefix = format!("{p700}inside");
    let deep_in_prefix = format!("{p700}{}", long_name("deep", 1000));
    let outside_prefix = &p700[..p700.len() - 1];

    p.step(&["user", "add", &format!("{u600}:pw600")]);
    p.step(&["user", "add", u4k, "--new-user-password=pw4k"]);
    p.step(&["user", "add", &format!("{u600}:again")]);
    p.step(&["user", "list"]);
    p.step(&["user", "list", "-w", "json"]);
    p.step(&["role", "add", r700]);
    p.step(&["role", "add", r4k]);
    p.step(&["role", "add", r700]);
    p.step(&["role", "list"]);
    p.step(&["role", "grant-permission", r700, "readwrite", k600]);
    p.step(&["role", "grant-permission", r700, "--prefix=true", "readwrite", p700]);
    p.step(&["role", "grant-permission", r700, "read", lo, hi]);
    p.step(&["role", "grant-permission", r4k, "--from-key", "write", k600]);
    p.step(&["role", "grant-permission", r4k, "--prefix=true", "read", p700]);
    p.step(&["role", "get", r700]);
    p.step(&["role", "get", r700, "-w", "json"]);
    p.step(&["role", "get", r4k]);
    p.step(&["user", "grant-role", u600, r700]);
    p.step(&["user", "grant-role", u4k, r4k]);
    p.step(&["user", "grant-role", u4k, r700]);
    p.step(&["user", "get", u600]);
    p.step(&["user", "get", u600, "--detail"]);
    p.step(&["user", "get", u4k, "--detail", "-w", "json"]);
    p.step(&["user", "get", u4k]);
    p.step(&["user", "add", "root:rootpw"]);
    p.step(&["auth", "enable"]);

    // the 600-byte user inside and outside its grants
    as_user(&mut p, u600, "pw600", &["put", k600, "v"]);
    as_user(&mut p, u600, "pw600", &["get", k600]);
    as_user(&mut p, u600, "pw600", &["put", &in_prefix, "v"]);
    as_user(&mut p, u600, "pw600", &["put", &deep_in_prefix, "v"]);
    as_user(&mut p, u600, "pw600", &["get", p700, "--prefix", "--keys-only"]);
    as_user(&mut p, u600, "pw600", &["put", outside_prefix, "v"]);
    as_user(&mut p, u600, "pw600", &["put", "short", "v"]);
    as_user(&mut p, u600, "pw600", &["get", outside_prefix, "--prefix"]);
    as_user(&mut p, u600, "pw600", &["get", &format!("{lo}b")]);
    as_user(&mut p, u600, "pw600", &["put", &format!("{lo}b"), "v"]);
    as_user(&mut p, u600, "pw600", &["get", lo, hi]);
    as_user(&mut p, u600, "pw600", &["get", lo, "zzz"]);
    p.step_stdin(
        &[&format!("--user={u600}:pw600"), "txn"],
        &format!("value(\"{in_prefix}\") = \"v\"\n\nput {p700}txn t\n\nget {in_prefix}\n\n"),
    );
    as_user(&mut p, u600, "pw600", &["del", &in_prefix]);
    as_user(&mut p, u600, "pw600", &["del", "short"]);
    as_user(&mut p, u600, "pw600", &["user", "get", u600]);
    as_user(&mut p, u600, "pw600", &["role", "get", r4k]);
    as_user(&mut p, u600, "wrong", &["get", k600]);
    // the 4 KiB user: write-only from k600, read-only under the prefix
    as_user(&mut p, u4k, "pw4k", &["put", &format!("{k600}zzz"), "v"]);
    as_user(&mut p, u4k, "pw4k", &["get", &format!("{k600}zzz")]);
    as_user(&mut p, u4k, "pw4k", &["get", p700, "--prefix", "--keys-only"]);
    as_user(&mut p, u4k, "pw4k", &["put", &in_prefix, "v"]);

    // revocations take effect at once
    as_user(&mut p, "root", "rootpw", &["role", "revoke-permission", r700, k600]);
    as_user(&mut p, u600, "pw600", &["put", k600, "v2"]);
    as_user(&mut p, "root", "rootpw", &["role", "revoke-permission", r700, lo, hi]);
    as_user(&mut p, u600, "pw600", &["get", lo, hi]);
    as_user(&mut p, "root", "rootpw", &["user", "revoke-role", u4k, r700]);
    as_user(&mut p, "root", "rootpw", &["role", "get", r700]);
    as_user(&mut p, "root", "rootpw", &["user", "get", u4k, "--detail"]);

    // The harness waits for `etcdctl endpoint health`, which etcd 3.4 answers "user name is empty"
    // while auth is on: auth is off across the restart, and back on for the steps after it.
    as_user(&mut p, "root", "rootpw", &["auth", "disable"]);
    p.restart_and_compare(&[
        (args(&["get", "", "--from-key", "-w", "json"]), &without_header),
        (args(&["user", "list"]), &as_is),
        (args(&["role", "list"]), &as_is),
        (args(&["user", "get", u600, "--detail", "-w", "json"]), &as_is),
        (args(&["user", "get", u4k, "--detail"]), &as_is),
        (args(&["role", "get", r700, "-w", "json"]), &as_is),
        (args(&["role", "get", r4k]), &as_is),
    ]);
    p.step(&["auth", "enable"]);
    as_user(&mut p, u600, "pw600", &["get", p700, "--prefix", "-w", "json"]);
    as_user(&mut p, u600, "pw600", &["put", &in_prefix, "after-restart"]);
    as_user(&mut p, u600, "pw600", &["put", outside_prefix, "after-restart"]);
    as_user(&mut p, "root", "rootpw", &["role", "delete", r4k]);
    as_user(&mut p, "root", "rootpw", &["user", "delete", u4k]);
    as_user(&mut p, "root", "rootpw", &["user", "list"]);
    as_user(&mut p, "root", "rootpw", &["role", "list"]);
    as_user(&mut p, "root", "rootpw", &["user", "get", u600, "--detail"]);
    as_user(&mut p, u4k, "pw4k", &["get", p700, "--prefix"]);
    p.finish();
}

// ---------------------------------------------------------------------------
// scenario 4: binary and megabyte keys through the etcd-client crate
// ---------------------------------------------------------------------------

/// Bound on one client call: a liveness limit so a hung member fails the test instead of hanging it.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Large enough for a watch response carrying several 1 MiB events with their previous values.
const MAX_MESSAGE: usize = 256 << 20;

/// The keys of the client scenario: `(name, bytes)`.
fn client_keys() -> Vec<(String, Vec<u8>)> {
    let mut keys: Vec<(String, Vec<u8>)> =
        LONG_SIZES.iter().chain(&[MIB]).map(|&len| (format!("text {len}"), long_name("k", len).into_bytes())).collect();
    let mut push = |name: &str, bytes: Vec<u8>| keys.push((name.to_string(), bytes));
    push("247 zero bytes", vec![0; 247]);
    push("600 zero bytes", vec![0; 600]);
    push("64 KiB of zero bytes", vec![0; 64 << 10]);
    push("zeros inside", [&b"n"[..], &[0; 300], b"n", &[0; 300]].concat());
    push("493 a + ff", [vec![b'a'; 493], vec![0xff]].concat());
    push("493 a + ff 00", [vec![b'a'; 493], vec![0xff, 0]].concat());
    push("600 ff", vec![0xff; 600]);
    push("600 ff + 00", [vec![0xff; 600], vec![0]].concat());
    push("1000 x + ff ff", [vec![b'x'; 1000], vec![0xff, 0xff]].concat());
    keys
}

/// Bytes as a short exact stand-in: escaped when short, else length, SHA-256 prefix and both ends.
fn show(b: &[u8]) -> String {
    if b.len() <= 40 {
        format!("\"{}\"", b.escape_ascii())
    } else {
        format!(
            "<{} bytes \"{}…{}\" sha256 {}>",
            b.len(),
            b[..10].escape_ascii(),
            b[b.len() - 6..].escape_ascii(),
            &hex(&sha256(b))[..12]
        )
    }
}

fn show_kv(kv: &KeyValue) -> String {
    format!(
        "{}={} create {} mod {} version {} lease {}",
        show(kv.key()),
        show(kv.value()),
        kv.create_revision(),
        kv.mod_revision(),
        kv.version(),
        kv.lease()
    )
}

fn show_kvs(kvs: &[KeyValue]) -> String {
    kvs.iter().map(show_kv).collect::<Vec<_>>().join(", ")
}

fn error_text(e: &etcd_client::Error) -> String {
    match e {
        etcd_client::Error::GRpcStatus(s) => format!("error {:?}: {}", s.code(), s.message()),
        other => format!("error: {other}"),
    }
}

/// One side of the client scenario: a client, and the transcript of everything it observed.
struct Run {
    kv: KvClient,
    client: Client,
    lines: Vec<String>,
}

impl Run {
    async fn connect(server: &Server) -> Run {
        let client = server.client().await;
        let kv = client.kv_client().max_decoding_message_size(MAX_MESSAGE);
        Run { kv, client, lines: Vec::new() }
    }

    /// Records `what: <rendering of the result>` and returns the result.
    fn note<T>(
        &mut self,
        what: &str,
        r: Result<Result<T, etcd_client::Error>, tokio::time::error::Elapsed>,
        show: impl FnOnce(&T) -> String,
    ) -> Option<T> {
        match r {
            Err(_) => {
                self.lines.push(format!("{what}: no answer within {CALL_TIMEOUT:?}"));
                None
            }
            Ok(Err(e)) => {
                self.lines.push(format!("{what}: {}", error_text(&e)));
                None
            }
            Ok(Ok(v)) => {
                self.lines.push(format!("{what}: {}", show(&v)));
                Some(v)
            }
        }
    }

    /// A put; returns the revision it got (0 if it failed).
    async fn put(&mut self, what: &str, key: &[u8], value: &str, opts: Option<PutOptions>) -> i64 {
        let r = tokio::time::timeout(CALL_TIMEOUT, self.kv.put(key, value, opts)).await;
        let got = self.note(what, r, |r| {
            format!("rev {} prev {}", r.header().map_or(0, |h| h.revision()), r.prev_key().map_or("-".into(), show_kv))
        });
        got.and_then(|r| r.header().map(|h| h.revision())).unwrap_or(0)
    }

    async fn get(&mut self, what: &str, key: &[u8], opts: Option<GetOptions>) {
        let r = tokio::time::timeout(CALL_TIMEOUT, self.kv.get(key, opts)).await;
        self.note(what, r, |r| {
            format!(
                "rev {} count {} more {} [{}]",
                r.header().map_or(0, |h| h.revision()),
                r.count(),
                r.more(),
                show_kvs(r.kvs())
            )
        });
    }

    /// A delete; returns the revision of the response (0 if it failed).
    async fn delete(&mut self, what: &str, key: &[u8], opts: Option<DeleteOptions>) -> i64 {
        let r = tokio::time::timeout(CALL_TIMEOUT, self.kv.delete(key, opts)).await;
        let got = self.note(what, r, |r| {
            format!(
                "rev {} deleted {} prev [{}]",
                r.header().map_or(0, |h| h.revision()),
                r.deleted(),
                show_kvs(r.prev_kvs())
            )
        });
        got.and_then(|r| r.header().map(|h| h.revision())).unwrap_or(0)
    }

    async fn txn(&mut self, what: &str, txn: Txn) {
        let r = tokio::time::timeout(CALL_TIMEOUT, self.kv.txn(txn)).await;
        self.note(what, r, |r| {
            let ops: Vec<String> = r
                .op_responses()
                .iter()
                .map(|op| match op {
                    TxnOpResponse::Put(p) => format!("put prev {}", p.prev_key().map_or("-".into(), show_kv)),
                    TxnOpResponse::Get(g) => format!("get count {} [{}]", g.count(), show_kvs(g.kvs())),
                    TxnOpResponse::Delete(d) => format!("delete {}", d.deleted()),
                    TxnOpResponse::Txn(_) => "txn".into(),
                })
                .collect();
            format!("rev {} succeeded {} {ops:?}", r.header().map_or(0, |h| h.revision()), r.succeeded())
        });
    }
}

/// Per key: put, get, overwrite with prev_kv, history, txn compares on every target (true and false),
/// lease attach and time-to-live, delete, revoke of a lease with the key attached, recreate.
async fn write_and_read_each_key(run: &mut Run, keys: &[(String, Vec<u8>)]) {
    for (i, (name, k)) in keys.iter().enumerate() {
        let k = k.as_slice();
        let r1 = run.put(&format!("{name}: put v1"), k, "v1", None).await;
        run.get(&format!("{name}: get"), k, None).await;
        let r2 = run.put(&format!("{name}: put v2"), k, "v2", Some(PutOptions::new().with_prev_key())).await;
        run.get(&format!("{name}: get at rev {r1}"), k, Some(GetOptions::new().with_revision(r1))).await;
        let holds = [
            Compare::value(k, CompareOp::Equal, "v2"),
            Compare::version(k, CompareOp::Equal, 2),
            Compare::create_revision(k, CompareOp::Equal, r1),
            Compare::mod_revision(k, CompareOp::Equal, r2),
            Compare::value(k, CompareOp::Greater, "v1"),
        ];
        let fails = [Compare::value(k, CompareOp::Equal, "nope"), Compare::version(k, CompareOp::Less, 1)];
        if k.len() <= 64 << 10 {
            let txn = Txn::new()
                .when(holds)
                .and_then([TxnOp::put(k, "v3", Some(PutOptions::new().with_prev_key())), TxnOp::get(k, None)])
                .or_else([TxnOp::get(k, None)]);
            run.txn(&format!("{name}: txn whose compares hold"), txn).await;
            let txn = Txn::new()
                .when(fails)
                .and_then([TxnOp::put(k, "never", None)])
                .or_else([TxnOp::get(k, Some(GetOptions::new().with_keys_only()))]);
            run.txn(&format!("{name}: txn whose compares fail"), txn).await;
        } else {
            // Each copy of a 1 MiB key in a request counts against etcd's 1.5 MiB request limit (and
            // its 2 MiB gRPC message limit): one compare per txn, and the ops on a short key.
            let side = format!("txn side {i}");
            for (j, compare) in holds.into_iter().chain(fails).enumerate() {
                let txn = Txn::new()
                    .when([compare])
                    .and_then([TxnOp::put(side.as_str(), format!("then {j}"), None)])
                    .or_else([TxnOp::get(side.as_str(), None)]);
                run.txn(&format!("{name}: txn compare {j}"), txn).await;
            }
        }

        let lease = 1000 + i as i64;
        let grant = tokio::time::timeout(
            CALL_TIMEOUT,
            run.client.lease_grant(600, Some(LeaseGrantOptions::new().with_id(lease))),
        )
        .await;
        run.note(&format!("{name}: lease grant"), grant, |r| format!("id {} ttl {}", r.id(), r.ttl()));
        run.put(&format!("{name}: put v4 with the lease"), k, "v4", Some(PutOptions::new().with_lease(lease))).await;
        let ttl = tokio::time::timeout(
            CALL_TIMEOUT,
            run.client.lease_time_to_live(lease, Some(LeaseTimeToLiveOptions::new().with_keys())),
        )
        .await;
        run.note(&format!("{name}: lease keys"), ttl, |r| {
            format!(
                "granted {} keys [{}]",
                r.granted_ttl(),
                r.keys().iter().map(|k| show(k)).collect::<Vec<_>>().join(", ")
            )
        });
        run.get(&format!("{name}: get with lease"), k, None).await;
        let r_del = run.delete(&format!("{name}: delete"), k, Some(DeleteOptions::new().with_prev_key())).await;
        run.get(&format!("{name}: get after delete"), k, None).await;
        run.get(&format!("{name}: get before the delete"), k, Some(GetOptions::new().with_revision(r_del - 1))).await;
        run.put(&format!("{name}: put v5 with the lease"), k, "v5", Some(PutOptions::new().with_lease(lease))).await;
        let revoke = tokio::time::timeout(CALL_TIMEOUT, run.client.lease_revoke(lease)).await;
        run.note(&format!("{name}: lease revoke"), revoke, |r| {
            format!("rev {}", r.header().map_or(0, |h| h.revision()))
        });
        run.get(&format!("{name}: get after revoke"), k, None).await;
        run.put(&format!("{name}: recreate"), k, &format!("final {i}"), None).await;
    }
}

/// Range reads over the whole key set: all keys, count only, limits, sorting, prefixes ending in or
/// made of 0xff (whose range end the client computes), from-key, explicit ranges, and history.
async fn read_ranges(run: &mut Run, history_rev: i64) {
    let all = || GetOptions::new().with_all_keys();
    let text = |len| long_name("k", len).into_bytes();
    run.get("all keys", b"", Some(all().with_keys_only())).await;
    run.get("all keys, count only", b"", Some(all().with_count_only())).await;
    run.get("all keys, limit 3", b"", Some(all().with_keys_only().with_limit(3))).await;
    let descending = all().with_keys_only().with_sort(SortTarget::Key, SortOrder::Descend).with_limit(4);
    run.get("all keys, by key descending, limit 4", b"", Some(descending)).await;
    let by_create = all().with_keys_only().with_sort(SortTarget::Create, SortOrder::Descend).with_limit(4);
    run.get("all keys, by create descending, limit 4", b"", Some(by_create)).await;
    run.get("prefix 247 zero bytes", &[0; 247], Some(GetOptions::new().with_prefix().with_keys_only())).await;
    run.get("prefix ff", &[0xff], Some(GetOptions::new().with_prefix().with_keys_only())).await;
    run.get("prefix 600 ff", &[0xff; 600], Some(GetOptions::new().with_prefix().with_keys_only())).await;
    run.get("prefix 493 a", &[b'a'; 493], Some(GetOptions::new().with_prefix())).await;
    run.get("prefix text 493", &text(493), Some(GetOptions::new().with_prefix().with_keys_only())).await;
    run.get("prefix text 493, count only", &text(493), Some(GetOptions::new().with_prefix().with_count_only())).await;
    run.get("from text 600, limit 2", &text(600), Some(GetOptions::new().with_from_key().with_limit(2))).await;
    run.get("range [text 494, text 600)", &text(494), Some(GetOptions::new().with_range(text(600)))).await;
    run.get("range [\\0, zeros inside)", &[0], Some(GetOptions::new().with_range(&b"n"[..]).with_keys_only())).await;
    let history = all().with_keys_only().with_revision(history_rev);
    run.get(&format!("all keys at rev {history_rev}"), b"", Some(history)).await;
    let history_values = GetOptions::new().with_prefix().with_revision(history_rev);
    run.get(&format!("prefix text 493 at rev {history_rev}"), &text(493), Some(history_values)).await;
}

/// The events of a watch stream until one at `last_rev` arrives, each rendered; the stream's first
/// (created) response is rendered too.
async fn watch_events(run: &mut Run, what: &str, stream: Option<WatchStream>, last_rev: i64) {
    let Some(mut stream) = stream else { return };
    let mut events = 0;
    loop {
        let next = tokio::time::timeout(CALL_TIMEOUT, stream.message()).await;
        let response: WatchResponse = match next {
            Err(_) => return run.lines.push(format!("{what}: no event at rev {last_rev} within {CALL_TIMEOUT:?}")),
            Ok(Err(e)) => return run.lines.push(format!("{what}: {}", error_text(&e))),
            Ok(Ok(None)) => return run.lines.push(format!("{what}: stream ended")),
            Ok(Ok(Some(r))) => r,
        };
        if response.created() || response.canceled() {
            run.lines.push(format!(
                "{what}: created {} canceled {} compact_revision {} reason {:?}",
                response.created(),
                response.canceled(),
                response.compact_revision(),
                response.cancel_reason()
            ));
        }
        if response.canceled() {
            return;
        }
        // Responses are flattened: how etcd groups events into responses is not what this test is about.
        for e in response.events() {
            events += 1;
            let kv = e.kv().map_or("-".into(), show_kv);
            let prev = e.prev_kv().map_or("-".into(), show_kv);
            run.lines.push(format!("{what}: event {events} {:?} {kv} prev {prev}", e.event_type()));
            if e.kv().is_some_and(|kv| kv.mod_revision() >= last_rev) {
                return;
            }
        }
    }
}

async fn open_watch(run: &mut Run, what: &str, key: &[u8], opts: WatchOptions) -> Option<WatchStream> {
    let mut watch = run.client.watch_client().max_decoding_message_size(MAX_MESSAGE);
    let r = tokio::time::timeout(CALL_TIMEOUT, watch.watch(key, Some(opts))).await;
    match r {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(e)) => {
            run.lines.push(format!("{what}: {}", error_text(&e)));
            None
        }
        Err(_) => {
            run.lines.push(format!("{what}: no answer within {CALL_TIMEOUT:?}"));
            None
        }
    }
}

/// What the client scenario keeps of a server before the restart.
struct Observed {
    /// Whole-store dump and range results (compared across servers and across the restart).
    reads: Vec<String>,
    /// HashKV at the current revision (compared across the restart only: the hash function differs
    /// between implementations).
    hash: String,
}

/// Reads that must survive a restart unchanged.
async fn observe(run: &mut Run, history_rev: i64) -> Observed {
    let start = run.lines.len();
    run.get("dump", b"", Some(GetOptions::new().with_all_keys())).await;
    read_ranges(run, history_rev).await;
    let reads = run.lines.split_off(start);
    let hash = tokio::time::timeout(CALL_TIMEOUT, run.client.hash_kv(0)).await;
    let hash = match hash {
        Ok(Ok(h)) => format!("hash {} compact {}", h.hash(), h.compact_version()),
        Ok(Err(e)) => error_text(&e),
        Err(_) => "no answer".into(),
    };
    run.lines.extend(reads.iter().cloned());
    Observed { reads, hash }
}

/// The first half before the restart: writes and reads, with a watch open on every key since the
/// start. Returns the run (with that watch) and the revision of the last write.
async fn writes_and_reads(server: &Server, keys: &[(String, Vec<u8>)]) -> (Run, Option<WatchStream>, i64) {
    let mut run = Run::connect(server).await;
    // From revision 2, the first write's, explicitly: the client returns before the server has taken
    // the create request, and a watch "from now" missed that write once in a full-suite run.
    let live = WatchOptions::new().with_all_keys().with_prev_key().with_start_revision(2);
    let live = open_watch(&mut run, "live watch", b"", live).await;
    write_and_read_each_key(&mut run, keys).await;
    let after_writes = run.put("marker", b"marker", "m", None).await;
    read_ranges(&mut run, after_writes / 2).await;
    (run, live, after_writes)
}

/// The second half before the restart: watches (live and replayed), a prefix delete, compaction and
/// a snapshot. Returns what must survive the restart and the compaction revision.
async fn watches_compaction_snapshot(
    server: &Server,
    run: &mut Run,
    live: Option<WatchStream>,
    after_writes: i64,
) -> (Observed, i64) {
    watch_events(run, "live watch", live, after_writes).await;
    let replay = WatchOptions::new().with_all_keys().with_prev_key().with_start_revision(1);
    let replay = open_watch(run, "replayed watch", b"", replay).await;
    watch_events(run, "replayed watch", replay, after_writes).await;
    let prefix = WatchOptions::new().with_prefix().with_start_revision(1);
    let prefix = open_watch(run, "watch of prefix 493 a", &[b'a'; 493], prefix).await;
    let last = key_last_rev(run, "493 a + ff 00");
    watch_events(run, "watch of prefix 493 a", prefix, last).await;

    // deleting a 0xff prefix range, then compaction in the middle of the history
    run.delete("delete prefix 600 ff", &[0xff; 600], Some(DeleteOptions::new().with_prefix().with_prev_key())).await;
    let compact_at = after_writes / 2;
    let compact = tokio::time::timeout(
        CALL_TIMEOUT,
        run.client.compact(compact_at, Some(etcd_client::CompactionOptions::new().with_physical())),
    )
    .await;
    run.note(&format!("compact at {compact_at}"), compact, |r| {
        format!("rev {}", r.header().map_or(0, |h| h.revision()))
    });
    let before_compaction = GetOptions::new().with_all_keys().with_revision(compact_at - 1);
    run.get("all keys before the compaction", b"", Some(before_compaction)).await;
    let stale = WatchOptions::new().with_all_keys().with_start_revision(compact_at - 1);
    let stale = open_watch(run, "watch from a compacted revision", b"", stale).await;
    watch_events(run, "watch from a compacted revision", stale, i64::MAX).await;

    // a snapshot holds every live key (its format differs between servers; these checks do not)
    let live_bytes: usize = {
        let all = run.kv.get(b"", Some(GetOptions::new().with_all_keys().with_keys_only())).await;
        all.map(|r| r.kvs().iter().map(|kv| kv.key().len()).sum()).unwrap_or(0)
    };
    let verdict = match snapshot_bytes(&mut run.client).await {
        Ok(bytes) => {
            let file = server.dir().path().join("client-snapshot.db");
            std::fs::write(&file, &bytes).expect("write the snapshot");
            snapshot_file_problems(&file, live_bytes).unwrap_or_else(|| "checksum ok, holds the live keys".into())
        }
        Err(e) => e,
    };
    run.lines.push(format!("snapshot: {verdict}"));
    (observe(run, compact_at).await, compact_at)
}

/// The revision of the last transcript line for key `name` that reports one (`name: ... rev N`).
fn key_last_rev(run: &Run, name: &str) -> i64 {
    run.lines
        .iter()
        .rev()
        .filter(|l| l.starts_with(&format!("{name}: ")))
        .find_map(|l| l.split(": rev ").nth(1).and_then(|r| r.split(' ').next()).and_then(|r| r.parse().ok()))
        .unwrap_or(i64::MAX)
}

async fn snapshot_bytes(client: &mut Client) -> Result<Vec<u8>, String> {
    let mut stream = client.snapshot().await.map_err(|e| error_text(&e))?;
    let mut bytes = Vec::new();
    loop {
        match tokio::time::timeout(CALL_TIMEOUT, stream.message()).await {
            Err(_) => return Err(format!("no snapshot chunk within {CALL_TIMEOUT:?}")),
            Ok(Err(e)) => return Err(error_text(&e)),
            Ok(Ok(None)) => return Ok(bytes),
            Ok(Ok(Some(chunk))) => bytes.extend_from_slice(chunk.blob()),
        }
    }
}

async fn after_restart(server: &Server, compact_at: i64) -> (Vec<String>, Observed) {
    let mut run = Run::connect(server).await;
    let observed = observe(&mut run, compact_at).await;
    run.put("put after the restart", &[0; 600], "again", Some(PutOptions::new().with_prev_key())).await;
    run.get("get after the restart", &[0; 600], None).await;
    (run.lines, observed)
}

#[track_caller]
fn assert_same_lines(what: &str, etcd: &[String], candidate: &[String]) {
    if etcd != candidate {
        let (a, b) = (etcd.join("\n"), candidate.join("\n"));
        let differing: Vec<String> = etcd
            .iter()
            .map(Some)
            .chain(std::iter::repeat(None))
            .zip(candidate.iter().map(Some).chain(std::iter::repeat(None)))
            .take(etcd.len().max(candidate.len()))
            .filter(|(x, y)| x != y)
            .take(12)
            .map(|(x, y)| {
                format!(
                    "  etcd:      {}\n  candidate: {}",
                    x.map_or("<none>".into(), |l| abbreviate(l, 400)),
                    y.map_or("<none>".into(), |l| abbreviate(l, 400))
                )
            })
            .collect();
        panic!(
            "{what}: transcripts differ ({} vs {} lines); first difference at {}\nfirst differing lines:\n{}",
            etcd.len(),
            candidate.len(),
            first_difference(&a, &b),
            differing.join("\n")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn binary_and_megabyte_keys_through_the_client() {
    let (mut etcd, mut candidate) = common::start_pair().await;
    let keys = client_keys();
    let show_log = |lines_differ: bool, candidate: &Server| {
        if lines_differ {
            eprintln!("=== last lines of the candidate's log:\n{}", log_tail(candidate));
        }
    };
    // Writes and reads are compared before any watch waits for events a stopped member never sends.
    let ((mut a, a_live, a_rev), (mut b, b_live, b_rev)) =
        tokio::join!(writes_and_reads(&etcd, &keys), writes_and_reads(&candidate, &keys));
    show_log(a.lines != b.lines, &candidate);
    if std::env::var("KEYWARD_HARNESS_VERBOSE").is_ok_and(|v| v == "1") {
        eprintln!("etcd's transcript of writes and reads:\n{}", a.lines.join("\n"));
    }
    assert_same_lines("writes and reads", &a.lines, &b.lines);
    let ((a_seen, compact_at), (b_seen, _)) = tokio::join!(
        watches_compaction_snapshot(&etcd, &mut a, a_live, a_rev),
        watches_compaction_snapshot(&candidate, &mut b, b_live, b_rev)
    );
    show_log(a.lines != b.lines, &candidate);
    if std::env::var("KEYWARD_HARNESS_VERBOSE").is_ok_and(|v| v == "1") {
        eprintln!("etcd's whole transcript before the restart:\n{}", a.lines.join("\n"));
    }
    assert_same_lines("watches, compaction, snapshot", &a.lines, &b.lines);

    tokio::task::block_in_place(|| {
        etcd.restart();
        candidate.restart();
    });
    let ((a2, a_again), (b2, b_again)) =
        tokio::join!(after_restart(&etcd, compact_at), after_restart(&candidate, compact_at));
    show_log(a2 != b2, &candidate);
    assert_same_lines("after the restart", &a2, &b2);
    for (label, seen, again) in [("etcd", &a_seen, &a_again), ("candidate", &b_seen, &b_again)] {
        assert_same_lines(&format!("{label}: reads before and after the restart"), &seen.reads, &again.reads);
        assert_eq!(seen.hash, again.hash, "{label}: HashKV before and after the restart");
    }
}
