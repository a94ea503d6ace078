//! `--auto-compaction-mode` and `--auto-compaction-retention` as etcd reads them; `node/jobs/compactor.rs` runs
//! the policy.

use std::time::Duration;

/// What `--auto-compaction-*` asked for (`None` in `Config` when the retention is 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AutoCompaction {
    /// Keep this much history.
    Periodic(Duration),
    /// Keep this many revisions.
    Revision(i64),
}

/// etcd's revision compactor runs every 5 minutes.
pub(crate) const REVISION_INTERVAL: Duration = Duration::from_secs(5 * 60);

impl AutoCompaction {
    /// From etcd's flags; `Ok(None)` when the retention is 0 (off).
    pub fn from_flags(mode: &str, retention: &str) -> Result<Option<AutoCompaction>, String> {
        match mode {
            "periodic" => {
                // etcd: a bare number is hours.
                let period = match retention.parse::<u64>() {
                    Ok(hours) => Duration::from_secs(hours.saturating_mul(3600)),
                    Err(_) => super::duration::parse_go_duration(retention)
                        .map_err(|e| format!("--auto-compaction-retention {retention:?}: {e}"))?,
                };
                Ok((!period.is_zero()).then_some(AutoCompaction::Periodic(period)))
            }
            "revision" => {
                let revisions = retention.parse::<i64>().ok().filter(|r| *r >= 0).ok_or_else(|| {
                    format!("--auto-compaction-retention {retention:?}: revision mode wants a number of revisions")
                })?;
                Ok((revisions > 0).then_some(AutoCompaction::Revision(revisions)))
            }
            other => Err(format!("--auto-compaction-mode {other:?}: want \"periodic\" or \"revision\"")),
        }
    }

    /// How often the compactor looks at the revision.
    pub fn interval(self) -> Duration {
        match self {
            AutoCompaction::Periodic(period) => period.min(Duration::from_secs(3600)) / 10,
            AutoCompaction::Revision(_) => REVISION_INTERVAL,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_as_etcd_reads_them() {
        let parse = AutoCompaction::from_flags;
        assert_eq!(parse("periodic", "0"), Ok(None));
        assert_eq!(parse("periodic", "1"), Ok(Some(AutoCompaction::Periodic(Duration::from_secs(3600)))));
        assert_eq!(parse("periodic", "30m"), Ok(Some(AutoCompaction::Periodic(Duration::from_secs(1800)))));
        assert_eq!(parse("revision", "1000"), Ok(Some(AutoCompaction::Revision(1000))));
        assert_eq!(parse("revision", "0"), Ok(None));
        assert!(parse("revision", "1h").unwrap_err().contains("number of revisions"));
        assert!(parse("periodic", "soon").is_err());
        assert!(parse("hourly", "1").unwrap_err().contains("want \"periodic\" or \"revision\""));
    }

    #[test]
    fn intervals_follow_etcd() {
        assert_eq!(AutoCompaction::Periodic(Duration::from_secs(3600 * 5)).interval(), Duration::from_secs(360));
        assert_eq!(AutoCompaction::Periodic(Duration::from_secs(60)).interval(), Duration::from_secs(6));
        assert_eq!(AutoCompaction::Revision(5).interval(), REVISION_INTERVAL);
    }
}
