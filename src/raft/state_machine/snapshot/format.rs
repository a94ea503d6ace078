//! The snapshot file format: openraft's metadata and every kv table's records, written from an LMDB
//! read transaction and loaded into a write transaction record by record, so that neither building,
//! sending, receiving nor installing a snapshot ever holds it in memory.
//!
//! Versions 2 and 3 are version 1 under other magics (`keyward-snap-v2\n`, `keyward-snap-v3\n`): they
//! mark the records of kv layouts 3 and 4, which a keyward of an older layout must refuse rather than
//! misread (see `MAGIC`).
//!
//! A whole file is what a leader sends to a follower (openraft sends it in chunks, by offset), and
//! what a follower installs. Version 1, byte by byte:
//!
//! ```text
//! magic         16 bytes   "keyward-snap-v1\n" (versions 2 and 3: "keyward-snap-v2\n", "-v3\n")
//! meta length   u32 LE
//! meta          postcard(openraft SnapshotMeta)
//! body          varint(table count), then for each table, in `State::tables` order:
//!                 varint(record count), then for each record, in LMDB's key order:
//!                 varint(key length) key varint(value length) value
//! checksum      u32 LE: CRC-32C of every byte before it
//! ```
//!
//! `varint` is unsigned LEB128 (postcard's varint), so the body is byte for byte postcard's encoding
//! of `Vec<Vec<(bytes, bytes)>>` — which is what the files before version 1 carried, as the `data`
//! field of `postcard({meta, data})`, without magic or checksum; `upgrade_legacy` converts one.
//!
//! The file is untrusted input when it comes from the network or a disk: every length is checked
//! against what is left of the file before anything is allocated, records must arrive in key order
//! (LMDB's `APPEND` refuses others), and nothing is committed unless the checksum matches.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};

use heed::{PutFlags, RoTxn, RwTxn, WithoutTls};
use openraft::SnapshotMeta;

use crate::raft::member::MemberNode;

use crate::storage::Db;

/// openraft's description of a snapshot: the last log id and membership it includes, and its id.
pub(crate) type Meta = SnapshotMeta<u64, MemberNode>;

/// The first bytes of a file this version writes: version 3 is version 1 byte for byte, written by a
/// member of kv layout 4 (`layout.rs`), whose index a keyward of layout 3 would misread: that one
/// refuses the file (it knows only versions 1 and 2) instead of installing it. All three are read
/// here; the installer finds older layouts' records by their bytes and converts them. A file from
/// before version 1 starts with postcard's encoding of an `Option` (0 or 1), so none can be confused.
pub(crate) const MAGIC: &[u8; 16] = b"keyward-snap-v3\n";
/// The first bytes of a file a member of kv layout 3 wrote.
const MAGIC_V2: &[u8; 16] = b"keyward-snap-v2\n";
/// The first bytes of a file a member of kv layout 2 (or 1) wrote.
const MAGIC_V1: &[u8; 16] = b"keyward-snap-v1\n";
/// Buffer for file reads and writes: large enough for few system calls, small against any store.
const IO_BUFFER: usize = 1 << 20;
/// Scratch space postcard may use while decoding the metadata of a legacy file (its strings: the
/// snapshot id and the members' addresses).
const LEGACY_META_SCRATCH: usize = 1 << 20;
/// The longest LEB128 encoding of a u64.
const MAX_VARINT_LEN: u32 = 10;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Writes a snapshot of `tables` as of `txn`, described by `meta`, to `file`, and returns the file with
/// every byte handed to the kernel but not synced: the caller syncs it after ending `txn`, so that the
/// read transaction (which keeps LMDB from reusing the pages freed meanwhile) does not wait for the
/// disk.
///
/// `give_way` is asked every `GIVE_WAY_EVERY` records: if it says so, the write stops with `GaveWay`
/// (the file is incomplete), so that the caller can end `txn` and start over.
pub(crate) fn write(
    file: File,
    meta: &Meta,
    tables: &[Db],
    txn: &RoTxn<WithoutTls>,
    give_way: &dyn Fn() -> bool,
) -> Result<File, BoxError> {
    let mut out = writer(file);
    write_header(&mut out, meta)?;
    write_varint(&mut out, tables.len() as u64)?;
    for db in tables {
        write_varint(&mut out, db.len(txn)?)?;
        for (n, item) in db.iter(txn)?.enumerate() {
            if n % GIVE_WAY_EVERY == 0 && give_way() {
                return Err(GaveWay.into());
            }
            let (key, value) = item?;
            write_bytes(&mut out, key)?;
            write_bytes(&mut out, value)?;
        }
    }
    finish_writing(out)
}

