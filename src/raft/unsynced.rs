//! The kv environment commits without syncing (`storage::Durability::Deferred`): an applied batch is
//! in the page cache when its commit returns, which a process crash (`kill -9`) never loses, but which
//! an operating-system crash or a power loss can — and LMDB without syncs may then be torn, not just
//! behind. Everything applied is still derivable: the current snapshot (a synced file) plus the raft
//! log after it (synced before any entry is acknowledged), which is never purged past the snapshot.
//!
//! So the one question at start-up is whether the kernel that held the environment's unsynced pages
//! is still the one running. `<member>/kv.unsynced` holds the boot id of the run that may have left
//! unsynced pages; it is written (and synced) before the kv environment is opened, and removed after
//! a clean shutdown has synced the environment. Found at start with another boot id (or unreadable),
//! the environment is thrown away and rebuilt from the snapshot and the log, as etcd replays its WAL
//! onto its backend.
//!
//! While a member runs, `storage/paced_writeback.rs` writes the environment's dirty pages back in
//! small slices (`sync_file_range`) so that the kernel never writes a burst of them ahead of the raft
//! log's `fdatasync`. That is a schedule, not durability: nothing is synced or flushed, so a page may
//! still be lost or torn at a power loss, and every rule above stands unchanged.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The marker's name in the member directory.
pub(crate) const MARKER: &str = "kv.unsynced";

/// Where Linux tells the id of the running boot.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// What start-up found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Previous {
    /// No marker: the last run synced the environment and stopped cleanly (or there was none).
    Clean,
    /// The last run ended without syncing, under the running kernel: its pages are in the page cache.
    SameBoot,
    /// The last run ended without syncing under another kernel (or the boot id cannot be compared):
    /// the environment may be torn.
    OtherBoot,
}

/// The running kernel's boot id; `None` where the system does not tell (then every unclean stop
/// counts as another boot: the safe answer).
pub(crate) fn boot_id() -> Option<String> {
    fs::read_to_string(BOOT_ID).ok().map(|id| id.trim().to_string()).filter(|id| !id.is_empty())
}

fn marker(member_dir: &Path) -> PathBuf {
    member_dir.join(MARKER)
}

/// Reads the marker left by the previous run.
pub(crate) fn previous(member_dir: &Path, running_boot: Option<&str>) -> io::Result<Previous> {
    match fs::read_to_string(marker(member_dir)) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Previous::Clean),
        Err(e) => Err(e),
        Ok(recorded) => Ok(match running_boot {
            Some(running) if recorded.trim() == running => Previous::SameBoot,
            _ => Previous::OtherBoot,
        }),
    }
}

/// Records that this boot may leave unsynced pages: synced, and the directory entry too, before the
/// environment takes its first unsynced commit.
pub(crate) fn mark(member_dir: &Path, running_boot: Option<&str>) -> io::Result<()> {
    let path = marker(member_dir);
    let temp = member_dir.join(format!("{MARKER}.tmp"));
    let mut file = crate::storage::data_dir::create_private_file(&temp)?;
    file.write_all(running_boot.unwrap_or("unknown").as_bytes())?;
    file.sync_all()?;
    fs::rename(&temp, &path)?;
    File::open(member_dir)?.sync_all()
}

/// After the environment was synced at a clean shutdown: nothing unsynced is left.
pub(crate) fn clear(member_dir: &Path) -> io::Result<()> {
    match fs::remove_file(marker(member_dir)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    File::open(member_dir)?.sync_all()
}

/// Throws away a kv environment that may be torn: renamed aside first (one atomic step, synced), then
/// deleted, so a crash midway leaves either the old directory aside or nothing.
pub(crate) fn discard(kv_dir: &Path) -> io::Result<()> {
    if !kv_dir.exists() {
        return Ok(());
    }
    let aside = kv_dir.with_extension("torn");
    if aside.exists() {
        fs::remove_dir_all(&aside)?;
    }
    fs::rename(kv_dir, &aside)?;
    if let Some(parent) = kv_dir.parent() {
        File::open(parent)?.sync_all()?;
    }
    fs::remove_dir_all(&aside)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_tells_which_boot_left_unsynced_pages() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(previous(dir.path(), Some("boot-a")).unwrap(), Previous::Clean);
        mark(dir.path(), Some("boot-a")).unwrap();
        assert_eq!(previous(dir.path(), Some("boot-a")).unwrap(), Previous::SameBoot);
        assert_eq!(previous(dir.path(), Some("boot-b")).unwrap(), Previous::OtherBoot);
        assert_eq!(previous(dir.path(), None).unwrap(), Previous::OtherBoot, "unknown boot: assume the worst");
        clear(dir.path()).unwrap();
        assert_eq!(previous(dir.path(), Some("boot-b")).unwrap(), Previous::Clean);
        clear(dir.path()).unwrap(); // twice is fine
    }

    #[test]
    fn discarding_removes_the_environment_and_any_earlier_leftover() {
        let dir = tempfile::tempdir().unwrap();
        let kv = dir.path().join("kv");
        fs::create_dir(&kv).unwrap();
        fs::write(kv.join("data.mdb"), b"torn").unwrap();
        fs::create_dir(dir.path().join("kv.torn")).unwrap();
        discard(&kv).unwrap();
        assert!(!kv.exists() && !dir.path().join("kv.torn").exists());
        discard(&kv).unwrap(); // nothing to do
    }

    #[test]
    fn this_machine_has_a_boot_id() {
        if cfg!(target_os = "linux") {
            assert!(boot_id().is_some_and(|id| id.len() >= 32));
        }
    }
}
