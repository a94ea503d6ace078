//! One step of the background removal of compacted versions (`mvcc/compaction.rs`), in its own short
//! write transaction between applies: through the write gate apply uses (`KvEnv::try_write`), so a
//! Defragment's swap never meets a step half-way and a step never makes an apply wait on more than
//! one step. A step is committed whole or not at all: one that finds storage full is aborted (a full
//! map grows first, as apply's does, `full_retry.rs`) and its caller retries later. The job that runs
//! the steps is the node's (`node/jobs/compaction.rs`).

use std::time::Instant;

use super::kv_env::KvEnv;
use super::state::{BoxError, State};
use crate::error::EtcdError;
use crate::logging::slow;
use crate::mvcc::compaction::Step;
use crate::space::Full;

/// Why a removal step did nothing.
#[derive(Debug)]
pub(crate) enum StepFailure {
    /// Apply (or a defragment) holds the write gate: try again shortly.
    Busy,
    /// Storage is full: nothing of the step was kept; try again after a while.
    Full(Full),
    /// Storage failed.
    Storage(BoxError),
}

impl KvEnv {
    /// The compacted revision on the current environment, and whether its removal is still pending.
    pub(crate) fn removal(&self) -> Result<(i64, bool), BoxError> {
        let state = self.current();
        let txn = state.read_txn()?;
        let compacted = state.kv.view(&txn)?.compact_rev;
        Ok((compacted, state.kv.removal_pending(&txn)?.is_some()))
    }

    /// One removal step of at most `limit` versions, unless a writer holds the gate.
    pub(crate) fn try_compaction_step(&self, limit: usize) -> Result<Step, StepFailure> {
        self.try_write(|state| state.compaction_step(limit)).unwrap_or(Err(StepFailure::Busy))
    }
}

impl State {
    /// One removal step in its own write transaction, committed with the size in use it leaves.
    pub(crate) fn compaction_step(&self, limit: usize) -> Result<Step, StepFailure> {
        #[cfg(test)]
        {
            use std::sync::atomic::Ordering::SeqCst;
            if self.inject_full.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_ok() {
                return Err(StepFailure::Full(Full::Disk));
            }
        }
        let failed = |e: heed::Error| match crate::space::full_kind_at(&e, self.env.path()) {
            Some(kind) => StepFailure::Full(kind),
            None => StepFailure::Storage(e.into()),
        };
        let started = Instant::now();
        let mut txn = self.env.write_txn().map_err(failed)?;
        let step = match self.kv.compaction_step(&mut txn, limit) {
            Ok(step) => step,
            Err(EtcdError::StorageFull { map }) => {
                txn.abort();
                return Err(self.after_full(if map { Full::Map } else { Full::Disk }));
            }
            Err(e) => return Err(StepFailure::Storage(format!("removing compacted versions: {e}").into())),
        };
        if step.examined == 0 && step.pending.is_none() {
            // Nothing was pending: no commit.
            return Ok(step);
        }
        self.refresh_size_in_use(&txn).map_err(failed)?;
        let committing = Instant::now();
        match txn.commit() {
            Ok(()) => {
                let done = Instant::now();
                if slow::worth_logging(done - started) {
                    tracing::debug!(
                        target: slow::TARGET,
                        examined = step.examined,
                        removed = step.removed,
                        work_ms = slow::ms(committing - started),
                        commit_ms = slow::ms(done - committing),
                        "slow compaction step"
                    );
                }
                Ok(step)
            }
            Err(e) => match failed(e) {
                StepFailure::Full(kind) => Err(self.after_full(kind)),
                other => Err(other),
            },
        }
    }

    /// A full map grows (with no write transaction open) so the next attempt may fit.
    fn after_full(&self, kind: Full) -> StepFailure {
        if kind == Full::Map {
            if let Err(super::full_retry::ApplyFailure::Storage(e)) = self.grow_map(0) {
                return StepFailure::Storage(e);
            }
        }
        StepFailure::Full(kind)
    }
}
