//! How the kv environment's file is written, and when its map may be touched.
//!
//! **Mapped writes.** By default LMDB copies each page a transaction dirties into a buffer and writes
//! it to the file with `pwrite` at commit. Under a put load that is about a fifth of the member's CPU
//! (`docs/performance.md`). With `MDB_WRITEMAP` a transaction writes the mapped pages in place.
//!
//! The catch is what a full disk does then. LMDB sizes the file to the whole map, and the blocks
//! behind pages never written are not allocated. Writing such a page on a full disk raises `SIGBUS`
//! in the writing thread (apply) instead of returning `ENOSPC`, and the entry would kill the member
//! again at every replay. So here the map is exactly as large as the blocks reserved for the file
//! (`fallocate`): LMDB cannot touch a page without an allocated block. A transaction that needs more
//! gets `MDB_MAP_FULL`, an error. The writer aborts it, reserves more (`ENOSPC` there takes the
//! ordinary disk-full path, `space/mod.rs`), remaps, and runs the transaction again.
//!
//! This holds only where writing an allocated block cannot fail for want of space: ext4 and tmpfs.
//! On copy-on-write file systems (btrfs, ZFS, XFS with shared extents) a reserved block may still
//! need a new one when written, so there the environment is written with `pwrite`, as before.
//!
//! **The pin.** A remap may move the map. Every reader of the map (a read transaction, a copy, a
//! sync) holds the pin shared. A remap holds it exclusively. Only the writer remaps, between two of
//! its write transactions.

use std::fs::{File, OpenOptions};
use std::io;
use std::ops::Deref;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use heed::{Env, RoTxn, WithoutTls};
use rustix::fs::FallocateFlags;

/// `storage::LmdbEnv`, named here so that this module does not import its parent, which opens
/// environments with it.
type LmdbEnv = Env<WithoutTls>;

/// The first reservation of a new environment, and the smallest step by which one grows.
pub(crate) const MIN_RESERVE: u64 = 4 << 20;
/// Reservations are whole multiples of this.
const GRANULE: u64 = 1 << 20;
/// After a commit, the reservation grows once pages past this share of it are in use, so that a
/// batch rarely meets `MDB_MAP_FULL` and has to run twice.
const GROW_EARLY_AT: (u64, u64) = (15, 16);
/// Ahead of need (`grow_early`) a reservation grows by this share of itself (at least
/// `MIN_RESERVE`). With `GROW_EARLY_AT`, the file (`dbSize`, as etcd's is its file) is at most
/// (1 + 1/16) / (15/16) = 17/15 times the pages LMDB has handed out (its last page number, free
/// pages among them) once the step is past `MIN_RESERVE` (a reservation of 64 MiB). A sixth at
/// five sixths, before, allowed 1.4 (measured at 1M keys: a 234 MB file for 171 MB in use; at 2M,
/// 436 MB for 343 MB), a quarter at three quarters 1.67. etcd's bbolt grows its file 16 MiB past what it uses. A smaller step means more
/// remaps (about 2.6 times as many on the way to a given size: 91 from 4 MiB to 1 GiB, where a sixth
/// took 36); each is taken only when no reader holds the map.
const GROW_BY: u64 = 16;
/// After `MDB_MAP_FULL` (`grow`: a batch larger than the room left, which runs again after the
/// growth) the step is this larger share, so that a huge batch (a delete of millions of keys) runs
/// as few times as before the early step was made smaller.
pub(crate) const MAP_FULL_GROW_BY: u64 = 6;

const EXT4_SUPER_MAGIC: i64 = 0xEF53;
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// How an environment's pages reach its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Writes {
    /// Copied and written with `pwrite` at commit; the map is address space only.
    Copied,
    /// Written in place in the map (`MDB_WRITEMAP`), which never exceeds the reserved blocks.
    Mapped,
}

impl Writes {
    /// `Mapped` where the file system of `dir` writes reserved blocks in place and reserves blocks
    /// (checked by reserving one in a scratch file), else `Copied`.
    pub(crate) fn for_dir(dir: &Path) -> Writes {
        // `f_type`'s integer type differs between architectures.
        #[allow(clippy::unnecessary_cast)]
        let in_place = rustix::fs::statfs(dir)
            .map(|fs| matches!(fs.f_type as i64, EXT4_SUPER_MAGIC | TMPFS_MAGIC))
            .unwrap_or(false);
        if in_place && can_reserve(dir) {
            Writes::Mapped
        } else {
            Writes::Copied
        }
    }
}

