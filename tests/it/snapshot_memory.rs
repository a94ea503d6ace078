//! A snapshot never has to fit in memory: building one, sending it chunk by chunk and installing it
//! allocate a bounded amount of heap whatever the store's size.
//!
//! The test binary counts every heap allocation Rust makes (`common/heap.rs`) and checks the
//! peak of live bytes during the build and during the install against the snapshot's size. LMDB's dirty
//! pages are C allocations and are not counted: the install's write transaction holds them until its
//! commit, bounded by LMDB's dirty-page list (2^17 pages, 512 MiB; beyond it LMDB spills pages to the
//! file), as any large write transaction does. The count is the whole process's, so each test here
//! runs in a process of its own (`common::alone`), with no other test beside it.
//!
//! `measure_build_and_install_of_a_large_store` (ignored; run with `cargo test --release --test it
//! snapshot_memory:: -- --ignored --nocapture`) reports times and peaks for a ~200 MB store (`KEYWARD_SNAPSHOT_MB` to change it).

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Instant;

use keyward::proto::etcdserverpb::{InternalRaftBatch, InternalRaftRequest, PutRequest};
use keyward::StateMachine;
use keyward::{Entry, LogId, RaftBatch};
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::{CommittedLeaderId, EntryPayload};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common;
use crate::common::heap::peak_growth;

fn open(dir: &Path) -> StateMachine {
    StateMachine::open(&dir.join("kv"), &dir.join("snap")).expect("open")
}

/// Fills `sm` with `keys` puts of `value_len` bytes, `per_entry` to an entry.
async fn fill(sm: &mut StateMachine, keys: usize, value_len: usize, per_entry: usize) {
    let value = vec![0x5a; value_len];
    for (index, first) in (0..keys).step_by(per_entry).enumerate() {
        let requests = (first..(first + per_entry).min(keys))
            .map(|i| InternalRaftRequest {
                put: Some(Box::new(PutRequest {
                    key: format!("key/{i:08}").into(),
                    value: value.clone(),
                    ..Default::default()
                })),
                ..Default::default()
            })
            .collect();
        let entry = Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index as u64 + 1),
            payload: EntryPayload::Normal(RaftBatch::new(InternalRaftBatch { requests })),
        };
        let results = sm.apply([entry]).await.expect("apply");
        assert!(results[0].iter().all(Result::is_ok));
    }
}

struct Transfer {
    snapshot_bytes: u64,
    build_peak: usize,
    install_peak: usize,
    build_secs: f64,
    install_secs: f64,
}

/// Builds a snapshot on `leader` and installs it on `follower` through openraft's trait methods, sent
/// in chunks of openraft's default size; measures each side.
async fn transfer(leader: &mut StateMachine, follower: &mut StateMachine) -> Transfer {
    let started = Instant::now();
    let (snapshot, build_peak) =
        peak_growth(async { leader.get_snapshot_builder().await.build_snapshot().await }).await;
    let snapshot = snapshot.expect("build");
    let build_secs = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let chunk = openraft::Config::default().snapshot_max_chunk_size as usize;
    let (snapshot_bytes, install_peak) = peak_growth(async {
        let mut sending = snapshot.snapshot;
        let mut receiving = follower.begin_receiving_snapshot().await.expect("begin receiving");
        let mut buf = vec![0u8; chunk];
        let mut sent = 0u64;
        loop {
            let n = sending.read(&mut buf).await.expect("read a chunk");
            if n == 0 {
                break;
            }
            receiving.write_all(&buf[..n]).await.expect("write a chunk");
            sent += n as u64;
        }
        follower.install_snapshot(&snapshot.meta, receiving).await.expect("install");
        sent
    })
    .await;
    let install_secs = started.elapsed().as_secs_f64();
    Transfer { snapshot_bytes, build_peak, install_peak, build_secs, install_secs }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn building_sending_and_installing_a_snapshot_holds_a_small_fraction_of_it_in_memory() {
    if common::alone::elsewhere(
        "snapshot_memory::building_sending_and_installing_a_snapshot_holds_a_small_fraction_of_it_in_memory",
    ) {
        return;
    }
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut leader, mut follower) = (open(a.path()), open(b.path()));
    // 48 MiB of values, each stored once (kv layout 2): a ~48 MiB snapshot.
    fill(&mut leader, 3072, 16 << 10, 64).await;

    let t = transfer(&mut leader, &mut follower).await;

    println!(
        "snapshot {} bytes; heap peak: build +{}, send and install +{}",
        t.snapshot_bytes, t.build_peak, t.install_peak
    );
    assert!(t.snapshot_bytes > 48 << 20, "snapshot of {} bytes", t.snapshot_bytes);
    let bound = (t.snapshot_bytes / 4) as usize;
    assert!(t.build_peak < bound, "building held {} bytes of a {}-byte snapshot", t.build_peak, t.snapshot_bytes);
    assert!(t.install_peak < bound, "installing held {} bytes of a {}-byte snapshot", t.install_peak, t.snapshot_bytes);
    assert_eq!(follower.applied_state().await.unwrap(), leader.applied_state().await.unwrap());
    let (sent, kept) = (a.path().join("snap/current.snap"), b.path().join("snap/current.snap"));
    assert!(std::fs::read(kept).unwrap() == std::fs::read(sent).unwrap(), "the follower keeps what it received");
}

/// The peak resident set (VmHWM) and the current anonymous resident memory (RssAnon), in KiB.
fn rss_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap_or_default();
        line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or(0)
    };
    (field("VmHWM:"), field("RssAnon:"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement (~200 MB store): run with --release --test it snapshot_memory:: -- --ignored --nocapture"]
async fn measure_build_and_install_of_a_large_store() {
    if common::alone::elsewhere("snapshot_memory::measure_build_and_install_of_a_large_store") {
        return;
    }
    let megabytes: usize = std::env::var("KEYWARD_SNAPSHOT_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut leader, mut follower) = (open(a.path()), open(b.path()));
    // 1000-byte values, each held twice by the store.
    fill(&mut leader, megabytes * 1000 / 2, 1000, 1000).await;
    // Anonymous memory sampled while the transfer runs (VmHWM also counts LMDB's mapped file pages).
    let sampling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let sampling = sampling.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while sampling.load(Ordering::Relaxed) {
                peak = peak.max(rss_kib().1);
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            peak
        })
    };
    let (hwm_before, anon_before) = rss_kib();
    let t = transfer(&mut leader, &mut follower).await;
    sampling.store(false, Ordering::Relaxed);
    let anon_peak = sampler.join().unwrap();
    let (hwm_after, _) = rss_kib();
    println!(
        "snapshot {:.1} MB | build {:.2} s, heap peak +{:.1} MB | send+install {:.2} s, heap peak +{:.1} MB | \
         RssAnon {:.1} -> peak {:.1} MB | VmHWM {:.1} -> {:.1} MB",
        t.snapshot_bytes as f64 / 1e6,
        t.build_secs,
        t.build_peak as f64 / 1e6,
        t.install_secs,
        t.install_peak as f64 / 1e6,
        anon_before as f64 / 1e3,
        anon_peak as f64 / 1e3,
        hwm_before as f64 / 1e3,
        hwm_after as f64 / 1e3,
    );
}
