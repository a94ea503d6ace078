//! The raft log: append-only segment files in `<data-dir>/member/wal`, one `fdatasync` per write.
//!
//! Owns the log entries, the vote, the committed id, the last purged id and the member identity;
//! nothing else reads or writes that directory. Format: `segment.rs`; writes: `write.rs`; start-up
//! scan: `recover.rs`; the move from the LMDB log of older versions: `migrate.rs`.
//!
//! Every write — an append batch, a truncation, a purge, a vote, the identity — is one sequential
//! write of framed records at the end of the active segment, ended by a `State` record holding the
//! whole non-log state, then one `File::sync_data`. So:
//! - an append is durable (and openraft told so) after that one `fdatasync`; batches form while the
//!   previous one syncs (group commit);
//! - the vote is a record in the log rather than a file of its own: a file would cost a write, an
//!   fsync, a rename and a directory fsync per vote, where the log costs one `fdatasync`, and votes
//!   are then ordered with the entries by construction;
//! - the committed id (openraft's `save_committed`) is kept in memory and travels in the next
//!   write's `State` record: never a sync of its own, never ahead of what is committed, at most one
//!   write behind (as etcd's `HardState.Commit` rides with the next WAL write);
//! - a truncation is a `Truncate` record (durable before `truncate` returns); the superseded frames
//!   stay in the file, dead, until their segment is purged;
//! - a purge records the last purged id (a `State` record, synced), then deletes the segments whose
//!   every live entry is purged. The newest `State` is always in a segment that is kept.
//!
//! A segment holds up to 64 MiB, allocated ahead of the records 4 MiB at a time; a write that does
//! not fit goes to a new segment, whose creation also costs one directory fsync. An in-memory index (log index → segment, offset) serves
//! reads of older entries; `raft/log/cache.rs` serves the newest without touching the disk.
//!
//! A write that finds the disk full zeros what it may have written, gets the ballast back and is tried
//! once more (`space/mod.rs`); if the disk is still full the write fails, which stops the raft core.

pub(crate) mod migrate;
mod queue;
pub(crate) mod recover;
pub(crate) mod segment;
mod write;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{RaftLogReader, StorageIOError, Vote};

use self::queue::WriteQueue;
use self::segment::{Loc, Segment, State};
use crate::raft::log::cache::LogCache;
use crate::raft::{any_error, blocking, Entry, LogId, NodeId, StorageError, TypeConfig};
use crate::space::Space;

/// A new segment's size.
pub(crate) const SEGMENT_BYTES: u64 = 64 << 20;

#[derive(Clone)]
pub(crate) struct Wal {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    segment_bytes: u64,
    space: Arc<Space>,
    /// The newest entries, so applying them does not read them back from disk.
    recent: Mutex<LogCache>,
    /// The latest committed log id openraft saved, written with the next write.
    committed: Mutex<Option<LogId>>,
    /// The state machine's last applied index, when the node shares it (`overlap_with_apply`).
    applied: OnceLock<Arc<AtomicU64>>,
    /// What readers see: the durable entries and state.
    index: Mutex<Index>,
    /// Writes, one at a time.
    writer: Mutex<Writer>,
    /// Writes that must not block the raft thread, in the order submitted (`queue.rs`).
    queue: WriteQueue,
    /// Whether this member is its cluster's only voter (`set_sole_voter`).
    sole_voter: AtomicBool,
}

struct Index {
    entries: BTreeMap<u64, Loc>,
    /// Every segment kept, by sequence number.
    segments: BTreeMap<u64, Segment>,
    /// The state the newest `State` record on disk holds.
    state: State,
}

struct Writer {
    active: Segment,
    /// Where the next frame goes in `active`.
    end: u64,
    /// A failed write whose bytes could not be zeroed again: no further write may follow it.
    broken: bool,
}

/// One write's change, applied to the index once it is durable.
enum Change<'a> {
    Append(&'a [Entry]),
    Truncate(u64),
    Purge(LogId),
    Vote(Vote<NodeId>),
    Identity((u64, u64)),
    /// The whole state at once (migration).
    Restore(State),
}

/// Poison carries no meaning here: every critical section leaves its data consistent before anything
/// that could panic, so the data stays usable.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn io_to_heed(e: std::io::Error) -> heed::Error {
    heed::Error::Io(e)
}

