//! Every etcdctl 3.4 command that talks to a server, with its endpoint written as a URL —
//! `http://127.0.0.1:PORT` and `https://127.0.0.1:PORT`, as etcd deployments write them — against a
//! real etcd and keyward, same command, same output (after `common::normalize` and the masks below).
//!
//! etcdctl 3.4 gives some commands (`endpoint status/hashkv/health`, `defrag`, `snapshot save`,
//! `move-leader`) a client per endpoint whose HTTP/2 `:authority` is the whole URL; keyward serves
//! them through its patched h2 (`vendor/h2/PATCH.md`).
//!
//! Offline commands are not here: `snapshot status|restore` read the backup file, not a server (keyward's
//! backups are etcd's format: `etcd_backup.rs` runs them), and `migrate` converts an etcd v2 data dir.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::common::pki::Pki;
use crate::common::{
    differences, etcdctl_bin, free_port, normalize, scrub_env, ClientUrl, Kind, Output, Scenario, Server,
};
use tempfile::TempDir;

/// One differential run: etcd and keyward, both reached through `client`, and the values each side
/// produced that later steps name (`{LEASE}`, `{LEARNER}`, ...).
struct Differential {
    sc: Scenario,
    vars: [BTreeMap<&'static str, String>; 2],
    dirs: [TempDir; 2],
    steps: usize,
}

/// What a step's output may legitimately differ in, beyond `normalize`.
#[derive(Clone, Copy, PartialEq)]
enum Mask {
    None,
    /// `endpoint hashkv`: the hash is of each server's own storage.
    Hash,
    /// `snapshot save`: etcdctl's info log lines (timestamps, sizes, durations).
    SnapshotLog,
    /// `check datascale`: its progress bar, and the memory the server used.
    Memory,
    /// `check perf`: its progress bar, every number, and the verdicts (a busy machine may fail a
    /// latency bound on either server): what is compared is that the same steps ran.
    Perf,
    /// `lease timetolive`: the seconds `remaining(..)`, which tick between the grant and the call.
    Remaining,
    /// Members are listed in id order, and ids are random: `member list`'s lines and the entries of
    /// `member add`'s `ETCD_INITIAL_CLUSTER` are compared as sets.
    MemberOrder,
}

impl Differential {
    fn start(client: &ClientUrl) -> Differential {
        let sc = Scenario::start_on(client, &[]);
        let dir = || tempfile::Builder::new().prefix("etcdctl-endpoints-").tempdir().unwrap();
        let mut d = Differential { sc, vars: Default::default(), dirs: [dir(), dir()], steps: 0 };
        for (side, server) in [&d.sc.reference, &d.sc.candidate].into_iter().enumerate() {
            d.vars[side].insert("DIR", d.dirs[side].path().to_str().unwrap().to_string());
            let out = server.etcdctl(&["member", "list"]);
            out.assert_ok();
            d.vars[side].insert("MEMBER", out.stdout.split(',').next().unwrap().trim().to_string());
        }
        d
    }

    fn servers(&self) -> [&Server; 2] {
        [&self.sc.reference, &self.sc.candidate]
    }

    /// `args` with every `{NAME}` replaced by `side`'s value.
    fn args_for(&self, side: usize, args: &[&str]) -> Vec<String> {
        args.iter()
            .map(|a| self.vars[side].iter().fold(a.to_string(), |a, (k, v)| a.replace(&format!("{{{k}}}"), v)))
            .collect()
    }

    /// `out` of `side` normalized, then each recorded value turned back into its `{NAME}`.
    fn clean(&self, side: usize, out: &Output, mask: Mask) -> Output {
        let mut cleaned = self.clean_text(side, out, mask);
        if mask == Mask::Perf && perf_failed_on_timing_only(&out.stdout) {
            // `check perf` exits 1 on a failed verdict; a busy machine decides a timing one.
            cleaned.status = std::os::unix::process::ExitStatusExt::from_raw(0);
        }
        cleaned
    }

