//! A read-only reader of bbolt files (etcd's backend), enough to walk a bucket's keys in order.
//!
//! Why not a crate (checked against a snapshot from etcd 3.4.23's `etcdctl snapshot save`):
//! `bbolt-rs` 1.3.10 refuses every etcd file ("invalid database"): it checks the meta page with
//! FNV-1 where bbolt writes FNV-1a. `bolt-lite` 0.1.0 reads that small file, but loads the whole file
//! into memory, panics on a corrupt page (unchecked slicing), recurses without bound on a page cycle
//! and looks keys up in the wrong child of a branch page.
//!
//! The file is untrusted: every offset and length is checked against the page or the file before
//! it is used, a walk visits at most as many pages as the file holds (a cycle cannot loop), and the
//! meta page must carry bbolt's magic, version 2 and a valid checksum. Pages are read one at a time
//! (`pread`), so memory stays at one page per tree level.
//!
//! Format (bbolt, little-endian): a page is `id u64, flags u16, count u16, overflow u32` then its
//! elements; a leaf element is `flags u32, pos u32, ksize u32, vsize u32` (pos from the element), a
//! branch element `pos u32, ksize u32, pgid u64`. The meta (pages 0 and 1, the valid one with the
//! higher txid wins) is `magic, version, page size, flags (u32 each), root bucket (root u64,
//! sequence u64), freelist u64, high-water pgid u64, txid u64, checksum u64`. A bucket's value is
//! its header `root u64, sequence u64`, followed by the bucket's own page when it is inline (root 0).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

pub(crate) const MAGIC: u32 = 0xED0C_DAED;
pub(crate) const VERSION: u32 = 2;
pub(crate) const BRANCH: u16 = 0x01;
pub(crate) const LEAF: u16 = 0x02;
pub(crate) const META: u16 = 0x04;
/// A leaf element that is a nested bucket.
pub(crate) const BUCKET_LEAF: u32 = 0x01;
pub(crate) const PAGE_HEADER: usize = 16;
pub(crate) const ELEMENT: usize = 16;
const META_LEN: usize = 64;
/// Deeper than any bbolt tree can be (each level multiplies the fan-out).
const MAX_DEPTH: usize = 64;

/// What a walk calls for each leaf element: key, value, element flags.
type Visit<'a> = dyn FnMut(&[u8], &[u8], u32) -> Result<(), BoltError> + 'a;

#[derive(Debug, thiserror::Error)]
pub(crate) enum BoltError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("not a bbolt database: {0}")]
    NotBolt(&'static str),
    #[error("corrupt bbolt database: {0}")]
    Corrupt(String),
}

fn corrupt(what: impl Into<String>) -> BoltError {
    BoltError::Corrupt(what.into())
}

/// Whether the file at `path` starts as a bbolt database (its first meta page has bbolt's magic): a
/// backup in etcd's format, whatever else is wrong with it.
pub(crate) fn has_magic(path: &Path) -> bool {
    let mut head = [0u8; PAGE_HEADER + 4];
    File::open(path).and_then(|f| f.read_exact_at(&mut head, 0)).is_ok() && head[PAGE_HEADER..] == MAGIC.to_le_bytes()
}

pub(crate) struct Bolt {
    file: File,
    /// Bytes of the file that belong to the database (a trailing digest excluded).
    len: u64,
    page_size: usize,
    /// Pages below the meta's high-water mark: the only ones a tree may reference.
    page_count: u64,
    root: Bucket,
}

/// Where a bucket's tree is: a root page, or its own page inline in its parent's value.
#[derive(Clone, Debug)]
pub(crate) enum Bucket {
    Root(u64),
    Inline(Vec<u8>),
}