fn heed_to_io(e: heed::Error) -> std::io::Error {
    match e {
        heed::Error::Io(e) => e,
        other => std::io::Error::other(other.to_string()),
    }
}

impl Wal {
    /// Opens the log in `dir` without a disk-full ballast (tests, tools).
    pub(crate) fn open(dir: &Path) -> std::io::Result<Self> {
        Wal::open_with(dir, Arc::new(Space::without_ballast()))
    }

    /// Opens (or creates) the log in `dir`; a write that finds the disk full uses `space`'s ballast.
    pub(crate) fn open_with(dir: &Path, space: Arc<Space>) -> std::io::Result<Self> {
        Wal::open_sized(dir, space, SEGMENT_BYTES)
    }

    pub(crate) fn open_sized(dir: &Path, space: Arc<Space>, segment_bytes: u64) -> std::io::Result<Self> {
        crate::storage::data_dir::create_private_dir(dir)?;
        let found = recover::scan(dir, segment_bytes)?;
        let active = found.segments.last().cloned().ok_or_else(|| std::io::Error::other("no segment"))?;
        let mut index = Index {
            entries: found.entries,
            segments: found.segments.into_iter().map(|s| (s.seq, s)).collect(),
            state: found.state,
        };
        // Segments a purge meant to delete (its unlinks are not synced) go again.
        delete_purged(&mut index, found.state_seq.min(active.seq));
        let committed = Mutex::new(index.state.committed);
        let inner = Inner {
            dir: dir.to_path_buf(),
            segment_bytes,
            space,
            recent: Default::default(),
            committed,
            applied: OnceLock::new(),
            index: Mutex::new(index),
            writer: Mutex::new(Writer { end: found.end, active, broken: false }),
            queue: WriteQueue::default(),
            sole_voter: AtomicBool::new(false),
        };
        Ok(Wal { inner: Arc::new(inner) })
    }

    /// This member's `(member_id, cluster_id)` if it has bootstrapped or joined before: chosen once and
    /// kept, so that a later change of flags cannot change the raft node id under existing raft state.
    pub(crate) fn identity(&self) -> Result<Option<(u64, u64)>, StorageError> {
        Ok(lock(&self.inner.index).state.identity)
    }

    /// Records this member's `(member_id, cluster_id)` at bootstrap or when it joins.
    pub(crate) fn set_identity(&self, ids: (u64, u64)) -> Result<(), StorageError> {
        self.write(Change::Identity(ids)).map_err(|e| StorageIOError::write(any_error(e)).into())
    }

    /// The durable state (vote, committed, last purged, identity).
    pub(crate) fn state(&self) -> State {
        lock(&self.inner.index).state.clone()
    }

    /// Replaces the whole state at once (migration from an older log).
    pub(crate) fn restore(&self, state: State) -> std::io::Result<()> {
        *lock(&self.inner.committed) = state.committed;
        self.write(Change::Restore(state))
    }

    /// Appends entries durably, without a callback (migration, tests).
    pub(crate) fn append_now(&self, entries: &[Entry]) -> std::io::Result<()> {
        self.write(Change::Append(entries))
    }

    /// Lets appends overlap applies: `applied` is the state machine's last applied index
    /// (`StateMachine::applied_index`).
    pub(crate) fn overlap_with_apply(&self, applied: Arc<AtomicU64>) {
        let _ = self.inner.applied.set(applied);
    }

    /// Whether this member is its cluster's only voter, as its membership changes (`node/start.rs`):
    /// a sole voter's own entries have no follower to go to while they are written.
    pub(crate) fn set_sole_voter(&self, sole: bool) {
        self.inner.sole_voter.store(sole, Ordering::Release);
    }

    /// Whether committed entries wait to be applied, on the raft thread, while this append would
    /// block it.
    fn apply_pending(&self) -> bool {
        let Some(applied) = self.inner.applied.get() else { return false };
        let committed = lock(&self.inner.committed).map_or(0, |id| id.index);
        committed > applied.load(Ordering::Acquire)
    }