    fn clean_text(&self, side: usize, out: &Output, mask: Mask) -> Output {
        out.map_text(|text| {
            // etcdctl prints ids as `%16x`: an id with a leading zero nibble comes with a space.
            let mut text = collapse_spaces(&normalize(text));
            for (k, v) in &self.vars[side] {
                if !v.is_empty() {
                    text = text.replace(v.as_str(), &format!("{{{k}}}"));
                }
            }
            match mask {
                Mask::None => text,
                Mask::Hash => mask_after_last(&text, ", "),
                Mask::SnapshotLog => text.lines().filter(|l| !l.starts_with('{')).map(|l| format!("{l}\n")).collect(),
                Mask::Memory => {
                    let kept: String = text.lines().filter(|l| !l.contains(" / ")).map(|l| format!("{l}\n")).collect();
                    mask_after_last(&kept, ": ")
                }
                Mask::MemberOrder => sort_members(&text),
                Mask::Remaining => mask_remaining(&text),
                // "Compacting with revision N" lands on the progress bar's line or on its own,
                // depending on when the bar last redrew: dropped with the bar.
                Mask::Perf => text
                    .lines()
                    .filter(|l| !l.contains(" / ") && !l.starts_with("Compacting with") && !l.is_empty())
                    .map(|l| {
                        // A failed latency or throughput bound is worded apart from a passed one.
                        let l = l
                            .replace("FAIL: Throughput too low:", "FAIL: Throughput is")
                            .replace("Slowest request took too long:", "FAIL: Slowest request took")
                            .replace("Stddev too high:", "FAIL: Stddev is");
                        let words = l.split(' ').map(|w| {
                            if w.starts_with(|c: char| c.is_ascii_digit()) {
                                "<N>"
                            } else {
                                match w.trim_end_matches(':') {
                                    "PASS" | "FAIL" => "<VERDICT>",
                                    _ => w,
                                }
                            }
                        });
                        format!("{}\n", words.collect::<Vec<_>>().join(" "))
                    })
                    .collect(),
            }
        })
    }

    /// Runs `args` (and `stdin`) on both servers and asserts the same result.
    #[track_caller]
    fn step_with(&mut self, args: &[&str], stdin: Option<&str>, mask: Mask) -> [Output; 2] {
        let idx = self.steps;
        self.steps += 1;
        // Both servers at once: `check perf` runs for a minute on each.
        let outs = thread::scope(|scope| {
            [0, 1]
                .map(|side| {
                    // 30 s per command and per dial (etcdctl logs in while it dials), not the
                    // harness's 5 s: with both cores busy a login's bcrypt can take seconds, and how
                    // long is not what is compared. A step's own --command-timeout comes later and wins.
                    let timeouts = ["--command-timeout=30s", "--dial-timeout=30s"].map(String::from).to_vec();
                    let args = [timeouts, self.args_for(side, args)].concat();
                    let server = self.servers()[side];
                    scope.spawn(move || {
                        let args: Vec<&str> = args.iter().map(String::as_str).collect();
                        match stdin {
                            Some(input) => server.etcdctl_stdin(&args, input),
                            None => server.etcdctl(&args),
                        }
                    })
                })
                .map(|running| running.join().expect("etcdctl thread"))
        });
        let [a, b] = [0, 1].map(|side| self.clean(side, &outs[side], mask));
        let diffs = differences("etcd", &a, "keyward", &b);
        assert!(
            diffs.is_empty(),
            "step {idx}: `etcdctl --endpoints={} {}` differs\n\n{}\n=== etcd stdout:\n{}=== etcd stderr:\n{}\n\
             === keyward stdout:\n{}=== keyward stderr:\n{}\n=== last lines of keyward's log:\n{}",
            self.sc.candidate.etcdctl_endpoint(),
            args.join(" "),
            diffs.join("\n"),
            a.stdout,
            a.stderr,
            b.stdout,
            b.stderr,
            self.sc.candidate.log_tail(15)
        );
        outs
    }

