//! The removal of what compaction made unreachable, in the background (etcd's `kvstore_compaction.go`:
//! 1,000 keys per batch, a 10 ms pause between batches; here each step's size and pause adapt to what
//! the last one cost, `compaction_pacing.rs`, so none holds the write path for more than a few
//! milliseconds even on a loaded machine): while removal is pending
//! (`mvcc/compaction.rs`), one bounded step at a time, each its own short write transaction between
//! applies (`raft/state_machine/compaction.rs`). It starts with the member, so a removal a restart
//! interrupted resumes, and wakes when an applied batch schedules a compaction or a snapshot install
//! replaces the applied state (which may carry a pending removal). Once removal is done it publishes
//! the compacted revision, for `Compact` requests with `physical` set, which wait for it
//! (`Node::removed_through`).

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::compaction_pacing::Pacing;
use crate::metrics;
use crate::mvcc::compaction::Step;
use crate::node::Node;
use crate::raft::state_machine::compaction::StepFailure;

/// How often an idle worker looks for pending removal it was not told about (a defragment's swap).
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// Waits while writers hold the gate, and while storage is full: doubling up to these.
const BUSY_RETRY_MAX: Duration = Duration::from_millis(50);
const FULL_RETRY_MAX: Duration = Duration::from_secs(10);

/// What one round of the worker found.
enum Round {
    /// Nothing pending: removal is done up to this compacted revision.
    Idle(i64),
    Stepped(Step, Duration),
    Failed(StepFailure),
}

/// Runs for the life of the member.
pub(super) async fn remove_compacted(node: Weak<Node>, due: Arc<Notify>) {
    let mut started: Option<Instant> = None;
    let mut busy_wait = Duration::from_millis(1);
    let mut full_wait = Duration::from_millis(100);
    let mut pacing = Pacing::default();
    loop {
        let Some(kv) = node.upgrade().map(|n| n.kv.clone()) else { return };
        let limit = pacing.limit();
        let round = tokio::task::spawn_blocking(move || match kv.removal() {
            Err(e) => Round::Failed(StepFailure::Storage(e)),
            Ok((compacted, false)) => Round::Idle(compacted),
            Ok((_, true)) => {
                let stepping = std::time::Instant::now();
                match kv.try_compaction_step(limit) {
                    Ok(step) => Round::Stepped(step, stepping.elapsed()),
                    Err(failure) => Round::Failed(failure),
                }
            }
        })
        .await;
        let Ok(round) = round else { return };
        match round {
            Round::Idle(compacted) => {
                if let Some(since) = started.take() {
                    metrics::COMPACTION_TOTAL_MS.observe(since.elapsed().as_secs_f64() * 1e3);
                    tracing::info!(compacted, took = ?since.elapsed(), "compacted versions removed");
                }
                if let Some(node) = node.upgrade() {
                    node.compaction_removed.send_if_modified(|done| std::mem::replace(done, compacted) != compacted);
                }
                let _ = tokio::time::timeout(IDLE_CHECK, due.notified()).await;
            }
            Round::Stepped(step, took) => {
                (busy_wait, full_wait) = (Duration::from_millis(1), Duration::from_millis(100));
                started.get_or_insert_with(Instant::now);
                metrics::COMPACTION_PAUSE_MS.observe(took.as_secs_f64() * 1e3);
                metrics::COMPACTION_KEYS.inc_by(step.removed as u64);
                let pause = pacing.after_step(took);
                if step.pending.is_some() {
                    tokio::time::sleep(pause).await;
                }
            }
            Round::Failed(StepFailure::Busy) => {
                tokio::time::sleep(busy_wait).await;
                busy_wait = (busy_wait * 2).min(BUSY_RETRY_MAX);
            }
            Round::Failed(StepFailure::Full(kind)) => {
                tracing::warn!(?kind, retry_in = ?full_wait, "storage full: removal of compacted versions waits");
                tokio::time::sleep(full_wait).await;
                full_wait = (full_wait * 2).min(FULL_RETRY_MAX);
            }
            Round::Failed(StepFailure::Storage(e)) => {
                tracing::error!(error = %e, retry_in = ?full_wait, "removal of compacted versions failed");
                tokio::time::sleep(full_wait).await;
                full_wait = (full_wait * 2).min(FULL_RETRY_MAX);
            }
        }
    }
}
