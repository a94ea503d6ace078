//! A writer of fresh bbolt files (etcd's backend format) by sorted bulk load: every bucket's keys come
//! in ascending order, and each tree is built bottom-up as they arrive, pages written as they fill.
//! No general B-tree: nothing is ever updated, split or freed, so the file is exactly the pages it
//! needs plus bbolt's fixed ones (two meta pages and an empty freelist).
//!
//! Memory is one open page per tree level (a page with one large element is as large as the
//! element), whatever the number of keys: a leaf page is written when the next element does not fit,
//! its first key and page id go to the level above, and so on up. When a bucket ends, the open pages
//! are written bottom-up and the top one is its root. A bucket small enough is inline in its parent's
//! value, as bbolt makes it (root 0, the leaf page after the bucket header, at most a quarter page).
//!
//! The layout is the one the reader (`backup/migrate/bolt.rs`) documents: pages 0 and 1 are the meta
//! pages (written last, when the root and the high-water mark are known), page 2 the freelist, data
//! pages from 3 on, each at `pgid * PAGE_SIZE` (an element larger than a page makes its page span
//! overflow pages). The file's length is the high-water mark times the page size: a multiple of 512,
//! as `etcdctl snapshot save` expects before the digest.

use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::backup::migrate::bolt::{fnv1a, BRANCH, BUCKET_LEAF, ELEMENT, LEAF, MAGIC, META, PAGE_HEADER, VERSION};

/// The page size written: etcd's on Linux (`os.Getpagesize()`); readers take it from the meta page.
pub(crate) const PAGE_SIZE: usize = 4096;
/// bbolt's freelist page flag.
const FREELIST: u16 = 0x10;
/// bbolt's largest value (`MaxValueSize`).
const MAX_VALUE: usize = (1 << 31) - 2;
/// The longest key an element can describe (its length is a u32). bbolt's `Put` takes keys of at most
/// 32 KiB (`MaxKeySize`), but reads any: a keyward user or role name past that (keyward's limit is
/// the request size) is written, so the backup is whole; etcd reads it, and only a `Put` of that very
/// key would be refused there.
const MAX_KEY: usize = u32::MAX as usize;
/// Elements a page holds before it may be written for lack of room (bbolt's `minKeysPerPage`): pages
/// of elements larger than a page each (overflow pages) still branch two ways, so a tree of `n` keys
/// is at most about log2(n) levels deep.
const MIN_KEYS_PER_PAGE: usize = 2;
/// A bucket header: root page id, sequence.
const BUCKET_HEADER: usize = 16;
/// The first data page: after the two meta pages and the freelist.
const FIRST_DATA_PAGE: u64 = 3;
const FREELIST_PAGE: u64 = 2;

#[derive(Debug, thiserror::Error)]
pub(crate) enum WriteError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("bucket {bucket}: {what}")]
    Invalid { bucket: String, what: String },
}

/// The file being written and the next free page.
pub(crate) struct BoltWriter {
    file: File,
    next_page: u64,
}

/// Where a finished bucket is: the value its parent holds for it.
pub(crate) struct BucketValue(Vec<u8>);

/// One bucket's tree, built as its keys arrive in order.
pub(crate) struct BucketBuilder {
    name: String,
    /// `levels[0]` is the open leaf page, each next one the open branch page above.
    levels: Vec<OpenPage>,
    last_key: Option<Vec<u8>>,
}

/// A page being filled: its elements' headers and their keys and values.
struct OpenPage {
    leaf: bool,
    /// (flags or 0, key length, value length or child page id) per element.
    elements: Vec<(u32, usize, u64)>,
    data: Vec<u8>,
    /// The first key (a branch element's key for this page).
    first_key: Vec<u8>,
    /// Pages this level already wrote: the top level is the root only if it wrote none.
    written: u64,
}

impl BoltWriter {
    /// Writes into `file` (empty, opened read-write; its content is replaced).
    pub(crate) fn new(file: File) -> Result<BoltWriter, WriteError> {
        file.set_len(0)?;
        Ok(BoltWriter { file, next_page: FIRST_DATA_PAGE })
    }

    pub(crate) fn bucket(&self, name: &str) -> BucketBuilder {
        BucketBuilder { name: name.to_string(), levels: vec![OpenPage::new(true)], last_key: None }
    }

