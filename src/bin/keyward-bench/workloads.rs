//! The request-driving loop shared by every workload, and the watch workload.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::transport::Channel;
use tonic::{Request, Status};

use crate::args::{BenchArgs, Consistency, Workload};
use crate::conn::{connect_all, describe, Conn};
use crate::report::{spawn_progress, Counters, Percentiles, Recorder, Summary};
use keyward::proto::etcdserverpb::auth_client::AuthClient;
use keyward::proto::etcdserverpb::kv_client::KvClient;
use keyward::proto::etcdserverpb::watch_client::WatchClient;
use keyward::proto::etcdserverpb::{
    request_op, watch_request, AuthenticateRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
    WatchCreateRequest, WatchRequest,
};

/// One request a client sends.
pub(crate) enum Op {
    Put(PutRequest),
    Range(RangeRequest),
    Txn(TxnRequest),
    Authenticate(AuthenticateRequest),
}

/// Builds request number `n` for a client (`rng` is the client's own).
type MakeOp = dyn Fn(&mut SmallRng, u64) -> Op + Send + Sync;

pub(crate) async fn run(args: &BenchArgs) -> anyhow::Result<Summary> {
    if let Workload::Watch { streams, watchers_per_stream, drain_timeout } = &args.workload {
        return watch(args, *streams, *watchers_per_stream, *drain_timeout).await;
    }
    let keys = Keys::new(args);
    let mut value = vec![0u8; args.val_size];
    SmallRng::from_os_rng().fill_bytes(&mut value);
    let (name, make): (String, Arc<MakeOp>) = match &args.workload {
        Workload::Put => {
            let keys = keys.clone();
            (
                "put".into(),
                Arc::new(move |rng: &mut SmallRng, n| {
                    Op::Put(PutRequest {
                        key: keys.key(keys.index(rng, n)),
                        value: value.clone(),
                        ..Default::default()
                    })
                }),
            )
        }
        Workload::Range { key, range_end, consistency, limit } => {
            let request = RangeRequest {
                key: key.as_ref().map(|k| k.as_bytes().to_vec()).unwrap_or_else(|| keys.key(0)),
                range_end: range_end.as_ref().map(|k| k.as_bytes().to_vec()).unwrap_or_default(),
                limit: *limit,
                serializable: *consistency == Consistency::S,
                ..Default::default()
            };
            let name = match consistency {
                Consistency::L => "range (linearizable)",
                Consistency::S => "range (serializable)",
            };
            (name.into(), Arc::new(move |_: &mut SmallRng, _| Op::Range(request.clone())))
        }
        Workload::TxnPut { txn_ops } => {
            let (keys, ops) = (keys.clone(), *txn_ops as u64);
            (
                "txn-put".into(),
                Arc::new(move |rng: &mut SmallRng, n| {
                    let first = keys.index(rng, n * ops);
                    let success = (0..ops)
                        .map(|i| RequestOp {
                            request: Some(request_op::Request::RequestPut(PutRequest {
                                key: keys.key((first + i) % keys.space),
                                value: value.clone(),
                                ..Default::default()
                            })),
                        })
                        .collect();
                    Op::Txn(TxnRequest { compare: Vec::new(), success, failure: Vec::new() })
                }),
            )
        }
        Workload::Authenticate => {
            let (name, password) =
                crate::args::credentials(args).ok_or_else(|| anyhow!("authenticate needs --user"))?;
            let request = AuthenticateRequest { name, password };
            ("authenticate".into(), Arc::new(move |_: &mut SmallRng, _| Op::Authenticate(request.clone())))
        }
        Workload::Watch { .. }
        | Workload::SetupAuth { .. }
        | Workload::Bcrypt { .. }
        | Workload::CeilingServer { .. }
        | Workload::Probe(_) => {
            unreachable!("not a load: dispatched in main")
        }
    };
    // Authenticate measures the RPC itself: no per-connection token.
    let conns = connect_all(args, !matches!(args.workload, Workload::Authenticate)).await?;
    let idle = crate::idle_watchers::open(args, &conns).await?;
    let (recorder, elapsed) = drive(args, &name, &conns, make).await;
    drop(idle);
    let mut summary = Summary::new(&name, args, "requests");
    summary.record(recorder, elapsed);
    if args.idle_watchers > 0 {
        summary.extra.push(("idle watchers", args.idle_watchers as f64));
    }
    let reauths: u64 = conns.iter().filter_map(|c| c.auth.as_ref()).map(|a| a.reauths.load(Ordering::Relaxed)).sum();
    if conns.iter().any(|c| c.auth.is_some()) {
        summary.extra.push(("reauthentications", reauths as f64));
    }
    Ok(summary)
}