/// Whether `fallocate` works in `dir` (ext2 and ext3 share ext4's magic but refuse it).
fn can_reserve(dir: &Path) -> bool {
    let probe = dir.join("data.mdb.reserve-probe");
    let reserved = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&probe)
        .and_then(|file| Ok(rustix::fs::fallocate(&file, FallocateFlags::empty(), 0, 4096)?));
    let _ = std::fs::remove_file(&probe);
    reserved.is_ok()
}

/// Allocates the blocks of `file` up to `bytes` (and its length, if shorter).
fn allocate(file: &File, bytes: u64) -> io::Result<()> {
    Ok(rustix::fs::fallocate(file, FallocateFlags::empty(), 0, bytes)?)
}

/// The first reservation for an environment whose file holds `existing` bytes.
fn initial_reserve(existing: u64) -> u64 {
    round_up(existing.max(MIN_RESERVE))
}

/// How to open the environment in `dir` whose `data.mdb` holds `existing` bytes (0: none yet), when
/// `wanted` says how it should be written: the way, and the map size (at most `ceiling`). For mapped
/// writes to an existing file its first reservation is allocated here, before LMDB maps it; with no
/// room for it (a member restarting on a full disk) the environment is written with copied writes
/// instead, which need no room to open and serve reads, until a restart finds room. A new file is
/// reserved once LMDB has created it (`reserve_opened`).
pub(crate) fn plan(dir: &Path, wanted: Writes, existing: u64, ceiling: u64) -> io::Result<(Writes, u64)> {
    let reserve = initial_reserve(existing).min(ceiling);
    match wanted {
        Writes::Copied => return Ok((Writes::Copied, ceiling)),
        Writes::Mapped if existing == 0 => return Ok((Writes::Mapped, reserve)),
        Writes::Mapped => {}
    }
    let file = OpenOptions::new().write(true).open(dir.join("data.mdb"))?;
    match allocate(&file, reserve) {
        Ok(()) => Ok((Writes::Mapped, reserve)),
        Err(e) if is_disk_full(&e) => {
            tracing::warn!(
                dir = %dir.display(),
                reserve,
                "no room to reserve the kv file for mapped writes: written with pwrite until a restart finds room"
            );
            Ok((Writes::Copied, ceiling))
        }
        Err(e) => Err(e),
    }
}

fn is_disk_full(e: &io::Error) -> bool {
    let full = [rustix::io::Errno::NOSPC.raw_os_error(), rustix::io::Errno::DQUOT.raw_os_error()];
    e.raw_os_error().is_some_and(|code| full.contains(&code))
}

fn round_up(bytes: u64) -> u64 {
    bytes.div_ceil(GRANULE).saturating_mul(GRANULE)
}

/// Allocates the blocks of `<dir>/data.mdb` for the whole of `env`'s map, right after LMDB opened it
/// with `MDB_WRITEMAP` (which sized the file to the map) and before any transaction writes a page.
pub(crate) fn reserve_opened(dir: &Path, env: &LmdbEnv) -> io::Result<()> {
    let file = OpenOptions::new().write(true).open(dir.join("data.mdb"))?;
    allocate(&file, env.info().map_size as u64)
}

/// The pin and, for mapped writes, the reservation of one open environment.
pub(crate) struct Mapping {
    pin: RwLock<()>,
    /// The writer waits for the pin to remap (`grow`): a long reader that can start over (a
    /// snapshot's dump) ends its transaction instead of stalling apply for the rest of its length.
    remap_waiting: AtomicBool,
    reserve: Option<Reserve>,
    page_size: u64,
}

struct Reserve {
    /// `data.mdb`, to allocate its blocks.
    file: File,
    /// The map's size: every block below it is allocated.
    reserved: AtomicU64,
    /// Bytes allocated to the file: ahead of `reserved` when a growth allocated and then found a
    /// reader holding the map (`grow_early`), so the next try does not allocate again.
    allocated: AtomicU64,
    /// The most the map may grow to (`space::map_size`); past it, `MDB_MAP_FULL` stands.
    ceiling: u64,
}

/// A growth of the reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grown {
    pub from: u64,
    pub to: u64,
}

/// The map pinned: it cannot move while this is held.
pub(crate) type Pin<'a> = RwLockReadGuard<'a, ()>;

/// A read transaction that holds the map pinned for as long as it lives.
pub(crate) struct ReadTxn<'a> {
    // Declared first: dropped (ended) before the pin is released.
    txn: RoTxn<'a, WithoutTls>,
    _pin: Pin<'a>,
}

impl<'a> Deref for ReadTxn<'a> {
    type Target = RoTxn<'a, WithoutTls>;

    fn deref(&self) -> &Self::Target {
        &self.txn
    }
}

