//! The log's on-disk format: segment files of framed records.
//!
//! A segment is `<seq:016x>.wal` in the log directory and holds records back to back from offset 0;
//! everything after the last record is zeros. Its space is allocated ahead of the records
//! ([`ALLOCATION_STEP`] at a time, up to the segment size), so most appends overwrite allocated
//! blocks and their `fdatasync` need not also change the file's size.
//!
//! A record is a frame: `len: u32 LE` (payload bytes, never 0), `crc: u32 LE` (CRC-32C of the
//! payload), then the payload, a postcard-encoded [`Record`]. A zero header is where the records
//! end. Nothing read from disk is trusted before its CRC matches: a length is only ever used to slice
//! bytes already read or to read bytes inside the file's size, never to size an allocation.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::Vote;
use serde::{Deserialize, Serialize};

use crate::raft::{Entry, LogId, NodeId};

/// A frame's header: length and CRC.
pub(crate) const HEADER: usize = 8;

/// How much a segment's allocation grows at a time: one size change per this many bytes of log, and
/// a small disk (or a file-size limit) is not taken by a whole segment at once.
pub(crate) const ALLOCATION_STEP: u64 = 4 << 20;
/// The most bytes written between two `fdatasync`s (a single larger record is written alone): a
/// torn write at the end of the log spans no more (see `recover.rs`).
pub(crate) const SYNC_CHUNK: usize = 4 << 20;

/// What a record says. The variants' order is the format: append new variants at the end only.
/// Outside tests only entries are read whole (`read_entry`); the start-up scan reads `RecordHead`.
#[derive(Debug, Deserialize)]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) enum Record {
    /// A log entry. An entry at index `i` replaces any entries from `i` on (raft's overwrite).
    Entry(Entry),
    /// The log was truncated: entries from this index on are gone.
    Truncate { from: u64 },
    /// The whole non-log state after the write it ends (see [`State`]).
    State(State),
}

/// [`Record`] as the start-up scan reads it (`recover.rs`): of an entry, its log id only, which is
/// the encoded entry's first field, so the payload is neither copied nor decoded (a start-up over a
/// log of 1 GB of values copied all of it, issue 30). Same variants, same order.
#[derive(Debug, Deserialize)]
pub(crate) enum RecordHead {
    Entry(EntryHead),
    Truncate { from: u64 },
    State(State),
}

/// The start of an encoded `Entry`: postcard reads a struct's fields in order and leaves the rest.
#[derive(Debug, Deserialize)]
pub(crate) struct EntryHead {
    pub log_id: LogId,
}

/// [`Record`] for encoding without copying the entry.
#[derive(Serialize)]
pub(crate) enum RecordRef<'a> {
    Entry(&'a Entry),
    Truncate { from: u64 },
    State(&'a State),
}

/// Everything but the entries, rewritten at the end of every write (about 60 bytes): the newest one
/// found at recovery is the state, and the active segment always holds one (see `mod.rs`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct State {
    pub vote: Option<Vote<NodeId>>,
    pub committed: Option<LogId>,
    pub last_purged: Option<LogId>,
    /// `(member_id, cluster_id)`.
    pub identity: Option<(u64, u64)>,
}

/// Appends `record` framed to `out`.
pub(crate) fn frame(record: &RecordRef<'_>, out: &mut Vec<u8>) -> std::io::Result<()> {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER]);
    postcard::to_io(record, &mut *out).map_err(std::io::Error::other)?;
    let payload_len = out.len() - start - HEADER;
    let len = u32::try_from(payload_len).map_err(|_| std::io::Error::other("raft log record over 4 GiB"))?;
    let crc = crc32c::crc32c(&out[start + HEADER..]);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + HEADER].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// What is at one offset of a segment's bytes.
#[derive(Debug, PartialEq)]
pub(crate) enum Frame<'a> {
    /// A valid frame: its payload and where the next frame starts.
    Valid { payload: &'a [u8], next: usize },
    /// A zero header (or fewer than a header's bytes left): the records end here.
    End,
    /// A frame whose length reaches past the bytes there are.
    Short { len: u32 },
    /// A frame whose payload does not match its CRC; `next` is where it claims the next one starts.
    BadCrc { next: usize },
}

/// Reads the frame at `offset` of `bytes`.
pub(crate) fn read_frame(bytes: &[u8], offset: usize) -> Frame<'_> {
    let Some(header) = bytes.get(offset..offset + HEADER) else { return Frame::End };
    if header == [0; HEADER] {
        return Frame::End;
    }
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    let start = offset + HEADER;
    let Some(payload) = start.checked_add(len as usize).and_then(|end| bytes.get(start..end)) else {
        return Frame::Short { len };
    };
    let next = start + payload.len();
    if len == 0 || crc32c::crc32c(payload) != crc {
        return Frame::BadCrc { next };
    }
    Frame::Valid { payload, next }
}