    /// Whether `entries` are this member's own, made as the leader: openraft (`vendor/openraft`,
    /// PATCH.md) then goes on to replicate them while they are written, and does not wait.
    fn made_here(&self, entries: &[Entry]) -> bool {
        let Some((member, _)) = lock(&self.inner.index).state.identity else { return false };
        entries.last().is_some_and(|entry| entry.log_id.leader_id.node_id == member)
    }

    /// Runs `change` on the writer thread, after every write submitted before it.
    async fn write_queued(
        &self,
        change: impl FnOnce(&Wal) -> std::io::Result<()> + Send + 'static,
    ) -> std::io::Result<()> {
        let this = self.clone();
        self.inner.queue.run(move || change(&this)).await
    }

    fn recent(&self) -> MutexGuard<'_, LogCache> {
        lock(&self.inner.recent)
    }
}

/// Deletes the segments before the one holding the oldest live entry (or before `keep`, whichever is
/// older): all they hold is purged, superseded, or state a newer record replaced. The unlinks are not
/// synced: a segment that comes back after a crash is read again and purged again (`recover.rs`).
/// Their files are closed in the background: freeing a gigabyte of segments took a second, with the
/// index locked and the raft core waiting (a follower's purge after a snapshot install).
fn delete_purged(index: &mut Index, keep: u64) {
    let oldest_live = index.entries.values().next().map_or(keep, |loc| loc.seq);
    let bound = oldest_live.min(keep);
    let kept = index.segments.split_off(&bound);
    let mut released = Vec::new();
    for (_, segment) in std::mem::replace(&mut index.segments, kept) {
        if let Err(e) = std::fs::remove_file(&segment.path) {
            tracing::warn!(segment = %segment.path.display(), error = %e, "cannot delete a purged raft log segment");
        }
        released.push(segment.file);
    }
    if !released.is_empty() {
        crate::storage::data_dir::release_in_background(released);
    }
}

/// Whether no index lies in `bounds`.
fn is_empty(bounds: (Bound<u64>, Bound<u64>)) -> bool {
    let start = match bounds.0 {
        Bound::Included(i) => i,
        Bound::Excluded(i) => match i.checked_add(1) {
            Some(i) => i,
            None => return true,
        },
        Bound::Unbounded => 0,
    };
    match bounds.1 {
        Bound::Included(end) => start > end,
        Bound::Excluded(end) => start >= end,
        Bound::Unbounded => false,
    }
}

impl RaftLogReader<TypeConfig> for Wal {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        if let Some(entries) = self.recent().get(&range) {
            return Ok(entries);
        }
        // Older entries come from the files; the newest may still be being written (a leader sends
        // its entries while it writes them), so whatever the files do not hold yet comes from the cache.
        let mut entries = self.read_durable((range.start_bound().cloned(), range.end_bound().cloned())).await?;
        let next = match (entries.last(), range.start_bound()) {
            (Some(last), _) => Some(last.log_id.index + 1),
            (None, Bound::Included(&i)) => Some(i),
            (None, Bound::Excluded(&i)) => i.checked_add(1),
            (None, Bound::Unbounded) => None,
        };
        if let Some(next) = next {
            let rest = (Bound::Included(next), range.end_bound().cloned());
            if !is_empty(rest) {
                entries.extend(self.recent().tail(next, range.end_bound().cloned()));
            }
        }
        Ok(entries)
    }
}

impl Wal {
    /// The entries in `range` that are durable, read from the segment files.
    async fn read_durable(&self, bounds: (Bound<u64>, Bound<u64>)) -> Result<Vec<Entry>, StorageError> {
        if is_empty(bounds) {
            return Ok(Vec::new()); // `BTreeMap::range` panics on an inverted range
        }
        let wanted: Vec<(Loc, Segment)> = {
            let index = lock(&self.inner.index);
            let mut wanted = Vec::new();
            for loc in index.entries.range(bounds).map(|(_, loc)| *loc) {
                // Invariant: a segment holding a live entry is never deleted (`delete_purged`).
                let Some(segment) = index.segments.get(&loc.seq) else {
                    return Err(
                        StorageIOError::read_logs(any_error("raft log segment missing for a live entry")).into()
                    );
                };
                wanted.push((loc, segment.clone()));
            }
            wanted
        };
        if wanted.is_empty() {
            return Ok(Vec::new());
        }
        blocking(move || {
            wanted
                .iter()
                .map(|(loc, segment)| segment::read_entry(&segment.file, &segment.path, loc))
                .collect::<std::io::Result<Vec<_>>>()
                .map_err(|e| StorageIOError::read_logs(any_error(e)).into())
        })
        .await
    }
}

