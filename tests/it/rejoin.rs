//! A member that fell behind comes back (issue 30). Three members on loopback with a small
//! `--snapshot-count`; one is stopped while the others write past several snapshots (so the leader's
//! log is purged behind it), then restarted: it must catch up, with one snapshot transfer at most,
//! counted on both sides (`etcd_network_snapshot_send_success` on the members that sent one,
//! `etcd_network_snapshot_receive_success` and the "receiving a snapshot" log lines, one per transfer
//! begun at byte 0, on the restarted one).
//!
//! The same scenario runs at two sizes: a small store in the suite, and a store whose snapshot is
//! over 1 GB (`#[ignore]`d: it writes several GB). Before the fix, the large one never caught up: each
//! chunk had openraft's 200 ms, the last one included though it waits for the install (26.7 s for
//! 2.38 GB), and every timeout restarted the transfer from byte 0. Its numbers (time to catch up,
//! transfers, the leader's failed chunks) are printed; run it with `--nocapture`, and with
//! `KEYWARD_HARNESS_KEYWARD=target/release/keyward` to time a release build.

use std::time::Instant;

use etcd_client::{Client, GetOptions};

use crate::common;
use crate::common::cluster::{metric_sum, wait_for_revision, Cluster, Member, Options};

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// What the cluster holds and writes in one run.
struct Scenario {
    /// Values of `value_bytes` each, written while every member is up (they make the snapshot big).
    values: usize,
    value_bytes: usize,
    /// Small puts written while the member is down: past several snapshots.
    puts_while_down: usize,
    snapshot_count: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_behind_the_purged_log_comes_back_with_one_snapshot_transfer() {
    let scenario = Scenario { values: 48, value_bytes: 256 << 10, puts_while_down: 350, snapshot_count: 100 };
    rejoin(scenario).await;
}

/// `KEYWARD_REJOIN_VALUES_MB` (default 1,100) of values: since kv layout 2 the snapshot holds each
/// once, so a little over 1.1 GB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes several GB: run by hand (see the module doc)"]
async fn a_member_behind_a_large_store_comes_back_with_one_snapshot_transfer() {
    let mb: usize = std::env::var("KEYWARD_REJOIN_VALUES_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(1100);
    let value_bytes = 512 << 10;
    let values = (mb << 20) / value_bytes;
    // One snapshot while loading; then more while the member is down, purging the log past it. 7,000
    // puts: past etcd's 5,000 entries kept for slow followers too, so the same run against etcd
    // (by hand) also needs a snapshot.
    let snapshot_count = values * 2 / 3;
    let puts_while_down = (snapshot_count * 2 + 100).max(7_000);
    let scenario = Scenario { values, value_bytes, puts_while_down, snapshot_count };
    rejoin(scenario).await;
}

async fn rejoin(scenario: Scenario) {
    let count = scenario.snapshot_count.to_string();
    let mut cluster = blocking(|| Cluster::start(Options::new(3).flags(&["--snapshot-count", &count])));
    let leader = cluster.leader().await;
    let down = (0..3).find(|&i| i != leader).unwrap();
    let up: Vec<usize> = (0..3).filter(|&i| i != down).collect();

    let mut client = common::auth::connect(&cluster.members[leader].client_url).await;
    let loading = Instant::now();
    put_values(&client, scenario.values, scenario.value_bytes).await;
    eprintln!("loaded {} values of {} bytes in {:?}", scenario.values, scenario.value_bytes, loading.elapsed());

    blocking(|| cluster.members[down].kill_9());
    let mut timed_out = 0;
    for i in 0..scenario.puts_while_down {
        // A put that timed out (a leader stalled by its own multi-GB snapshot build, issue 30's part C)
        // is put again: the same key, so the counts below hold either way.
        loop {
            match client.put(format!("down/{i:06}"), format!("v{i}"), None).await {
                Ok(_) => break,
                Err(e) if e.to_string().contains("request timed out") && timed_out < 20 => timed_out += 1,
                Err(e) => panic!("put while a member is down: {e}"),
            }
        }
    }
    eprintln!("{} puts while the member was down ({timed_out} timed out and were put again)", scenario.puts_while_down);
    let last = client.put("down/last", "here", None).await.expect("the last put");
    let last_revision = last.header().expect("header").revision();

    let restarting = Instant::now();
    // Not `restart`, which waits for `endpoint health` 30 s at most: catching up is what is timed.
    blocking(|| cluster.members[down].spawn());
    let rejoined = &cluster.members[down];
    wait_for_revision(rejoined, last_revision).await;
    eprintln!("restarted member caught up {:?} after its restart", restarting.elapsed());

    // It holds what the others hold.
    let mut there = common::auth::connect(&rejoined.client_url).await;
    let serializable = || GetOptions::new().with_serializable().with_prefix().with_count_only();
    let here = there.get("down/", Some(serializable())).await.expect("count on the rejoined member");
    assert_eq!(here.count() as usize, scenario.puts_while_down + 1, "keys written while down");
    let values = there.get("value/", Some(serializable())).await.expect("count on the rejoined member");
    assert_eq!(values.count() as usize, scenario.values);

    let sent: f64 = up.iter().map(|&i| metric_sum(&cluster.members[i], "etcd_network_snapshot_send_success")).sum();
    let skipped: f64 =
        up.iter().map(|&i| metric_sum(&cluster.members[i], "keyward_network_snapshot_send_skipped_total")).sum();
    let snapshot_lines = |m: &Member, what: &str| -> Vec<String> {
        m.log().lines().filter(|l| l.contains(what)).map(str::to_string).collect()
    };
    let received = metric_sum(rejoined, "etcd_network_snapshot_receive_success");
    let received_bytes = metric_sum(rejoined, "keyward_network_snapshot_received_bytes_total");
    let begun = rejoined.log().matches("receiving a snapshot").count();
    // The size of the snapshot installed, as the receiver logs it.
    let installed: Vec<f64> = snapshot_lines(rejoined, "installing a snapshot received")
        .iter()
        .filter_map(|l| l.split(" size=").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    let sent_ahead: f64 =
        up.iter().map(|&i| metric_sum(&cluster.members[i], "keyward_network_snapshot_chunks_sent_ahead_total")).sum();
    let failed_chunks: usize =
        up.iter().map(|&i| cluster.members[i].log().matches("snapshot chunk failed").count()).sum();
    let sizes: Vec<String> =
        up.iter().flat_map(|&i| snapshot_lines(&cluster.members[i], "sending a snapshot")).collect();
    let story = || {
        let sender = up.iter().flat_map(|&i| snapshot_lines(&cluster.members[i], "snapshot")).collect::<Vec<_>>();
        format!("senders:\n{}\nreceiver:\n{}", sender.join("\n"), snapshot_lines(rejoined, "snapshot").join("\n"))
    };
    eprintln!(
        "transfers: sent {sent}, skipped {skipped}, received {received} ({received_bytes} bytes for snapshots of \
         {installed:?} bytes installed), begun at byte 0 {begun}; chunks sent ahead of an answer {sent_ahead}; failed chunks on the leader \
         {failed_chunks}; {}",
        sizes.join(" | ")
    );
    for line in up.iter().flat_map(|&i| snapshot_lines(&cluster.members[i], "snapshot chunk failed")).take(5) {
        eprintln!("  {line}");
    }
    assert_eq!(received, 1.0, "the restarted member received one snapshot:\n{}", story());
    assert_eq!(sent, 1.0, "one snapshot sent:\n{}", story());
    // Chunks sent again (a lost answer, a transfer resumed) are few; a transfer restarted from byte 0
    // would send the whole snapshot again. (A transfer begun and left for a newer snapshot, on a leader
    // change, may have sent a part of another one before.)
    assert_eq!(installed.len(), 1, "one snapshot installed:\n{}", story());
    assert!(received_bytes < 2.0 * installed[0], "{received_bytes} bytes received for one snapshot:\n{}", story());
    // A snapshot of more than one chunk crosses with several chunks in flight (one call at a time left
    // the link idle while the follower wrote each chunk).
    if installed[0] > f64::from(4u32 << 20) {
        assert!(sent_ahead > 0.0, "no chunk was sent before the one before it was answered:\n{}", story());
    }
    // Every member holds the same store (`etcdctl endpoint hashkv`), the installed one included.
    let hashes: Vec<String> = cluster.members.iter().map(|m| blocking(|| m.hashkv())).collect();
    assert!(hashes.iter().all(|h| *h == hashes[0] && h != "null"), "HashKV differs: {hashes:?}");
}

/// `n` values of `bytes` bytes each under `value/`, eight puts at a time.
async fn put_values(client: &Client, n: usize, bytes: usize) {
    let value = vec![b'x'; bytes];
    let mut workers = Vec::new();
    for worker in 0..8 {
        let (mut client, value) = (client.clone(), value.clone());
        workers.push(tokio::spawn(async move {
            for i in (worker..n).step_by(8) {
                client.put(format!("value/{i:06}"), value.clone(), None).await.expect("put a value");
            }
        }));
    }
    for worker in workers {
        worker.await.expect("a put worker");
    }
}
