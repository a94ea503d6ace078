//! The files of an environment replaced by a compacting copy of itself (`raft/state_machine/defrag.rs`
//! drives it): the copy is written and synced beside `data.mdb`, the old file keeps a second name
//! until the copy has opened, and whatever a crash leaves is removed at the next open. At every
//! instant `data.mdb` is the old file or the complete copy.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::LmdbEnv;

const DATA: &str = "data.mdb";
pub(crate) const COPY: &str = "data.mdb.defrag.tmp";
pub(crate) const OLD: &str = "data.mdb.predefrag";

/// Writes a compacting copy of `env` (free pages left out) beside its `data.mdb`, owner-only as every
/// data file, fsynced; then gives the current `data.mdb` the second name `OLD` (a hard link: no copy).
pub(crate) fn prepare(env: &LmdbEnv) -> heed::Result<()> {
    let dir = env.path();
    let mut file = OpenOptions::new().write(true).create_new(true).mode(0o600).open(dir.join(COPY))?;
    env.copy_to_file(&mut file, heed::CompactionOption::Enabled)?;
    file.sync_all()?;
    super::data_dir::remove_file_in_background(&dir.join(OLD))?;
    std::fs::hard_link(dir.join(DATA), dir.join(OLD))?;
    Ok(())
}

/// The directory of the fresh environment a snapshot is loaded into before it replaces the one at
/// `kv_dir` (`raft/state_machine/snapshot/install.rs`), beside it.
pub(crate) fn fresh_dir(kv_dir: &Path) -> std::path::PathBuf {
    kv_dir.with_extension("install")
}

/// Removes the fresh environment beside `kv_dir`, if any: after an install, or what a crash left of
/// one (at open, before the kv environment opens).
pub(crate) fn remove_fresh(kv_dir: &Path) -> io::Result<()> {
    match std::fs::remove_dir_all(fresh_dir(kv_dir)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Makes the closed environment file `file` (on the same file system: a snapshot loaded into a fresh
/// environment, `raft/state_machine/snapshot/install.rs`) the copy beside `dir`'s `data.mdb`, and gives
/// `data.mdb` the second name `OLD`, as `prepare` does. Not synced: the kv environment never is
/// (`raft/unsynced.rs`; after an operating-system crash it is rebuilt from the current snapshot).
pub(crate) fn adopt(dir: &Path, file: &Path) -> io::Result<()> {
    std::fs::rename(file, dir.join(COPY))?;
    super::data_dir::remove_file_in_background(&dir.join(OLD))?;
    std::fs::hard_link(dir.join(DATA), dir.join(OLD))
}

/// Renames the copy over `data.mdb` (durably). The environment must be closed.
pub(crate) fn swap_in(dir: &Path) -> io::Result<()> {
    std::fs::rename(dir.join(COPY), dir.join(DATA))?;
    super::data_dir::sync_dir(dir)
}

/// Puts the old file back as `data.mdb` (durably), after the copy failed to open.
pub(crate) fn roll_back(dir: &Path) -> io::Result<()> {
    std::fs::rename(dir.join(OLD), dir.join(DATA))?;
    super::data_dir::sync_dir(dir)
}

/// Removes the copy and the old file's second name, if present (after a swap, a failure, or a crash
/// at any point of one). After a swap `OLD` is the old file's last name: its space is freed in the
/// background.
pub(crate) fn remove_leftovers(dir: &Path) -> io::Result<()> {
    let mut removed = false;
    for name in [COPY, OLD] {
        removed |= super::data_dir::remove_file_in_background(&dir.join(name))?;
    }
    if removed {
        super::data_dir::sync_dir(dir)?;
    }
    Ok(())
}
