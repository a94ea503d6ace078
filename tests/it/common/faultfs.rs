//! faultfs: an in-memory FUSE file system that loses what a power loss loses.
//!
//! It models a disk behind a volatile cache. Every read and write sees the *current* state (file
//! contents, directory entries), as the page cache does; what would survive a power loss is the
//! *durable* state:
//!
//! * a file's data and size as of its last `fsync`/`fdatasync` (closing a file makes nothing
//!   durable);
//! * a directory's entries (name → inode) as of its last `fsync` of the directory. A new file or
//!   directory, a rename, an unlink or a hard link is durable only once the directory holding the
//!   name is synced (the strict POSIX reading: a file's own `fsync` does not make its name
//!   durable, nor does a directory's `fsync` make the directory's name in its parent durable).
//!
//! [`FaultFs::power_loss`] stops the file system at once (later requests fail with EIO), unmounts
//! it and writes the durable image into the now empty mount point, a real directory a process can
//! start on normally. [`Loss::Torn`] also keeps each page written since its file's last sync with
//! probability 1/2 (and picks the synced or the current size), as a real power loss may persist
//! some of the writeback that was in progress; unsynced directory changes are always dropped.
//!
//! Data is kept per 4 KiB page, shared between the current and the durable state until written
//! again (copy on write), with the pages written since the last sync tracked per file: a sync
//! costs what was written since the previous one, and a page never written (a hole, a
//! `fallocate`d range) costs nothing.
//!
//! Supported: lookup, getattr, setattr (size, mode, owner, times), mknod (regular files), create,
//! open/release, read, write, flush, fsync, opendir/readdir/releasedir, fsyncdir, mkdir, rmdir,
//! unlink, rename (with NOREPLACE and EXCHANGE, replacing a target), link, fallocate (mode 0 and
//! KEEP_SIZE), statfs (1 TiB free), access. `flock` and POSIX locks are left to the kernel, which
//! keeps them locally when the file system does not take them. No writeback cache: the kernel
//! sends every write through, so the page cache (and any mmap reading it) matches this state.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    AccessFlags, BsdFileFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

/// The unit of data tracking (and of the torn mode's choices).
pub(crate) const PAGE: usize = 4096;
const PAGE_U64: u64 = PAGE as u64;
/// How long the kernel may cache attributes and names: everything changes through the kernel, so
/// its caches stay right; a short TTL only bounds the damage of a mistake here.
const TTL: Duration = Duration::from_secs(1);
/// What statfs reports: 1 TiB, all of it free.
const TOTAL_BLOCKS: u64 = (1 << 40) / PAGE_U64;

/// `st_mode`'s file type bits, and a regular file's.
const S_IFMT: u32 = 0o170_000;
const S_IFREG: u32 = 0o100_000;

type Page = Arc<[u8; PAGE]>;

/// How a power loss treats what was written but not synced.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Loss {
    /// Only the durable state survives.
    Clean,
    /// The durable state, plus each page written since its file's last sync independently kept or
    /// dropped (and the synced or the current size), chosen by a generator seeded with `seed`.
    Torn { seed: u64 },
}

/// What a power loss kept and lost.
#[derive(Debug, Default)]
#[allow(
    dead_code,
    reason = "the sync counts and the interrupted file are read through Debug: the report a failing test prints"
)]
pub(crate) struct PowerLoss {
    pub files: usize,
    pub dirs: usize,
    /// Pages written since their file's last sync: kept in the image / lost.
    pub unsynced_pages_kept: usize,
    pub unsynced_pages_lost: usize,
    /// Paths that existed at the power loss and are not in the image (a lost directory stands for
    /// everything under it).
    pub lost_paths: Vec<String>,
    /// Paths in the image that no longer existed at the power loss (unsynced unlinks and renames).
    pub revived_paths: Vec<String>,
    /// `fsync`s of files and of directories the file system served while mounted.
    pub file_syncs: u64,
    pub dir_syncs: u64,
    /// The file whose sync the power loss interrupted ([`FaultFs::stop_at_next_sync`]).
    pub interrupted_sync: Option<String>,
}

/// A file's bytes: its size and its non-zero pages (an absent page reads as zeros).
#[derive(Clone, Default)]
struct Data {
    size: u64,
    pages: BTreeMap<u64, Page>,
}

