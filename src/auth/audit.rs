//! The audit log (`--audit-log PATH`; no etcd has one): one JSON line per auth decision, written by
//! the member that took it.
//!
//! Decisions are taken where the permission checks run (`auth/check.rs`): in the apply phase, where
//! the line carries the raft index of the entry (so every member writes the same decisions, in log
//! order), and on the read path; plus every login (`server/auth.rs`). A line holds the time, the
//! member, the client's address and how it identified itself (token, certificate, forwarded
//! certificate, password, none) when the proposing member records them, the user, the operation, the
//! key range, allowed or denied and why, the auth revision and the raft index.
//!
//! The file is rotated by size: past `--audit-log-max-size` it becomes `PATH.1` (`PATH.1` becomes
//! `PATH.2`, ... up to `--audit-log-max-backups`, the oldest dropped) and a new `PATH` is started. A
//! write that fails is counted (`keyward_audit_write_failures_total`) and logged, never fatal. Every
//! file is created 0600 whatever the umask, and an existing one with a wider mode is narrowed.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::Serialize;

/// `--audit-log*`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditConfig {
    pub path: PathBuf,
    pub max_size: u64,
    pub max_backups: u32,
}

/// One auth decision.
#[derive(Debug, Serialize)]
pub(crate) struct Decision<'a> {
    pub time: String,
    pub member: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client: Option<&'a str>,
    pub source: &'a str,
    pub user: &'a str,
    pub op: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub range_end: Option<String>,
    pub allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub auth_revision: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raft_index: Option<u64>,
}

pub(crate) struct AuditLog {
    config: AuditConfig,
    member: String,
    file: Mutex<Open>,
}

struct Open {
    file: File,
    size: u64,
}

impl AuditLog {
    /// Opens (appends to) the log; `member` names this member in every line.
    pub(crate) fn open(config: AuditConfig, member: String) -> Result<AuditLog, String> {
        let file = open_append(&config.path)?;
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        Ok(AuditLog { config, member, file: Mutex::new(Open { file, size }) })
    }

    pub(crate) fn member(&self) -> &str {
        &self.member
    }

    /// Writes one decision as a JSON line (rotating first if the file is full).
    pub(crate) fn record(&self, decision: &Decision<'_>) {
        let mut line = match serde_json::to_vec(decision) {
            Ok(line) => line,
            Err(e) => return failed(&format!("encode: {e}")),
        };
        line.push(b'\n');
        let mut open = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if open.size > 0 && open.size + line.len() as u64 > self.config.max_size {
            match self.rotate() {
                Ok(file) => *open = Open { file, size: 0 },
                Err(e) => failed(&e),
            }
        }
        match open.file.write_all(&line) {
            Ok(()) => open.size += line.len() as u64,
            Err(e) => failed(&format!("write {}: {e}", self.config.path.display())),
        }
    }

    /// Shifts `PATH.i` to `PATH.i+1` (dropping the last), `PATH` to `PATH.1`, and opens a new `PATH`.
    fn rotate(&self) -> Result<File, String> {
        let path = &self.config.path;
        let numbered = |i: u32| PathBuf::from(format!("{}.{i}", path.display()));
        if self.config.max_backups == 0 {
            let _ = std::fs::remove_file(path);
        } else {
            let _ = std::fs::remove_file(numbered(self.config.max_backups));
            for i in (1..self.config.max_backups).rev() {
                let _ = std::fs::rename(numbered(i), numbered(i + 1));
            }
            std::fs::rename(path, numbered(1)).map_err(|e| format!("rotate {}: {e}", path.display()))?;
        }
        open_append(path)
    }
}

/// Owner-only whatever the umask (`logging/private_file.rs`): the log names keys, users and clients.
fn open_append(path: &Path) -> Result<File, String> {
    crate::logging::private_file::open_append(path).map_err(|e| format!("--audit-log {}: {e}", path.display()))
}

fn failed(why: &str) {
    crate::metrics::AUDIT_WRITE_FAILURES.inc();
    tracing::error!(error = %why, "audit log write failed");
}

/// Now, as RFC 3339 UTC with microseconds.
pub(crate) fn now() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let (secs, micros) = (now.as_secs() as i64, now.subsec_micros());
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{micros:06}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(op: &str) -> Decision<'_> {
        Decision {
            time: now(),
            member: "m1",
            client: Some("127.0.0.1:5000"),
            source: "token",
            user: "alice",
            op,
            key: Some("k".into()),
            range_end: None,
            allowed: false,
            reason: Some("etcdserver: permission denied".into()),
            auth_revision: 7,
            raft_index: Some(42),
        }
    }

    #[test]
    fn lines_are_json_and_the_file_rotates_by_size_keeping_the_backups() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let config = AuditConfig { path: path.clone(), max_size: 1000, max_backups: 2 };
        let log = AuditLog::open(config, "m1".into()).unwrap();
        for i in 0..40 {
            log.record(&decision(&format!("put{i}")));
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        assert_eq!(last["op"], "put39");
        assert_eq!(last["raft_index"], 42);
        assert!(std::fs::metadata(&path).unwrap().len() <= 1000);
        assert!(dir.path().join("audit.log.1").exists() && dir.path().join("audit.log.2").exists());
        assert!(!dir.path().join("audit.log.3").exists(), "at most --audit-log-max-backups");
    }

    #[test]
    fn dates_are_proleptic_gregorian() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_781), (2026, 11, 24));
    }
}