/// How often `write` asks whether to give way (an atomic load: cheap against a record's writes).
const GIVE_WAY_EVERY: usize = 256;

/// `write` stopped because it was asked to give way; the file is incomplete.
#[derive(Debug)]
pub(crate) struct GaveWay;

impl std::fmt::Display for GaveWay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the snapshot dump gave way before it was complete")
    }
}

impl std::error::Error for GaveWay {}

/// Reads a snapshot file from its start: the metadata first, then the records (`load`).
pub(crate) struct Reader {
    input: Checksummed<BufReader<File>>,
    /// Bytes left before the checksum; no length in the file may claim more.
    left: u64,
}

impl Reader {
    /// Opens a version 1 snapshot file and reads its metadata.
    pub(crate) fn open(mut file: File) -> io::Result<(Meta, Reader)> {
        let len = file.seek(SeekFrom::End(0))?;
        file.seek(SeekFrom::Start(0))?;
        let body_and_header = len.checked_sub(4).ok_or_else(|| corrupt("shorter than its checksum"))?;
        let mut reader =
            Reader { input: Checksummed::new(BufReader::with_capacity(IO_BUFFER, file)), left: body_and_header };
        let mut magic = [0u8; MAGIC.len()];
        reader.read_exact(&mut magic)?;
        if &magic != MAGIC && &magic != MAGIC_V2 && &magic != MAGIC_V1 {
            return Err(corrupt("not a keyward snapshot (version 1, 2 or 3)"));
        }
        let mut len = [0u8; 4];
        reader.read_exact(&mut len)?;
        let mut meta = Vec::new();
        reader.read_vec(u64::from(u32::from_le_bytes(len)), &mut meta)?;
        let meta = postcard::from_bytes(&meta).map_err(|e| corrupt(&format!("metadata: {e}")))?;
        Ok((meta, reader))
    }

    /// The next count (of tables, or of a table's records).
    fn count(&mut self) -> io::Result<u64> {
        read_varint(|| {
            let mut byte = [0u8];
            self.read_exact(&mut byte)?;
            Ok(byte[0])
        })
    }

    /// The next length-prefixed byte string, into `buf` (reused from record to record).
    fn bytes(&mut self, buf: &mut Vec<u8>) -> io::Result<()> {
        let len = self.count()?;
        self.read_vec(len, buf)
    }

    fn read_vec(&mut self, len: u64, buf: &mut Vec<u8>) -> io::Result<()> {
        if len > self.left {
            return Err(corrupt("truncated (a length runs past the end of the file)"));
        }
        buf.clear();
        buf.resize(len as usize, 0);
        self.read_exact(buf)
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        if buf.len() as u64 > self.left {
            return Err(corrupt("truncated"));
        }
        self.input.read_exact(buf)?;
        self.left -= buf.len() as u64;
        Ok(())
    }

    /// Checks that the body ended where the checksum begins and that the checksum matches.
    fn finish(mut self) -> io::Result<()> {
        if self.left != 0 {
            return Err(corrupt("bytes after the last table"));
        }
        let mut stored = [0u8; 4];
        self.input.inner.read_exact(&mut stored)?;
        if u32::from_le_bytes(stored) != self.input.crc {
            return Err(corrupt("checksum mismatch"));
        }
        Ok(())
    }
}

/// Where `load` hands a record it does not write (a key and its value).
pub(crate) type SkippedRecord<'a> = dyn FnMut(&[u8], &[u8]) -> heed::Result<()> + 'a;