    /// Writes the top-level bucket (whose keys are the buckets, in name order), the freelist and the
    /// meta pages; returns the file and its length.
    pub(crate) fn finish(mut self, mut root: BucketBuilder) -> Result<(File, u64), WriteError> {
        let root_page = root.finish_tree(&mut self, false)?.root_page();
        let high_water = self.next_page;
        let mut freelist = vec![0u8; PAGE_SIZE];
        page_header(&mut freelist, FREELIST_PAGE, FREELIST, 0, 0);
        self.file.write_all_at(&freelist, FREELIST_PAGE * PAGE_SIZE as u64)?;
        for (pgid, txid) in [(0u64, 1u64), (1, 2)] {
            let mut page = vec![0u8; PAGE_SIZE];
            page_header(&mut page, pgid, META, 0, 0);
            let meta = &mut page[PAGE_HEADER..];
            put_u32(meta, 0, MAGIC);
            put_u32(meta, 4, VERSION);
            put_u32(meta, 8, PAGE_SIZE as u32);
            put_u32(meta, 12, 0);
            put_u64(meta, 16, root_page);
            put_u64(meta, 24, 0);
            put_u64(meta, 32, FREELIST_PAGE);
            put_u64(meta, 40, high_water);
            put_u64(meta, 48, txid);
            let sum = fnv1a(&meta[..56]);
            put_u64(meta, 56, sum);
            self.file.write_all_at(&page, pgid * PAGE_SIZE as u64)?;
        }
        let len = high_water * PAGE_SIZE as u64;
        self.file.set_len(len)?;
        Ok((self.file, len))
    }

    /// Writes `bytes` (a whole number of pages) at the next free page; returns its id.
    fn write_pages(&mut self, bytes: &mut [u8], flags: u16, count: u16) -> Result<u64, WriteError> {
        let pages = (bytes.len() / PAGE_SIZE) as u64;
        let pgid = self.next_page;
        let overflow = u32::try_from(pages - 1).map_err(|_| std::io::Error::other("a page of over 2^32 pages"))?;
        page_header(bytes, pgid, flags, count, overflow);
        self.file.write_all_at(bytes, pgid * PAGE_SIZE as u64)?;
        self.next_page += pages;
        Ok(pgid)
    }
}

impl BucketValue {
    fn root_page(&self) -> u64 {
        u64::from_le_bytes(self.0[..8].try_into().unwrap_or_default())
    }
}

impl BucketBuilder {
    /// Adds a key and its value; keys must come in strictly ascending byte order.
    pub(crate) fn put(&mut self, writer: &mut BoltWriter, key: &[u8], value: &[u8]) -> Result<(), WriteError> {
        self.add(writer, key, value, 0)
    }

    /// Adds a finished nested bucket under `key` (in key order with the other keys).
    pub(crate) fn put_bucket(
        &mut self,
        writer: &mut BoltWriter,
        key: &[u8],
        bucket: BucketValue,
    ) -> Result<(), WriteError> {
        self.add(writer, key, &bucket.0, BUCKET_LEAF)
    }

    /// Finishes the bucket: its value for the parent (inline when bbolt would make it inline).
    pub(crate) fn finish(mut self, writer: &mut BoltWriter) -> Result<BucketValue, WriteError> {
        self.finish_tree(writer, true)
    }

    fn invalid(&self, what: impl Into<String>) -> WriteError {
        WriteError::Invalid { bucket: self.name.clone(), what: what.into() }
    }

    fn add(&mut self, writer: &mut BoltWriter, key: &[u8], value: &[u8], flags: u32) -> Result<(), WriteError> {
        if key.is_empty() || key.len() > MAX_KEY {
            return Err(self.invalid(format!("a key of {} bytes (a bbolt element takes 1 to {MAX_KEY})", key.len())));
        }
        if value.len() > MAX_VALUE {
            return Err(self.invalid(format!("a value of {} bytes (bbolt takes at most {MAX_VALUE})", value.len())));
        }
        if self.last_key.as_deref().is_some_and(|last| key <= last) {
            return Err(self.invalid("keys out of order"));
        }
        self.last_key = Some(key.to_vec());
        self.push(writer, 0, key, value, flags, 0)
    }

    /// Adds an element to the open page of `level`, writing that page first if the element does not
    /// fit and the page holds enough (and passing it up).
    fn push(
        &mut self,
        writer: &mut BoltWriter,
        level: usize,
        key: &[u8],
        value: &[u8],
        flags: u32,
        child: u64,
    ) -> Result<(), WriteError> {
        if level == self.levels.len() {
            self.levels.push(OpenPage::new(false));
        }
        let page = &self.levels[level];
        let grows_to = page.size() + ELEMENT + key.len() + value.len();
        if page.elements.len() >= MIN_KEYS_PER_PAGE && grows_to > PAGE_SIZE {
            self.write_level(writer, level)?;
        }
        let page = &mut self.levels[level];
        if page.elements.is_empty() {
            page.first_key = key.to_vec();
        }
        let third = if page.leaf { value.len() as u64 } else { child };
        page.elements.push((flags, key.len(), third));
        page.data.extend_from_slice(key);
        page.data.extend_from_slice(value);
        Ok(())
    }

