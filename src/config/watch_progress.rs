//! `--watch-progress-notify-interval` (etcd 3.5's name) and `--experimental-watch-progress-notify-interval`
//! (etcd 3.4's): how often a watcher created with `progress_notify` gets a progress notification when
//! idle. As etcd reads it: 0 (or not given) keeps the default of 10 minutes, less than 100 ms is
//! raised to 100 ms.

use std::time::Duration;

use super::duration::parse_go_duration;

/// etcd's default (`progressReportInterval`).
pub(crate) const DEFAULT_INTERVAL: Duration = Duration::from_secs(600);
/// etcd's floor (`minWatchProgressInterval`).
const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// The interval from the two flags; an error when both are given or one does not parse.
pub(crate) fn interval(current: Option<&str>, experimental: Option<&str>) -> Result<Duration, String> {
    let (flag, value) = match (current, experimental) {
        (Some(_), Some(_)) => {
            return Err("--watch-progress-notify-interval and --experimental-watch-progress-notify-interval \
                        are the same setting: give one"
                .to_string())
        }
        (Some(value), None) => ("--watch-progress-notify-interval", value),
        (None, Some(value)) => ("--experimental-watch-progress-notify-interval", value),
        (None, None) => return Ok(DEFAULT_INTERVAL),
    };
    let interval = parse_go_duration(value).map_err(|e| format!("{flag}: {e}"))?;
    Ok(match interval {
        Duration::ZERO => DEFAULT_INTERVAL,
        short if short < MIN_INTERVAL => MIN_INTERVAL,
        interval => interval,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn either_name_sets_it_as_etcd_reads_it() {
        assert_eq!(interval(None, None), Ok(DEFAULT_INTERVAL));
        assert_eq!(interval(Some("5s"), None), Ok(Duration::from_secs(5)));
        assert_eq!(interval(None, Some("1m30s")), Ok(Duration::from_secs(90)));
        assert_eq!(interval(Some("0"), None), Ok(DEFAULT_INTERVAL));
        assert_eq!(interval(None, Some("10ms")), Ok(MIN_INTERVAL));
        assert!(interval(Some("5s"), Some("5s")).unwrap_err().contains("give one"));
        assert!(interval(Some("soon"), None).unwrap_err().starts_with("--watch-progress-notify-interval: "));
    }
}
