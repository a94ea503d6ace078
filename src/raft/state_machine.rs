//! The raft state machine on LMDB (`<data-dir>/member/kv`): applies committed entries to the MVCC store
//! and records the applied log id and membership in the same transaction.
//!
//! Snapshots are a dump of every kv table; the newest one is kept in `<data-dir>/member/snap/` so a
//! restarted member can still send it to a follower.

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{EntryPayload, RaftSnapshotBuilder, StorageIOError};
use serde::{Deserialize, Serialize};

use super::{any_error, blocking, BatchResults, Entry, LogId, StorageError, StoredMembership, TypeConfig};
use crate::apply::{Effects, Stores};
use crate::auth::store::AuthStore;
use crate::auth::tokens::Tokens;
use crate::error::EtcdError;
use crate::lease::store::LeaseStore;
use crate::mvcc::KvStore;
use crate::storage::{self, Db, LmdbEnv};

const APPLIED: &[u8] = b"applied";
const MEMBERSHIP: &[u8] = b"membership";
const SNAPSHOT_FILE: &str = "current.snap";

/// The applied state, shared with the read path (which opens its own read transactions on `env`).
pub struct State {
    pub env: LmdbEnv,
    pub kv: KvStore,
    pub leases: LeaseStore,
    pub auth: AuthStore,
    tokens: std::sync::OnceLock<Arc<Tokens>>,
    meta: Db,
    snap_dir: PathBuf,
    observer: std::sync::OnceLock<Observer>,
}

/// What one applied batch changed, told to the observer after the batch's transaction commits.
#[derive(Debug, Default, Clone)]
pub struct Committed {
    /// The store's revision after the batch.
    pub revision: i64,
    /// Whether auth is enabled, and the auth revision, after the batch.
    pub auth_enabled: bool,
    pub auth_revision: u64,
    pub effects: Effects,
    /// Requests applied in the batch (a blank or membership entry counts as one), for `--snapshot-count`.
    pub requests: u64,
}

/// Called on the apply thread after each commit: must be quick and must not block.
pub type Observer = Box<dyn Fn(Committed) + Send + Sync>;

#[derive(Clone)]
pub struct StateMachine {
    state: Arc<State>,
}

/// A snapshot file: openraft's metadata and every kv table's records.
#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    meta: SnapshotMeta<u64, openraft::BasicNode>,
    #[serde(with = "serde_bytes")]
    data: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
struct SnapshotData {
    tables: Vec<Vec<(serde_bytes::ByteBuf, serde_bytes::ByteBuf)>>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl StateMachine {
    pub fn open(kv_dir: &Path, snap_dir: &Path) -> Result<Self, heed::Error> {
        let [live, revs, index, kv_meta] = KvStore::TABLES;
        let [leases, lease_keys] = LeaseStore::TABLES;
        let [users, roles, auth_meta] = AuthStore::TABLES;
        let names = [live, revs, index, kv_meta, leases, lease_keys, users, roles, auth_meta, "sm_meta"];
        let (env, dbs) = storage::open(kv_dir, names, storage::Durability::LastCommitMayUndo)?;
        let [live, revs, index, kv_meta, leases, lease_keys, users, roles, auth_meta, meta] = dbs;
        std::fs::create_dir_all(snap_dir)?;
        let state = State {
            env,
            kv: KvStore::new([live, revs, index, kv_meta]),
            leases: LeaseStore::new([leases, lease_keys]),
            auth: AuthStore::new([users, roles, auth_meta]),
            tokens: std::sync::OnceLock::new(),
            meta,
            snap_dir: snap_dir.to_path_buf(),
            observer: std::sync::OnceLock::new(),
        };
        Ok(StateMachine { state: Arc::new(state) })
    }

    pub fn state(&self) -> Arc<State> {
        self.state.clone()
    }
}

impl State {
    /// Sets who is told about each committed batch (once; later calls are ignored).
    pub fn observe(&self, observer: Observer) {
        let _ = self.observer.set(observer);
    }

    /// Sets the token provider Authenticate entries issue simple tokens into (once).
    pub fn use_tokens(&self, tokens: Arc<Tokens>) {
        let _ = self.tokens.set(tokens);
    }

    /// Every replicated table, in snapshot order.
    fn tables(&self) -> Vec<Db> {
        self.kv.tables().into_iter().chain(self.leases.tables()).chain(self.auth.tables()).collect()
    }

    pub fn page_size(&self) -> u64 {
        u64::from(self.env.unnamed_database_stat().page_size)
    }

    fn read_meta<T: serde::de::DeserializeOwned>(&self, txn: &heed::RoTxn, name: &[u8]) -> Result<Option<T>, BoxError> {
        Ok(self.meta.get(txn, name)?.map(postcard::from_bytes).transpose()?)
    }

