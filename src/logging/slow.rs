//! Debug lines for the write path's slow moments: a WAL sync, an applied batch, a wait for the write
//! gate or a background compaction step that took longer than `THRESHOLD`, each with what it was
//! doing, so that a client's stall can be matched with its cause by the lines' timestamps. Off unless
//! the `keyward::slow` target is enabled (`KEYWARD_LOG=info,keyward::slow=debug`).

use std::time::Duration;

/// The log target of these lines.
pub(crate) const TARGET: &str = "keyward::slow";

/// Shorter than this is not worth a line: well under the 100 ms a client notices.
pub(crate) const THRESHOLD: Duration = Duration::from_millis(10);

/// Whether `took` is worth a line (and the target is enabled: nothing else is computed otherwise).
pub(crate) fn worth_logging(took: Duration) -> bool {
    took >= THRESHOLD && tracing::enabled!(target: TARGET, tracing::Level::DEBUG)
}

/// Milliseconds, for the lines' fields.
pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