/// Key naming: `--prefix` then the index, zero-padded so that every key has the same length, at
/// least `--key-size` bytes.
#[derive(Clone)]
pub(crate) struct Keys {
    prefix: Vec<u8>,
    width: usize,
    pub space: u64,
    sequential: bool,
}

impl Keys {
    pub(crate) fn new(args: &BenchArgs) -> Keys {
        let digits = (args.key_space - 1).to_string().len();
        Keys {
            prefix: args.prefix.as_bytes().to_vec(),
            width: digits.max(args.key_size.saturating_sub(args.prefix.len())),
            space: args.key_space,
            sequential: args.sequential_keys,
        }
    }

    pub(crate) fn index(&self, rng: &mut SmallRng, n: u64) -> u64 {
        if self.sequential {
            n % self.space
        } else {
            rng.random_range(0..self.space)
        }
    }

    pub(crate) fn key(&self, index: u64) -> Vec<u8> {
        let mut key = self.prefix.clone();
        key.extend_from_slice(format!("{index:0width$}", width = self.width).as_bytes());
        key
    }
}

/// When to stop: after `--total` requests were issued or when `--duration` is up.
pub(super) struct Budget {
    pub total: Option<u64>,
    pub issued: AtomicU64,
    pub deadline: Option<Instant>,
}

impl Budget {
    pub(crate) fn take(&self) -> Option<u64> {
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return None;
        }
        let n = self.issued.fetch_add(1, Ordering::Relaxed);
        match self.total {
            Some(total) if n >= total => None,
            _ => Some(n),
        }
    }
}

/// The generated clients of one bench client, on its connection.
pub(crate) struct Clients {
    kv: KvClient<Channel>,
    auth: AuthClient<Channel>,
}

impl Clients {
    pub(crate) fn new(channel: &Channel) -> Clients {
        Clients {
            kv: KvClient::new(channel.clone()).max_decoding_message_size(usize::MAX),
            auth: AuthClient::new(channel.clone()),
        }
    }
}

/// Sends one request with the connection's token; a stale or unknown token is renewed once and the
/// request retried (the latency then includes both attempts).
pub(crate) async fn exec(conn: &Conn, clients: &mut Clients, op: &Op) -> Result<(), Status> {
    fn with_token<T>(conn: &Conn, message: T) -> (Request<T>, u64) {
        let mut request = Request::new(message);
        let generation = conn.attach(request.metadata_mut());
        (request, generation)
    }
    let mut retried = false;
    loop {
        let (generation, result) = match op {
            Op::Put(m) => {
                let (request, generation) = with_token(conn, m.clone());
                (generation, clients.kv.put(request).await.map(drop))
            }
            Op::Range(m) => {
                let (request, generation) = with_token(conn, m.clone());
                (generation, clients.kv.range(request).await.map(drop))
            }
            Op::Txn(m) => {
                let (request, generation) = with_token(conn, m.clone());
                (generation, clients.kv.txn(request).await.map(drop))
            }
            Op::Authenticate(m) => (0, clients.auth.authenticate(m.clone()).await.map(drop)),
        };
        match result {
            Err(status) if !retried && conn.should_reauthenticate(&status) => {
                retried = true;
                conn.reauthenticate(generation).await?;
            }
            other => return other,
        }
    }
}