    fn applied_state(&self) -> Result<(Option<LogId>, StoredMembership), BoxError> {
        let txn = self.env.read_txn()?;
        let applied = self.read_meta::<Option<LogId>>(&txn, APPLIED)?.flatten();
        let membership = self.read_meta(&txn, MEMBERSHIP)?.unwrap_or_default();
        Ok((applied, membership))
    }

    fn apply_batch(&self, entries: Vec<Entry>) -> Result<Vec<BatchResults>, BoxError> {
        let mut txn = self.env.write_txn()?;
        let mut results = Vec::with_capacity(entries.len());
        let mut applied = None;
        let mut effects = Effects::default();
        let mut requests = 0u64;
        let stores = Stores {
            kv: &self.kv,
            leases: &self.leases,
            auth: &self.auth,
            simple_tokens: self.tokens.get().and_then(|t| t.simple()),
        };
        for entry in entries {
            applied = Some(entry.log_id);
            let entry_results = match entry.payload {
                EntryPayload::Blank => Vec::new(),
                EntryPayload::Normal(batch) => {
                    let mut entry_results = Vec::with_capacity(batch.0.requests.len());
                    for req in &batch.0.requests {
                        entry_results.push(match crate::apply::apply(&stores, &mut txn, req, entry.log_id.index) {
                            Ok((applied, done)) => {
                                effects.events.extend(done.events);
                                effects.granted.extend(done.granted);
                                effects.revoked.extend(done.revoked);
                                effects.auth = merge_affected(effects.auth.take(), done.auth);
                                Ok(applied)
                            }
                            // A storage failure leaves the transaction unusable: abort the batch, stop the node.
                            Err(EtcdError::Internal) => return Err("storage failure while applying".into()),
                            Err(EtcdError::NoSpace) => return Err("database space exceeded while applying".into()),
                            Err(refused) => Err(refused),
                        });
                    }
                    entry_results
                }
                EntryPayload::Membership(membership) => {
                    let stored = StoredMembership::new(Some(entry.log_id), membership);
                    self.meta.put(&mut txn, MEMBERSHIP, &postcard::to_allocvec(&stored)?)?;
                    Vec::new()
                }
            };
            requests += entry_results.len().max(1) as u64;
            results.push(entry_results);
        }
        self.meta.put(&mut txn, APPLIED, &postcard::to_allocvec(&applied)?)?;
        let revision = self.kv.view(&txn)?.rev;
        let (auth_enabled, auth_revision) = (self.auth.enabled(&txn)?, self.auth.revision(&txn)?);
        txn.commit()?;
        // Only after the commit: observers must never see effects that a crash could undo.
        if let Some(observer) = self.observer.get() {
            observer(Committed { revision, auth_enabled, auth_revision, effects, requests });
        }
        Ok(results)
    }

    fn build_snapshot(&self) -> Result<SnapshotFile, BoxError> {
        // The log is purged behind a snapshot: everything the snapshot covers must be durable first.
        self.env.force_sync()?;
        let txn = self.env.read_txn()?;
        let last_log_id = self.read_meta::<Option<LogId>>(&txn, APPLIED)?.flatten();
        let last_membership: StoredMembership = self.read_meta(&txn, MEMBERSHIP)?.unwrap_or_default();
        let data = encode_tables(&self.tables(), &txn)?;
        drop(txn);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let snapshot_id = match last_log_id {
            Some(id) => format!("{}-{}-{nanos}", id.leader_id, id.index),
            None => format!("empty-{nanos}"),
        };
        let file = SnapshotFile { meta: SnapshotMeta { last_log_id, last_membership, snapshot_id }, data };
        self.save_snapshot(&file)?;
        Ok(file)
    }

    fn install_snapshot(&self, file: &SnapshotFile) -> Result<(), BoxError> {
        let data: SnapshotData = postcard::from_bytes(&file.data)?;
        let tables = self.tables();
        if data.tables.len() != tables.len() {
            return Err("snapshot has an unexpected number of tables".into());
        }
        let mut txn = self.env.write_txn()?;
        for (db, records) in tables.iter().zip(&data.tables) {
            db.clear(&mut txn)?;
            for (k, v) in records {
                db.put(&mut txn, k, v)?;
            }
        }
        self.meta.put(&mut txn, APPLIED, &postcard::to_allocvec(&file.meta.last_log_id)?)?;
        self.meta.put(&mut txn, MEMBERSHIP, &postcard::to_allocvec(&file.meta.last_membership)?)?;
        txn.commit()?;
        // Everything may have changed: no cached permission survives a snapshot install.
        self.auth.cache.clear();
        self.save_snapshot(file)
    }