impl Data {
    fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        let end = self.size.min(offset.saturating_add(len as u64));
        if offset >= end {
            return Vec::new();
        }
        let mut out = vec![0; (end - offset) as usize];
        let mut at = offset;
        while at < end {
            let index = at / PAGE_U64;
            let in_page = (at % PAGE_U64) as usize;
            let n = (PAGE - in_page).min((end - at) as usize);
            if let Some(page) = self.pages.get(&index) {
                let dst = (at - offset) as usize;
                out[dst..dst + n].copy_from_slice(&page[in_page..in_page + n]);
            }
            at += n as u64;
        }
        out
    }

    /// Writes `bytes` at `offset`; every page touched goes into `dirty`.
    fn write(&mut self, offset: u64, bytes: &[u8], dirty: &mut BTreeSet<u64>) {
        let mut done = 0;
        while done < bytes.len() {
            let at = offset + done as u64;
            let index = at / PAGE_U64;
            let in_page = (at % PAGE_U64) as usize;
            let n = (PAGE - in_page).min(bytes.len() - done);
            let page = self.pages.entry(index).or_insert_with(|| Arc::new([0; PAGE]));
            Arc::make_mut(page)[in_page..in_page + n].copy_from_slice(&bytes[done..done + n]);
            dirty.insert(index);
            done += n;
        }
        self.size = self.size.max(offset + bytes.len() as u64);
    }

    /// Sets the size; bytes past a smaller size are dropped (so a later extension reads zeros).
    fn resize(&mut self, size: u64, dirty: &mut BTreeSet<u64>) {
        if size < self.size {
            let first_gone = size.div_ceil(PAGE_U64);
            let gone: Vec<u64> = self.pages.range(first_gone..).map(|(&i, _)| i).collect();
            for index in gone {
                self.pages.remove(&index);
                dirty.insert(index);
            }
            let tail = (size % PAGE_U64) as usize;
            if tail != 0 {
                if let Some(page) = self.pages.get_mut(&(size / PAGE_U64)) {
                    Arc::make_mut(page)[tail..].fill(0);
                    dirty.insert(size / PAGE_U64);
                }
            }
        }
        self.size = size;
    }

    fn allocated_pages(&self) -> u64 {
        self.pages.len() as u64
    }
}

enum Body {
    File {
        current: Data,
        durable: Data,
        /// Pages whose current content may differ from the durable one.
        dirty: BTreeSet<u64>,
    },
    Dir {
        entries: BTreeMap<OsString, u64>,
        durable: BTreeMap<OsString, u64>,
        parent: u64,
    },
}

struct Inode {
    body: Body,
    mode: u16,
    uid: u32,
    gid: u32,
    nlink: u32,
    atime: SystemTime,
    mtime: SystemTime,
    ctime: SystemTime,
}

impl Inode {
    fn kind(&self) -> FileType {
        match self.body {
            Body::File { .. } => FileType::RegularFile,
            Body::Dir { .. } => FileType::Directory,
        }
    }

    fn attr(&self, ino: u64) -> FileAttr {
        let (size, blocks) = match &self.body {
            Body::File { current, .. } => (current.size, current.allocated_pages() * (PAGE_U64 / 512)),
            Body::Dir { entries, .. } => (entries.len() as u64, 0),
        };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks,
            atime: self.atime,
            mtime: self.mtime,
            ctime: self.ctime,
            crtime: self.ctime,
            kind: self.kind(),
            perm: self.mode,
            nlink: self.nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: PAGE as u32,
            flags: 0,
        }
    }
}

/// The whole file system: every inode ever created (an unlinked one may still be named by a
/// durable directory entry, so none is ever freed), and the open directory listings.
struct Disk {
    inodes: HashMap<u64, Inode>,
    next_ino: u64,
    listings: HashMap<u64, Vec<(u64, FileType, OsString)>>,
    next_fh: u64,
    /// Set by the power loss: from then on every request fails.
    stopped: bool,
    /// [`FaultFs::stop_at_next_sync`]: the next file sync is where the power goes out.
    stop_at_sync: bool,
    /// The file whose sync the power loss interrupted.
    interrupted_sync: Option<u64>,
    file_syncs: u64,
    dir_syncs: u64,
    /// Syncs served per file inode ([`FaultFs::file_syncs_of`]).
    syncs_per_file: HashMap<u64, u64>,
}

const ROOT: u64 = 1;

type Result<T> = std::result::Result<T, Errno>;

/// Whether a name holding `body` may be removed, or replaced, by an operation on a directory
/// (`dir`) or on a file: rmdir and rename's errors.
fn replaceable(body: &Body, dir: bool) -> Result<()> {
    match (body, dir) {
        (Body::Dir { entries, .. }, true) if !entries.is_empty() => Err(Errno::ENOTEMPTY),
        (Body::Dir { .. }, false) => Err(Errno::EISDIR),
        (Body::File { .. }, true) => Err(Errno::ENOTDIR),
        _ => Ok(()),
    }
}

