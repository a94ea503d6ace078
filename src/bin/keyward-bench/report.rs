//! Latency recording and the final report (text or JSON), plus the terminal progress line.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One client's measurements: every successful request's latency in microseconds, and the failures
/// by message.
#[derive(Default)]
pub(crate) struct Recorder {
    pub latencies_us: Vec<u32>,
    pub errors: BTreeMap<String, u64>,
}

impl Recorder {
    pub(crate) fn with_capacity(n: usize) -> Self {
        Recorder { latencies_us: Vec::with_capacity(n), errors: BTreeMap::new() }
    }

    pub(crate) fn ok(&mut self, latency: Duration) {
        self.latencies_us.push(u32::try_from(latency.as_micros()).unwrap_or(u32::MAX));
    }

    pub(crate) fn error(&mut self, message: String) {
        *self.errors.entry(message).or_default() += 1;
    }

    pub(crate) fn merge(&mut self, other: Recorder) {
        self.latencies_us.extend_from_slice(&other.latencies_us);
        for (message, n) in other.errors {
            *self.errors.entry(message).or_default() += n;
        }
    }
}

/// The result of one run.
#[derive(Debug, Clone, Default)]
pub(crate) struct Summary {
    pub workload: String,
    pub endpoints: Vec<String>,
    pub conns: usize,
    pub clients: usize,
    /// What one "request" is for this workload (`requests`, `events`, `hashes`).
    pub unit: &'static str,
    pub ok: u64,
    pub errors: u64,
    pub elapsed: Duration,
    pub latency: Percentiles,
    /// etcd `benchmark`'s `Response time histogram:` and `Latency distribution:` blocks.
    pub histogram: String,
    pub error_kinds: BTreeMap<String, u64>,
    /// Extra workload-specific counters (`puts`, `expected_events`, `reauthentications`, ...).
    pub extra: Vec<(&'static str, f64)>,
}

/// Latency distribution in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Percentiles {
    pub mean: f64,
    pub p50: u32,
    pub p90: u32,
    pub p99: u32,
    pub max: u32,
}

impl Percentiles {
    /// Nearest-rank percentiles of the samples (sorted here).
    pub(crate) fn of(samples: &mut [u32]) -> Percentiles {
        if samples.is_empty() {
            return Percentiles::default();
        }
        samples.sort_unstable();
        let rank = |q: f64| samples[((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1];
        let sum: u64 = samples.iter().map(|&v| u64::from(v)).sum();
        Percentiles {
            mean: sum as f64 / samples.len() as f64,
            p50: rank(0.50),
            p90: rank(0.90),
            p99: rank(0.99),
            max: samples[samples.len() - 1],
        }
    }
}

impl Summary {
    pub(crate) fn new(workload: &str, args: &crate::args::BenchArgs, unit: &'static str) -> Summary {
        Summary {
            workload: workload.to_string(),
            endpoints: args.endpoints.clone(),
            conns: args.conns,
            clients: args.clients,
            unit,
            ..Summary::default()
        }
    }

    /// Fills counts and percentiles from the merged recorder.
    pub(crate) fn record(&mut self, mut merged: Recorder, elapsed: Duration) {
        self.ok = merged.latencies_us.len() as u64;
        self.errors = merged.errors.values().sum();
        self.elapsed = elapsed;
        self.latency = Percentiles::of(&mut merged.latencies_us);
        let seconds: Vec<f64> = merged.latencies_us.iter().map(|&us| f64::from(us) / 1e6).collect();
        self.histogram = etcd_histogram(&seconds);
        self.error_kinds = merged.errors;
    }

    pub(crate) fn throughput(&self) -> f64 {
        if self.elapsed.is_zero() {
            0.0
        } else {
            self.ok as f64 / self.elapsed.as_secs_f64()
        }
    }

    pub(crate) fn to_text(&self) -> String {
        let ms = |us: f64| us / 1000.0;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} against {} ({} conns, {} clients)",
            self.workload,
            self.endpoints.join(","),
            self.conns,
            self.clients
        );
        let _ = writeln!(out, "  {:<19}{} ok, {} errors", format!("{}:", self.unit), self.ok, self.errors);
        let _ = writeln!(out, "  {:<19}{:.3} s", "elapsed:", self.elapsed.as_secs_f64());
        let _ = writeln!(out, "  {:<19}{:.1} {}/s", "throughput:", self.throughput(), self.unit);
        let l = &self.latency;
        let _ = writeln!(
            out,
            "  {:<19}p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, max {:.3} ms, mean {:.3} ms",
            "latency:",
            ms(f64::from(l.p50)),
            ms(f64::from(l.p90)),
            ms(f64::from(l.p99)),
            ms(f64::from(l.max)),
            ms(l.mean)
        );
        for (name, value) in &self.extra {
            let _ = writeln!(out, "  {:<19}{}", format!("{name}:"), trim_float(*value));
        }
        out.push_str(&self.histogram);
        if !self.error_kinds.is_empty() {
            let _ = writeln!(out, "  errors by message:");
            for (message, n) in &self.error_kinds {
                let _ = writeln!(out, "    {n:>8}  {message}");
            }
        }
        out
    }