    /// Writes the open page of `level` and adds it to the level above.
    fn write_level(&mut self, writer: &mut BoltWriter, level: usize) -> Result<u64, WriteError> {
        let page = std::mem::replace(&mut self.levels[level], OpenPage::new(level == 0));
        let mut bytes = page.encode(PAGE_SIZE);
        let flags = if page.leaf { LEAF } else { BRANCH };
        let pgid = writer.write_pages(&mut bytes, flags, page.count()?)?;
        self.levels[level].written = page.written + 1;
        self.push(writer, level + 1, &page.first_key, &[], 0, pgid)?;
        Ok(pgid)
    }

    /// Writes every open page bottom-up; the bucket's value (inline if `inline` allows and it fits).
    fn finish_tree(&mut self, writer: &mut BoltWriter, inline: bool) -> Result<BucketValue, WriteError> {
        let mut value = vec![0u8; BUCKET_HEADER];
        let mut level = 0;
        loop {
            let top = level + 1 == self.levels.len();
            let page = &self.levels[level];
            if top && page.written == 0 {
                if level > 0 && page.elements.len() == 1 {
                    // One child: it is the root.
                    put_u64(&mut value, 0, page.elements[0].2);
                    return Ok(BucketValue(value));
                }
                if level == 0 {
                    if inline && page.size() <= PAGE_SIZE / 4 {
                        let mut bytes = page.encode(1);
                        page_header(&mut bytes, 0, LEAF, page.count()?, 0);
                        value.extend_from_slice(&bytes);
                        return Ok(BucketValue(value));
                    }
                    let mut bytes = page.encode(PAGE_SIZE);
                    let pgid = writer.write_pages(&mut bytes, LEAF, page.count()?)?;
                    put_u64(&mut value, 0, pgid);
                    return Ok(BucketValue(value));
                }
            }
            self.write_level(writer, level)?;
            level += 1;
        }
    }
}

impl OpenPage {
    fn new(leaf: bool) -> OpenPage {
        OpenPage { leaf, elements: Vec::new(), data: Vec::new(), first_key: Vec::new(), written: 0 }
    }

    fn size(&self) -> usize {
        PAGE_HEADER + self.elements.len() * ELEMENT + self.data.len()
    }

    fn count(&self) -> Result<u16, WriteError> {
        // A page holds at most PAGE_SIZE / ELEMENT elements before it is written (each takes a header).
        u16::try_from(self.elements.len()).map_err(|_| std::io::Error::other("too many elements on a page").into())
    }

    /// The page's bytes, its length rounded up to a multiple of `unit` (the header left for the caller).
    fn encode(&self, unit: usize) -> Vec<u8> {
        let mut bytes = vec![0u8; self.size().div_ceil(unit) * unit];
        let mut data_at = PAGE_HEADER + self.elements.len() * ELEMENT;
        let mut from = 0;
        for (i, &(flags, ksize, third)) in self.elements.iter().enumerate() {
            let at = PAGE_HEADER + i * ELEMENT;
            let pos = (data_at - at) as u32;
            let len = if self.leaf {
                put_u32(&mut bytes, at, flags);
                put_u32(&mut bytes, at + 4, pos);
                put_u32(&mut bytes, at + 8, ksize as u32);
                put_u32(&mut bytes, at + 12, third as u32);
                ksize + third as usize
            } else {
                put_u32(&mut bytes, at, pos);
                put_u32(&mut bytes, at + 4, ksize as u32);
                put_u64(&mut bytes, at + 8, third);
                ksize
            };
            bytes[data_at..data_at + len].copy_from_slice(&self.data[from..from + len]);
            data_at += len;
            from += len;
        }
        bytes
    }
}

fn page_header(page: &mut [u8], pgid: u64, flags: u16, count: u16, overflow: u32) {
    put_u64(page, 0, pgid);
    page[8..10].copy_from_slice(&flags.to_le_bytes());
    page[10..12].copy_from_slice(&count.to_le_bytes());
    put_u32(page, 12, overflow);
}

