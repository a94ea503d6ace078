//! The legacy raft log: the log and vote on LMDB (`<data-dir>/member/raft`), as versions before the
//! segment log (`raft/log/wal/`) kept them. Not the live log: only read, by `raft/log/wal/migrate.rs`,
//! to move such a log into `member/wal`.
//!
//! Every append batch is one LMDB transaction committed with fsync before openraft is told it is
//! durable; batches form naturally while the previous commit is in flight (group commit).
//!
//! The committed log id (openraft's `save_committed`) is kept in memory and written with the next
//! log write (append, truncate, purge, vote), inside that write's fsynced transaction: it never costs
//! a commit of its own, is never ahead of what is committed, and lags at most one write behind —
//! as etcd's `HardState.Commit` travels with the next WAL write. On restart openraft re-applies the
//! log up to it before the member serves.
//!
//! A write that finds the disk full gets the ballast back and is tried once more (`space/mod.rs`); if the
//! disk is still full the write fails, which stops the raft core.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{RaftLogReader, StorageIOError, Vote};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::cache::LogCache;
use crate::raft::{any_error, blocking, Entry, LogId, NodeId, StorageError, TypeConfig};
use crate::space::Space;
use crate::storage::{self, Db, LmdbEnv};

const VOTE: &[u8] = b"vote";
const LAST_PURGED: &[u8] = b"last_purged";
const IDENTITY: &[u8] = b"identity";
const COMMITTED: &[u8] = b"committed";

#[derive(Clone)]
pub(crate) struct LegacyLog {
    inner: Arc<Inner>,
}

struct Inner {
    env: LmdbEnv,
    log: Db,
    meta: Db,
    /// The newest entries, so applying them does not read them back from LMDB.
    recent: std::sync::Mutex<LogCache>,
    /// The latest committed log id openraft saved, written with the next log write.
    committed: std::sync::Mutex<Option<LogId>>,
    space: Arc<Space>,
}

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, postcard::Error> {
    postcard::to_allocvec(value)
}

impl LegacyLog {
    /// Opens the log without a disk-full ballast.
    pub(crate) fn open(dir: &Path) -> Result<Self, heed::Error> {
        LegacyLog::open_with(dir, Arc::new(Space::without_ballast()))
    }

    /// Opens the log; a write that finds the disk full uses `space`'s ballast.
    pub(crate) fn open_with(dir: &Path, space: Arc<Space>) -> Result<Self, heed::Error> {
        let (env, [log, meta]) = storage::open(dir, ["log", "meta"], storage::Durability::Full)?;
        let inner = Inner { env, log, meta, recent: Default::default(), committed: Default::default(), space };
        Ok(LegacyLog { inner: Arc::new(inner) })
    }

    /// Runs `write` in a write transaction that also records the latest committed log id, and commits
    /// it (with fsync); on a full disk, once more after the ballast is given back.
    fn write(&self, write: impl Fn(&mut heed::RwTxn) -> heed::Result<()>) -> heed::Result<()> {
        self.inner.space.write_or_make_room(self.inner.env.path(), || {
            let mut txn = self.inner.env.write_txn()?;
            write(&mut txn)?;
            let committed = *self.inner.committed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(committed) = committed {
                let bytes = encode(&committed).map_err(|e| heed::Error::Encoding(Box::new(e)))?;
                self.inner.meta.put(&mut txn, COMMITTED, &bytes)?;
            }
            // etcd's WAL fsync: here the commit of the log's transaction, which fsyncs.
            let syncing = std::time::Instant::now();
            let committed = txn.commit();
            crate::metrics::WAL_FSYNC_SECONDS.observe(syncing.elapsed().as_secs_f64());
            committed
        })
    }

    /// This member's `(member_id, cluster_id)` if it has bootstrapped or joined before: chosen once and
    /// kept, so that a later change of flags cannot change the raft node id under existing raft state.
    pub(crate) fn identity(&self) -> Result<Option<(u64, u64)>, StorageError> {
        self.read_meta(IDENTITY)
    }

    /// Records this member's `(member_id, cluster_id)` at bootstrap or when it joins.
    #[cfg(test)]
    pub(crate) fn set_identity(&self, ids: (u64, u64)) -> Result<(), StorageError> {
        self.write_meta(IDENTITY, &ids)
    }

    fn recent(&self) -> std::sync::MutexGuard<'_, LogCache> {
        // The cache holds no invariant a panicking holder could break halfway: keep using it.
        self.inner.recent.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn read_meta<T: DeserializeOwned>(&self, name: &[u8]) -> Result<Option<T>, StorageError> {
        let read = || -> Result<Option<T>, Box<dyn std::error::Error>> {
            let txn = self.inner.env.read_txn()?;
            Ok(self.inner.meta.get(&txn, name)?.map(postcard::from_bytes).transpose()?)
        };
        read().map_err(|e| StorageIOError::read(any_error(e)).into())
    }

    fn write_meta<T: Serialize>(&self, name: &'static [u8], value: &T) -> Result<(), StorageError> {
        let bytes = encode(value).map_err(|e| StorageIOError::write(any_error(e)))?;
        self.write(|txn| self.inner.meta.put(txn, name, &bytes)).map_err(|e| StorageIOError::write(any_error(e)).into())
    }
}