    pub(crate) fn to_json(&self) -> String {
        let mut out = String::from("{");
        let _ = write!(out, "\"workload\":{},", json_str(&self.workload));
        let endpoints: Vec<String> = self.endpoints.iter().map(|e| json_str(e)).collect();
        let _ = write!(out, "\"endpoints\":[{}],", endpoints.join(","));
        let _ = write!(out, "\"conns\":{},\"clients\":{},", self.conns, self.clients);
        let _ = write!(out, "\"unit\":{},", json_str(self.unit));
        let _ = write!(out, "\"ok\":{},\"errors\":{},", self.ok, self.errors);
        let _ = write!(out, "\"elapsed_s\":{},", json_f64(self.elapsed.as_secs_f64()));
        let _ = write!(out, "\"throughput\":{},", json_f64(self.throughput()));
        let l = &self.latency;
        let _ = write!(
            out,
            "\"latency_us\":{{\"mean\":{},\"p50\":{},\"p90\":{},\"p99\":{},\"max\":{}}},",
            json_f64(l.mean),
            l.p50,
            l.p90,
            l.p99,
            l.max
        );
        let kinds: Vec<String> = self.error_kinds.iter().map(|(m, n)| format!("{}:{n}", json_str(m))).collect();
        let _ = write!(out, "\"error_kinds\":{{{}}}", kinds.join(","));
        for (name, value) in &self.extra {
            let _ = write!(out, ",{}:{}", json_str(name), json_f64(*value));
        }
        out.push('}');
        out
    }
}

/// etcd `benchmark`'s latency blocks for `sorted` latencies in seconds (ascending), as etcd's
/// `pkg/report` prints them with the benchmark's `%4.4f` precision: a histogram of ten equal buckets
/// from the fastest to the slowest (each line the bucket's upper bound, its count and a bar of up to 40
/// `∎`), then the latency at each of 10, 25, 50, 75, 90, 95, 99 and 99.9 %. Empty without samples.
pub(crate) fn etcd_histogram(sorted: &[f64]) -> String {
    let Some((&fastest, &slowest)) = sorted.first().zip(sorted.last()) else { return String::new() };
    let mut out = String::from("\nResponse time histogram:\n");
    const BUCKETS: usize = 10;
    let width = (slowest - fastest) / BUCKETS as f64;
    let mut bounds: Vec<f64> = (0..BUCKETS).map(|i| fastest + width * i as f64).collect();
    bounds.push(slowest);
    let mut counts = vec![0usize; bounds.len()];
    let mut bucket = 0;
    for &latency in sorted {
        // Sorted: move up to the first bucket whose bound holds it (the last bound is the slowest).
        while latency > bounds[bucket] && bucket < bounds.len() - 1 {
            bucket += 1;
        }
        counts[bucket] += 1;
    }
    let max = counts.iter().copied().max().unwrap_or(0);
    for (bound, &count) in bounds.iter().zip(&counts) {
        let bar = (count * 40).checked_div(max).unwrap_or(0);
        let _ = writeln!(out, "  {bound:4.4} [{count}]\t|{}", "∎".repeat(bar));
    }
    out.push_str("\nLatency distribution:\n");
    for (percent, latency) in ETCD_PERCENTILES.iter().zip(etcd_percentiles(sorted)) {
        if latency > 0.0 {
            let _ = writeln!(out, "  {percent}% in {latency:4.4} secs.");
        }
    }
    out
}

/// The percentiles etcd's report prints, with Go's `%v` text.
const ETCD_PERCENTILES: [&str; 8] = ["10", "25", "50", "75", "90", "95", "99", "99.9"];

/// etcd's `percentiles`: the first sample at or past each percentile's rank, one percentile per
/// sample at most (0 for a percentile no sample reached, which is then not printed).
fn etcd_percentiles(sorted: &[f64]) -> [f64; 8] {
    const AT: [f64; 8] = [10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.9];
    let mut data = [0.0; 8];
    let mut next = 0;
    for (i, &latency) in sorted.iter().enumerate() {
        if next == AT.len() {
            break;
        }
        if i as f64 * 100.0 / sorted.len() as f64 >= AT[next] {
            data[next] = latency;
            next += 1;
        }
    }
    data
}