impl RaftLogStorage<TypeConfig> for Wal {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let index = lock(&self.inner.index);
        let last_purged_log_id = index.state.last_purged;
        let last_log_id = index.entries.values().next_back().map(|loc| loc.log_id).or(last_purged_log_id);
        Ok(LogState { last_purged_log_id, last_log_id })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        let vote = *vote;
        self.write_queued(move |this| this.write(Change::Vote(vote)))
            .await
            .map_err(|e| StorageIOError::write_vote(any_error(e)).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        Ok(lock(&self.inner.index).state.vote)
    }

    /// Kept in memory and written with the next write (see the module documentation): openraft calls
    /// this before every apply, and a sync of its own would cost an `fdatasync` each time.
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        let mut saved = lock(&self.inner.committed);
        if committed > *saved {
            *saved = committed;
        }
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        let pending = *lock(&self.inner.committed);
        Ok(pending.max(lock(&self.inner.index).state.committed))
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        // Readable at once: openraft reads only entries it knows are flushed, or ships them to peers.
        self.recent().append(entries.iter().cloned());
        let made_here = self.made_here(&entries);
        let write = move |this: &Wal| {
            let result = this.write(Change::Append(&entries));
            let report = result.as_ref().map(|_| ()).map_err(|e| std::io::Error::new(e.kind(), e.to_string()));
            callback.log_io_completed(report);
            result
        };
        // Nothing else waits for the raft thread: an inline write costs no hop to the writer thread
        // and back.
        let idle = !self.apply_pending() && self.inner.queue.is_idle();
        // A leader's own entries: openraft (patched, `vendor/openraft/PATCH.md`) does not wait for
        // this write; it sends the entries to the followers while the writer thread syncs them, and
        // counts the leader in the quorum when the callback reports the flush (Raft thesis 10.2.1).
        // A sole voter has no follower to send to: when idle it writes inline, as a follower does.
        if made_here && !(idle && self.inner.sole_voter.load(Ordering::Acquire)) {
            let this = self.clone();
            return self
                .inner
                .queue
                .submit(move || {
                    let _ = write(&this);
                })
                .map_err(|e| StorageIOError::write_logs(any_error(e)).into());
        }
        // A follower's append (or a sole voter's): openraft's core waits for the flush before it
        // answers the leader (or, patched, takes the callback's report as it comes). When nothing
        // else waits for the raft thread (`raft/thread.rs`), the write runs inline, blocking it in
        // the sync: a hop to another thread and back would cost more than the write.
        // When committed entries wait to be applied, or earlier writes are still queued (an inline
        // write would overtake them), the write goes to the writer thread, so the apply runs on the
        // raft thread while the disk syncs: under load one entry applies while the next one is made durable.
        let result = if !idle {
            let this = self.clone();
            self.inner.queue.run(move || write(&this)).await
        } else {
            write(self)
        };
        result.map_err(|e| StorageIOError::write_logs(any_error(e)).into())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.recent().truncate(log_id.index);
        self.write_queued(move |this| this.write(Change::Truncate(log_id.index)))
            .await
            .map_err(|e| StorageIOError::write_logs(any_error(e)).into())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.recent().purge(log_id.index);
        // openraft's core waits for this (no heartbeat meanwhile): a slow one is worth a line.
        let started = std::time::Instant::now();
        let purged = self.write_queued(move |this| this.write(Change::Purge(log_id))).await;
        let took = started.elapsed();
        if crate::logging::slow::worth_logging(took) {
            let ms = crate::logging::slow::ms(took);
            tracing::debug!(target: crate::logging::slow::TARGET, ms, upto = log_id.index, "raft log purge (the raft core waited)");
        }
        if purged.is_ok() {
            // Once per snapshot at most (etcd logs each WAL file it purges): a member behind this
            // index now needs a snapshot.
            tracing::info!(upto = log_id.index, "raft log purged");
        }
        purged.map_err(|e| StorageIOError::write_logs(any_error(e)).into())
    }
}