/// Replaces the contents of `tables` with the snapshot's records, in `txn`; fails, leaving `txn` to be
/// aborted, if the file is malformed or its checksum does not match. Memory: one record at a time.
///
/// A file with one table more than `tables` is of the kv layout before 2 (`layout.rs`), whose first
/// table was `kv_live`: its records are handed to `skipped` instead of being written.
pub(crate) fn load(
    mut reader: Reader,
    tables: &[Db],
    txn: &mut RwTxn,
    skipped: &mut SkippedRecord,
) -> Result<(), BoxError> {
    let count = reader.count()?;
    let legacy = count == tables.len() as u64 + 1;
    if count != tables.len() as u64 && !legacy {
        return Err(corrupt(&format!("{count} tables where this version has {}", tables.len())).into());
    }
    let (mut key, mut value) = (Vec::new(), Vec::new());
    if legacy {
        for _ in 0..reader.count()? {
            reader.bytes(&mut key)?;
            reader.bytes(&mut value)?;
            skipped(&key, &value)?;
        }
    }
    for db in tables {
        db.clear(txn)?;
        for _ in 0..reader.count()? {
            reader.bytes(&mut key)?;
            reader.bytes(&mut value)?;
            // The records come in key order: appending fills pages without searching the tree, and a
            // record out of order (a corrupt file) is refused (MDB_KEYEXIST).
            db.put_with_flags(txn, PutFlags::APPEND, &key, &value)
                .map_err(|e| format!("snapshot record out of order or unwritable: {e}"))?;
        }
    }
    reader.finish()?;
    Ok(())
}

/// Checks a whole snapshot file without loading it: its metadata is `expected`, it has `tables` tables
/// (or one more, kv layout 1's `kv_live`), every key is one LMDB takes (1 to `LMDB_MAX_KEY` bytes) and
/// comes after the one before it in its table, and the checksum matches. What passes, `load` takes
/// (short of a full disk): a received file is checked before openraft is asked to install it, since
/// a failed install stops this member's raft for good.
pub(crate) fn verify(file: File, expected: &Meta, tables: usize) -> Result<(), BoxError> {
    let (meta, mut reader) = Reader::open(file)?;
    if meta != *expected {
        return Err(format!("the snapshot file holds {meta}, not {expected}").into());
    }
    let count = reader.count()?;
    if count != tables as u64 && count != tables as u64 + 1 {
        return Err(corrupt(&format!("{count} tables where this version has {tables}")).into());
    }
    let (mut key, mut previous, mut value) = (Vec::new(), Vec::new(), Vec::new());
    for table in 0..count {
        previous.clear();
        for record in 0..reader.count()? {
            reader.bytes(&mut key)?;
            if key.is_empty() || key.len() > crate::storage::LMDB_MAX_KEY {
                return Err(corrupt(&format!("a key of {} bytes in table {table}", key.len())).into());
            }
            if record > 0 && key <= previous {
                return Err(corrupt(&format!("records out of order in table {table}")).into());
            }
            reader.bytes(&mut value)?;
            std::mem::swap(&mut key, &mut previous);
        }
    }
    reader.finish()?;
    Ok(())
}

/// Whether `file` starts like a version 1 snapshot.
pub(crate) fn is_current_version(file: &mut File) -> io::Result<bool> {
    let mut magic = [0u8; MAGIC.len()];
    file.seek(SeekFrom::Start(0))?;
    let read = file.read(&mut magic)?;
    file.seek(SeekFrom::Start(0))?;
    Ok(read == MAGIC.len() && (&magic == MAGIC || &magic == MAGIC_V2 || &magic == MAGIC_V1))
}