fn trim_float(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v:.3}")
    }
}

fn json_f64(v: f64) -> String {
    if v.is_finite() {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        "null".into()
    }
}

fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Shared counters the clients bump and the progress line reads.
#[derive(Default)]
pub(crate) struct Counters {
    pub ok: AtomicU64,
    pub errors: AtomicU64,
}

/// Prints `\r<label>: N ok, E errors, R/s` to stderr every 200 ms while `running`, only when stderr
/// is a terminal; clears the line when stopped.
pub(crate) fn spawn_progress(
    label: String,
    target: Option<u64>,
    counters: Arc<Counters>,
    running: Arc<AtomicBool>,
) -> Option<tokio::task::JoinHandle<()>> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    Some(tokio::spawn(async move {
        let start = Instant::now();
        let mut ticker = tokio::time::interval(Duration::from_millis(200));
        while running.load(Ordering::Relaxed) {
            ticker.tick().await;
            let ok = counters.ok.load(Ordering::Relaxed);
            let errors = counters.errors.load(Ordering::Relaxed);
            let rate = ok as f64 / start.elapsed().as_secs_f64().max(1e-9);
            let of = target.map(|t| format!("/{t}")).unwrap_or_default();
            let mut stderr = std::io::stderr().lock();
            let _ = write!(
                stderr,
                "\r\x1b[K{label}: {ok}{of} ok, {errors} errors, {rate:.0}/s, {:.1} s",
                start.elapsed().as_secs_f64()
            );
            let _ = stderr.flush();
        }
        let mut stderr = std::io::stderr().lock();
        let _ = write!(stderr, "\r\x1b[K");
        let _ = stderr.flush();
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut samples: Vec<u32> = (1..=100).rev().collect();
        let p = Percentiles::of(&mut samples);
        assert_eq!((p.p50, p.p90, p.p99, p.max), (50, 90, 99, 100));
        assert_eq!(p.mean, 50.5);
        assert_eq!(Percentiles::of(&mut []), Percentiles::default());
        assert_eq!(Percentiles::of(&mut [7]).p99, 7);
    }

    #[test]
    fn the_histogram_is_etcds() {
        // 1 to 100 ms, one sample each: ten buckets of 9.9 ms from 1 ms.
        let samples: Vec<f64> = (1..=100).map(|ms| f64::from(ms) / 1000.0).collect();
        let text = etcd_histogram(&samples);
        let expected = "
Response time histogram:
  0.0010 [1]\t|∎∎∎∎
  0.0109 [9]\t|∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎
  0.0208 [10]\t|∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎
  0.0307 [10]\t|∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎
  0.0406 [10]\t|∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎
  0.0505 [10]\t|∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎
  0.0604 [10]\t|∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎
  0.0703 [10]\t|∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎
  0.0802 [10]\t|∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎
  0.0901 [10]\t|∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎
  0.1000 [10]\t|∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎

Latency distribution:
  10% in 0.0110 secs.
  25% in 0.0260 secs.
  50% in 0.0510 secs.
  75% in 0.0760 secs.
  90% in 0.0910 secs.
  95% in 0.0960 secs.
  99% in 0.1000 secs.
";
        assert_eq!(text, expected);
    }

    #[test]
    fn one_sample_and_no_samples() {
        assert_eq!(etcd_histogram(&[]), "");
        let one = etcd_histogram(&[0.002]);
        assert!(one.starts_with("\nResponse time histogram:\n  0.0020 [1]\t|∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎\n  0.0020 [0]\t|\n"), "{one}");
        // etcd's ranks: the one sample is at 0 %, below every percentile, so none is printed.
        assert!(one.ends_with("\nLatency distribution:\n"), "{one}");
    }

    #[test]
    fn json_is_escaped_and_complete() {
        let mut summary = Summary { workload: "put".into(), unit: "requests", ..Summary::default() };
        let mut recorder = Recorder::default();
        recorder.ok(Duration::from_micros(1500));
        recorder.error("etcdserver: \"denied\"\n".into());
        summary.record(recorder, Duration::from_secs(2));
        summary.extra.push(("puts", 3.0));
        let json = summary.to_json();
        assert!(json.contains("\"ok\":1,\"errors\":1,"), "{json}");
        assert!(json.contains("\"throughput\":0.5,"), "{json}");
        assert!(json.contains("\"etcdserver: \\\"denied\\\"\\n\":1"), "{json}");
        assert!(json.ends_with(",\"puts\":3}"), "{json}");
    }
}