impl Disk {
    fn new() -> Disk {
        let now = SystemTime::now();
        let root = Inode {
            body: Body::Dir { entries: BTreeMap::new(), durable: BTreeMap::new(), parent: ROOT },
            mode: 0o700,
            uid: rustix_uid(),
            gid: rustix_gid(),
            nlink: 2,
            atime: now,
            mtime: now,
            ctime: now,
        };
        Disk {
            inodes: HashMap::from([(ROOT, root)]),
            next_ino: ROOT + 1,
            listings: HashMap::new(),
            next_fh: 1,
            stopped: false,
            stop_at_sync: false,
            interrupted_sync: None,
            file_syncs: 0,
            dir_syncs: 0,
            syncs_per_file: HashMap::new(),
        }
    }

    fn inode(&self, ino: u64) -> Result<&Inode> {
        self.inodes.get(&ino).ok_or(Errno::ENOENT)
    }

    fn inode_mut(&mut self, ino: u64) -> Result<&mut Inode> {
        self.inodes.get_mut(&ino).ok_or(Errno::ENOENT)
    }

    fn entries(&self, dir: u64) -> Result<&BTreeMap<OsString, u64>> {
        match &self.inode(dir)?.body {
            Body::Dir { entries, .. } => Ok(entries),
            Body::File { .. } => Err(Errno::ENOTDIR),
        }
    }

    fn entries_mut(&mut self, dir: u64) -> Result<&mut BTreeMap<OsString, u64>> {
        match &mut self.inode_mut(dir)?.body {
            Body::Dir { entries, .. } => Ok(entries),
            Body::File { .. } => Err(Errno::ENOTDIR),
        }
    }

    fn touch_dir(&mut self, dir: u64) {
        if let Some(inode) = self.inodes.get_mut(&dir) {
            let now = SystemTime::now();
            inode.mtime = now;
            inode.ctime = now;
        }
    }

    fn lookup(&self, parent: u64, name: &OsStr) -> Result<FileAttr> {
        let ino = *self.entries(parent)?.get(name).ok_or(Errno::ENOENT)?;
        Ok(self.inode(ino)?.attr(ino))
    }

    /// A new inode named `name` in `parent`.
    fn add(&mut self, req: &Request, parent: u64, name: &OsStr, mode: u32, dir: bool) -> Result<FileAttr> {
        if name.len() > 255 {
            return Err(Errno::ENAMETOOLONG);
        }
        if self.entries(parent)?.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        let now = SystemTime::now();
        let body = if dir {
            Body::Dir { entries: BTreeMap::new(), durable: BTreeMap::new(), parent }
        } else {
            Body::File { current: Data::default(), durable: Data::default(), dirty: BTreeSet::new() }
        };
        let inode = Inode {
            body,
            mode: (mode & 0o7777) as u16,
            uid: req.uid(),
            gid: req.gid(),
            nlink: if dir { 2 } else { 1 },
            atime: now,
            mtime: now,
            ctime: now,
        };
        let ino = self.next_ino;
        self.next_ino += 1;
        let attr = inode.attr(ino);
        self.inodes.insert(ino, inode);
        self.entries_mut(parent)?.insert(name.to_os_string(), ino);
        if dir {
            self.inode_mut(parent)?.nlink += 1;
        }
        self.touch_dir(parent);
        Ok(attr)
    }

    /// Removes the name `name` from `parent` (the inode lives on: see [`Disk`]).
    fn remove(&mut self, parent: u64, name: &OsStr, want_dir: bool) -> Result<()> {
        let ino = *self.entries(parent)?.get(name).ok_or(Errno::ENOENT)?;
        replaceable(&self.inode(ino)?.body, want_dir)?;
        self.entries_mut(parent)?.remove(name);
        self.unlinked(ino, parent);
        self.touch_dir(parent);
        Ok(())
    }

    /// Accounting once one name of `ino` in `parent` is gone.
    fn unlinked(&mut self, ino: u64, parent: u64) {
        let is_dir = matches!(self.inodes[&ino].body, Body::Dir { .. });
        let inode = self.inodes.get_mut(&ino).expect("named inode");
        inode.nlink = if is_dir { 0 } else { inode.nlink.saturating_sub(1) };
        inode.ctime = SystemTime::now();
        if is_dir {
            if let Some(p) = self.inodes.get_mut(&parent) {
                p.nlink = p.nlink.saturating_sub(1);
            }
        }
    }

