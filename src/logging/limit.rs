//! Rate limits for log lines that clients can cause (denied requests, refused TLS handshakes): any
//! client could otherwise flood the log. Per key (a user, a refusal reason), at most `max` lines per
//! window; the rest are counted, and the next line logged says how many were suppressed.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Keys tracked at most; beyond, the table starts afresh (a key may then log again early).
const MAX_KEYS: usize = 10_000;

pub(crate) struct LogLimit {
    max: u32,
    window: Duration,
    keys: Mutex<BTreeMap<String, Window>>,
}

struct Window {
    start: Instant,
    logged: u32,
    suppressed: u64,
}

impl LogLimit {
    pub(crate) const fn new(max: u32, window: Duration) -> LogLimit {
        LogLimit { max, window, keys: Mutex::new(BTreeMap::new()) }
    }

    /// `Some(n)`: log this line, and mention the `n` suppressed since the last one logged for `key`.
    /// `None`: suppress it.
    pub(crate) fn admit(&self, key: &str) -> Option<u64> {
        let now = Instant::now();
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        if keys.len() >= MAX_KEYS && !keys.contains_key(key) {
            keys.clear();
        }
        let window = keys.entry(key.to_string()).or_insert(Window { start: now, logged: 0, suppressed: 0 });
        if now.duration_since(window.start) >= self.window {
            window.start = now;
            window.logged = 0;
        }
        if window.logged < self.max {
            window.logged += 1;
            Some(std::mem::take(&mut window.suppressed))
        } else {
            window.suppressed += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beyond_the_limit_lines_are_counted_and_reported_with_the_next_window() {
        let limit = LogLimit::new(3, Duration::from_millis(50));
        let first: Vec<Option<u64>> = (0..10).map(|_| limit.admit("mallory")).collect();
        assert_eq!(first, [Some(0), Some(0), Some(0), None, None, None, None, None, None, None]);
        assert_eq!(limit.admit("alice"), Some(0), "per key");
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(limit.admit("mallory"), Some(7), "the next window reports what was suppressed");
        assert_eq!(limit.admit("mallory"), Some(0));
    }
}
