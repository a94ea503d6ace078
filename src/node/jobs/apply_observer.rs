//! The apply loop's observer: called on the apply thread after each applied batch (or snapshot
//! install), it keeps what the node derives from the applied state current — the latest revision and
//! auth state, the lease clock, the count towards the next snapshot (and where it may purge the log
//! up to, `log_retention.rs`), the wake-up of compaction's removal — and hands the batch to the
//! watch hub (`watch_hub/`).
//!
//! What every batch sets off on the gRPC runtime (the watch hub's commit, the wake-up of the requests
//! waiting for its index) goes through the relay (`raft/relay.rs`), run by the relay's task there:
//! a wake-up sent from the raft thread would wake two of the runtime's workers, one of them for
//! nothing.

use std::sync::{Arc, Mutex, PoisonError};

use super::log_retention::RequestsBehind;

use crate::lease::lessor::Lessor;
use crate::node::latest_applied::LatestApplied;
use crate::raft::relay::Relay;
use crate::raft::state_machine::{Committed, State};
use crate::watch_hub::WatchHub;

/// What observing the applied state starts.
pub(in crate::node) struct Observed {
    /// Where the applied batches go to the watchers.
    pub(in crate::node) watch_hub: Arc<WatchHub>,
    /// Changed each time `--snapshot-count` requests were applied since the last snapshot.
    pub(in crate::node) snapshot_due: tokio::sync::watch::Receiver<SnapshotDue>,
    /// Notified when a batch scheduled a compaction or a snapshot replaced the applied state: removal
    /// may be pending (`compaction.rs`).
    pub(in crate::node) removal_due: Arc<tokio::sync::Notify>,
}

/// A snapshot is due: of the state applied up to `applied` or later.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(in crate::node) struct SnapshotDue {
    pub(in crate::node) applied: u64,
    /// Where such a snapshot may purge the log up to (`log_retention.rs`).
    pub(in crate::node) purge_upto: Option<u64>,
}

/// Where this member's count towards its first snapshot starts, so that the members of a cluster do
/// not build theirs at the same moment: the `i`-th of `n` initial members (by name) starts `i/n` of
/// the way, and builds its first snapshot after `(n - i)/n` of `--snapshot-count` requests, its next
/// ones every `--snapshot-count` as all members do.
///
/// Every member applies the same requests, so with one count all of them built a snapshot of the same
/// store at once: each build reads and writes the whole store (1.3 GB on each of three members at
/// 1M keys of 1 KiB), and with both followers building together the leader's commits waited on the
/// slower of two busy members instead of one. Staggered, one member builds at a time and a quorum
/// stays free. A member missing from `--initial-cluster` (added later) starts at 0.
pub(in crate::node) fn staggered_start(
    snapshot_count: u64,
    name: &str,
    initial_cluster: &[(String, Vec<String>)],
) -> u64 {
    let mut names: Vec<&str> = initial_cluster.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    match names.iter().position(|n| *n == name) {
        Some(rank) => (u128::from(snapshot_count) * rank as u128 / names.len() as u128) as u64,
        None => 0,
    }
}