/// Runs `--clients` tasks over the connections (client i on connection i mod conns) until the budget
/// is spent; returns the merged measurements and the wall time from the first request to the last
/// response.
async fn drive(args: &BenchArgs, label: &str, conns: &[Arc<Conn>], make: Arc<MakeOp>) -> (Recorder, Duration) {
    let total = match (args.total, args.duration) {
        (Some(total), _) => Some(total),
        (None, Some(_)) => None,
        (None, None) => Some(10_000),
    };
    let counters = Arc::new(Counters::default());
    let running = Arc::new(AtomicBool::new(true));
    let progress = spawn_progress(label.to_string(), total, counters.clone(), running.clone());
    let start = Instant::now();
    let budget = Arc::new(Budget { total, issued: AtomicU64::new(0), deadline: args.duration.map(|d| start + d) });
    let per_client = total.map(|t| (t / args.clients as u64 + 1) as usize).unwrap_or(1 << 16).min(1 << 22);
    let mut tasks = Vec::with_capacity(args.clients);
    for id in 0..args.clients {
        let conn = conns[id % conns.len()].clone();
        let (budget, make, counters) = (budget.clone(), make.clone(), counters.clone());
        tasks.push(tokio::spawn(async move {
            let mut clients = Clients::new(&conn.channel);
            let mut rng = SmallRng::from_os_rng();
            let mut recorder = Recorder::with_capacity(per_client);
            while let Some(n) = budget.take() {
                let op = make(&mut rng, n);
                let sent = Instant::now();
                match exec(&conn, &mut clients, &op).await {
                    Ok(()) => {
                        recorder.ok(sent.elapsed());
                        counters.ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(status) => {
                        recorder.error(describe(&status));
                        counters.errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            recorder
        }));
    }
    let mut merged = Recorder::default();
    for task in tasks {
        match task.await {
            Ok(recorder) => merged.merge(recorder),
            Err(e) => merged.error(format!("client task failed: {e}")),
        }
    }
    let elapsed = start.elapsed();
    running.store(false, Ordering::Relaxed);
    if let Some(progress) = progress {
        let _ = progress.await;
    }
    (merged, elapsed)
}

/// Length of the send-time stamp at the start of each watch workload value.
const STAMP_LEN: usize = 20;

/// `[key, range_end)` covering every key with the prefix (all keys for an empty prefix).
pub(super) fn prefix_range(prefix: &[u8]) -> (Vec<u8>, Vec<u8>) {
    if prefix.is_empty() {
        return (vec![0], vec![0]);
    }
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return (prefix.to_vec(), end);
        }
    }
    (prefix.to_vec(), vec![0])
}

/// Opens the watchers, then puts keys under the prefix with `--clients` clients; every event's value
/// carries the put's send time, so each delivery yields a put-to-event latency. Throughput is events
/// delivered per second, from the first put to the last event.
async fn watch(
    args: &BenchArgs,
    streams: usize,
    per_stream: usize,
    drain_timeout: Duration,
) -> anyhow::Result<Summary> {
    let conns = connect_all(args, true).await?;
    let (key, range_end) = prefix_range(args.prefix.as_bytes());
    let epoch = Instant::now();
    let received = Arc::new(AtomicU64::new(0));
    let last_event_us = Arc::new(AtomicU64::new(0));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut readers = Vec::with_capacity(streams);
    for s in 0..streams {
        let conn = conns[s % conns.len()].clone();
        let (tx, rx) = tokio::sync::mpsc::channel::<WatchRequest>(per_stream + 1);
        for _ in 0..per_stream {
            let create = WatchCreateRequest { key: key.clone(), range_end: range_end.clone(), ..Default::default() };
            tx.send(WatchRequest { request_union: Some(watch_request::RequestUnion::CreateRequest(create)) })
                .await
                .map_err(|_| anyhow!("watch request channel closed"))?;
        }
        let mut request = Request::new(ReceiverStream::new(rx));
        conn.attach(request.metadata_mut());
        let mut inbound = WatchClient::new(conn.channel.clone())
            .max_decoding_message_size(usize::MAX)
            .watch(request)
            .await
            .map_err(|s| anyhow!("watch stream {s}: {}", describe(&s)))?
            .into_inner();
        let mut created = 0;
        while created < per_stream {
            match inbound.next().await {
                Some(Ok(response)) if response.canceled => {
                    bail!("watch on stream {s} canceled: {}", response.cancel_reason)
                }
                Some(Ok(response)) if response.created => created += 1,
                Some(Ok(_)) => {}
                Some(Err(status)) => bail!("watch stream {s}: {}", describe(&status)),
                None => bail!("watch stream {s} closed before its watchers were created"),
            }
        }
        let (received, last_event_us, mut stop) = (received.clone(), last_event_us.clone(), stop_rx.clone());
        readers.push(tokio::spawn(async move {
            let _keep_open = tx;
            let mut recorder = Recorder::default();
            loop {
                tokio::select! {
                    _ = stop.changed() => break,
                    message = inbound.next() => match message {
                        Some(Ok(response)) => {
                            let now_us = epoch.elapsed().as_micros() as u64;
                            for event in &response.events {
                                let sent_us = event
                                    .kv
                                    .as_ref()
                                    .and_then(|kv| kv.value.get(..STAMP_LEN))
                                    .and_then(|stamp| std::str::from_utf8(stamp).ok()?.parse::<u64>().ok());
                                match sent_us {
                                    Some(sent) => recorder.ok(Duration::from_micros(now_us.saturating_sub(sent))),
                                    None => recorder.error("event without a send-time stamp".into()),
                                }
                            }
                            if response.canceled {
                                recorder.error(format!("watch canceled: {}", response.cancel_reason));
                            }
                            received.fetch_add(response.events.len() as u64, Ordering::Relaxed);
                            last_event_us.fetch_max(now_us, Ordering::Relaxed);
                        }
                        Some(Err(status)) => {
                            recorder.error(format!("watch stream: {}", describe(&status)));
                            break;
                        }
                        None => break,
                    },
                }
            }
            recorder
        }));
    }

    let keys = Keys::new(args);
    let filler = vec![b'v'; args.val_size.saturating_sub(STAMP_LEN)];
    let make: Arc<MakeOp> = Arc::new(move |rng: &mut SmallRng, n| {
        let mut value = format!("{:0w$}", epoch.elapsed().as_micros(), w = STAMP_LEN).into_bytes();
        value.extend_from_slice(&filler);
        Op::Put(PutRequest { key: keys.key(keys.index(rng, n)), value, ..Default::default() })
    });
    let puts_start_us = epoch.elapsed().as_micros() as u64;
    let (put_recorder, put_elapsed) = drive(args, "watch (puts)", &conns, make).await;
    let puts_ok = put_recorder.latencies_us.len() as u64;
    let watchers = (streams * per_stream) as u64;
    let expected = puts_ok * watchers;
    let drain_deadline = Instant::now() + drain_timeout;
    while received.load(Ordering::Relaxed) < expected && Instant::now() < drain_deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _ = stop_tx.send(true);
    let mut events = Recorder::default();
    for reader in readers {
        match reader.await {
            Ok(recorder) => events.merge(recorder),
            Err(e) => events.error(format!("watch reader failed: {e}")),
        }
    }
    for (message, n) in &put_recorder.errors {
        *events.errors.entry(format!("put: {message}")).or_default() += n;
    }
    let last = last_event_us.load(Ordering::Relaxed).max(puts_start_us);
    let mut summary = Summary::new("watch", args, "events");
    summary.record(events, Duration::from_micros(last - puts_start_us));
    let mut put_latencies = put_recorder.latencies_us;
    let put_latency = Percentiles::of(&mut put_latencies);
    summary.extra = vec![
        ("watchers", watchers as f64),
        ("puts", puts_ok as f64),
        ("put_throughput", puts_ok as f64 / put_elapsed.as_secs_f64().max(1e-9)),
        ("put_p99_us", f64::from(put_latency.p99)),
        ("expected_events", expected as f64),
        ("missing_events", expected.saturating_sub(received.load(Ordering::Relaxed)) as f64),
    ];
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ranges() {
        assert_eq!(prefix_range(b"bench/"), (b"bench/".to_vec(), b"bench0".to_vec()));
        assert_eq!(prefix_range(b"a\xff"), (b"a\xff".to_vec(), b"b".to_vec()));
        assert_eq!(prefix_range(b""), (vec![0], vec![0]));
    }

    #[test]
    fn keys_are_fixed_width() {
        let keys = Keys { prefix: b"bench/".to_vec(), width: 10, space: 10_000, sequential: true };
        let mut rng = SmallRng::seed_from_u64(1);
        assert_eq!(keys.key(keys.index(&mut rng, 10_042)), b"bench/0000000042".to_vec());
        let narrow = Keys { prefix: Vec::new(), width: 4, space: 10_000, sequential: false };
        assert!((0..100).all(|n| narrow.key(narrow.index(&mut rng, n)).len() == 4));
    }
}
