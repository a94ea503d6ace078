//! How big the background removal's next step is, and how long it pauses after one: etcd's 1,000
//! versions and 10 ms at most and at least, adapted to what the last step cost. A step holds the
//! write path (the applier's write gate) for all of its time, so a step slower than `TARGET` (a
//! loaded machine, cold pages, keys with many versions) makes the next one proportionally smaller,
//! and a fast one lets it grow back; and the pause after a step is never shorter than the step
//! itself, so removal never takes more than half of the write path's time, however slow it runs.

use std::time::Duration;

use crate::mvcc::compaction::STEP_LIMIT;

/// The longest a step should hold the write path: what an apply may have to wait for it.
pub(super) const TARGET: Duration = Duration::from_millis(5);

/// The smallest step: removal always moves on, however slow each version is to remove.
pub(super) const MIN_LIMIT: usize = 16;

/// etcd's pause between compaction batches: the least that applies get between two steps.
pub(super) const PAUSE: Duration = Duration::from_millis(10);

/// The pacing of one compaction's removal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Pacing {
    /// The most changes the next step examines (and versions it removes).
    limit: usize,
}

impl Default for Pacing {
    fn default() -> Self {
        Pacing { limit: STEP_LIMIT }
    }
}

impl Pacing {
    /// The next step's bound.
    pub(super) fn limit(&self) -> usize {
        self.limit
    }

    /// After a step of the current bound that took `took`: adapts the bound, and returns the pause
    /// before the next step.
    pub(super) fn after_step(&mut self, took: Duration) -> Duration {
        let (took_us, target_us) = (took.as_micros().max(1), TARGET.as_micros());
        if took > TARGET {
            // Scaled to what fits in the target at this step's cost per change.
            let scaled = (self.limit as u128 * target_us / took_us) as usize;
            self.limit = scaled.clamp(MIN_LIMIT, STEP_LIMIT);
        } else if took < TARGET / 2 {
            self.limit = (self.limit + self.limit / 2).clamp(MIN_LIMIT, STEP_LIMIT);
        }
        PAUSE.max(took)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn starts_at_etcds_batch_and_never_exceeds_it() {
        let mut pacing = Pacing::default();
        assert_eq!(pacing.limit(), STEP_LIMIT);
        for _ in 0..10 {
            pacing.after_step(Duration::from_micros(100));
        }
        assert_eq!(pacing.limit(), STEP_LIMIT);
    }

    #[test]
    fn a_slow_step_makes_the_next_one_fit_the_target() {
        let mut pacing = Pacing::default();
        // 1,000 changes in 20 ms: 250 fit in 5 ms.
        pacing.after_step(ms(20));
        assert_eq!(pacing.limit(), 250);
        // However slow, removal moves on.
        pacing.after_step(Duration::from_secs(10));
        assert_eq!(pacing.limit(), MIN_LIMIT);
    }

    #[test]
    fn fast_steps_grow_back() {
        let mut pacing = Pacing::default();
        pacing.after_step(ms(100));
        assert_eq!(pacing.limit(), 50);
        pacing.after_step(ms(1));
        assert_eq!(pacing.limit(), 75);
        // Within the target but not under half of it: unchanged.
        pacing.after_step(ms(4));
        assert_eq!(pacing.limit(), 75);
        for _ in 0..20 {
            pacing.after_step(ms(1));
        }
        assert_eq!(pacing.limit(), STEP_LIMIT);
    }

    #[test]
    fn removal_never_takes_more_than_half_of_the_write_path() {
        let mut pacing = Pacing::default();
        assert_eq!(pacing.after_step(ms(1)), PAUSE);
        assert_eq!(pacing.after_step(ms(30)), ms(30));
    }
}