fn put_u32(buf: &mut [u8], at: usize, v: u32) {
    buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(buf: &mut [u8], at: usize, v: u64) {
    buf[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::migrate::bolt::{Bolt, Bucket};

    fn read_all(bolt: &Bolt, bucket: &Bucket) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        bolt.for_each(bucket, |k, v| {
            out.push((k.to_vec(), v.to_vec()));
            Ok(())
        })
        .unwrap();
        out
    }

    /// Small buckets inline, a large one over many levels of branch pages, values larger than a page
    /// (overflow pages) and an empty bucket: the reader gets back exactly what was written.
    #[test]
    fn every_shape_of_tree_reads_back_in_order() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let mut writer = BoltWriter::new(file.reopen().unwrap()).unwrap();
        let mut big = writer.bucket("big");
        let mut expected_big = Vec::new();
        for i in 0..60_000u32 {
            let key = i.to_be_bytes().to_vec();
            let value = if i % 9_999 == 0 { vec![i as u8; 3 * PAGE_SIZE + 17] } else { format!("v{i}").into_bytes() };
            big.put(&mut writer, &key, &value).unwrap();
            expected_big.push((key, value));
        }
        let big = big.finish(&mut writer).unwrap();
        let mut small = writer.bucket("small");
        small.put(&mut writer, b"a", b"1").unwrap();
        small.put(&mut writer, b"b", b"").unwrap();
        let small = small.finish(&mut writer).unwrap();
        assert_eq!(small.root_page(), 0, "a small bucket is inline");
        let empty = writer.bucket("empty").finish(&mut writer).unwrap();
        let mut root = writer.bucket("");
        root.put_bucket(&mut writer, b"big", big).unwrap();
        root.put_bucket(&mut writer, b"empty", empty).unwrap();
        root.put_bucket(&mut writer, b"small", small).unwrap();
        let (_, len) = writer.finish(root).unwrap();
        assert_eq!(len % PAGE_SIZE as u64, 0);
        assert_eq!(std::fs::metadata(file.path()).unwrap().len(), len);

        let bolt = Bolt::open(file.path(), len).unwrap();
        assert_eq!(bolt.size(), len);
        let names: Vec<Vec<u8>> = bolt.buckets().unwrap().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, vec![b"big".to_vec(), b"empty".to_vec(), b"small".to_vec()]);
        assert_eq!(read_all(&bolt, &bolt.bucket(b"big").unwrap().unwrap()), expected_big);
        assert!(read_all(&bolt, &bolt.bucket(b"empty").unwrap().unwrap()).is_empty());
        assert_eq!(
            read_all(&bolt, &bolt.bucket(b"small").unwrap().unwrap()),
            vec![(b"a".to_vec(), b"1".to_vec()), (b"b".to_vec(), vec![])]
        );
    }

    #[test]
    fn keys_out_of_order_or_empty_are_refused() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let mut writer = BoltWriter::new(file.reopen().unwrap()).unwrap();
        let mut bucket = writer.bucket("b");
        bucket.put(&mut writer, b"b", b"").unwrap();
        for key in [&b"a"[..], b"b", b""] {
            let err = bucket.put(&mut writer, key, b"").unwrap_err().to_string();
            assert!(err.starts_with("bucket b: "), "{err}");
        }
    }

    /// Keys longer than bbolt's `MaxKeySize` (long user names), each larger than a page, are written
    /// and read back, on leaf pages and as branch pages' keys.
    #[test]
    fn keys_past_bbolts_put_limit_and_past_a_page_read_back() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let mut writer = BoltWriter::new(file.reopen().unwrap()).unwrap();
        let mut bucket = writer.bucket("long");
        // 100 of them: pages of at least two elements keep the tree shallow (one element per page
        // would stack a level per key, past what a reader accepts).
        let keys: Vec<Vec<u8>> = (0..100u8).map(|i| vec![i + 1; 40_000]).collect();
        for key in &keys {
            bucket.put(&mut writer, key, b"v").unwrap();
        }
        let long = bucket.finish(&mut writer).unwrap();
        let mut root = writer.bucket("");
        root.put_bucket(&mut writer, b"long", long).unwrap();
        let (_, len) = writer.finish(root).unwrap();
        let bolt = Bolt::open(file.path(), len).unwrap();
        let read = read_all(&bolt, &bolt.bucket(b"long").unwrap().unwrap());
        assert_eq!(read, keys.into_iter().map(|k| (k, b"v".to_vec())).collect::<Vec<_>>());
    }
}