    #[track_caller]
    fn step(&mut self, args: &[&str]) -> [Output; 2] {
        self.step_with(args, None, Mask::None)
    }

    /// A step whose output names new values: `pick` finds them in each side's stdout, and they are
    /// recorded (each under its name) before the outputs are compared.
    #[track_caller]
    fn step_recording(&mut self, args: &[&str], mask: Mask, pick: fn(&str) -> Vec<(&'static str, String)>) {
        let outs = [0, 1].map(|side| {
            let args = self.args_for(side, args);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            self.servers()[side].etcdctl(&args)
        });
        for (side, out) in outs.iter().enumerate() {
            let values = pick(&out.stdout);
            assert!(!values.is_empty(), "nothing recorded from `{}`: {out:?}", args.join(" "));
            self.vars[side].extend(values);
        }
        let [a, b] = [0, 1].map(|side| self.clean(side, &outs[side], mask));
        let diffs = differences("etcd", &a, "keyward", &b);
        assert!(diffs.is_empty(), "`etcdctl {}` differs:\n{}", args.join(" "), diffs.join("\n"));
        self.steps += 1;
    }

    /// Records `value` under `name` for both sides.
    fn set(&mut self, name: &'static str, value: &str) {
        self.vars.iter_mut().for_each(|vars| {
            vars.insert(name, value.to_string());
        });
    }

    /// Starts `args` on both servers, reads `lines` lines of stdout from each, then interrupts them
    /// (SIGINT, as an operator's Ctrl-C) and compares what they printed: for the commands that run
    /// until stopped (`elect`, `watch`, `lease keep-alive`).
    #[track_caller]
    fn step_until_lines(&mut self, args: &[&str], lines: usize) {
        let outs: Vec<String> = (0..2)
            .map(|side| {
                let args = self.args_for(side, args);
                let server = self.servers()[side];
                read_lines_then_interrupt(server, &args, lines)
            })
            .collect();
        let [a, b] = [0, 1].map(|side| {
            let mut text = outs[side].clone();
            for (k, v) in &self.vars[side] {
                text = text.replace(v.as_str(), &format!("{{{k}}}"));
            }
            normalize(&mask_lease_suffix(&text))
        });
        assert_eq!(a, b, "`etcdctl {}` printed differently (etcd, keyward)", args.join(" "));
        self.steps += 1;
    }
}

/// Spawns etcdctl with `args` against `server`, returns its first `lines` lines of stdout, then
/// sends it SIGINT and waits for it (by PID). Gives up after 20 s with what it has.
fn read_lines_then_interrupt(server: &Server, args: &[String], lines: usize) -> String {
    let mut cmd = Command::new(etcdctl_bin());
    scrub_env(&mut cmd);
    cmd.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", server.etcdctl_endpoint()))
        .args(&server.client.etcdctl_flags)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().expect("spawn etcdctl");
    let pid = child.id();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut got = String::new();
    for _ in 0..lines {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => {
                got.push_str(&line);
                got.push('\n');
            }
            Err(_) => break,
        }
    }
    let _ = Command::new("kill").args(["-INT", &pid.to_string()]).status();
    if wait_timeout(&mut child, Duration::from_secs(5)).is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    got
}

fn wait_timeout(child: &mut std::process::Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Each line's text after the last `sep` becomes `<MASKED>`.
fn mask_after_last(text: &str, sep: &str) -> String {
    text.lines()
        .map(|line| match line.rfind(sep) {
            Some(at) => format!("{}{sep}<MASKED>\n", &line[..at]),
            None => format!("{line}\n"),
        })
        .collect()
}

/// Every run of spaces as one.
fn collapse_spaces(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if !(c == ' ' && out.ends_with(' ')) {
            out.push(c);
        }
    }
    out
}

/// Lines sorted, and the comma-separated value of an `ETCD_INITIAL_CLUSTER=` line sorted.
fn sort_members(text: &str) -> String {
    let mut lines: Vec<String> = text
        .lines()
        .map(|line| match line.split_once("ETCD_INITIAL_CLUSTER=\"") {
            Some((before, list)) => {
                let mut entries: Vec<&str> = list.trim_end_matches('"').split(',').collect();
                entries.sort_unstable();
                format!("{before}ETCD_INITIAL_CLUSTER=\"{}\"", entries.join(","))
            }
            None => line.to_string(),
        })
        .collect();
    lines.sort_unstable();
    lines.iter().map(|l| format!("{l}\n")).collect()
}

/// `elect` prints its key, `NAME/<lease id in hex>`: the lease id is each server's own.
fn mask_lease_suffix(text: &str) -> String {
    text.lines()
        .map(|line| match line.rsplit_once('/') {
            Some((name, id)) if !id.is_empty() && id.len() <= 16 && id.bytes().all(|b| b.is_ascii_hexdigit()) => {
                format!("{name}/<LEASE>\n")
            }
            _ => format!("{line}\n"),
        })
        .collect()
}

/// The id in "lease 694d7c5b4b0a5d0b granted with TTL(100s)".
fn granted_lease(stdout: &str) -> Vec<(&'static str, String)> {
    let id = stdout.strip_prefix("lease ").and_then(|rest| rest.split_whitespace().next());
    id.map(|id| vec![("LEASE", id.to_string())]).unwrap_or_default()
}

/// The member and cluster ids in "Member 6e2ed8a7af6d7b0d added to cluster cdf818194e3a8c32".
fn added_member(stdout: &str) -> Vec<(&'static str, String)> {
    let first = stdout.lines().next().unwrap_or_default();
    match first.split_whitespace().collect::<Vec<_>>()[..] {
        ["Member", member, "added", "to", "cluster", cluster] => {
            vec![("LEARNER", member.to_string()), ("CLUSTER", cluster.to_string())]
        }
        _ => Vec::new(),
    }
}

const TXN: &str = "mod(\"k1\") = \"0\"\n\nput k1 \"one\"\nput k2 \"two\"\n\nput k1 \"failed\"\n\n";

/// Every command of etcdctl 3.4 that talks to a server, in an order where each finds what it needs.
fn every_command(d: &mut Differential) {
    // kv
    d.step(&["version"]);
    d.step(&["put", "foo", "bar"]);
    d.step(&["get", "foo"]);
    d.step(&["get", "foo", "-w", "json"]);
    d.step_with(&["txn"], Some(TXN), Mask::None);
    d.step(&["get", "k", "--prefix", "-w", "fields"]);
    d.step(&["del", "k2"]);
    d.step(&["put", "foo", "baz"]);
    d.step(&["compaction", "3"]);
    d.step(&["get", "foo", "--rev=2"]); // compacted on both
    d.step_until_lines(&["watch", "foo", "--rev=5"], 3); // PUT, key, value of rev 5
                                                         // maintenance and endpoints
    d.step(&["alarm", "list"]);
    d.step(&["alarm", "disarm"]);
    d.step(&["defrag"]);
    d.step(&["endpoint", "health"]);
    d.step(&["endpoint", "status"]);
    d.step(&["endpoint", "status", "-w", "json"]);
    d.step(&["endpoint", "status", "-w", "table"]);
    d.step_with(&["endpoint", "hashkv"], None, Mask::Hash);
    d.step(&["move-leader", "{MEMBER}"]);
    d.step_with(&["snapshot", "save", "{DIR}/snap.db"], None, Mask::SnapshotLog);
    // leases
    d.step_recording(&["lease", "grant", "100"], Mask::None, granted_lease);
    d.step(&["put", "leased", "v", "--lease={LEASE}"]);
    d.step(&["lease", "list"]);
    d.step_with(&["lease", "timetolive", "{LEASE}", "--keys"], None, Mask::Remaining);
    d.step(&["lease", "keep-alive", "--once", "{LEASE}"]);
    d.step(&["lease", "revoke", "{LEASE}"]);
    d.step(&["get", "leased"]);
    // concurrency recipes (client side on the kv and lease API)
    d.step(&["lock", "mylock", "echo", "locked"]);
    d.step_until_lines(&["elect", "myelection", "proposal-1"], 2);
    // membership, with a learner so the one-member quorum is untouched
    d.set("PEER", &format!("http://127.0.0.1:{}", free_port()));
    let add = ["member", "add", "learner1", "--learner", "--peer-urls={PEER}"];
    d.step_recording(&add, Mask::MemberOrder, added_member);
    d.step_with(&["member", "list"], None, Mask::MemberOrder);
    d.step(&["member", "promote", "{LEARNER}"]); // not in sync (never started): refused on both
    d.set("MOVED", &format!("http://127.0.0.1:{}", free_port()));
    d.step(&["member", "update", "{LEARNER}", "--peer-urls={MOVED}"]);
    d.step(&["member", "remove", "{LEARNER}"]);
    d.step(&["member", "list", "-w", "json"]);
    // users, roles, auth
    d.step(&["user", "add", "root:rootpw"]);
    d.step(&["user", "add", "alice:alicepw"]);
    d.step(&["role", "add", "r1"]);
    d.step(&["role", "grant-permission", "r1", "readwrite", "foo"]);
    d.step(&["role", "grant-permission", "r1", "read", "/p/", "--prefix"]);
    d.step(&["user", "grant-role", "alice", "r1"]);
    d.step(&["user", "get", "alice"]);
    d.step(&["role", "get", "r1"]);
    d.step(&["user", "list"]);
    d.step(&["role", "list"]);
    d.step(&["auth", "enable"]);
    d.step(&["get", "foo", "--user=alice:alicepw"]);
    d.step(&["put", "other", "x", "--user=alice:alicepw"]); // denied on both
    d.step_with(&["user", "passwd", "alice", "--interactive=false", "--user=root:rootpw"], Some("newpw\n"), Mask::None);
    d.step(&["get", "foo", "--user=alice:newpw"]);
    d.step(&["user", "revoke-role", "alice", "r1", "--user=root:rootpw"]);
    d.step(&["role", "revoke-permission", "r1", "foo", "--user=root:rootpw"]);
    d.step(&["user", "delete", "alice", "--user=root:rootpw"]);
    d.step(&["role", "delete", "r1", "--user=root:rootpw"]);
    d.step(&["auth", "disable", "--user=root:rootpw"]);
    d.step(&["get", "foo"]);
}

#[test]
fn every_command_with_http_scheme_endpoints() {
    let mut d = Differential::start(&ClientUrl::http_scheme());
    every_command(&mut d);
}

#[test]
fn every_command_with_https_scheme_endpoints() {
    let pki = Pki::new();
    let server_flags = ["--cert-file", pki.server.cert_str(), "--key-file", pki.server.key_str()];
    let client = ClientUrl::https(
        server_flags.map(String::from).to_vec(),
        vec![format!("--cacert={}", pki.ca_file().display())],
    );
    let mut d = Differential::start(&client);
    every_command(&mut d);
}

/// `make-mirror` in both directions between an etcd and a keyward, every endpoint a URL: keys
/// written before and after the mirror starts arrive under the destination prefix, identically.
#[test]
fn make_mirror_between_etcd_and_keyward_with_scheme_endpoints() {
    let client = ClientUrl::http_scheme();
    let sc = Scenario::start_on(&client, &[]);
    let (etcd, keyward) = (&sc.reference, &sc.candidate);
    for (source, dest) in [(etcd, keyward), (keyward, etcd)] {
        let from = format!("from-{}/", source.kind.label());
        source.etcdctl(&["put", "m/before", "1"]).assert_ok();
        let mut cmd = Command::new(etcdctl_bin());
        scrub_env(&mut cmd);
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", source.etcdctl_endpoint()))
            .args(["make-mirror", "--prefix=m/", &format!("--dest-prefix={from}"), &dest.etcdctl_endpoint()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut mirror = cmd.spawn().expect("spawn make-mirror");
        let deadline = Instant::now() + Duration::from_secs(30);
        let wanted = format!("{from}before\n1\n{from}during\n2\n");
        let mut wrote_during = false;
        let mut last = String::new();
        while Instant::now() < deadline {
            if !wrote_during && dest.etcdctl(&["get", &format!("{from}before")]).stdout.contains("1") {
                source.etcdctl(&["put", "m/during", "2"]).assert_ok();
                wrote_during = true;
            }
            last = dest.etcdctl(&["get", &from, "--prefix"]).stdout;
            if last == wanted {
                break;
            }
            thread::sleep(Duration::from_millis(100));
        }
        let _ = mirror.kill();
        let _ = mirror.wait();
        assert_eq!(last, wanted, "make-mirror from {} to {}", source.kind.label(), dest.kind.label());
        source.etcdctl(&["del", "m/", "--prefix"]).assert_ok();
    }
    assert_eq!(Kind::under_test(), keyward.kind);
}

/// `remaining(98s)` as `remaining(<N>s)`.
fn mask_remaining(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("remaining(") {
        let (before, after) = rest.split_at(at + "remaining(".len());
        out.push_str(before);
        let digits = after.len() - after.trim_start_matches(|c: char| c.is_ascii_digit() || c == '-').len();
        out.push_str(if digits > 0 { "<N>" } else { "" });
        rest = &after[digits..];
    }
    out.push_str(rest);
    out
}

#[test]
fn remaining_seconds_are_masked() {
    assert_eq!(
        mask_remaining("lease 1 granted with TTL(100s), remaining(98s), attached keys([leased])\n"),
        "lease 1 granted with TTL(100s), remaining(<N>s), attached keys([leased])\n"
    );
    assert_eq!(mask_remaining("no lease here\n"), "no lease here\n");
}

/// Whether `check perf` failed and only its timing bounds did (throughput, slowest request, stddev):
/// its errors (`FAIL: too many errors`, `FAIL: ERROR(...)`) are the server's.
fn perf_failed_on_timing_only(stdout: &str) -> bool {
    let mut fails = stdout.lines().filter(|l| l.starts_with("FAIL"));
    stdout.lines().any(|l| l == "FAIL") && fails.all(|l| l == "FAIL" || l.starts_with("FAIL: Throughput too low"))
}

#[test]
fn a_timing_verdict_is_masked_and_an_error_is_not() {
    let timing = "PASS: Throughput is 150 writes/s\nSlowest request took too long: 0.7s\nPASS: Stddev is 0.01s\nFAIL\n";
    assert!(perf_failed_on_timing_only(timing));
    assert!(!perf_failed_on_timing_only("FAIL: too many errors\nFAIL\n"));
    assert!(!perf_failed_on_timing_only("PASS: Throughput is 150 writes/s\nPASS\n"), "it did not fail");
}

/// `check perf` writes at 150 puts/s for a minute, compacts and defragments; both servers at once.
#[test]
fn check_perf_with_scheme_endpoints() {
    let mut d = Differential::start(&ClientUrl::http_scheme());
    d.step_with(
        &["--command-timeout=120s", "check", "perf", "--load=s", "--auto-compact", "--auto-defrag"],
        None,
        Mask::Perf,
    );
}

/// `check datascale` writes 10,000 keys and reads the server's `process_resident_memory_bytes`.
#[test]
fn check_datascale_with_scheme_endpoints() {
    let mut d = Differential::start(&ClientUrl::http_scheme());
    d.step_with(&["check", "datascale", "--load=s"], None, Mask::Memory);
}