    /// Whether `ancestor` is `dir` or one of its ancestors (in the current tree).
    fn is_ancestor(&self, ancestor: u64, mut dir: u64) -> bool {
        loop {
            if dir == ancestor {
                return true;
            }
            match self.inodes.get(&dir).map(|i| &i.body) {
                Some(Body::Dir { parent, .. }) if *parent != dir => dir = *parent,
                _ => return false,
            }
        }
    }

    fn set_parent(&mut self, ino: u64, new_parent: u64) {
        if let Some(Inode { body: Body::Dir { parent, .. }, .. }) = self.inodes.get_mut(&ino) {
            *parent = new_parent;
        }
    }

    fn rename(&mut self, parent: u64, name: &OsStr, newparent: u64, newname: &OsStr, flags: RenameFlags) -> Result<()> {
        if newname.len() > 255 {
            return Err(Errno::ENAMETOOLONG);
        }
        let ino = *self.entries(parent)?.get(name).ok_or(Errno::ENOENT)?;
        let target = self.entries(newparent)?.get(newname).copied();
        let moving_dir = matches!(self.inode(ino)?.body, Body::Dir { .. });
        if moving_dir && parent != newparent && self.is_ancestor(ino, newparent) {
            return Err(Errno::EINVAL);
        }
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            let other = target.ok_or(Errno::ENOENT)?;
            if matches!(self.inode(other)?.body, Body::Dir { .. })
                && parent != newparent
                && self.is_ancestor(other, parent)
            {
                return Err(Errno::EINVAL);
            }
            self.entries_mut(parent)?.insert(name.to_os_string(), other);
            self.entries_mut(newparent)?.insert(newname.to_os_string(), ino);
            self.set_parent(ino, newparent);
            self.set_parent(other, parent);
            self.touch_dir(parent);
            self.touch_dir(newparent);
            return Ok(());
        }
        if !(flags - RenameFlags::RENAME_NOREPLACE).is_empty() {
            return Err(Errno::EINVAL);
        }
        if let Some(target) = target {
            if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                return Err(Errno::EEXIST);
            }
            if target == ino {
                return Ok(()); // two names of one file: nothing happens
            }
            replaceable(&self.inode(target)?.body, moving_dir)?;
            self.entries_mut(newparent)?.remove(newname);
            self.unlinked(target, newparent);
        }
        self.entries_mut(parent)?.remove(name);
        self.entries_mut(newparent)?.insert(newname.to_os_string(), ino);
        if moving_dir && parent != newparent {
            self.set_parent(ino, newparent);
            self.inode_mut(parent)?.nlink -= 1;
            self.inode_mut(newparent)?.nlink += 1;
        }
        self.inode_mut(ino)?.ctime = SystemTime::now();
        self.touch_dir(parent);
        self.touch_dir(newparent);
        Ok(())
    }

    fn link(&mut self, ino: u64, newparent: u64, newname: &OsStr) -> Result<FileAttr> {
        if matches!(self.inode(ino)?.body, Body::Dir { .. }) {
            return Err(Errno::EPERM);
        }
        if self.entries(newparent)?.contains_key(newname) {
            return Err(Errno::EEXIST);
        }
        self.entries_mut(newparent)?.insert(newname.to_os_string(), ino);
        self.touch_dir(newparent);
        let inode = self.inode_mut(ino)?;
        inode.nlink += 1;
        inode.ctime = SystemTime::now();
        Ok(inode.attr(ino))
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &mut self,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
    ) -> Result<FileAttr> {
        let inode = self.inode_mut(ino)?;
        let now = SystemTime::now();
        if let Some(size) = size {
            match &mut inode.body {
                Body::File { current, dirty, .. } => current.resize(size, dirty),
                Body::Dir { .. } => return Err(Errno::EISDIR),
            }
            inode.mtime = now;
        }
        if let Some(mode) = mode {
            inode.mode = (mode & 0o7777) as u16;
        }
        if let Some(uid) = uid {
            inode.uid = uid;
        }
        if let Some(gid) = gid {
            inode.gid = gid;
        }
        let at = |t: TimeOrNow| match t {
            TimeOrNow::SpecificTime(t) => t,
            TimeOrNow::Now => now,
        };
        if let Some(t) = atime {
            inode.atime = at(t);
        }
        if let Some(t) = mtime {
            inode.mtime = at(t);
        }
        inode.ctime = now;
        Ok(inode.attr(ino))
    }

    fn read(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        match &self.inode(ino)?.body {
            Body::File { current, .. } => Ok(current.read(offset, size as usize)),
            Body::Dir { .. } => Err(Errno::EISDIR),
        }
    }

    fn write(&mut self, ino: u64, offset: u64, data: &[u8]) -> Result<u32> {
        let inode = self.inode_mut(ino)?;
        match &mut inode.body {
            Body::File { current, dirty, .. } => current.write(offset, data, dirty),
            Body::Dir { .. } => return Err(Errno::EISDIR),
        }
        let now = SystemTime::now();
        inode.mtime = now;
        inode.ctime = now;
        Ok(data.len() as u32)
    }

    fn fallocate(&mut self, ino: u64, offset: u64, length: u64, mode: i32) -> Result<()> {
        const KEEP_SIZE: i32 = 0x01;
        if mode & !KEEP_SIZE != 0 {
            return Err(Errno::EOPNOTSUPP); // punching holes, zeroing ranges: not modelled
        }
        let inode = self.inode_mut(ino)?;
        match &mut inode.body {
            // Allocated blocks read as zeros: nothing to store, only the size may grow.
            Body::File { current, .. } => {
                let end = offset.checked_add(length).ok_or(Errno::EFBIG)?;
                if mode & KEEP_SIZE == 0 && end > current.size {
                    current.size = end;
                    inode.ctime = SystemTime::now();
                }
                Ok(())
            }
            Body::Dir { .. } => Err(Errno::EISDIR),
        }
    }

    fn fsync(&mut self, ino: u64) -> Result<()> {
        if self.stop_at_sync {
            // The power goes out while the disk writes this file's pages: none of them is synced.
            self.stopped = true;
            self.interrupted_sync = Some(ino);
            return Err(Errno::EIO);
        }
        self.file_syncs += 1;
        *self.syncs_per_file.entry(ino).or_default() += 1;
        match &mut self.inode_mut(ino)?.body {
            Body::File { current, durable, dirty } => {
                for index in std::mem::take(dirty) {
                    match current.pages.get(&index) {
                        Some(page) => durable.pages.insert(index, page.clone()),
                        None => durable.pages.remove(&index),
                    };
                }
                durable.size = current.size;
                Ok(())
            }
            Body::Dir { .. } => Err(Errno::EISDIR),
        }
    }

    fn fsyncdir(&mut self, ino: u64) -> Result<()> {
        self.dir_syncs += 1;
        match &mut self.inode_mut(ino)?.body {
            Body::Dir { entries, durable, .. } => {
                durable.clone_from(entries);
                Ok(())
            }
            Body::File { .. } => Err(Errno::ENOTDIR),
        }
    }

    fn opendir(&mut self, ino: u64) -> Result<u64> {
        let inode = self.inode(ino)?;
        let Body::Dir { entries, parent, .. } = &inode.body else { return Err(Errno::ENOTDIR) };
        let mut listing =
            vec![(ino, FileType::Directory, OsString::from(".")), (*parent, FileType::Directory, OsString::from(".."))];
        for (name, &child) in entries {
            listing.push((child, self.inode(child)?.kind(), name.clone()));
        }
        let fh = self.next_fh;
        self.next_fh += 1;
        self.listings.insert(fh, listing);
        Ok(fh)
    }
}