/// Installs the observer on `state` and starts the watch hub, before anything is applied. The count
/// towards the first snapshot starts at `counted` (`staggered_start`). Called on the gRPC runtime,
/// whose tasks `relay` wakes.
pub(in crate::node) fn observe(
    state: &State,
    relay: Arc<Relay>,
    lessor: Arc<Lessor>,
    latest: Arc<LatestApplied>,
    snapshot_count: u64,
    counted: u64,
) -> Observed {
    // Made before anything is applied: the hub sees every batch from the store's revision on.
    let watch_hub = WatchHub::new(latest.revision());
    let hub = watch_hub.clone();
    let (due, snapshot_due) = tokio::sync::watch::channel(SnapshotDue::default());
    // Only the apply thread takes the lock: (requests since the last snapshot, the log behind).
    let counts = Mutex::new((counted, RequestsBehind::new(snapshot_count)));
    let removal_due = Arc::new(tokio::sync::Notify::new());
    let removal = removal_due.clone();
    state.observe(Box::new(move |mut batch: Committed| {
        let mut counts = counts.lock().unwrap_or_else(PoisonError::into_inner);
        let (since_snapshot, behind) = &mut *counts;
        // An installed snapshot is the newest one: the count starts again from it (etcd's `snapi`).
        let before = if batch.installed.is_some() { 0 } else { *since_snapshot };
        let applied = before + batch.requests;
        match batch.installed {
            Some(_) => behind.installed(batch.last_index),
            None => behind.applied(batch.last_index, batch.requests),
        }
        if applied >= snapshot_count {
            due.send_replace(SnapshotDue { applied: batch.last_index, purge_upto: behind.purge_upto() });
        }
        *since_snapshot = if applied >= snapshot_count { 0 } else { applied };
        drop(counts);
        let reached = latest.record(&batch);
        if batch.effects.compacted || batch.installed.is_some() {
            removal.notify_one();
        }
        for &(id, ttl) in &batch.effects.granted {
            lessor.granted(id, ttl);
        }
        for &id in &batch.effects.revoked {
            lessor.revoked(id);
        }
        if let Some(installed) = &mut batch.installed {
            // A snapshot install: the lease clock follows the installed lease table. Taken out: the
            // hub keeps the last batches.
            lessor.follow_installed(std::mem::take(&mut installed.leases));
        }
        // Answered on the runtime, as the proposer's answers are (`raft/awaited.rs`).
        let answers = batch.answers.take();
        // Batches offered while one relayed commit waits are committed by it.
        let commit = hub.offer(Arc::new(batch)).then(|| hub.clone());
        if commit.is_some() || !reached.is_empty() {
            relay.run(move || {
                reached.wake();
                if let Some(hub) = commit {
                    hub.commit_offered();
                }
            });
        }
        if !answers.is_empty() {
            relay.send(answers);
        }
    }));
    Observed { watch_hub, snapshot_due, removal_due }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::state_machine::snapshot_tests::put;
    use crate::raft::state_machine::StateMachine;

    fn relay() -> Arc<Relay> {
        Arc::new(Relay::start().unwrap())
    }

    /// Whether a snapshot became due since the last look, marking it seen.
    fn due_now(due: &mut tokio::sync::watch::Receiver<SnapshotDue>) -> bool {
        let changed = due.has_changed().unwrap_or(false);
        due.borrow_and_update();
        changed
    }

    /// The count towards the next snapshot starts again at an installed snapshot, as etcd's does from
    /// the snapshot it applied: a member that caught up by a snapshot does not build one of the same
    /// state (1 GB for a 1 GB store) a few entries later. Fails if the install does not reset it.
    #[tokio::test]
    async fn an_installed_snapshot_starts_the_count_towards_the_next_one_again() {
        let (dir, source_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let sm = StateMachine::open(&dir.path().join("kv"), &dir.path().join("snap")).unwrap();
        let source = StateMachine::open(&source_dir.path().join("kv"), &source_dir.path().join("snap")).unwrap();
        let mut observed = observe(
            &sm.state(),
            relay(),
            Arc::new(Lessor::default()),
            Arc::new(LatestApplied::new(1, false, 0, 0)),
            10,
            0,
        );
        let puts = |prefix: &str, n: usize| (0..n).map(|i| put(format!("{prefix}{i}").as_bytes(), b"v", 0)).collect();

        sm.state().apply_requests(1, puts("a", 6));
        assert!(!due_now(&mut observed.snapshot_due), "6 of 10");
        source.state().apply_requests(5, puts("s", 3));
        sm.kv_env().install_snapshot_of(&source.state()).unwrap();
        sm.state().apply_requests(6, puts("b", 6));
        assert!(!due_now(&mut observed.snapshot_due), "6 of 10 since the install");
        sm.state().apply_requests(7, puts("c", 4));
        assert!(due_now(&mut observed.snapshot_due), "10 since the install");
    }

    /// The members of a cluster build their snapshots at different moments: the first after 10, 7
    /// and 4 of 10 requests for the three initial members (whatever the order they are given in),
    /// then every 10. Fails if every member starts its count at 0.
    #[tokio::test]
    async fn the_members_of_a_cluster_build_their_snapshots_at_different_counts() {
        let cluster: Vec<(String, Vec<String>)> =
            ["m3", "m1", "m2"].iter().map(|n| (n.to_string(), vec![format!("http://{n}:2380")])).collect();
        let starts: Vec<u64> =
            ["m1", "m2", "m3", "added-later"].iter().map(|n| staggered_start(10, n, &cluster)).collect();
        assert_eq!(starts, [0, 3, 6, 0]);

        let mut first_due_after = Vec::new();
        for &counted in &starts[..3] {
            let dir = tempfile::tempdir().unwrap();
            let sm = StateMachine::open(&dir.path().join("kv"), &dir.path().join("snap")).unwrap();
            let latest = Arc::new(LatestApplied::new(1, false, 0, 0));
            let mut observed = observe(&sm.state(), relay(), Arc::new(Lessor::default()), latest, 10, counted);
            let mut applied = 0;
            while !due_now(&mut observed.snapshot_due) {
                applied += 1;
                assert!(applied <= 10, "no snapshot due after 10 requests (start {counted})");
                sm.state().apply_requests(applied, vec![put(format!("k{applied}").as_bytes(), b"v", 0)]);
            }
            // The next one is a whole count later.
            for i in 1..10 {
                sm.state().apply_requests(applied + i, vec![put(format!("n{i}").as_bytes(), b"v", 0)]);
            }
            assert!(!due_now(&mut observed.snapshot_due), "9 requests after a snapshot (start {counted})");
            sm.state().apply_requests(applied + 10, vec![put(b"n10", b"v", 0)]);
            assert!(due_now(&mut observed.snapshot_due), "10 requests after a snapshot (start {counted})");
            first_due_after.push(applied);
        }
        assert_eq!(first_due_after, [10, 7, 4]);
    }

    /// An applied batch wakes one of the gRPC runtime's workers (the relay's doorbell), not two: the
    /// watch hub's commit runs on the relay's task. Fails if the hub is woken from the apply thread
    /// (a task scheduled from outside the runtime wakes a worker that wakes the other).
    #[test]
    fn an_applied_batch_wakes_one_worker_of_the_runtime() {
        const BATCHES: u64 = 200;
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let sm = StateMachine::open(&dir.path().join("kv"), &dir.path().join("snap")).unwrap();
        let observed = runtime.block_on(async {
            let latest = Arc::new(LatestApplied::new(1, false, 0, 0));
            observe(&sm.state(), relay(), Arc::new(Lessor::default()), latest, 1_000_000, 0)
        });
        let parks = || {
            let metrics = runtime.metrics();
            (0..metrics.num_workers()).map(|w| metrics.worker_park_count(w)).sum::<u64>()
        };
        std::thread::sleep(std::time::Duration::from_millis(50)); // every worker parked
        let before = parks();
        for index in 1..=BATCHES {
            // Applied from this thread, outside the runtime, as the raft thread applies.
            sm.state().apply_requests(index, vec![put(format!("k{index}").as_bytes(), b"v", 0)]);
            std::thread::sleep(std::time::Duration::from_micros(500));
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while *observed.watch_hub.revisions().borrow() < BATCHES as i64 + 1 {
            assert!(std::time::Instant::now() < deadline, "the hub did not commit every batch");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let parked = parks() - before;
        assert!(parked * 4 < BATCHES * 6, "the runtime's workers parked {parked} times for {BATCHES} batches");
    }
}