/// Decodes a payload whose CRC matched.
pub(crate) fn decode(payload: &[u8]) -> Result<Record, postcard::Error> {
    postcard::from_bytes(payload)
}

/// Decodes the head of a payload whose CRC matched (`RecordHead`).
pub(crate) fn decode_head(payload: &[u8]) -> Result<RecordHead, postcard::Error> {
    postcard::from_bytes(payload)
}

/// Where an entry's frame is: enough to read it back without scanning.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Loc {
    pub log_id: LogId,
    pub seq: u64,
    /// Offset of the frame (its header) in the segment.
    pub offset: u64,
    /// Payload bytes (checked against the frame's own header when read back).
    pub len: u32,
}

/// Reads the entry at `loc` of `file`, checking its frame again (the disk may have changed since).
pub(crate) fn read_entry(file: &File, path: &Path, loc: &Loc) -> std::io::Result<Entry> {
    let mut bytes = vec![0; HEADER + loc.len as usize];
    file.read_exact_at(&mut bytes, loc.offset)?;
    let corrupt = |what: &str| corrupt(path, loc.offset, what);
    match read_frame(&bytes, 0) {
        Frame::Valid { payload, .. } => match decode(payload) {
            Ok(Record::Entry(entry)) if entry.log_id == loc.log_id => Ok(entry),
            Ok(_) => Err(corrupt("not the entry the index expects")),
            Err(e) => Err(corrupt(&format!("undecodable record: {e}"))),
        },
        _ => Err(corrupt("entry's frame no longer valid")),
    }
}

/// The error for corrupt data: names the file and the offset.
pub(crate) fn corrupt(path: &Path, offset: u64, what: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("raft log corrupt: {} at offset {offset}: {what}", path.display()),
    )
}

/// An open segment file.
#[derive(Clone, Debug)]
pub(crate) struct Segment {
    pub seq: u64,
    pub path: PathBuf,
    pub file: Arc<File>,
    /// The file's size: what is allocated for records.
    pub size: u64,
}

pub(crate) fn file_name(seq: u64) -> String {
    format!("{seq:016x}.wal")
}

/// The sequence number a segment file name stands for; `None` for any other file.
pub(crate) fn parse_name(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(".wal")?;
    (hex.len() == 16).then(|| u64::from_str_radix(hex, 16).ok()).flatten()
}

impl Segment {
    /// Creates segment `seq` in `dir` with `size` bytes allocated, owner-only. The caller makes the
    /// new directory entry durable (`sync_dir`) before anything in it is acknowledged.
    pub(crate) fn create(dir: &Path, seq: u64, size: u64) -> std::io::Result<Segment> {
        let path = dir.join(file_name(seq));
        let file = OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&path)?;
        preallocate(&file, size)?;
        Ok(Segment { seq, path, file: Arc::new(file), size })
    }

    pub(crate) fn open(dir: &Path, seq: u64) -> std::io::Result<Segment> {
        let path = dir.join(file_name(seq));
        let file = OpenOptions::new().read(true).write(true).open(&path)?;
        let size = file.metadata()?.len();
        Ok(Segment { seq, path, file: Arc::new(file), size })
    }

    /// Allocates the file up to `size` bytes (zeros); the next `sync_data` makes the new size durable.
    pub(crate) fn grow(&mut self, size: u64) -> std::io::Result<()> {
        preallocate(&self.file, size)?;
        self.size = size;
        Ok(())
    }

    /// Zeros everything from `offset` on, keeping the size: a rejected or torn tail can never be read
    /// as records. Cutting the file and extending it again needs no free space (a full disk is when
    /// this runs), unlike writing zeros.
    pub(crate) fn zero_from(&self, offset: u64) -> std::io::Result<()> {
        self.file.set_len(offset)?;
        // Allocated again where possible; a file system that cannot is left sparse (still zeros).
        let _ = preallocate(&self.file, self.size);
        self.file.set_len(self.size)
    }
}

/// Allocates `size` bytes for `file` (`fallocate`), or only sets its size where the file system has
/// no `fallocate`.
fn preallocate(file: &File, size: u64) -> std::io::Result<()> {
    match rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, size) {
        Ok(()) => Ok(()),
        Err(e) if e == rustix::io::Errno::OPNOTSUPP || e == rustix::io::Errno::NOSYS => file.set_len(size),
        Err(e) => Err(e.into()),
    }
}