impl RaftLogReader<TypeConfig> for LegacyLog {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        if let Some(entries) = self.recent().get(&range) {
            return Ok(entries);
        }
        let this = self.clone();
        let start = match range.start_bound() {
            Bound::Included(&i) => Bound::Included(i),
            Bound::Excluded(&i) => Bound::Excluded(i),
            Bound::Unbounded => Bound::Unbounded,
        };
        let end = match range.end_bound() {
            Bound::Included(&i) => Bound::Included(i),
            Bound::Excluded(&i) => Bound::Excluded(i),
            Bound::Unbounded => Bound::Unbounded,
        };
        blocking(move || {
            let read = || -> Result<Vec<Entry>, Box<dyn std::error::Error>> {
                let txn = this.inner.env.read_txn()?;
                let start = start.map(index_key);
                let end = end.map(index_key);
                let bounds = (start.as_ref().map(|k| &k[..]), end.as_ref().map(|k| &k[..]));
                let mut entries = Vec::new();
                for item in this.inner.log.range(&txn, &bounds)? {
                    let (_, bytes) = item?;
                    entries.push(postcard::from_bytes(bytes)?);
                }
                Ok(entries)
            };
            read().map_err(|e| StorageIOError::read_logs(any_error(e)).into())
        })
        .await
    }
}

impl RaftLogStorage<TypeConfig> for LegacyLog {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let this = self.clone();
        blocking(move || {
            let last_purged_log_id: Option<LogId> = this.read_meta(LAST_PURGED)?;
            let read = || -> Result<Option<Entry>, Box<dyn std::error::Error>> {
                let txn = this.inner.env.read_txn()?;
                Ok(this.inner.log.last(&txn)?.map(|(_, bytes)| postcard::from_bytes(bytes)).transpose()?)
            };
            let last = read().map_err(|e| StorageIOError::read_logs(any_error(e)))?;
            let last_log_id = last.map(|e| e.log_id).or(last_purged_log_id);
            Ok(LogState { last_purged_log_id, last_log_id })
        })
        .await
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        let (this, vote) = (self.clone(), *vote);
        blocking(move || this.write_meta(VOTE, &vote)).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        let this = self.clone();
        blocking(move || this.read_meta(VOTE)).await
    }

    /// Kept in memory and written with the next log write (see the module documentation): openraft
    /// calls this before every apply, and a commit of its own would cost an fsync each time.
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        let mut saved = self.inner.committed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if committed > *saved {
            *saved = committed;
        }
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        let latest = *self.inner.committed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if latest.is_some() {
            return Ok(latest);
        }
        let this = self.clone();
        blocking(move || this.read_meta(COMMITTED)).await
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let encoded: Vec<([u8; 8], Vec<u8>)> = entries
            .iter()
            .map(|e| Ok((index_key(e.log_id.index), encode(e)?)))
            .collect::<Result<_, postcard::Error>>()
            .map_err(|e| StorageIOError::write_logs(any_error(e)))?;
        // Readable at once: openraft reads only entries it knows are flushed, or ships them to peers.
        self.recent().append(entries);
        let this = self.clone();
        blocking(move || {
            let result = this.write(|txn| {
                for (key, bytes) in &encoded {
                    this.inner.log.put(txn, key, bytes)?;
                }
                Ok(())
            });
            let report = result.as_ref().map(|_| ()).map_err(|e| std::io::Error::other(e.to_string()));
            callback.log_io_completed(report);
            result.map_err(|e| StorageIOError::write_logs(any_error(e)).into())
        })
        .await
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.recent().truncate(log_id.index);
        let this = self.clone();
        blocking(move || {
            let from = index_key(log_id.index);
            this.write(|txn| {
                this.inner.log.delete_range(txn, &(Bound::Included(&from[..]), Bound::Unbounded))?;
                Ok(())
            })
            .map_err(|e| StorageIOError::write_logs(any_error(e)).into())
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.recent().purge(log_id.index);
        let this = self.clone();
        blocking(move || {
            let purged = encode(&log_id).map_err(|e| StorageIOError::write_logs(any_error(e)))?;
            let upto = index_key(log_id.index);
            this.write(|txn| {
                this.inner.meta.put(txn, LAST_PURGED, &purged)?;
                this.inner.log.delete_range(txn, &(Bound::Unbounded, Bound::Included(&upto[..])))?;
                Ok(())
            })
            .map_err(|e| StorageIOError::write_logs(any_error(e)).into())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use openraft::CommittedLeaderId;

    use super::*;

    #[tokio::test]
    async fn the_committed_id_is_written_with_the_next_log_write() {
        let dir = tempfile::tempdir().unwrap();
        let committed = Some(LogId::new(CommittedLeaderId::new(1, 1), 3));
        {
            let mut log = LegacyLog::open(dir.path()).unwrap();
            log.save_committed(committed).await.unwrap();
            assert_eq!(log.read_committed().await.unwrap(), committed);
            assert_eq!(log.read_meta::<LogId>(COMMITTED).unwrap(), None, "no commit of its own");
            log.save_vote(&Vote::new(1, 1)).await.unwrap();
            assert_eq!(log.read_meta::<LogId>(COMMITTED).unwrap(), committed);
            // Never backwards.
            log.save_committed(Some(LogId::new(CommittedLeaderId::new(1, 1), 2))).await.unwrap();
            assert_eq!(log.read_committed().await.unwrap(), committed);
        }
        let mut reopened = LegacyLog::open(dir.path()).unwrap();
        assert_eq!(reopened.read_committed().await.unwrap(), committed, "read back after a restart");
    }
}