/// Converts a snapshot written before version 1 (postcard of `{meta, data}`) into version 1 in `out`
/// (synced), streaming: the old `data` is version 1's body as it is.
pub(crate) fn upgrade_legacy(legacy: File, out: File) -> Result<Meta, BoxError> {
    let input = BufReader::with_capacity(IO_BUFFER, legacy);
    let mut scratch = vec![0u8; LEGACY_META_SCRATCH];
    let (meta, (mut input, _)): (Meta, _) =
        postcard::from_io((input, &mut scratch)).map_err(|e| corrupt(&format!("legacy snapshot metadata: {e}")))?;
    // The length prefix of the legacy `data`.
    let data_len = read_varint(|| {
        let mut byte = [0u8];
        input.read_exact(&mut byte)?;
        Ok(byte[0])
    })?;
    let mut out = writer(out);
    write_header(&mut out, &meta)?;
    let copied = io::copy(&mut input.by_ref().take(data_len), &mut out)?;
    if copied != data_len {
        return Err(corrupt("legacy snapshot is truncated").into());
    }
    finish_writing(out)?.sync_all()?;
    Ok(meta)
}

/// An unsigned LEB128 varint, byte by byte from `next`.
fn read_varint(mut next: impl FnMut() -> io::Result<u8>) -> io::Result<u64> {
    let mut value = 0u64;
    for i in 0..MAX_VARINT_LEN {
        let byte = next()?;
        let bits = u64::from(byte & 0x7f);
        if i == MAX_VARINT_LEN - 1 && bits > 1 {
            return Err(corrupt("a length overflows 64 bits"));
        }
        value |= bits << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(corrupt("a length is longer than 10 bytes"))
}

fn write_header(out: &mut impl Write, meta: &Meta) -> Result<(), BoxError> {
    let meta = postcard::to_allocvec(meta)?;
    out.write_all(MAGIC)?;
    out.write_all(&u32::try_from(meta.len())?.to_le_bytes())?;
    out.write_all(&meta)?;
    Ok(())
}

fn write_bytes(out: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
    write_varint(out, bytes.len() as u64)?;
    out.write_all(bytes)
}

fn write_varint(out: &mut impl Write, mut value: u64) -> io::Result<()> {
    let mut buf = [0u8; MAX_VARINT_LEN as usize];
    let mut len = 0;
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        buf[len] = if value == 0 { byte } else { byte | 0x80 };
        len += 1;
        if value == 0 {
            return out.write_all(&buf[..len]);
        }
    }
}

/// A snapshot file being written: buffered, then checksummed a whole buffer at a time (a record's
/// four small writes each checksummed cost more than the buffering).
type Writer = BufWriter<Checksummed<File>>;

fn writer(file: File) -> Writer {
    BufWriter::with_capacity(IO_BUFFER, Checksummed::new(file))
}

/// Appends the checksum of everything written and flushes the file (to the kernel: not synced).
fn finish_writing(out: Writer) -> Result<File, BoxError> {
    let Checksummed { inner: mut file, crc } = out.into_inner().map_err(|e| e.into_error())?;
    file.write_all(&crc.to_le_bytes())?;
    Ok(file)
}

fn corrupt(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("snapshot file is corrupt: {what}"))
}

/// A reader or writer that keeps the CRC-32C of the bytes that went through it.
struct Checksummed<T> {
    inner: T,
    crc: u32,
}

impl<T> Checksummed<T> {
    fn new(inner: T) -> Self {
        Checksummed { inner, crc: 0 }
    }
}

