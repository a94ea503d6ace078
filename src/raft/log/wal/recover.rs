//! Start-up: reads every segment, rebuilds the entry index and the state, and cuts a torn tail. Every
//! frame's CRC is checked; of an entry only its log id is decoded (its payload is decoded when read).
//!
//! Only the end of the last segment can hold a write that was never acknowledged: a crash (or power
//! loss) during an append leaves any subset of that write's pages on disk. So a bad frame there — a
//! CRC mismatch followed only by zeros, a frame cut off by the end of the file, or a zero header
//! followed by stray bytes within one sync's reach — is that write, and is zeroed. A bad frame
//! anywhere else, or a tail that does not look like one interrupted write, is corruption of data
//! that was acknowledged: opening fails, naming the file and the offset.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::segment::{self, corrupt, decode_head, read_frame, Frame, Loc, RecordHead, Segment, State, SYNC_CHUNK};

/// What the segments hold.
pub(crate) struct Recovered {
    /// Every segment kept, in order; the last one is where appends go.
    pub segments: Vec<Segment>,
    /// Where the next record goes in the last segment.
    pub end: u64,
    pub entries: BTreeMap<u64, Loc>,
    pub state: State,
    /// The segment holding the newest state record (never deleted by a purge).
    pub state_seq: u64,
}

/// Scans the segments in `dir` (creating the first one if there is none).
pub(crate) fn scan(dir: &Path, segment_bytes: u64) -> std::io::Result<Recovered> {
    let seqs = segment_seqs(dir)?;
    if seqs.is_empty() {
        let first = Segment::create(dir, 0, segment_bytes.min(segment::ALLOCATION_STEP))?;
        crate::storage::data_dir::sync_dir(dir)?;
        let entries = BTreeMap::new();
        return Ok(Recovered { segments: vec![first], end: 0, entries, state: State::default(), state_seq: 0 });
    }
    let mut segments = Vec::new();
    let mut entries: BTreeMap<u64, Loc> = BTreeMap::new();
    let mut state = State::default();
    let mut state_seq = seqs[0];
    // The newest entry index dropped at a gap in the sequence (see below).
    let mut dropped_at_gap: Option<u64> = None;
    let mut end = 0;
    // One buffer for every segment: a fresh one per segment cost a page fault per page (64 MiB each).
    let mut bytes = Vec::new();
    for (i, &seq) in seqs.iter().enumerate() {
        let last = i + 1 == seqs.len();
        let seg = Segment::open(dir, seq)?;
        if i > 0 && seqs[i - 1] + 1 != seq {
            // A purge unlinks whole segments oldest first without syncing the directory, so a crash
            // can bring back some of them but not others. Everything before such a gap was purged:
            // checked below against the last purged id.
            dropped_at_gap = entries.keys().next_back().copied().max(dropped_at_gap);
            entries.clear();
        }
        // Every byte is read over: only a longer segment's extra bytes need to be made first.
        bytes.resize(seg.size as usize, 0);
        seg.file.read_exact_at(&mut bytes, 0)?;
        let mut offset = 0usize;
        let stop = loop {
            match read_frame(&bytes, offset) {
                Frame::Valid { payload, next } => {
                    let record = decode_head(payload)
                        .map_err(|e| corrupt(&seg.path, offset as u64, &format!("undecodable record: {e}")))?;
                    match record {
                        RecordHead::Entry(entry) => {
                            let index = entry.log_id.index;
                            entries.split_off(&index);
                            let loc =
                                Loc { log_id: entry.log_id, seq, offset: offset as u64, len: payload.len() as u32 };
                            entries.insert(index, loc);
                        }
                        RecordHead::Truncate { from } => {
                            entries.split_off(&from);
                        }
                        RecordHead::State(s) => {
                            if let Some(purged) = s.last_purged {
                                entries = entries.split_off(&(purged.index + 1));
                            }
                            state = s;
                            state_seq = seq;
                        }
                    }
                    offset = next;
                }
                other => break other,
            }
        };
        if last {
            if let Some(torn) = torn_tail(&seg.path, &bytes, offset, &stop)? {
                tracing::warn!(segment = %seg.path.display(), offset, bytes = torn, "raft log: cut a torn write at the end (never acknowledged)");
                seg.zero_from(offset as u64)?;
                seg.file.sync_data()?;
            }
            end = offset as u64;
        } else if stop != Frame::End {
            return Err(corrupt(&seg.path, offset as u64, bad(&stop)));
        }
        segments.push(seg);
    }
    check_gap(dir, dropped_at_gap, &state)?;
    Ok(Recovered { segments, end, entries, state, state_seq })
}

/// The sequence numbers of the segment files in `dir`, oldest first.
fn segment_seqs(dir: &Path) -> std::io::Result<Vec<u64>> {
    let mut seqs = Vec::new();
    for item in std::fs::read_dir(dir)? {
        let name = item?.file_name();
        if let Some(seq) = name.to_str().and_then(segment::parse_name) {
            seqs.push(seq);
        }
    }
    seqs.sort_unstable();
    Ok(seqs)
}

/// Entries dropped at a gap in the segment sequence (the newest is `dropped_at_gap`) must have been
/// purged: otherwise a segment is missing.
fn check_gap(dir: &Path, dropped_at_gap: Option<u64>, state: &State) -> std::io::Result<()> {
    let purged = state.last_purged.map(|p| p.index);
    if let Some(dropped) = dropped_at_gap {
        if purged.is_none_or(|p| dropped > p) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "raft log corrupt: {}: a segment is missing (entry {dropped} is lost, not purged)",
                    dir.display()
                ),
            ));
        }
    }
    Ok(())
}

fn bad(frame: &Frame<'_>) -> &'static str {
    match frame {
        Frame::Short { .. } => "frame reaches past the end of the file",
        Frame::BadCrc { .. } => "CRC mismatch",
        _ => "unexpected data",
    }
}

/// How many bytes at `offset` (where the valid records of the last segment stop, at `stop`) are a
/// torn write to cut; `None` if the rest is zeros; an error if the rest is not one interrupted write.
///
/// An append syncs at most `SYNC_CHUNK` bytes at a time (more only for a single larger record), and
/// the interrupted write started at or before `offset`: bytes further on than that were acknowledged,
/// so the bad frame is corruption, not a torn write.
pub(super) fn torn_tail(path: &Path, bytes: &[u8], offset: usize, stop: &Frame<'_>) -> std::io::Result<Option<usize>> {
    let last_nonzero = bytes.get(offset..).and_then(|rest| rest.iter().rposition(|&b| b != 0));
    let (reach, what) = match *stop {
        Frame::Valid { .. } => unreachable!("the scan stops at the first frame that is not valid"),
        Frame::End => (SYNC_CHUNK, "records continue after a zero header"),
        // Cut off by the end of the file: the rest of the file is this frame.
        Frame::Short { .. } => return Ok(Some(bytes.len() - offset)),
        Frame::BadCrc { next } => (SYNC_CHUNK.max(next - offset), "CRC mismatch"),
    };
    match last_nonzero {
        None => Ok(None),
        Some(p) if p < reach => Ok(Some(p + 1)),
        Some(_) => Err(corrupt(path, offset as u64, what)),
    }
}
