//! `probe`: a client that wants one linearizable get and one put every tick, each on its own
//! connection, and reports the longest wait of each: what a stall of the server's write or read path
//! costs a well-behaved client (`benches/store-scale.sh` runs it beside a compaction, a big delete,
//! a snapshot).
//!
//! Each request is due at a tick of a fixed schedule (`start + k × --every`) and its latency counts
//! from when it was due, not from when it could be sent: a request stuck for 3 s is reported as a
//! 3 s wait, and the request due meanwhile is sent as soon as the stuck one returns, its latency
//! counted from its own due time. Ticks that passed entirely while a request was stuck are not sent
//! (a burst of catch-up requests would only measure the burst), and are counted as skipped.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use tokio::task::JoinHandle;

use crate::args::{BenchArgs, OutputFormat, ProbeArgs};
use crate::conn::{connect_all, describe, Conn};
use crate::report::Percentiles;
use crate::workloads::{exec, Clients, Op};
use keyward::proto::etcdserverpb::{PutRequest, RangeRequest};

/// A wait at least this long is listed with its due time.
const SLOW: Duration = Duration::from_millis(50);
/// Enough for every slow tick of a half-hour probe at 10 ticks a second: a cap at the first 100
/// dropped the late stalls of a long load (a 572 ms wait at 73 s went unlisted).
const SLOW_KEPT: usize = 20_000;

/// What one of the two probing clients saw.
#[derive(Debug, Clone, Default, PartialEq)]
struct ProbeLog {
    ok: u64,
    errors: u64,
    /// Every request's wait from its due time, answered or failed (microseconds).
    waits_us: Vec<u32>,
    /// The longest wait so far (microseconds) and when its request was due, since the start.
    worst_us: u32,
    worst_due: Duration,
    skipped_ticks: u64,
    /// The waits of at least `SLOW` (due time since the start, microseconds), the first `SLOW_KEPT`:
    /// when each stall happened, to match it with the server's log.
    slow: Vec<(Duration, u32)>,
    /// The first error's message, if any.
    first_error: Option<String>,
}

impl ProbeLog {
    fn record(&mut self, due: Duration, wait: Duration, error: Option<String>) {
        let us = u32::try_from(wait.as_micros()).unwrap_or(u32::MAX);
        if self.waits_us.is_empty() || us > self.worst_us {
            (self.worst_us, self.worst_due) = (us, due);
        }
        self.waits_us.push(us);
        if wait >= SLOW && self.slow.len() < SLOW_KEPT {
            self.slow.push((due, us));
        }
        match error {
            None => self.ok += 1,
            Some(message) => {
                self.errors += 1;
                self.first_error.get_or_insert(message);
            }
        }
    }
}

/// Which get/put a probing client sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ProbeOp {
    Get,
    Put,
}

/// The tick to send next after the request due at tick `served` returned `done_after` past the
/// start: the following tick, or, when the request overran it, the latest tick already due (sent at
/// once, its wait counted from its due time). Returns that tick and how many ticks in between are
/// skipped.
fn next_tick(served: u64, every: Duration, done_after: Duration) -> (u64, u64) {
    let latest_due = (done_after.as_nanos() / every.as_nanos().max(1)) as u64;
    if latest_due <= served + 1 {
        (served + 1, 0)
    } else {
        (latest_due, latest_due - served - 1)
    }
}

/// Probes until the stop file appears or --duration is up, then prints the report.
pub(crate) async fn run(args: &BenchArgs, probe: &ProbeArgs) -> anyhow::Result<()> {
    // Two connections: the get and the put never wait behind each other.
    let mut two = args.clone();
    two.conns = 2;
    let conns = connect_all(&two, true).await?;
    let start = Instant::now();
    let started_at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let stop = Stop { file: probe.until_file.clone(), deadline: args.duration.map(|d| start + d) };
    let spawn = |op, conn: &Arc<Conn>| -> JoinHandle<ProbeLog> {
        let (conn, probe, stop) = (conn.clone(), probe.clone(), stop.clone());
        tokio::spawn(async move { probe_loop(op, conn, probe, start, stop).await })
    };
    let get = spawn(ProbeOp::Get, &conns[0]);
    let put = spawn(ProbeOp::Put, &conns[1]);
    let (get, put) = (get.await?, put.await?);
    let elapsed = start.elapsed();
    if get.ok + put.ok == 0 {
        bail!("no probe request succeeded (get: {:?}; put: {:?})", get.first_error, put.first_error);
    }
    match args.write_out {
        OutputFormat::Simple => print!("{}", to_text(probe.every, elapsed, &get, &put)),
        OutputFormat::Json => println!("{}", to_json(probe.every, started_at, elapsed, &get, &put)),
    }
    Ok(())
}

#[derive(Clone)]
struct Stop {
    file: Option<PathBuf>,
    deadline: Option<Instant>,
}

impl Stop {
    fn now(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d) || self.file.as_deref().is_some_and(Path::exists)
    }
}