fn rustix_uid() -> u32 {
    rustix::process::getuid().as_raw()
}

fn rustix_gid() -> u32 {
    rustix::process::getgid().as_raw()
}

/// The `fuser` side: every request locks the disk, checks it is still powered, and answers.
struct Fs {
    disk: Arc<Mutex<Disk>>,
}

fn lock(disk: &Mutex<Disk>) -> MutexGuard<'_, Disk> {
    disk.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Fs {
    /// Runs `f` on the disk unless the power is off.
    fn with<T>(&self, f: impl FnOnce(&mut Disk) -> Result<T>) -> Result<T> {
        let mut disk = lock(&self.disk);
        if disk.stopped {
            return Err(Errno::EIO);
        }
        f(&mut disk)
    }
}

fn empty(reply: ReplyEmpty, r: Result<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

fn entry(reply: ReplyEntry, r: Result<FileAttr>) {
    match r {
        Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
        Err(e) => reply.error(e),
    }
}

fn attr(reply: ReplyAttr, r: Result<FileAttr>) {
    match r {
        Ok(attr) => reply.attr(&TTL, &attr),
        Err(e) => reply.error(e),
    }
}

impl Filesystem for Fs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        entry(reply, self.with(|d| d.lookup(parent.0, name)));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        attr(reply, self.with(|d| Ok(d.inode(ino.0)?.attr(ino.0))));
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        attr(reply, self.with(|d| d.setattr(ino.0, mode, uid, gid, size, atime, mtime)));
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & S_IFMT != S_IFREG {
            return reply.error(Errno::EPERM); // only regular files are modelled
        }
        entry(reply, self.with(|d| d.add(req, parent.0, name, mode, false)));
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, reply: ReplyEntry) {
        entry(reply, self.with(|d| d.add(req, parent.0, name, mode, true)));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.with(|d| d.remove(parent.0, name, false)));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.with(|d| d.remove(parent.0, name, true)));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.with(|d| d.rename(parent.0, name, newparent.0, newname, flags)));
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        entry(reply, self.with(|d| d.link(ino.0, newparent.0, newname)));
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.with(|d| d.inode(ino.0).map(|_| ())) {
            // No FOPEN_KEEP_CACHE: the kernel drops its cached pages of the file at every open.
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.with(|d| d.read(ino.0, offset, size)) {
            Ok(bytes) => reply.data(&bytes),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.with(|d| d.write(ino.0, offset, data)) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    /// `close`: makes nothing durable.
    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        empty(reply, self.with(|_| Ok(())));
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    /// `fsync` and `fdatasync` alike: the data and the size.
    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        empty(reply, self.with(|d| d.fsync(ino.0)));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.with(|d| d.opendir(ino.0)) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    /// Served from the listing taken at `opendir`: removing entries while listing skips none.
    fn readdir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let disk = lock(&self.disk);
        let Some(listing) = disk.listings.get(&fh.0) else { return reply.error(Errno::EBADF) };
        for (i, (ino, kind, name)) in listing.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        lock(&self.disk).listings.remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        empty(reply, self.with(|d| d.fsyncdir(ino.0)));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let used: u64 = lock(&self.disk)
            .inodes
            .values()
            .map(|i| match &i.body {
                Body::File { current, .. } => current.allocated_pages(),
                Body::Dir { .. } => 0,
            })
            .sum();
        let free = TOTAL_BLOCKS.saturating_sub(used);
        reply.statfs(TOTAL_BLOCKS, free, free, 1 << 20, 1 << 20, PAGE as u32, 255, PAGE as u32);
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        empty(reply, self.with(|d| d.inode(ino.0).map(|_| ())));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        match self.with(|d| d.add(req, parent.0, name, mode, false)) {
            Ok(attr) => reply.created(&TTL, &attr, Generation(0), FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.with(|d| d.fallocate(ino.0, offset, length, mode)));
    }
}

/// A mounted faultfs. Dropping it unmounts it (lazily if it is still in use); the image is only
/// written by [`FaultFs::power_loss`].
pub(crate) struct FaultFs {
    mountpoint: PathBuf,
    disk: Arc<Mutex<Disk>>,
    session: Option<fuser::BackgroundSession>,
}

impl FaultFs {
    /// Mounts an empty faultfs on `mountpoint` (an existing empty directory). `Err` says why FUSE
    /// is not available here (no `/dev/fuse`, or the mount was refused).
    pub(crate) fn mount(mountpoint: &Path) -> std::result::Result<FaultFs, String> {
        if !Path::new("/dev/fuse").exists() {
            return Err("no /dev/fuse".into());
        }
        let disk = Arc::new(Mutex::new(Disk::new()));
        let mut config = fuser::Config::default();
        config.mount_options = vec![MountOption::FSName("faultfs".into()), MountOption::NoDev, MountOption::NoSuid];
        let session = fuser::spawn_mount(Fs { disk: disk.clone() }, mountpoint, &config)
            .map_err(|e| format!("cannot mount a FUSE file system on {}: {e}", mountpoint.display()))?;
        Ok(FaultFs { mountpoint: mountpoint.to_path_buf(), disk, session: Some(session) })
    }

    pub(crate) fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// The power goes out during the next `fsync`/`fdatasync` of a file: that sync fails (EIO)
    /// and persists nothing, and so does every request after it. See [`FaultFs::stopped`].
    pub(crate) fn stop_at_next_sync(&self) {
        lock(&self.disk).stop_at_sync = true;
    }

    /// How many times the file now at `path` (relative to the mount point) has been synced, 0 if
    /// there is none.
    pub(crate) fn file_syncs_of(&self, path: &Path) -> u64 {
        let disk = lock(&self.disk);
        let wanted = Path::new("/").join(path);
        disk.syncs_per_file
            .iter()
            .find(|(&ino, _)| Path::new(&path_of(&disk, ROOT, ino, String::new())) == wanted)
            .map_or(0, |(_, &syncs)| syncs)
    }

    /// Whether the power is out (every request fails).
    pub(crate) fn stopped(&self) -> bool {
        lock(&self.disk).stopped
    }

    /// The power goes out: every later request fails, the file system is unmounted, and what
    /// `loss` keeps of it is written into the (now plain) mount point directory. Nothing may still
    /// use the file system (kill the processes that did first).
    pub(crate) fn power_loss(mut self, loss: Loss) -> io::Result<PowerLoss> {
        lock(&self.disk).stopped = true;
        self.unmount()?;
        let disk = lock(&self.disk);
        let mut report = PowerLoss {
            file_syncs: disk.file_syncs,
            dir_syncs: disk.dir_syncs,
            interrupted_sync: disk.interrupted_sync.map(|ino| path_of(&disk, ROOT, ino, String::new())),
            ..PowerLoss::default()
        };
        let mut rng = match loss {
            Loss::Clean => None,
            Loss::Torn { seed } => Some(SplitMix64(seed)),
        };
        let mut written: HashMap<u64, PathBuf> = HashMap::new();
        let mut on_path = vec![ROOT];
        materialize(&disk, ROOT, &self.mountpoint, &mut rng, &mut report, &mut written, &mut on_path)?;
        let root_mode = u32::from(disk.inodes[&ROOT].mode);
        std::fs::set_permissions(&self.mountpoint, std::fs::Permissions::from_mode(root_mode))?;
        let durable = |d: &Disk, ino| match &d.inodes[&ino].body {
            Body::Dir { durable, .. } => Some(durable.clone()),
            Body::File { .. } => None,
        };
        let current = |d: &Disk, ino| match &d.inodes[&ino].body {
            Body::Dir { entries, .. } => Some(entries.clone()),
            Body::File { .. } => None,
        };
        diff_trees(&disk, ROOT, ROOT, "", &current, &durable, &mut report.lost_paths);
        diff_trees(&disk, ROOT, ROOT, "", &durable, &current, &mut report.revived_paths);
        Ok(report)
    }

    /// Unmounts, waiting a little for the kernel to let go of files just closed by a killed
    /// process; then the FUSE thread ends.
    fn unmount(&mut self) -> io::Result<()> {
        let Some(session) = self.session.take() else { return Ok(()) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match unmount(&self.mountpoint, false) {
                Ok(()) => break,
                Err(e)
                    if e.raw_os_error() == Some(rustix::io::Errno::BUSY.raw_os_error())
                        && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(e) => {
                    let _ = unmount(&self.mountpoint, true);
                    std::mem::forget(session); // joining could wait for whoever still uses it
                    return Err(io::Error::other(format!("unmount {}: {e}", self.mountpoint.display())));
                }
            }
        }
        match session.join() {
            // Unmounted: the FUSE thread's next read of the device ends it, with ENODEV, or with
            // ECONNABORTED when the kernel tore the connection down first (the suite met that once,
            // on a busy machine, right after the server was killed with requests in flight).
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::CONNABORTED.raw_os_error()) => Ok(()),
            ended => ended,
        }
    }
}

