//! The write path: one change and the resulting state as one run of frames at the end of the
//! active segment (or a new one), synced, and only then shown to readers.

use std::os::unix::fs::FileExt;

use super::segment::{self, frame, Loc, RecordRef, Segment, State, SYNC_CHUNK};
use super::{delete_purged, heed_to_io, io_to_heed, lock, Change, Wal, Writer};
use crate::raft::LogId;

impl Wal {
    /// Writes `change` and the resulting state as one run of frames, syncs, and only then shows the
    /// change to readers.
    pub(super) fn write(&self, change: Change<'_>) -> std::io::Result<()> {
        let mut writer = lock(&self.inner.writer);
        if writer.broken {
            return Err(std::io::Error::other("raft log: an earlier failed write could not be undone"));
        }
        let mut state = lock(&self.inner.index).state.clone();
        match &change {
            Change::Purge(id) => state.last_purged = Some(*id).max(state.last_purged),
            Change::Vote(vote) => state.vote = Some(*vote),
            Change::Identity(ids) => state.identity = Some(*ids),
            Change::Restore(restored) => state = restored.clone(),
            Change::Append(_) | Change::Truncate(_) => {}
        }
        state.committed = state.committed.max(*lock(&self.inner.committed));

        let (buf, frames) = encode(&change, &state)?;

        let mut locs = Vec::new();
        let mut start = 0; // first byte of the next chunk in `buf`
        let mut first = 0; // its first frame
        while first < frames.len() {
            // A chunk: frames up to SYNC_CHUNK bytes, at least one.
            let mut last = first;
            while last + 1 < frames.len() && frames[last + 1].0 - start <= SYNC_CHUNK {
                last += 1;
            }
            let chunk = &buf[start..frames[last].0];
            let (seq, offset) = self
                .inner
                .space
                .write_or_make_room(&self.inner.dir, || self.write_chunk(&mut writer, chunk).map_err(io_to_heed))
                .map_err(heed_to_io)?;
            let mut frame_start = start;
            for &(frame_end, log_id) in &frames[first..=last] {
                if let Some(log_id) = log_id {
                    let len = (frame_end - frame_start - segment::HEADER) as u32;
                    locs.push(Loc { log_id, seq, offset: offset + (frame_start - start) as u64, len });
                }
                frame_start = frame_end;
            }
            start = frames[last].0;
            first = last + 1;
        }

        // Durable: readers may see it.
        let mut index = lock(&self.inner.index);
        for loc in locs {
            index.entries.split_off(&loc.log_id.index);
            index.entries.insert(loc.log_id.index, loc);
        }
        match change {
            Change::Truncate(from) => {
                index.entries.split_off(&from);
            }
            Change::Purge(_) | Change::Restore(_) => {
                if let Some(purged) = state.last_purged {
                    index.entries = index.entries.split_off(&(purged.index + 1));
                }
            }
            _ => {}
        }
        index.state = state;
        if matches!(change, Change::Purge(_)) {
            delete_purged(&mut index, writer.active.seq);
        }
        Ok(())
    }

    /// Writes `chunk` at the end of the log and syncs it; returns its segment and offset. On failure
    /// the bytes it may have written are zeroed again, so a retry (or recovery) never sees half of it.
    fn write_chunk(&self, writer: &mut Writer, chunk: &[u8]) -> std::io::Result<(u64, u64)> {
        let len = chunk.len() as u64;
        let needed = writer.end + len;
        if needed <= writer.active.size.max(self.inner.segment_bytes) {
            let offset = writer.end;
            if needed > writer.active.size {
                // Allocated ahead, a step at a time: this write's sync also makes the new size durable.
                let step = segment::ALLOCATION_STEP;
                writer.active.grow(needed.div_ceil(step).saturating_mul(step).min(self.inner.segment_bytes))?;
            }
            let written = writer.active.file.write_all_at(chunk, offset).and_then(|()| {
                // etcd's WAL fsync histogram: the one durable write of each log write.
                let syncing = std::time::Instant::now();
                let synced = writer.active.file.sync_data();
                let took = syncing.elapsed();
                crate::metrics::WAL_FSYNC_SECONDS.observe(took.as_secs_f64());
                if crate::logging::slow::worth_logging(took) {
                    let ms = crate::logging::slow::ms(took);
                    tracing::debug!(target: crate::logging::slow::TARGET, bytes = len, sync_ms = ms, "slow WAL sync");
                }
                synced
            });
            if let Err(e) = written {
                if writer.active.zero_from(offset).is_err() {
                    writer.broken = true;
                }
                return Err(e);
            }
            writer.end = offset + len;
            return Ok((writer.active.seq, offset));
        }
        // A new segment: its directory entry must be durable too before anything in it is acknowledged.
        let seq = writer.active.seq + 1;
        let size = self.inner.segment_bytes.min(segment::ALLOCATION_STEP).max(len);
        let created = Segment::create(&self.inner.dir, seq, size).and_then(|segment| {
            segment.file.write_all_at(chunk, 0)?;
            let syncing = std::time::Instant::now();
            segment.file.sync_data()?;
            crate::metrics::WAL_FSYNC_SECONDS.observe(syncing.elapsed().as_secs_f64());
            crate::storage::data_dir::sync_dir(&self.inner.dir)?;
            Ok(segment)
        });
        match created {
            Ok(segment) => {
                lock(&self.inner.index).segments.insert(seq, segment.clone());
                writer.active = segment;
                writer.end = len;
                Ok((seq, 0))
            }
            Err(e) => {
                // Not acknowledged, not in the index: a leftover file would only be a torn tail, but
                // removing it gives back its space (a full disk is the likely cause).
                let _ = std::fs::remove_file(self.inner.dir.join(segment::file_name(seq)));
                Err(e)
            }
        }
    }
}

/// Where each frame of an encoded write ends in its bytes, with the entry's log id if it is an entry.
type Frames = Vec<(usize, Option<LogId>)>;

/// `change` and then `state` as frames back to back, and where each ends.
fn encode(change: &Change<'_>, state: &State) -> std::io::Result<(Vec<u8>, Frames)> {
    let mut buf = Vec::new();
    let mut frames: Frames = Vec::new();
    match change {
        Change::Append(entries) => {
            for entry in entries.iter() {
                frame(&RecordRef::Entry(entry), &mut buf)?;
                frames.push((buf.len(), Some(entry.log_id)));
            }
        }
        Change::Truncate(from) => {
            frame(&RecordRef::Truncate { from: *from }, &mut buf)?;
            frames.push((buf.len(), None));
        }
        _ => {}
    }
    frame(&RecordRef::State(state), &mut buf)?;
    frames.push((buf.len(), None));
    Ok((buf, frames))
}
