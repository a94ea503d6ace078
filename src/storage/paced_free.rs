//! Freeing a replaced file's blocks a slice at a time, so that the raft log's `fdatasync` never waits
//! for a whole file's worth of freed blocks.
//!
//! A replaced snapshot is as large as the store. Closed at once, its blocks were freed in one journal
//! transaction, and on a file system mounted with `discard` (as cloud disks often are) the commit of
//! that transaction discards all of them while every `fdatasync` on the disk waits: 50–60 ms of a
//! put's time at each snapshot of a 1M-key store (docs/performance.md, session 23). Shrunk 8 MiB at a
//! time with a pause between slices, the longest wait in the same reproduction was 11–12 ms.
//!
//! Shrinking is only done when nothing else can read the file: its names are gone (nothing can open
//! it again), and no descriptor or mapping of it exists in this process (a snapshot still being sent
//! to a follower holds one) or in any other process this one can see. A process that cannot be seen
//! runs as another user, and the files keyward creates are owner-only; root aside, it cannot hold
//! them. Otherwise the file is closed as before, and the last holder's close frees it. The check
//! `stat`s every readable descriptor: one on a file system that does not answer (a hung FUSE mount)
//! holds this thread and the replaced file's space, never the write path.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

/// Freed at a time.
const SLICE: u64 = 8 << 20;
/// Between two slices: the journal commits, and the log's syncs pass, in between.
const PAUSE: Duration = Duration::from_millis(5);

/// Frees `file`, whose last name is gone, on a thread of its own: a slice at a time when nothing else
/// holds it, else by closing it.
pub(crate) fn free_in_background(file: File) {
    let spawned = std::thread::Builder::new().name("free-file".into()).spawn(move || free(file));
    if let Err(e) = spawned {
        // `spawn` dropped the closure, and the file with it: closed in place.
        tracing::debug!(error = %e, "no thread to free a replaced file: closed in place");
    }
}

/// Shrinks `file` to nothing a slice at a time if nothing else holds it, then closes it. Returns
/// whether it was shrunk.
fn free(file: File) -> bool {
    let started = std::time::Instant::now();
    let bytes = file.metadata().map_or(0, |m| m.len());
    let shrunk = match only_holder(&file) {
        Ok(true) => shrink(&file).map_err(|e| tracing::debug!(error = %e, "shrinking a replaced file failed")).is_ok(),
        Ok(false) => false,
        Err(e) => {
            tracing::debug!(error = %e, "could not tell who holds a replaced file: closed as it is");
            false
        }
    };
    drop(file);
    let ms = crate::logging::slow::ms(started.elapsed());
    tracing::debug!(target: crate::logging::slow::TARGET, bytes, shrunk, ms, "replaced file freed");
    shrunk
}

fn shrink(file: &File) -> std::io::Result<()> {
    let mut len = file.metadata()?.len();
    while len > 0 {
        len = len.saturating_sub(SLICE);
        file.set_len(len)?;
        if len > 0 {
            std::thread::sleep(PAUSE);
        }
    }
    Ok(())
}

/// Whether `file` has no name left and no descriptor or mapping of it exists besides `file` itself,
/// in this process or any other whose `/proc` entries this one may read.
fn only_holder(file: &File) -> std::io::Result<bool> {
    let meta = file.metadata()?;
    if meta.nlink() != 0 {
        return Ok(false);
    }
    let (dev, ino) = (meta.dev(), meta.ino());
    let mut holders = 0;
    for process in std::fs::read_dir("/proc")? {
        let process = process?.path();
        let is_pid =
            process.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()));
        if !is_pid {
            continue;
        }
        // A process that ended meanwhile, or one of another user: not readable, skipped.
        let Ok(fds) = std::fs::read_dir(process.join("fd")) else { continue };
        for fd in fds.flatten() {
            if std::fs::metadata(fd.path()).is_ok_and(|m| m.dev() == dev && m.ino() == ino) {
                holders += 1;
            }
        }
        if mapped(&process.join("maps"), dev, ino) {
            return Ok(false);
        }
    }
    Ok(holders == 1)
}