impl Bolt {
    /// Opens the first `len` bytes of `path` as a bbolt database.
    pub(crate) fn open(path: &Path, len: u64) -> Result<Bolt, BoltError> {
        let file = File::open(path)?;
        let mut first = vec![0u8; PAGE_HEADER + META_LEN];
        if len < first.len() as u64 {
            return Err(BoltError::NotBolt("the file is too short"));
        }
        file.read_exact_at(&mut first, 0)?;
        let page_size = read_u32(&first, PAGE_HEADER + 8)? as usize;
        if !(512..=1 << 20).contains(&page_size) || !page_size.is_power_of_two() {
            // The first meta page's page size is trusted only if that page checks out below.
            if read_u32(&first, PAGE_HEADER)? != MAGIC {
                return Err(BoltError::NotBolt("no bbolt magic"));
            }
            return Err(corrupt(format!("page size {page_size}")));
        }
        let mut best: Option<Meta> = None;
        let mut first_error = None;
        for page in 0..2u64 {
            match read_meta(&file, len, page, page_size) {
                Ok(meta) => {
                    if best.as_ref().is_none_or(|b| meta.txid > b.txid) {
                        best = Some(meta);
                    }
                }
                Err(e) => first_error = first_error.or(Some(e)),
            }
        }
        let meta = best.ok_or_else(|| first_error.unwrap_or(BoltError::NotBolt("no valid meta page")))?;
        // bbolt writes the file up to its high-water mark before a meta page counts it: a shorter
        // file lost pages (a cut copy).
        let page_count = meta.high_water;
        if page_count.checked_mul(page_size as u64).is_none_or(|needed| needed > len) {
            return Err(corrupt(format!(
                "the file is truncated: its meta page counts {page_count} pages of {page_size} bytes, the file \
                 holds {len} bytes"
            )));
        }
        Ok(Bolt { file, len, page_size, page_count, root: Bucket::Root(meta.root) })
    }

    /// The top-level bucket `name`, if there is one.
    pub(crate) fn bucket(&self, name: &[u8]) -> Result<Option<Bucket>, BoltError> {
        let mut found = None;
        self.walk(&self.root.clone(), &mut |key, value, flags| {
            if key == name && flags & BUCKET_LEAF != 0 {
                found = Some(bucket_of(value)?);
            }
            Ok(())
        })?;
        Ok(found)
    }

    /// Calls `f` with every key and value of `bucket` in key order (nested buckets skipped).
    pub(crate) fn for_each(
        &self,
        bucket: &Bucket,
        mut f: impl FnMut(&[u8], &[u8]) -> Result<(), BoltError>,
    ) -> Result<(), BoltError> {
        self.walk(bucket, &mut |key, value, flags| if flags & BUCKET_LEAF == 0 { f(key, value) } else { Ok(()) })
    }

    /// Every top-level bucket, by name, in key order.
    pub(crate) fn buckets(&self) -> Result<Vec<(Vec<u8>, Bucket)>, BoltError> {
        let mut buckets = Vec::new();
        self.walk(&self.root.clone(), &mut |key, value, flags| {
            if flags & BUCKET_LEAF != 0 {
                buckets.push((key.to_vec(), bucket_of(value)?));
            }
            Ok(())
        })?;
        Ok(buckets)
    }

    /// The database's size in bytes: its pages up to the high-water mark, as bbolt's `Tx.Size`.
    pub(crate) fn size(&self) -> u64 {
        self.page_count * self.page_size as u64
    }

    fn walk(&self, bucket: &Bucket, f: &mut Visit<'_>) -> Result<(), BoltError> {
        let root = match bucket {
            Bucket::Inline(page) => return leaf_elements(page, f),
            Bucket::Root(pgid) => *pgid,
        };
        let mut visited = 0u64;
        // Depth-first, one page per level: (branch page, next child).
        let mut stack: Vec<(Vec<u8>, usize)> = Vec::new();
        let mut next = Some(root);
        loop {
            if let Some(pgid) = next.take() {
                visited += 1;
                if visited > self.page_count {
                    return Err(corrupt("a tree references more pages than the file holds"));
                }
                let page = self.page(pgid)?;
                match read_u16(&page, 8)? {
                    LEAF => leaf_elements(&page, f)?,
                    BRANCH => {
                        if stack.len() >= MAX_DEPTH {
                            return Err(corrupt("tree deeper than any bbolt tree"));
                        }
                        stack.push((page, 0));
                    }
                    flags => return Err(corrupt(format!("page {pgid}: unexpected page flags {flags:#x}"))),
                }
            }
            let Some((page, child)) = stack.last_mut() else { return Ok(()) };
            let count = read_u16(page, 10)? as usize;
            if *child >= count {
                stack.pop();
                continue;
            }
            let at = PAGE_HEADER + *child * ELEMENT;
            next = Some(read_u64(page, at + 8)?);
            *child += 1;
        }
    }