/// `umount2` (lazily: `MNT_DETACH`); where that is not allowed (not root: fuser mounted through the
/// setuid `fusermount3`), `fusermount3 -u` (`-z`).
fn unmount(mountpoint: &Path, lazy: bool) -> io::Result<()> {
    let flags = if lazy { rustix::mount::UnmountFlags::DETACH } else { rustix::mount::UnmountFlags::empty() };
    match rustix::mount::unmount(mountpoint, flags) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::PERM) => {
            let mut last = io::Error::other("no fusermount3 or fusermount");
            for helper in ["fusermount3", "fusermount"] {
                let mut cmd = std::process::Command::new(helper);
                cmd.arg(if lazy { "-uz" } else { "-u" }).arg(mountpoint);
                match cmd.output() {
                    Ok(out) if out.status.success() => return Ok(()),
                    Ok(out) => last = io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_string()),
                    Err(e) => last = e,
                }
            }
            Err(last)
        }
        Err(e) => Err(e.into()),
    }
}

impl Drop for FaultFs {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            lock(&self.disk).stopped = true;
            // Lazily if need be, so a process still using it (a test that panicked before killing
            // its server) cannot keep the mount behind; the FUSE thread ends once the kernel lets go.
            if unmount(&self.mountpoint, false).is_ok() {
                let _ = session.join();
            } else {
                let _ = unmount(&self.mountpoint, true);
                std::mem::forget(session); // joining could wait for that process
            }
        }
    }
}