impl<W: Write> Write for Checksummed<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc = crc32c::crc32c_append(self.crc, &buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<R: Read> Read for Checksummed<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.crc = crc32c::crc32c_append(self.crc, &buf[..n]);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tables_with_records(dir: &std::path::Path) -> (crate::storage::LmdbEnv, Vec<Db>) {
        let names = ["t0", "t1", "t2"];
        let (env, dbs) = crate::storage::open(dir, names, crate::storage::Durability::Full).unwrap();
        let mut txn = env.write_txn().unwrap();
        for (i, db) in dbs.iter().enumerate() {
            for j in 0..(i * 200) {
                db.put(&mut txn, format!("key-{j:04}").as_bytes(), &vec![i as u8; j]).unwrap();
            }
        }
        txn.commit().unwrap();
        (env, dbs.to_vec())
    }

    #[test]
    fn the_body_is_postcards_encoding_of_the_tables_and_loads_back() {
        let dir = tempfile::tempdir().unwrap();
        let (env, tables) = tables_with_records(&dir.path().join("env"));
        let path = dir.path().join("snap");
        let meta = Meta { snapshot_id: "s".into(), ..Default::default() };
        write(File::create(&path).unwrap(), &meta, &tables, &env.read_txn().unwrap(), &|| false).unwrap();

        let txn = env.read_txn().unwrap();
        let records: Vec<Vec<(serde_bytes::ByteBuf, serde_bytes::ByteBuf)>> = tables
            .iter()
            .map(|db| db.iter(&txn).unwrap().map(|kv| kv.map(|(k, v)| (k.to_vec().into(), v.to_vec().into())).unwrap()))
            .map(Iterator::collect)
            .collect();
        assert_eq!(records.iter().map(Vec::len).sum::<usize>(), 200 + 400);
        let bytes = std::fs::read(&path).unwrap();
        let meta_len = u32::from_le_bytes(bytes[16..20].try_into().unwrap()) as usize;
        let body = &bytes[20 + meta_len..bytes.len() - 4];
        assert_eq!(body, postcard::to_allocvec(&records).unwrap(), "the format before streaming had this body");
        assert_eq!(&bytes[bytes.len() - 4..], crc32c::crc32c(&bytes[..bytes.len() - 4]).to_le_bytes());

        let copy = tempfile::tempdir().unwrap();
        let (env2, [a, b, c]) =
            crate::storage::open(copy.path(), ["t0", "t1", "t2"], crate::storage::Durability::Full).unwrap();
        let (read_meta, reader) = Reader::open(File::open(&path).unwrap()).unwrap();
        assert_eq!(read_meta, meta);
        let mut wtxn = env2.write_txn().unwrap();
        load(reader, &[a, b, c], &mut wtxn, &mut |_, _| panic!("no table is skipped")).unwrap();
        wtxn.commit().unwrap();
        let rtxn = env2.read_txn().unwrap();
        for (db, original) in [a, b, c].iter().zip(&tables) {
            let got: Vec<_> = db.iter(&rtxn).unwrap().map(|kv| kv.unwrap()).collect();
            let want: Vec<_> = original.iter(&txn).unwrap().map(|kv| kv.unwrap()).collect();
            assert_eq!(got, want);
        }
    }

    #[test]
    fn varints_are_postcards_and_overlong_ones_are_refused() {
        for value in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            let mut encoded = Vec::new();
            write_varint(&mut encoded, value).unwrap();
            assert_eq!(encoded, postcard::to_allocvec(&value).unwrap());
            let mut bytes = encoded.into_iter();
            assert_eq!(read_varint(|| bytes.next().ok_or_else(|| corrupt("end"))).unwrap(), value);
        }
        let mut eleven = std::iter::repeat(0x80u8);
        assert!(read_varint(|| Ok(eleven.next().unwrap())).is_err());
        let mut overflowing = [0xffu8; 9].into_iter().chain([0x02]);
        assert!(read_varint(|| Ok(overflowing.next().unwrap())).is_err());
    }

    #[test]
    fn a_length_past_the_end_of_the_file_is_refused_before_anything_is_allocated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snap");
        let mut out = writer(File::create(&path).unwrap());
        write_header(&mut out, &Meta::default()).unwrap();
        // One table, one record whose key claims almost 2^63 bytes.
        for value in [1, 1, u64::MAX >> 1] {
            write_varint(&mut out, value).unwrap();
        }
        finish_writing(out).unwrap();
        let (_, mut reader) = Reader::open(File::open(&path).unwrap()).unwrap();
        assert_eq!((reader.count().unwrap(), reader.count().unwrap()), (1, 1));
        let err = reader.bytes(&mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");
    }

    #[test]
    fn a_file_without_the_magic_is_not_taken_for_a_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snap");
        std::fs::write(&path, [1u8; 64]).unwrap();
        assert!(!is_current_version(&mut File::open(&path).unwrap()).unwrap());
        let err = Reader::open(File::open(&path).unwrap()).err().expect("refused");
        assert!(err.to_string().contains("not a keyward snapshot"), "{err}");
    }
}
