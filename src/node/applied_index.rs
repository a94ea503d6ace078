//! The index of the last log entry this member has applied, and the requests waiting for an index to
//! be applied: a follower's forwarded write (answered once applied here too) and a linearizable read
//! (served once the read index is applied here).
//!
//! openraft's metrics could say the same, but a wait on them wakes at every change of any metric and
//! clones them all each time: with a hundred waiting requests that was a hundred wake-ups per applied
//! batch. Here the apply observer advances the index after each commit, and only the waiters at or
//! below it are woken, each once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;

pub(super) struct AppliedIndex {
    index: AtomicU64,
    /// Waiters by the index they wait for. A waiter that gave up stays until that index is applied.
    waiting: Mutex<BTreeMap<u64, Vec<oneshot::Sender<()>>>>,
}

/// Waiters whose index was applied. The apply observer wakes them from the gRPC runtime
/// (`raft/relay.rs`), not from the raft thread.
#[must_use]
pub(super) struct Reached(Vec<oneshot::Sender<()>>);

impl Reached {
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(super) fn wake(self) {
        for sender in self.0 {
            let _ = sender.send(()); // a waiter that gave up is gone
        }
    }
}

/// The index was not applied in time.
#[derive(Debug, PartialEq)]
pub(super) struct NotApplied;

impl AppliedIndex {
    /// As the state machine was opened: `index` applied.
    pub(super) fn new(index: u64) -> AppliedIndex {
        AppliedIndex { index: AtomicU64::new(index), waiting: Mutex::default() }
    }

    pub(super) fn get(&self) -> u64 {
        self.index.load(Ordering::Acquire)
    }

    /// Everything up to `index` is applied and committed (the apply observer, after each batch or
    /// installed snapshot): returns the waiters at or below it, to be woken (`Reached::wake`).
    pub(super) fn advance(&self, index: u64) -> Reached {
        self.index.fetch_max(index, Ordering::AcqRel);
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        let later = waiting.split_off(&(index + 1));
        let reached = std::mem::replace(&mut *waiting, later);
        Reached(reached.into_values().flatten().collect())
    }

    /// Waits until `index` is applied, for at most `within`.
    pub(super) async fn reached(&self, index: u64, within: Duration) -> Result<(), NotApplied> {
        if self.get() >= index {
            return Ok(());
        }
        let (sender, applied) = oneshot::channel();
        {
            let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
            // Checked again under the lock: `advance` stores the index before it takes the lock, so
            // either it is seen here or this waiter is in the map when `advance` drains it.
            if self.get() >= index {
                return Ok(());
            }
            waiting.entry(index).or_default().push(sender);
        }
        match tokio::time::timeout(within, applied).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(NotApplied),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn a_waiter_is_woken_when_its_index_is_applied_and_not_before() {
        let applied = Arc::new(AppliedIndex::new(5));
        assert_eq!(applied.reached(5, Duration::ZERO).await, Ok(()));
        let waiter = tokio::spawn({
            let applied = applied.clone();
            async move { applied.reached(8, Duration::from_secs(30)).await }
        });
        let later = tokio::spawn({
            let applied = applied.clone();
            async move { applied.reached(9, Duration::from_millis(200)).await }
        });
        tokio::task::yield_now().await;
        applied.advance(7).wake();
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "woken at 7 while waiting for 8");
        applied.advance(8).wake();
        assert_eq!(waiter.await.unwrap(), Ok(()));
        assert_eq!(later.await.unwrap(), Err(NotApplied), "9 was never applied");
        assert_eq!(applied.get(), 8);
    }

    #[tokio::test]
    async fn an_index_never_goes_back() {
        let applied = AppliedIndex::new(10);
        applied.advance(4).wake();
        assert_eq!(applied.get(), 10);
        assert_eq!(applied.reached(10, Duration::ZERO).await, Ok(()));
    }
}