impl Mapping {
    /// The mapping of `env`, opened at `dir` with `writes`; `ceiling` bounds a mapped reservation.
    pub(crate) fn new(dir: &Path, env: &LmdbEnv, writes: Writes, ceiling: u64) -> io::Result<Mapping> {
        let reserve = match writes {
            Writes::Copied => None,
            Writes::Mapped => Some(Reserve {
                file: OpenOptions::new().write(true).open(dir.join("data.mdb"))?,
                reserved: AtomicU64::new(env.info().map_size as u64),
                allocated: AtomicU64::new(env.info().map_size as u64),
                ceiling: ceiling.max(env.info().map_size as u64),
            }),
        };
        let page_size = u64::from(env.unnamed_database_stat().page_size);
        Ok(Mapping { pin: RwLock::new(()), remap_waiting: AtomicBool::new(false), reserve, page_size })
    }

    pub(crate) fn writes(&self) -> Writes {
        match self.reserve {
            Some(_) => Writes::Mapped,
            None => Writes::Copied,
        }
    }

    /// Pins the map; for anything but a read transaction that reads it (a copy, a sync, a stat).
    pub(crate) fn pin(&self) -> Pin<'_> {
        self.pin.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Begins a read transaction on `env` (the environment of this mapping), with the map pinned.
    pub(crate) fn read_txn<'a>(&'a self, env: &'a LmdbEnv) -> heed::Result<ReadTxn<'a>> {
        let pin = self.pin();
        Ok(ReadTxn { txn: env.read_txn()?, _pin: pin })
    }

    /// Bytes reserved for the file (the map's size), for mapped writes.
    pub(crate) fn reserved(&self) -> Option<u64> {
        self.reserve.as_ref().map(|r| r.reserved.load(Ordering::Acquire))
    }

    /// After `MDB_MAP_FULL`: reserves more, at least `at_least` bytes in all, and remaps. `Ok(None)`
    /// when the map cannot grow here (copied writes, or the reservation is at its ceiling); `ENOSPC`
    /// (`heed::Error::Io`) when the disk has no room. Only the writer calls this, with none of its
    /// write transactions open. It waits for the readers in flight (a `snapshot save` copy holds the
    /// pin for its whole length).
    pub(crate) fn grow(&self, env: &LmdbEnv, at_least: u64) -> heed::Result<Option<Grown>> {
        self.grow_with(env, MAP_FULL_GROW_BY, at_least, |pin| {
            self.remap_waiting.store(true, Ordering::Release);
            let remapping = pin.write().unwrap_or_else(PoisonError::into_inner);
            self.remap_waiting.store(false, Ordering::Release);
            Some(remapping)
        })
    }

    /// Whether the writer is waiting for the readers in flight to remap (`grow`, after
    /// `MDB_MAP_FULL`): apply is stalled until they end.
    pub(crate) fn remap_waiting(&self) -> bool {
        self.remap_waiting.load(Ordering::Acquire)
    }

    /// Tests: says a remap is waiting (or not) without one.
    #[cfg(test)]
    pub(crate) fn pretend_remap_waiting(&self, waiting: bool) {
        self.remap_waiting.store(waiting, Ordering::Release);
    }

    /// After a commit: grows the reservation ahead of need once most of it is in use, unless a reader
    /// holds the map (then a later commit tries again). A failure is left to the next
    /// `MDB_MAP_FULL`, which reports it.
    pub(crate) fn grow_early(&self, env: &LmdbEnv) -> Option<Grown> {
        let reserved = self.reserved()?;
        let used = self.handed_out(env);
        if used * GROW_EARLY_AT.1 < reserved * GROW_EARLY_AT.0 {
            return None;
        }
        self.grow_with(env, GROW_BY, 0, |pin| pin.try_write().ok()).ok().flatten()
    }

    /// Before a write transaction expected to need `wanted` bytes of new pages: grows the
    /// reservation to hold them beside the pages LMDB has handed out (free ones among them count as
    /// used: conservative), unless a reader holds the map (then the transaction may meet
    /// `MDB_MAP_FULL` and the writer grows it after). `None` when nothing grew.
    pub(crate) fn grow_for(&self, env: &LmdbEnv, wanted: u64) -> Option<Grown> {
        let reserved = self.reserved()?;
        let needed = self.handed_out(env).saturating_add(wanted);
        if needed <= reserved {
            return None;
        }
        self.grow_with(env, GROW_BY, needed, |pin| pin.try_write().ok()).ok().flatten()
    }

    /// Bytes of the pages LMDB has handed out (its last page number, free pages among them).
    pub(crate) fn handed_out(&self, env: &LmdbEnv) -> u64 {
        (env.info().last_page_number as u64 + 1) * self.page_size
    }

