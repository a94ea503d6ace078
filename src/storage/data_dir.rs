//! The data directory a member owns: created private to its user, and held by one process at a time.
//!
//! Two processes on one data dir would each apply the same raft log to the same LMDB files, each
//! believing it is the only member: an entry gets applied twice (a key written once shows version 2)
//! and both serve diverging answers. `lock` takes an exclusive `flock` on `<data-dir>/keyward.lock`
//! before any LMDB environment is opened and writes the holder's PID into it; a second process fails
//! at once with a message naming the dir and the holder. The lock belongs to the open file, so the
//! kernel releases it however the holder exits: a `kill -9` leaves no stale lock behind.
//!
//! Everything keyward creates under the data dir is owner-only: directories 0700, files 0600. The
//! data dir holds every key and value and the users' bcrypt hashes (in LMDB and in snapshot files).

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Directories keyward creates: owner only.
pub(crate) const DIR_MODE: u32 = 0o700;
/// Files keyward creates (snapshots, the lock, the ballast): owner read/write only.
pub(crate) const FILE_MODE: u32 = 0o600;
/// The lock file, directly in the data dir.
pub(crate) const LOCK_FILE: &str = "keyward.lock";

#[derive(Debug, thiserror::Error)]
pub(crate) enum LockError {
    #[error(
        "data dir {} is in use by another process (pid {holder}): a data dir belongs to one member process",
        dir.display()
    )]
    Held { dir: PathBuf, holder: String },
    // The cause is the error's source, printed after it by `{:#}` (not repeated in the message).
    #[error("cannot lock data dir {}", dir.display())]
    Io { dir: PathBuf, source: std::io::Error },
}

/// The exclusive hold on a data dir; released when dropped or when the process exits.
#[derive(Debug)]
pub(crate) struct DataDirLock {
    _file: File,
}

/// Creates `dir` if needed (0700) and locks it for this process, or says who holds it.
pub(crate) fn lock(dir: &Path) -> Result<DataDirLock, LockError> {
    let io = |source| LockError::Io { dir: dir.to_path_buf(), source };
    create_private_dir(dir).map_err(io)?;
    warn_if_shared(dir);
    // Not truncated on open: the file may be the holder's, and its PID is what a refusal reports.
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .open(dir.join(LOCK_FILE))
        .map_err(io)?;
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = match holder.trim() {
                "" => "unknown".to_string(),
                pid => pid.to_string(),
            };
            return Err(LockError::Held { dir: dir.to_path_buf(), holder });
        }
        Err(e) => return Err(io(e.into())),
    }
    file.set_len(0).map_err(io)?;
    file.write_all(format!("{}\n", std::process::id()).as_bytes()).map_err(io)?;
    Ok(DataDirLock { _file: file })
}

/// Creates `dir` and any missing parent owner-only (0700), and makes each new directory's name
/// durable by syncing the directory that holds it: a power loss must not take away a directory whose
/// files were synced (`member/` with the whole log in it). An existing directory keeps its mode.
pub(crate) fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let missing: Vec<&Path> = dir.ancestors().take_while(|d| !d.as_os_str().is_empty() && !d.exists()).collect();
    DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir)?;
    // Outermost first: each name is durable before the one inside it.
    for created in missing.iter().rev() {
        let holder = created.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        sync_dir(holder)?;
    }
    Ok(())
}

/// Opens a new file for writing, owner-only (0600), replacing any file at `path`.
pub(crate) fn create_private_file(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().write(true).create(true).truncate(true).mode(FILE_MODE).open(path)
}

/// Closes `files`, handles on files whose last names are gone (replaced or removed), on a thread of
/// its own: the file system frees their blocks and drops their cached pages at the last close, which
/// takes about a second per gigabyte (a replaced snapshot or kv file, purged raft log segments), and
/// nothing need wait for that.
pub(crate) fn release_in_background(files: impl Send + 'static) {
    let spawned = std::thread::Builder::new().name("release-file".into()).spawn(move || drop(files));
    if let Err(e) = spawned {
        // `spawn` dropped the closure, and the file with it: released in place.
        tracing::debug!(error = %e, "no thread to release a removed file: released in place");
    }
}

/// Removes the file at `path` (false if there is none), freeing its space in the background
/// (`release_in_background`). Not durable until `dir` is synced.
pub(crate) fn remove_file_in_background(path: &Path) -> std::io::Result<bool> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    std::fs::remove_file(path)?;
    release_in_background(file);
    Ok(true)
}

/// Makes a rename or an unlink in `dir` durable (the directory entry itself is fsynced).
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// A data dir created by hand (or by an older keyward) may be readable by others: keyward does not
/// change a mode it did not choose, but says so, as etcd does.
fn warn_if_shared(dir: &Path) {
    if let Ok(meta) = std::fs::metadata(dir) {
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            tracing::warn!(
                dir = %dir.display(),
                mode = format!("{mode:o}"),
                "the data dir is accessible to other users; 700 is recommended (it holds every key and the bcrypt hashes)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_on_a_data_dir_is_refused_with_the_holders_pid() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        let held = lock(&dir).unwrap();
        // flock locks belong to the open file: a second open in the same process conflicts too.
        let err = lock(&dir).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, LockError::Held { .. }), "{msg}");
        assert!(msg.contains(&dir.display().to_string()), "{msg}");
        assert!(msg.contains(&format!("pid {}", std::process::id())), "{msg}");
        drop(held);
        lock(&dir).expect("free again once the holder is gone");
    }

    #[test]
    fn created_dirs_and_files_are_owner_only() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        create_private_dir(&dir).unwrap();
        for d in [tmp.path().join("a"), dir.clone()] {
            assert_eq!(std::fs::metadata(&d).unwrap().permissions().mode() & 0o777, 0o700, "{}", d.display());
        }
        let f = dir.join("f");
        create_private_file(&f).unwrap();
        assert_eq!(std::fs::metadata(&f).unwrap().permissions().mode() & 0o777, 0o600);
        let _lock = lock(&dir).unwrap();
        assert_eq!(std::fs::metadata(dir.join(LOCK_FILE)).unwrap().permissions().mode() & 0o777, 0o600);
    }
}