    /// Writes the snapshot file atomically: a crash leaves the previous one or the new one.
    fn save_snapshot(&self, file: &SnapshotFile) -> Result<(), BoxError> {
        let tmp = self.snap_dir.join(format!("{SNAPSHOT_FILE}.tmp"));
        {
            use std::io::Write;
            // Streamed: the snapshot is not held in memory a second time while it is written.
            let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
            postcard::to_io(file, &mut f)?;
            f.flush()?;
            f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        }
        std::fs::rename(&tmp, self.snap_dir.join(SNAPSHOT_FILE))?;
        Ok(())
    }

    fn load_snapshot(&self) -> Result<Option<SnapshotFile>, BoxError> {
        match std::fs::read(self.snap_dir.join(SNAPSHOT_FILE)) {
            Ok(bytes) => Ok(Some(postcard::from_bytes(&bytes)?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

fn merge_affected(
    a: Option<crate::auth::cache::Affected>,
    b: Option<crate::auth::cache::Affected>,
) -> Option<crate::auth::cache::Affected> {
    use crate::auth::cache::Affected;
    match (a, b) {
        (None, x) | (x, None) => x,
        (Some(Affected::Everyone), _) | (_, Some(Affected::Everyone)) => Some(Affected::Everyone),
        (Some(Affected::Nobody), x) | (x, Some(Affected::Nobody)) => x,
        (Some(Affected::Users(mut a)), Some(Affected::Users(b))) => {
            a.extend(b);
            Some(Affected::Users(a))
        }
    }
}

/// Encodes every table's records exactly as postcard encodes `SnapshotData`, straight from the read
/// transaction into one buffer: the snapshot is in memory once, as its encoding, instead of also as a
/// pair of allocations per record.
fn encode_tables(tables: &[Db], txn: &heed::RoTxn<'_, heed::WithoutTls>) -> Result<Vec<u8>, BoxError> {
    // A sequence is its length as a varint, then its elements; a byte string likewise.
    let mut data = postcard::to_extend(&tables.len(), Vec::new())?;
    for db in tables {
        data = postcard::to_extend(&(db.len(txn)? as usize), data)?;
        for item in db.iter(txn)? {
            let (k, v) = item?;
            data = postcard::to_extend(&(serde_bytes::Bytes::new(k), serde_bytes::Bytes::new(v)), data)?;
        }
    }
    Ok(data)
}

fn to_snapshot(file: SnapshotFile) -> Snapshot<TypeConfig> {
    Snapshot { meta: file.meta, snapshot: Box::new(Cursor::new(file.data)) }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let state = self.state.clone();
        blocking(move || state.build_snapshot().map_err(|e| StorageIOError::write_snapshot(None, any_error(e)).into()))
            .await
            .map(to_snapshot)
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let state = self.state.clone();
        blocking(move || state.applied_state().map_err(|e| StorageIOError::read_state_machine(any_error(e)).into()))
            .await
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<BatchResults>, StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let state = self.state.clone();
        blocking(move || {
            state.apply_batch(entries).map_err(|e| StorageIOError::write_state_machine(any_error(e)).into())
        })
        .await
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, openraft::BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let file = SnapshotFile { meta: meta.clone(), data: snapshot.into_inner() };
        let state = self.state.clone();
        let signature = meta.signature();
        blocking(move || {
            state
                .install_snapshot(&file)
                .map_err(|e| StorageIOError::write_snapshot(Some(signature), any_error(e)).into())
        })
        .await
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let state = self.state.clone();
        blocking(move || state.load_snapshot().map_err(|e| StorageIOError::read_snapshot(None, any_error(e)).into()))
            .await
            .map(|file| file.map(to_snapshot))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_table_encoding_is_postcards_encoding_of_the_records() {
        let dir = tempfile::tempdir().expect("temp dir");
        let sm = StateMachine::open(&dir.path().join("kv"), &dir.path().join("snap")).expect("open");
        let state = sm.state();
        let tables = state.tables();
        let mut txn = state.env.write_txn().unwrap();
        for (i, db) in tables.iter().enumerate().take(3) {
            for j in 0..(i * 200) {
                db.put(&mut txn, format!("key-{j:04}").as_bytes(), &vec![i as u8; j]).unwrap();
            }
        }
        txn.commit().unwrap();

        let txn = state.env.read_txn().unwrap();
        let streamed = encode_tables(&tables, &txn).unwrap();
        let records = tables
            .iter()
            .map(|db| {
                db.iter(&txn)
                    .unwrap()
                    .map(|kv| kv.map(|(k, v)| (serde_bytes::ByteBuf::from(k), serde_bytes::ByteBuf::from(v))).unwrap())
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>();
        assert_eq!(records.iter().map(Vec::len).sum::<usize>(), 200 + 400);
        assert_eq!(streamed, postcard::to_allocvec(&SnapshotData { tables: records }).unwrap());
    }
}
