//! Files keyward appends to outside its data dir (the audit log, `--log-outputs` files): created
//! owner-only (0600) whatever the umask, since they name keys, users and client addresses.
//!
//! A regular file that already exists with a looser mode (one an older keyward created under the
//! umask, 0644) is narrowed to 0600 and the change is logged: rotation creates owner-only files
//! anyway, so a wider mode would not last. Anything that is not a regular file (`/dev/stderr`, a
//! FIFO a log collector reads) is used as it is, never chmodded.

use std::fs::{File, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Owner read and write only.
pub(crate) const MODE: u32 = 0o600;

/// Opens `path` for appending, creating it 0600; an existing regular file readable or writable by
/// anyone but its owner is narrowed to 0600.
pub(crate) fn open_append(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new().create(true).append(true).mode(MODE).open(path)?;
    narrow(&file, path);
    Ok(file)
}

fn narrow(file: &File, path: &Path) {
    let Ok(meta) = file.metadata() else { return };
    let mode = meta.permissions().mode() & 0o7777;
    if !meta.is_file() || mode & 0o077 == 0 {
        return;
    }
    match file.set_permissions(Permissions::from_mode(MODE)) {
        Ok(()) => tracing::warn!(
            path = %path.display(),
            was = format!("{mode:o}"),
            "a log file was accessible to other users: narrowed to 600"
        ),
        Err(e) => tracing::warn!(
            path = %path.display(),
            mode = format!("{mode:o}"),
            error = %e,
            "a log file is accessible to other users and its mode cannot be narrowed"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn new_files_are_owner_only_and_wider_existing_ones_are_narrowed() {
        let dir = tempfile::tempdir().unwrap();
        let new = dir.path().join("new.log");
        open_append(&new).unwrap();
        assert_eq!(mode(&new), 0o600);
        let old = dir.path().join("old.log");
        std::fs::write(&old, b"kept\n").unwrap();
        std::fs::set_permissions(&old, Permissions::from_mode(0o644)).unwrap();
        use std::io::Write;
        open_append(&old).unwrap().write_all(b"appended\n").unwrap();
        assert_eq!(mode(&old), 0o600);
        assert_eq!(std::fs::read_to_string(&old).unwrap(), "kept\nappended\n");
    }
}
