//! Full storage: a batch that finds the disk or LMDB's map full is aborted and applied again,
//! unchanged, until it fits (`space/mod.rs`), so what an entry does never depends on one member's disk.
//! A full map first grows (`storage::mapping`); a full disk first gives the ballast back
//! (`Space::report_full`, which also tells the node); otherwise apply waits, retrying with backoff,
//! and the member reports unhealthy meanwhile.

use std::time::Duration;

use super::state::{BoxError, State};
use crate::raft::{BatchResults, Entry};
use crate::space::Full;

/// Longest wait between attempts to apply a batch while storage is full.
const FULL_RETRY_MAX: Duration = Duration::from_secs(10);

/// Why a batch could not be applied.
#[derive(Debug)]
pub(super) enum ApplyFailure {
    /// Storage is full: nothing of the batch was kept; apply it again once there is room.
    Full(Full),
    /// Storage failed: the raft core must stop.
    Storage(BoxError),
}

impl ApplyFailure {
    /// For callers outside apply, which do not retry: full storage is an error like any other.
    pub(super) fn into_error(self) -> BoxError {
        match self {
            ApplyFailure::Full(Full::Disk) => "no space left on the disk of the kv database".into(),
            ApplyFailure::Full(Full::Map) => "the map of the kv database is full".into(),
            ApplyFailure::Storage(e) => e,
        }
    }
}

impl<E: Into<BoxError>> From<E> for ApplyFailure {
    fn from(err: E) -> ApplyFailure {
        ApplyFailure::Storage(err.into())
    }
}

impl State {
    /// A heed error from a write or a commit, told apart: full storage is retried, anything else
    /// stops the raft core.
    pub(super) fn write_failure(&self, err: heed::Error) -> ApplyFailure {
        match crate::space::full_kind_at(&err, self.env.path()) {
            Some(kind) => ApplyFailure::Full(kind),
            None => ApplyFailure::Storage(err.into()),
        }
    }

    /// Applies `entries` once; on `Full` nothing changed.
    pub(super) fn apply_once(&self, entries: &[Entry]) -> Result<Vec<BatchResults>, ApplyFailure> {
        self.make_room_for(entries);
        let results = self.apply_batch(entries)?;
        if self.space.stalled() {
            self.space.set_stalled(false);
            tracing::warn!("storage has room again: applying resumed");
        }
        Ok(results)
    }

    /// Applies `entries`; while storage is full, applies them again (unchanged) until they fit.
    #[cfg(test)]
    pub(super) fn apply_until_applied(&self, entries: &[Entry]) -> Result<Vec<BatchResults>, BoxError> {
        self.apply_after_map_full(entries, 0)
    }

    /// `apply_until_applied` for a batch that already met a full map `map_full` times (on the raft
    /// thread): the map grows before it runs again. Each growth for one batch is twice the one before,
    /// so a batch far larger than the usual step (a delete of a million keys) runs a few times, not
    /// once per step.
    pub(super) fn apply_after_map_full(
        &self,
        entries: &[Entry],
        mut map_full: u32,
    ) -> Result<Vec<BatchResults>, BoxError> {
        let mut wait = Duration::from_millis(100);
        if map_full > 0 {
            // A failed growth is met, and reported, by the attempt below.
            let _ = self.grow_map(self.map_wanted(map_full));
        }
        loop {
            match self.apply_once(entries) {
                Ok(results) => return Ok(results),
                Err(ApplyFailure::Storage(e)) => return Err(e),
                Err(ApplyFailure::Full(mut kind)) => {
                    if kind == Full::Map {
                        map_full += 1;
                        match self.grow_map(self.map_wanted(map_full)) {
                            Ok(true) => continue, // a larger map: apply the batch again
                            Ok(false) => {}       // at its ceiling
                            Err(ApplyFailure::Full(disk)) => kind = disk,
                            Err(ApplyFailure::Storage(e)) => return Err(e),
                        }
                    }
                    if self.space.report_full(kind, self.env.path()) {
                        continue; // the ballast is gone: there is room for this batch now
                    }
                    self.space.set_stalled(true);
                    match kind {
                        Full::Disk => tracing::error!(
                            retry_in = ?wait,
                            "disk full: cannot apply committed entries; free disk space (the member \
                             keeps retrying and reports unhealthy meanwhile)"
                        ),
                        Full::Map => tracing::error!(
                            retry_in = ?wait,
                            "the LMDB map of the kv database is full: cannot apply committed entries; \
                             restart the member to reserve a larger map"
                        ),
                    }
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(FULL_RETRY_MAX);
                }
            }
        }
    }

    /// The reservation to ask for after a batch met a full map `times` times: the usual step
    /// (`storage::mapping::MAP_FULL_GROW_BY`, a sixth of the reservation) the first time, doubled at
    /// each time after.
    fn map_wanted(&self, times: u32) -> u64 {
        if times <= 1 {
            return 0; // `grow_map`'s usual step
        }
        let reserved = self.mapping.reserved().unwrap_or(0);
        let step = reserved / crate::storage::mapping::MAP_FULL_GROW_BY;
        reserved.saturating_add(step.saturating_mul(1 << (times - 1).min(16)))
    }

    /// Grows the map of a mapped environment after `MDB_MAP_FULL` (`storage::mapping`), to at least
    /// `at_least` bytes: false when it cannot grow (copied writes, or at its ceiling); a full disk is
    /// `Full::Disk`. Call with no write transaction open.
    pub(super) fn grow_map(&self, at_least: u64) -> Result<bool, ApplyFailure> {
        match self.mapping.grow(&self.env, at_least) {
            Ok(Some(grown)) => {
                tracing::info!(from = grown.from, to = grown.to, "kv file reservation grown");
                Ok(true)
            }
            Ok(None) => Ok(false),
            Err(e) => Err(self.write_failure(e)),
        }
    }
}