async fn probe_loop(op: ProbeOp, conn: Arc<Conn>, probe: ProbeArgs, start: Instant, stop: Stop) -> ProbeLog {
    let mut clients = Clients::new(&conn.channel);
    let mut log = ProbeLog::default();
    let mut tick = 0u64;
    loop {
        let due = probe.every * u32::try_from(tick).unwrap_or(u32::MAX);
        tokio::time::sleep_until((start + due).into()).await;
        if stop.now() {
            return log;
        }
        let request = match op {
            ProbeOp::Get => Op::Range(RangeRequest { key: probe.key.as_bytes().to_vec(), ..Default::default() }),
            ProbeOp::Put => Op::Put(PutRequest {
                key: probe.key.as_bytes().to_vec(),
                value: tick.to_string().into_bytes(),
                ..Default::default()
            }),
        };
        let error = match tokio::time::timeout(probe.request_timeout, exec(&conn, &mut clients, &request)).await {
            Ok(Ok(())) => None,
            Ok(Err(status)) => Some(describe(&status)),
            Err(_) => Some(format!("no answer after {:?}", probe.request_timeout)),
        };
        let done_after = start.elapsed();
        log.record(due, done_after.saturating_sub(due), error);
        let (next, skipped) = next_tick(tick, probe.every, done_after);
        log.skipped_ticks += skipped;
        tick = next;
    }
}

fn to_text(every: Duration, elapsed: Duration, get: &ProbeLog, put: &ProbeLog) -> String {
    let mut out = format!("probe every {every:?} for {:.3} s\n", elapsed.as_secs_f64());
    for (name, log) in [("get", get), ("put", put)] {
        let p = Percentiles::of(&mut log.waits_us.clone());
        out.push_str(&format!(
            "  {name}: {} ok, {} errors, longest wait {:.3} ms (due at {:.3} s), p99 {:.3} ms, {} ticks skipped{}\n",
            log.ok,
            log.errors,
            f64::from(p.max) / 1000.0,
            log.worst_due.as_secs_f64(),
            f64::from(p.p99) / 1000.0,
            log.skipped_ticks,
            log.first_error.as_ref().map(|e| format!(", first error: {e}")).unwrap_or_default(),
        ));
    }
    out
}

fn to_json(every: Duration, started_at: Duration, elapsed: Duration, get: &ProbeLog, put: &ProbeLog) -> String {
    let side = |log: &ProbeLog| {
        let p = Percentiles::of(&mut log.waits_us.clone());
        serde_json::json!({
            "ok": log.ok,
            "errors": log.errors,
            "max_ms": f64::from(p.max) / 1000.0,
            "p99_ms": f64::from(p.p99) / 1000.0,
            "worst_due_s": log.worst_due.as_secs_f64(),
            "skipped_ticks": log.skipped_ticks,
            "first_error": log.first_error,
            "slow": log.slow.iter().map(|(due, us)| serde_json::json!({
                "due_s": due.as_secs_f64(),
                "wait_ms": f64::from(*us) / 1000.0,
            })).collect::<Vec<_>>(),
        })
    };
    serde_json::json!({
        "every_ms": every.as_secs_f64() * 1000.0,
        "started_unix_s": started_at.as_secs_f64(),
        "elapsed_s": elapsed.as_secs_f64(),
        "get": side(get),
        "put": side(put),
        "max_ms": f64::from(Percentiles::of(&mut [get.waits_us.clone(), put.waits_us.clone()].concat()).max) / 1000.0,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: Duration = Duration::from_millis(100);

    #[test]
    fn a_request_answered_within_its_tick_leads_to_the_next_tick() {
        assert_eq!(next_tick(0, TICK, Duration::from_millis(3)), (1, 0));
        assert_eq!(next_tick(7, TICK, Duration::from_millis(799)), (8, 0));
        // Answered exactly when the next tick falls due: that tick is sent, none skipped.
        assert_eq!(next_tick(7, TICK, Duration::from_millis(800)), (8, 0));
    }

    #[test]
    fn a_stuck_request_sends_the_latest_due_tick_at_once_and_skips_the_rest() {
        // Due at 0.2 s, answered at 3.25 s: ticks 3..=31 passed, 32 (due 3.2 s) goes out now.
        assert_eq!(next_tick(2, TICK, Duration::from_millis(3250)), (32, 29));
        // Answered at 0.45 s: tick 3 (due 0.3 s) passed while it was stuck, tick 4 (0.4 s) goes out now.
        assert_eq!(next_tick(2, TICK, Duration::from_millis(450)), (4, 1));
    }

    #[test]
    fn waits_count_from_the_due_time_and_the_worst_is_located() {
        let mut log = ProbeLog::default();
        log.record(Duration::from_millis(0), Duration::from_millis(2), None);
        log.record(Duration::from_millis(100), Duration::from_millis(3150), Some("request timed out".into()));
        log.record(Duration::from_millis(3200), Duration::from_millis(60), None);
        log.record(Duration::from_millis(3300), Duration::from_millis(3150), Some("second".into()));
        assert_eq!((log.ok, log.errors), (2, 2));
        assert_eq!(log.worst_due, Duration::from_millis(100), "the first of equal waits stays the worst");
        assert_eq!(log.first_error.as_deref(), Some("request timed out"));
        assert_eq!(Percentiles::of(&mut log.waits_us.clone()).max, 3_150_000);
    }

    #[test]
    fn the_report_names_both_sides() {
        let mut get = ProbeLog::default();
        get.record(Duration::ZERO, Duration::from_millis(5), None);
        let mut put = ProbeLog::default();
        put.record(Duration::ZERO, Duration::from_millis(1500), None);
        let json: serde_json::Value =
            serde_json::from_str(&to_json(TICK, Duration::ZERO, Duration::from_secs(2), &get, &put)).unwrap();
        assert_eq!(json["get"]["max_ms"], 5.0);
        assert_eq!(json["put"]["max_ms"], 1500.0);
        assert_eq!(json["max_ms"], 1500.0);
        assert!(
            to_text(TICK, Duration::from_secs(2), &get, &put).contains("put: 1 ok, 0 errors, longest wait 1500.000 ms")
        );
    }
}
