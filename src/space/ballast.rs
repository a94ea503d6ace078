//! The disk-full ballast: a file of reserved blocks in the data dir, given back the moment a write
//! finds the disk full (CockroachDB's emergency ballast).
//!
//! A full disk must not turn into a different apply result on one member: the batch that hit ENOSPC
//! is retried unchanged. Deleting the ballast makes room for that retry (and for the raft log entry
//! that raises the NOSPACE alarm), so the member gets past the moment the disk fills without dropping
//! or changing anything. The ballast is put back once the alarm is disarmed and the disk has room
//! for it again.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::storage::data_dir;

/// Default size: a few thousand typical batches, and small next to any real disk.
pub(crate) const DEFAULT_BALLAST_BYTES: u64 = 64 << 20;

pub(crate) struct Ballast {
    path: PathBuf,
    size: u64,
    /// Serialises create and release (apply thread, log writes, the recreate task).
    lock: Mutex<()>,
}

impl Ballast {
    /// A ballast of `size` bytes at `path` (0 = none). Nothing is created yet: see `ensure`.
    pub(crate) fn new(path: PathBuf, size: u64) -> Ballast {
        Ballast { path, size, lock: Mutex::new(()) }
    }

    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    pub(crate) fn present(&self) -> bool {
        self.size > 0 && self.path.exists()
    }

    /// Whether a ballast is wanted (a non-zero size) and not in place: given back, or never created.
    pub(crate) fn missing(&self) -> bool {
        self.size() > 0 && !self.present()
    }

    /// Creates the ballast if it is missing and the file system has room for it with as much again to
    /// spare. Returns whether a ballast is in place afterwards.
    pub(crate) fn ensure(&self) -> std::io::Result<bool> {
        let _held = self.lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.size == 0 {
            return Ok(false);
        }
        if self.path.exists() {
            return Ok(true);
        }
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let free = free_bytes(dir)?;
        if free < self.size.saturating_mul(2) {
            tracing::warn!(
                free_bytes = free,
                ballast_bytes = self.size,
                "not enough free disk space to put the disk-full ballast in place; will try again later"
            );
            return Ok(false);
        }
        let tmp = self.path.with_extension("tmp");
        let written = write_reserved(&tmp, self.size).and_then(|()| std::fs::rename(&tmp, &self.path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        data_dir::sync_dir(dir)?;
        tracing::info!(path = %self.path.display(), bytes = self.size, "disk-full ballast in place");
        Ok(true)
    }

    /// Deletes the ballast to make room; returns whether there was one to delete.
    pub(crate) fn release(&self) -> bool {
        let _held = self.lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match std::fs::remove_file(&self.path) {
            Ok(()) => {
                tracing::warn!(
                    path = %self.path.display(),
                    bytes = self.size,
                    "disk full: deleted the ballast to make room"
                );
                true
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e, "cannot delete the disk-full ballast");
                false
            }
        }
    }
}

/// Bytes available to this (unprivileged) process on the file system holding `dir`.
pub(crate) fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    let stat = rustix::fs::statvfs(dir)?;
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// Writes a file of `size` bytes whose blocks are really allocated (not a sparse file, which would
/// reserve nothing): `fallocate` where the file system has it, zeros otherwise.
fn write_reserved(path: &Path, size: u64) -> std::io::Result<()> {
    let mut file = data_dir::create_private_file(path)?;
    if rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, size).is_err() {
        let chunk = vec![0u8; 1 << 20];
        let mut left = size;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            file.write_all(&chunk[..n])?;
            left -= n as u64;
        }
    }
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ballast_is_created_once_released_once_and_owner_only() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let ballast = Ballast::new(dir.path().join("ballast"), 1 << 20);
        assert!(!ballast.present());
        assert!(ballast.ensure().unwrap());
        let meta = std::fs::metadata(dir.path().join("ballast")).unwrap();
        assert_eq!(meta.len(), 1 << 20);
        assert!(meta.blocks() * 512 >= 1 << 20, "blocks are allocated, not a sparse file");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert!(ballast.ensure().unwrap(), "already there");
        assert!(ballast.release());
        assert!(!ballast.release(), "nothing left to give back");
        assert!(!ballast.present());
    }

    #[test]
    fn a_zero_size_ballast_is_never_created() {
        let dir = tempfile::tempdir().unwrap();
        let ballast = Ballast::new(dir.path().join("ballast"), 0);
        assert!(!ballast.ensure().unwrap());
        assert!(!dir.path().join("ballast").exists());
    }
}