/// Writes the durable image of directory `dir` into `path` (an existing directory).
fn materialize(
    disk: &Disk,
    dir: u64,
    path: &Path,
    rng: &mut Option<SplitMix64>,
    report: &mut PowerLoss,
    written: &mut HashMap<u64, PathBuf>,
    on_path: &mut Vec<u64>,
) -> io::Result<()> {
    let Body::Dir { durable, .. } = &disk.inodes[&dir].body else { unreachable!("a directory") };
    for (name, &ino) in durable {
        let inode = &disk.inodes[&ino];
        let child = path.join(name);
        match &inode.body {
            Body::Dir { .. } => {
                if on_path.contains(&ino) {
                    continue; // a cycle only unsynced renames of directories could make
                }
                std::fs::create_dir(&child)?;
                report.dirs += 1;
                on_path.push(ino);
                materialize(disk, ino, &child, rng, report, written, on_path)?;
                on_path.pop();
            }
            Body::File { current, durable, dirty } => {
                if let Some(first) = written.get(&ino) {
                    std::fs::hard_link(first, &child)?;
                    continue;
                }
                let mut pages = durable.pages.clone();
                let mut size = durable.size;
                if let Some(rng) = rng.as_mut() {
                    if current.size != durable.size && rng.coin() {
                        size = current.size;
                    }
                    for &index in dirty {
                        if rng.coin() {
                            report.unsynced_pages_kept += 1;
                            match current.pages.get(&index) {
                                Some(page) => pages.insert(index, page.clone()),
                                None => pages.remove(&index),
                            };
                        } else {
                            report.unsynced_pages_lost += 1;
                        }
                    }
                } else {
                    report.unsynced_pages_lost += dirty.len();
                }
                let file = std::fs::File::create(&child)?;
                file.set_len(size)?;
                for (&index, page) in &pages {
                    let at = index * PAGE_U64;
                    if at >= size || page.iter().all(|&b| b == 0) {
                        continue;
                    }
                    let n = (size - at).min(PAGE_U64) as usize;
                    file.write_all_at(&page[..n], at)?;
                }
                file.set_permissions(std::fs::Permissions::from_mode(u32::from(inode.mode)))?;
                written.insert(ino, child);
                report.files += 1;
            }
        }
        if let Body::Dir { .. } = &inode.body {
            std::fs::set_permissions(path.join(name), std::fs::Permissions::from_mode(u32::from(inode.mode)))?;
        }
    }
    Ok(())
}

