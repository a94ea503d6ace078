//! The kv file's write-back, paced by keyward instead of left to the kernel: a thread writes its dirty
//! pages back a slice at a time, every `INTERVAL`, so they never pile up.
//!
//! The kv environment is never synced while a member runs (`raft/unsynced.rs`), so without this the
//! kernel's flusher writes `data.mdb` back when its pages turn 30 s old (`dirty_expire_centisecs`), in
//! one burst of everything that expired: traced here (`/proc/meminfo`, `/sys/block/*/stat` sampled
//! every 50 ms beside the probe), 47 MB under write-back at once, the disk's queue 52 requests deep,
//! and the raft log's small append and its `fdatasync` behind them for 171 ms, then 167 ms: the
//! longest client stalls of a compaction and of a load with snapshots. Written back here instead, at
//! most `SLICE` bytes of the file are queued at the disk at a time, each waited for, and what is dirty
//! is at most what `INTERVAL` of applies dirtied.
//!
//! Write-back is only a schedule, never durability: no sync, no cache flush. The crash rules of
//! `raft/unsynced.rs` stay as they are; a system without `sync_file_range` (or an error from it)
//! costs the pacing, which is then left to the kernel, and nothing else.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the file is walked. Shorter bounds the dirty pages tighter but writes a page that apply
/// keeps changing (a branch page, the meta pages) more often; etcd's backend commits every 100 ms.
const INTERVAL: Duration = Duration::from_millis(250);

/// Written back and waited for at a time: the most of this file queued at the disk ahead of the log's
/// append. Smaller than `paced_sync`'s snapshot slices: this runs all the time, not once per snapshot.
const SLICE: u64 = 1 << 20;

/// The thread that writes one file back; stopped (and joined) on drop.
pub(crate) struct PacedWriteback {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    file: File,
    stopping: Mutex<bool>,
    wake: Condvar,
    /// Walks of the whole file finished.
    passes: AtomicU64,
}

impl PacedWriteback {
    /// Starts writing `path` back every `INTERVAL`.
    pub(crate) fn start(path: &Path) -> io::Result<PacedWriteback> {
        let shared = Arc::new(Shared {
            file: File::open(path)?,
            stopping: Mutex::new(false),
            wake: Condvar::new(),
            passes: AtomicU64::new(0),
        });
        let thread = std::thread::Builder::new().name("kv-writeback".into()).spawn({
            let shared = shared.clone();
            move || shared.run()
        })?;
        Ok(PacedWriteback { shared, thread: Some(thread) })
    }

    /// Walks of the whole file finished so far.
    #[cfg(test)]
    pub(crate) fn passes(&self) -> u64 {
        self.shared.passes.load(Ordering::Acquire)
    }

    /// Tests: waits (at most a minute, for a busy machine) until `passes` walks have finished.
    #[cfg(test)]
    pub(crate) fn wait_for_passes(&self, passes: u64) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while self.passes() < passes {
            assert!(std::time::Instant::now() < deadline, "the write-back thread did not walk the file");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for PacedWriteback {
    fn drop(&mut self) {
        *self.shared.stopping.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.shared.wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Shared {
    fn run(&self) {
        while self.pause() {
            match self.pass() {
                Ok(()) => {
                    self.passes.fetch_add(1, Ordering::AcqRel);
                }
                Err(e) => {
                    tracing::info!(error = %e, "kv file write-back left to the kernel: sync_file_range refused");
                    return;
                }
            }
        }
    }

    /// Waits `INTERVAL`; false once stopping.
    fn pause(&self) -> bool {
        let stopping = self.stopping.lock().unwrap_or_else(PoisonError::into_inner);
        let (stopping, _) = self
            .wake
            .wait_timeout_while(stopping, INTERVAL, |stopping| !*stopping)
            .unwrap_or_else(PoisonError::into_inner);
        !*stopping
    }

    fn stopping(&self) -> bool {
        *self.stopping.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes back every dirty page of the file, `SLICE` bytes at a time, each waited for. Clean
    /// slices cost a lookup in the page cache's dirty tags, not a write.
    fn pass(&self) -> io::Result<()> {
        let len = self.file.metadata()?.len();
        let mut offset = 0;
        while offset < len && !self.stopping() {
            super::paced_sync::write_back(&self.file, offset, SLICE.min(len - offset))?;
            offset += SLICE;
        }
        Ok(())
    }
}

/// Tests: the pages of a file the page cache holds dirty, through Linux's `cachestat` (6.5 and
/// later); `None` where the kernel does not have it.
#[cfg(test)]
pub(crate) fn dirty_pages(file: &File) -> Option<u64> {
    use std::os::fd::AsRawFd;
    /// `cachestat`'s number in Linux's generic syscall table (x86_64, aarch64 and the rest alike).
    const SYS_CACHESTAT: libc::c_long = 451;
    #[repr(C)]
    struct Range {
        offset: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        cache: u64,
        dirty: u64,
        writeback: u64,
        evicted: u64,
        recently_evicted: u64,
    }
    let range = Range { offset: 0, len: 0 }; // 0: to the end of the file
    let mut stat = Stat::default();
    // SAFETY: `cachestat` reads `range` and writes `stat`, both live locals of the layout the kernel
    // defines (`struct cachestat_range`, `struct cachestat`); the descriptor is borrowed from `file`.
    #[allow(unsafe_code)]
    let done =
        unsafe { libc::syscall(SYS_CACHESTAT, file.as_raw_fd(), &range as *const Range, &mut stat as *mut Stat, 0u32) };
    (done == 0).then_some(stat.dirty + stat.writeback)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn a_walk_leaves_no_page_of_the_file_dirty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        let mut file = File::create(&path).unwrap();
        file.write_all(&vec![7u8; (3 * SLICE + 4096 + 17) as usize]).unwrap();
        let Some(dirty) = dirty_pages(&file) else {
            eprintln!("skipping: this kernel has no cachestat");
            return;
        };
        assert!(dirty > 3 * SLICE / 4096, "just written, not yet written back: {dirty} dirty pages");

        let writeback = PacedWriteback::start(&path).unwrap();
        writeback.wait_for_passes(1);
        assert_eq!(dirty_pages(&file), Some(0));

        // Dirtied again: the next walk writes it back too.
        let done = writeback.passes();
        file.write_all(&[1u8; 8192]).unwrap();
        writeback.wait_for_passes(done + 2);
        assert_eq!(dirty_pages(&file), Some(0));
        drop(writeback); // stops and joins
        assert_eq!(std::fs::read(&path).unwrap().len() as u64, 3 * SLICE + 4096 + 17 + 8192);
    }
}
