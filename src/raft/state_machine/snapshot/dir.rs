//! The snap dir (`<data-dir>/member/snap/`): `current.snap`, the newest snapshot (a restarted member
//! can still send it to a follower), and `*.tmp` files being built or received.
//!
//! A snapshot becomes current only whole and durable: its file is written (or received) under a temp
//! name, fsynced, renamed over `current.snap`, and the directory is fsynced, so a crash at any point
//! leaves the previous snapshot or the new one. Temp files a crash left behind are removed at open.
//! Files are owner-only: they hold every value and the users' bcrypt hashes.

use std::fs::{File, OpenOptions};
use std::io::Seek;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::format::{self, Meta};

const CURRENT: &str = "current.snap";
const TEMP_SUFFIX: &str = ".tmp";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub(crate) struct SnapDir {
    dir: PathBuf,
    /// Held while `current.snap` is replaced, so a snapshot built from an older state can never
    /// replace a newer one that was installed meanwhile (openraft builds while it installs).
    publishing: Mutex<()>,
}

impl SnapDir {
    /// Opens the snap dir (creating it owner-only): removes what a crash left half-written and
    /// converts a `current.snap` from before version 1 of the format.
    pub(crate) fn open(dir: &Path) -> Result<SnapDir, BoxError> {
        crate::storage::data_dir::create_private_dir(dir)?;
        let snap_dir = SnapDir { dir: dir.to_path_buf(), publishing: Mutex::new(()) };
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.to_str().is_some_and(|p| p.ends_with(TEMP_SUFFIX)) {
                tracing::info!(path = %path.display(), "removing a snapshot file left unfinished");
                std::fs::remove_file(&path)?;
            }
        }
        snap_dir.upgrade_legacy()?;
        Ok(snap_dir)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.dir
    }

    /// Where the current snapshot is (it may not exist).
    pub(crate) fn current_path(&self) -> PathBuf {
        self.dir.join(CURRENT)
    }

    /// The current snapshot's metadata and its file (at its start), if there is one.
    pub(crate) fn current(&self) -> Result<Option<(Meta, File)>, BoxError> {
        let mut file = match File::open(self.current_path()) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let (meta, _) = format::Reader::open(file.try_clone()?)?;
        file.rewind()?;
        Ok(Some((meta, file)))
    }

    /// A new owner-only temp file in the snap dir, open for reading and writing.
    pub(crate) fn temp(&self, purpose: &str) -> std::io::Result<(TempFile, File)> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = self.dir.join(format!("{purpose}-{}{TEMP_SUFFIX}", NEXT.fetch_add(1, Ordering::Relaxed)));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(crate::storage::data_dir::FILE_MODE)
            .open(&path)?;
        Ok((TempFile { path, renamed: false, kept: false }, file))
    }

    /// Makes a complete, synced snapshot file `temp` (of `meta`) the current one, unless the current
    /// one is newer (then `temp` is removed). Returns whether it became current.
    pub(crate) fn publish(&self, temp: TempFile, meta: &Meta) -> Result<bool, BoxError> {
        let _publishing = self.publishing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((current, _)) = self.current()? {
            if current.last_log_id > meta.last_log_id {
                return Ok(false);
            }
        }
        self.replace_current(temp)?;
        Ok(true)
    }

    fn replace_current(&self, temp: TempFile) -> std::io::Result<()> {
        // Held across the rename, so that the replaced file's space is freed in the background, a
        // slice at a time when nothing else reads it (`storage/paced_free.rs`); writable for that.
        let previous = OpenOptions::new().read(true).write(true).open(self.current_path()).ok();
        temp.persist(&self.current_path())?;
        // The rename is durable only once the directory is: until then a power loss can bring back
        // the previous snapshot after the log behind the new one was purged.
        crate::storage::data_dir::sync_dir(&self.dir)?;
        if let Some(previous) = previous {
            crate::storage::paced_free::free_in_background(previous);
        }
        Ok(())
    }

    /// Converts a `current.snap` written before version 1 into version 1, atomically.
    fn upgrade_legacy(&self) -> Result<(), BoxError> {
        let mut legacy = match File::open(self.current_path()) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        if format::is_current_version(&mut legacy)? {
            return Ok(());
        }
        let (temp, out) = self.temp("upgrade")?;
        let meta = format::upgrade_legacy(legacy, out)?;
        self.replace_current(temp)?;
        tracing::info!(snapshot = %meta.snapshot_id, "converted the current snapshot to the streamed format");
        Ok(())
    }
}

/// A temp file in the snap dir: removed when dropped, unless it was renamed into place or is kept
/// (a snapshot being received, which outlives this process: `receiving.rs`).
#[derive(Debug)]
pub struct TempFile {
    path: PathBuf,
    renamed: bool,
    kept: bool,
}

impl TempFile {
    /// The file at `path`, which dropping it leaves in place: only a rename or an explicit removal
    /// ends it.
    pub(super) fn kept(path: PathBuf) -> TempFile {
        TempFile { path, renamed: false, kept: true }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn persist(mut self, to: &Path) -> std::io::Result<()> {
        std::fs::rename(&self.path, to)?;
        self.renamed = true;
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if self.renamed || self.kept {
            return;
        }
        if let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot remove a snapshot temp file");
        }
    }
}