    fn grow_with<'a>(
        &'a self,
        env: &LmdbEnv,
        share: u64,
        at_least: u64,
        remapping: impl FnOnce(&'a RwLock<()>) -> Option<RwLockWriteGuard<'a, ()>>,
    ) -> heed::Result<Option<Grown>> {
        let Some(reserve) = &self.reserve else { return Ok(None) };
        let from = reserve.reserved.load(Ordering::Acquire);
        if from >= reserve.ceiling {
            return Ok(None);
        }
        // A `share`th more (at least `MIN_RESERVE`); nearer a full disk, as little as one granule.
        let mut step = round_up((from / share).max(MIN_RESERVE).max(at_least.saturating_sub(from)));
        let to = loop {
            let to = (from + step).min(reserve.ceiling);
            if to <= reserve.allocated.load(Ordering::Acquire) {
                break to;
            }
            match allocate(&reserve.file, to) {
                Ok(()) => {
                    reserve.allocated.fetch_max(to, Ordering::AcqRel);
                    break to;
                }
                Err(e) if is_disk_full(&e) && step > GRANULE => {
                    step = round_up(step / 2);
                }
                Err(e) => return Err(e.into()),
            }
        };
        // Blocks past the map are allocated but unused until the remap: harmless if it never comes,
        // and not allocated again by the next try (`allocated`).
        let Some(_remapping) = remapping(&self.pin) else { return Ok(None) };
        // SAFETY: LMDB requires that no transaction of this process is open during a remap. Every read
        // transaction and every other access to the map holds the pin, held exclusively here; the
        // only writer is the caller, between its transactions.
        #[allow(unsafe_code)]
        unsafe {
            env.resize(to as usize)?
        };
        reserve.reserved.store(to, Ordering::Release);
        Ok(Some(Grown { from, to }))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::process::Command;

    use super::*;

    /// A tmpfs of `size` mounted at a temp dir, unmounted on drop; `None` where mounting is not
    /// allowed (not root), and the test returns early.
    struct SmallDisk(tempfile::TempDir);

    impl SmallDisk {
        fn mount(size: &str) -> Option<SmallDisk> {
            let dir = tempfile::tempdir().unwrap();
            let mounted = Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs"])
                .arg(dir.path())
                .output()
                .is_ok_and(|out| out.status.success());
            if !mounted {
                eprintln!("skipping: cannot mount a tmpfs (needs root)");
            }
            mounted.then_some(SmallDisk(dir))
        }

        fn path(&self) -> &Path {
            self.0.path()
        }
    }

    impl Drop for SmallDisk {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(self.0.path()).status();
        }
    }

    /// Writes `path` until the file system is full.
    fn fill(path: &Path) {
        let mut file = std::fs::File::create(path).unwrap();
        let chunk = vec![1u8; 64 << 10];
        while file.write_all(&chunk).is_ok() {}
    }

    #[test]
    fn an_existing_file_without_room_for_its_reservation_is_opened_with_copied_writes() {
        let Some(disk) = SmallDisk::mount("16m") else { return };
        assert_eq!(Writes::for_dir(disk.path()), Writes::Mapped, "tmpfs writes reserved blocks in place");
        // A file left by copied writes: shorter than a reservation, not a whole number of granules.
        std::fs::write(disk.path().join("data.mdb"), vec![7u8; 1_500_000]).unwrap();
        fill(&disk.path().join("filler"));
        let ceiling = 1 << 30;

        let (writes, map_size) =
            plan(disk.path(), Writes::Mapped, 1_500_000, ceiling).expect("a full disk is no error");
        assert_eq!((writes, map_size), (Writes::Copied, ceiling));
        assert_eq!(std::fs::metadata(disk.path().join("data.mdb")).unwrap().len(), 1_500_000, "the file is as it was");

        // With room again, the same file is reserved for mapped writes.
        std::fs::remove_file(disk.path().join("filler")).unwrap();
        assert_eq!(plan(disk.path(), Writes::Mapped, 1_500_000, ceiling).unwrap(), (Writes::Mapped, MIN_RESERVE));
        let meta = std::fs::metadata(disk.path().join("data.mdb")).unwrap();
        assert_eq!(meta.len(), MIN_RESERVE);
        assert!(std::os::unix::fs::MetadataExt::blocks(&meta) * 512 >= MIN_RESERVE);
    }

    #[test]
    fn other_file_systems_get_copied_writes() {
        // /proc is neither ext4 nor tmpfs.
        assert_eq!(Writes::for_dir(Path::new("/proc")), Writes::Copied);
    }
}