/// Whether the `/proc/<pid>/maps` at `maps` maps the file `(dev, ino)`.
fn mapped(maps: &Path, dev: u64, ino: u64) -> bool {
    let Ok(maps) = std::fs::read_to_string(maps) else { return false };
    maps.lines().any(|line| {
        // address perms offset major:minor inode [path]
        let mut fields = line.split_whitespace().skip(3);
        let (Some(device), Some(inode)) = (fields.next(), fields.next()) else { return false };
        let Some((major, minor)) = device.split_once(':') else { return false };
        let (Ok(major), Ok(minor), Ok(inode)) =
            (u32::from_str_radix(major, 16), u32::from_str_radix(minor, 16), inode.parse::<u64>())
        else {
            return false;
        };
        inode == ino && libc::makedev(major, minor) == dev
    })
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    /// A file of `len` bytes at `dir/name`, open for reading and writing, and its bytes.
    fn file_of(dir: &Path, name: &str, len: usize) -> (File, Vec<u8>) {
        let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let mut file =
            std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(dir.join(name)).unwrap();
        file.write_all(&bytes).unwrap();
        (file, bytes)
    }

    /// The sole holder of a file without a name shrinks it; a file that still has a name is only closed.
    #[test]
    fn a_replaced_file_nothing_else_holds_is_shrunk_and_a_named_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let (replaced, _) = file_of(dir.path(), "replaced", (2 * SLICE + 5) as usize);
        std::fs::remove_file(dir.path().join("replaced")).unwrap();
        assert!(free(replaced));

        let (named, bytes) = file_of(dir.path(), "named", (SLICE + 5) as usize);
        assert!(!free(named));
        assert_eq!(std::fs::read(dir.path().join("named")).unwrap(), bytes);
    }

    /// A snapshot being sent holds its own descriptor of the file: what it reads must stay whole.
    /// Fails if the file is shrunk whoever holds it.
    #[test]
    fn a_file_another_descriptor_reads_is_left_whole() {
        let dir = tempfile::tempdir().unwrap();
        let (replaced, bytes) = file_of(dir.path(), "replaced", (2 * SLICE + 5) as usize);
        let mut sending = File::open(dir.path().join("replaced")).unwrap();
        std::fs::remove_file(dir.path().join("replaced")).unwrap();
        assert!(!free(replaced));
        let mut read = Vec::new();
        sending.read_to_end(&mut read).unwrap();
        assert!(read == bytes, "read {} of {} bytes", read.len(), bytes.len());
    }

    /// A mapping of the file (as LMDB maps its data file) keeps it whole too, even with no descriptor
    /// open: shrinking a mapped file would fault its readers.
    #[test]
    #[allow(unsafe_code)]
    fn a_mapped_file_is_left_whole() {
        let dir = tempfile::tempdir().unwrap();
        let (replaced, _) = file_of(dir.path(), "replaced", SLICE as usize);
        let len = SLICE as usize;
        let mapping = {
            let fd = File::open(dir.path().join("replaced")).unwrap();
            use std::os::fd::AsRawFd;
            // SAFETY: a fresh read-only shared mapping of `len` bytes of a file that long; unmapped below.
            let address =
                unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
            assert_ne!(address, libc::MAP_FAILED);
            address
            // `fd` is closed here: only the mapping is left.
        };
        std::fs::remove_file(dir.path().join("replaced")).unwrap();
        assert!(!free(replaced));
        // SAFETY: the mapping made above, still `len` bytes of a file that was not shrunk.
        let last = unsafe { *(mapping as *const u8).add(len - 1) };
        assert_eq!(last, ((len - 1) % 251) as u8);
        // SAFETY: unmaps exactly the mapping made above, not used after.
        assert_eq!(unsafe { libc::munmap(mapping, len) }, 0);
    }
}