/// A current path of `ino` under directory `dir` (`prefix`), or `inode N` if it has none.
fn path_of(disk: &Disk, dir: u64, ino: u64, prefix: String) -> String {
    let mut stack = vec![(dir, prefix)];
    while let Some((dir, prefix)) = stack.pop() {
        let Body::Dir { entries, .. } = &disk.inodes[&dir].body else { continue };
        for (name, &child) in entries {
            let path = format!("{prefix}/{}", String::from_utf8_lossy(name.as_bytes()));
            if child == ino {
                return path;
            }
            if matches!(disk.inodes[&child].body, Body::Dir { .. }) && child != dir {
                stack.push((child, path));
            }
        }
    }
    format!("inode {ino} (unlinked)")
}

type Tree = dyn Fn(&Disk, u64) -> Option<BTreeMap<OsString, u64>>;

/// Paths under `a_dir` in tree `a` that tree `b` (at `b_dir`) does not have, topmost only.
fn diff_trees(disk: &Disk, a_dir: u64, b_dir: u64, prefix: &str, a: &Tree, b: &Tree, out: &mut Vec<String>) {
    let (Some(a_entries), Some(b_entries)) = (a(disk, a_dir), b(disk, b_dir)) else { return };
    for (name, &ino) in &a_entries {
        let path = format!("{prefix}/{}", String::from_utf8_lossy(name.as_bytes()));
        match b_entries.get(name) {
            Some(&other) if other == ino => {
                if out.len() < 1000 && prefix.len() < 4096 {
                    diff_trees(disk, ino, other, &path, a, b, out);
                }
            }
            _ => out.push(path),
        }
    }
}

/// A small seeded generator (SplitMix64): the torn mode's choices depend on the seed only.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn coin(&mut self) -> bool {
        self.next() >> 63 == 1
    }
}