    /// Page `pgid` with its overflow pages.
    fn page(&self, pgid: u64) -> Result<Vec<u8>, BoltError> {
        if pgid < 2 || pgid >= self.page_count {
            return Err(corrupt(format!("page id {pgid} outside the file's {} pages", self.page_count)));
        }
        let offset = pgid * self.page_size as u64;
        let mut header = [0u8; PAGE_HEADER];
        self.file.read_exact_at(&mut header, offset)?;
        let overflow = u64::from(read_u32(&header, 12)?);
        let pages = overflow.checked_add(1).filter(|n| pgid.checked_add(*n).is_some_and(|end| end <= self.page_count));
        let Some(pages) = pages else {
            return Err(corrupt(format!("page {pgid}: {overflow} overflow pages run past the end of the file")));
        };
        let bytes = pages * self.page_size as u64;
        if offset + bytes > self.len {
            return Err(corrupt(format!("page {pgid} runs past the end of the file")));
        }
        let mut page = vec![0u8; bytes as usize];
        self.file.read_exact_at(&mut page, offset)?;
        Ok(page)
    }
}

struct Meta {
    root: u64,
    high_water: u64,
    txid: u64,
}

fn read_meta(file: &File, len: u64, page: u64, page_size: usize) -> Result<Meta, BoltError> {
    let offset = page * page_size as u64;
    if offset + (PAGE_HEADER + META_LEN) as u64 > len {
        return Err(BoltError::NotBolt("the file is too short"));
    }
    let mut buf = vec![0u8; PAGE_HEADER + META_LEN];
    file.read_exact_at(&mut buf, offset)?;
    if read_u16(&buf, 8)? & META == 0 {
        return Err(BoltError::NotBolt("no meta page"));
    }
    let meta = &buf[PAGE_HEADER..];
    if read_u32(meta, 0)? != MAGIC {
        return Err(BoltError::NotBolt("no bbolt magic"));
    }
    if read_u32(meta, 4)? != VERSION {
        return Err(corrupt(format!("bbolt version {} (2 expected)", read_u32(meta, 4)?)));
    }
    if read_u32(meta, 8)? as usize != page_size {
        return Err(corrupt("the meta pages disagree on the page size"));
    }
    if fnv1a(&meta[..56]) != read_u64(meta, 56)? {
        return Err(corrupt(format!("meta page {page}: checksum mismatch")));
    }
    Ok(Meta { root: read_u64(meta, 16)?, high_water: read_u64(meta, 40)?, txid: read_u64(meta, 48)? })
}

/// Calls `f` for each element of the leaf page `page` (a page read from the file, or inline).
fn leaf_elements(page: &[u8], f: &mut Visit<'_>) -> Result<(), BoltError> {
    if page.len() < PAGE_HEADER {
        return Err(corrupt("inline bucket shorter than a page header"));
    }
    if read_u16(page, 8)? != LEAF {
        return Err(corrupt("bucket page is not a leaf"));
    }
    let count = read_u16(page, 10)? as usize;
    for i in 0..count {
        let at = PAGE_HEADER + i * ELEMENT;
        let flags = read_u32(page, at)?;
        let pos = read_u32(page, at + 4)? as usize;
        let ksize = read_u32(page, at + 8)? as usize;
        let vsize = read_u32(page, at + 12)? as usize;
        let key_start = at.checked_add(pos);
        let key_end = key_start.and_then(|s| s.checked_add(ksize));
        let value_end = key_end.and_then(|e| e.checked_add(vsize)).filter(|&end| end <= page.len());
        let (Some(key_start), Some(key_end), Some(value_end)) = (key_start, key_end, value_end) else {
            return Err(corrupt(format!("leaf element {i} runs past its page")));
        };
        f(&page[key_start..key_end], &page[key_end..value_end], flags)?;
    }
    Ok(())
}

fn bucket_of(value: &[u8]) -> Result<Bucket, BoltError> {
    let root = read_u64(value, 0)?;
    if root == 0 {
        value.get(16..).map(|page| Bucket::Inline(page.to_vec())).ok_or_else(|| corrupt("short bucket header"))
    } else {
        Ok(Bucket::Root(root))
    }
}

fn read_u16(buf: &[u8], at: usize) -> Result<u16, BoltError> {
    buf.get(at..at + 2).map(|b| u16::from_le_bytes([b[0], b[1]])).ok_or_else(|| corrupt("truncated page"))
}

fn read_u32(buf: &[u8], at: usize) -> Result<u32, BoltError> {
    let bytes = buf.get(at..at + 4).ok_or_else(|| corrupt("truncated page"))?;
    Ok(u32::from_le_bytes(bytes.try_into().map_err(|_| corrupt("truncated page"))?))
}

fn read_u64(buf: &[u8], at: usize) -> Result<u64, BoltError> {
    let bytes = buf.get(at..at + 8).ok_or_else(|| corrupt("truncated page"))?;
    Ok(u64::from_le_bytes(bytes.try_into().map_err(|_| corrupt("truncated page"))?))
}

/// bbolt's meta checksum: FNV-1a, 64 bits.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}
