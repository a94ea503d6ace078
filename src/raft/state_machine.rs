//! The raft state machine on LMDB (`<data-dir>/member/kv`): applies committed entries to the MVCC store
//! and records the applied log id and membership in the same transaction.
//!
//! Snapshots are a dump of every kv table, streamed from a read transaction into a file
//! (`snapshot_file.rs`) and kept in the snap dir (`snap_dir.rs`); installing one streams its records
//! into one write transaction, then rebuilds everything derived from the applied state and tells the
//! observer (`Committed::installed`).
//!
//! A batch that finds storage full (the disk, or LMDB's map) is aborted and applied again, unchanged,
//! until it fits (`space/mod.rs`): what an entry does never depends on one member's disk.

use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use openraft::storage::{RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{EntryPayload, RaftSnapshotBuilder, StorageIOError};

use super::snap_dir::{SnapDir, TempFile};
use super::snapshot_data::SnapshotData;
use super::snapshot_file::{self, Meta};
use super::{any_error, blocking, BatchResults, Entry, LogId, StorageError, StoredMembership, TypeConfig};
use crate::apply::{Effects, Stores};
use crate::auth::store::AuthStore;
use crate::auth::tokens::Tokens;
use crate::error::EtcdError;
use crate::lease::store::{LeaseRecord, LeaseStore};
use crate::mvcc::KvStore;
use crate::proto::etcdserverpb::{AlarmMember, AlarmType};
use crate::space::alarm::AlarmStore;
use crate::space::{Full, Space};
use crate::storage::mapping::{self, Mapping, ReadTxn};
use crate::storage::table::LongKeys;
use crate::storage::{self, Db, LmdbEnv, Writes};

#[cfg(test)]
mod apply_fuzz;
pub(crate) mod defrag;
#[cfg(test)]
mod mapping_tests;
#[cfg(test)]
pub(crate) mod snapshot_tests;

const APPLIED: &[u8] = b"applied";
const MEMBERSHIP: &[u8] = b"membership";
/// Longest wait between attempts to apply a batch while storage is full.
const FULL_RETRY_MAX: Duration = Duration::from_secs(10);

/// The applied state, shared with the read path (which opens its own read transactions on `env`).
pub struct State {
    /// Private: every use of the map goes through `mapping`'s pin (`read_txn`, `sync`, ...).
    env: LmdbEnv,
    mapping: Mapping,
    pub kv: KvStore,
    pub leases: LeaseStore,
    pub auth: AuthStore,
    pub alarms: AlarmStore,
    pub space: Arc<Space>,
    /// The remainders of keys longer than LMDB's limit, for every table above (`storage/table.rs`).
    long: LongKeys,
    /// Every active alarm as of the latest commit, for readers that must not open a transaction
    /// (`/health`, `/metrics`, the quota check).
    active_alarms: RwLock<Arc<Vec<AlarmMember>>>,
    meta: Db,
    /// What this environment's `State` hands on to the one that replaces it (`defrag.rs`).
    tokens: Arc<OnceLock<Arc<Tokens>>>,
    snaps: Arc<SnapDir>,
    observer: Arc<OnceLock<Observer>>,
    /// Tests: how many more batches find storage full before anything is written.
    #[cfg(test)]
    pub(crate) inject_full: std::sync::atomic::AtomicU32,
    /// Tests: the next batch meets a storage failure (the raft core stops).
    #[cfg(test)]
    pub(crate) inject_failure: std::sync::atomic::AtomicBool,
}

/// What one applied batch changed, told to the observer after the batch's transaction commits.
#[derive(Debug, Default, Clone)]
pub struct Committed {
    /// The store's revision after the batch.
    pub revision: i64,
    /// The store's revision before it: a watcher that has delivered up to here misses nothing.
    pub previous_revision: i64,
    /// Whether auth is enabled, and the auth revision, after the batch.
    pub auth_enabled: bool,
    pub auth_revision: u64,
    pub effects: Effects,
    /// Requests applied in the batch (a blank or membership entry counts as one), for `--snapshot-count`.
    pub requests: u64,
    /// Set when a snapshot install replaced the whole applied state instead of a batch: there are no
    /// events, the revision may have jumped, and whatever was derived from the old state must be
    /// derived again from the new one.
    pub installed: Option<Installed>,
    /// `effects.events` encoded for watchers, once, by the first that sends them.
    pub encoded: crate::mvcc::encoded_events::EncodedEvents,
}

/// What a snapshot install tells the observer beyond the revision and the auth state.
#[derive(Debug, Default, Clone)]
pub struct Installed {
    /// Every lease of the installed state, for the lease clock.
    pub leases: Vec<(i64, LeaseRecord)>,
}

/// Called on the apply thread after each commit: must be quick and must not block.
pub(crate) type Observer = Box<dyn Fn(Committed) + Send + Sync>;

#[derive(Clone)]
pub struct StateMachine {
    kv: Arc<KvEnv>,
    /// The index of the last entry applied (`applied_index`).
    applied: Arc<AtomicU64>,
}

/// The kv environment as every holder reaches it (the node's read path, apply, snapshots): the one
/// indirection Defragment swaps (`defrag.rs`). A reader takes the current `State`, an `Arc`, so a read
/// in flight keeps its environment open until it ends; writers (apply, snapshot installs) also hold
/// `writing`, which Defragment takes to pause them.
pub struct KvEnv {
    /// `None` only while Defragment, holding the write lock, closes one environment and opens the
    /// next: no reader can see it.
    current: RwLock<Option<Arc<State>>>,
    writing: Mutex<()>,
    /// A defragment is running (etcd's `etcd_disk_defrag_inflight`).
    defragmenting: AtomicBool,
}

impl KvEnv {
    /// The applied state on the current environment.
    pub fn current(&self) -> Arc<State> {
        let current = self.current.read().unwrap_or_else(PoisonError::into_inner);
        // Invariant: `None` only under Defragment's write lock (see `current`).
        current.clone().expect("the kv environment is open outside a defragment's swap")
    }

    /// Runs `write` on the current state with writes paused for Defragment.
    fn write<T>(&self, write: impl FnOnce(&State) -> T) -> T {
        let _writing = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        write(&self.current())
    }

    /// Like `write`, but `None` at once instead of waiting while a defragment pauses writes.
    fn try_write<T>(&self, write: impl FnOnce(&State) -> T) -> Option<T> {
        let _writing = match self.writing.try_lock() {
            Ok(writing) => writing,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        Some(write(&self.current()))
    }

    /// Whether a defragment is running.
    pub fn defragmenting(&self) -> bool {
        self.defragmenting.load(std::sync::atomic::Ordering::Relaxed)
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a batch could not be applied.
#[derive(Debug)]
enum ApplyFailure {
    /// Storage is full: nothing of the batch was kept; apply it again once there is room.
    Full(Full),
    /// Storage failed: the raft core must stop.
    Storage(BoxError),
}

impl ApplyFailure {
    /// For callers outside apply, which do not retry: full storage is an error like any other.
    fn into_error(self) -> BoxError {
        match self {
            ApplyFailure::Full(Full::Disk) => "no space left on the disk of the kv database".into(),
            ApplyFailure::Full(Full::Map) => "the map of the kv database is full".into(),
            ApplyFailure::Storage(e) => e,
        }
    }
}

impl<E: Into<BoxError>> From<E> for ApplyFailure {
    fn from(err: E) -> ApplyFailure {
        ApplyFailure::Storage(err.into())
    }
}

impl State {
    /// A heed error from a write or a commit, told apart: full storage is retried, anything else
    /// stops the raft core.
    fn write_failure(&self, err: heed::Error) -> ApplyFailure {
        match crate::space::full_kind_at(&err, self.env.path()) {
            Some(kind) => ApplyFailure::Full(kind),
            None => ApplyFailure::Storage(err.into()),
        }
    }
}

impl StateMachine {
    /// Opens the state machine with etcd's default quota and no disk-full ballast.
    pub fn open(kv_dir: &Path, snap_dir: &Path) -> Result<Self, heed::Error> {
        StateMachine::open_with(kv_dir, snap_dir, Arc::new(Space::without_ballast()))
    }

    /// Opens the state machine for an offline tool (`keyward snapshot`, `migrate`): written with
    /// copied writes, so its map never has to grow (`storage::mapping`).
    pub fn open_offline(kv_dir: &Path, snap_dir: &Path) -> Result<Self, heed::Error> {
        StateMachine::open_writing(kv_dir, snap_dir, Arc::new(Space::without_ballast()), Some(Writes::Copied))
    }

    /// Opens the state machine; `space` sets the quota (and with it the map size) and the ballast.
    pub fn open_with(kv_dir: &Path, snap_dir: &Path, space: Arc<Space>) -> Result<Self, heed::Error> {
        StateMachine::open_writing(kv_dir, snap_dir, space, None)
    }

    /// `open_with`, with the environment written as `writes` says instead of as its file system
    /// allows (for tests of each way).
    pub fn open_writing(
        kv_dir: &Path,
        snap_dir: &Path,
        space: Arc<Space>,
        writes: Option<Writes>,
    ) -> Result<Self, heed::Error> {
        let snaps = SnapDir::open(snap_dir).map_err(|e| heed::Error::Io(std::io::Error::other(e)))?;
        if kv_dir.exists() {
            storage::compacted::remove_leftovers(kv_dir).map_err(heed::Error::Io)?;
        }
        let carried = Carried {
            space,
            tokens: Default::default(),
            snaps: Arc::new(snaps),
            observer: Default::default(),
            audit: None,
            writes,
        };
        let state = State::open(kv_dir, carried)?;
        let kv = KvEnv {
            current: RwLock::new(Some(Arc::new(state))),
            writing: Mutex::new(()),
            defragmenting: AtomicBool::new(false),
        };
        Ok(StateMachine { kv: Arc::new(kv), applied: Default::default() })
    }

    /// The applied state on the current kv environment.
    pub fn state(&self) -> Arc<State> {
        self.kv.current()
    }

    /// The index of the last entry applied since this process started (0 before the first apply),
    /// for the log: an append may overlap a pending apply (`wal/mod.rs`).
    pub fn applied_index(&self) -> Arc<AtomicU64> {
        self.applied.clone()
    }

    /// The swappable kv environment, for the node to hold.
    pub fn kv_env(&self) -> Arc<KvEnv> {
        self.kv.clone()
    }
}

/// What a `State` hands on to the one that replaces it after a defragment: everything that is not
/// tied to the environment (the permission cache is rebuilt on use, alarms and size are re-read).
#[derive(Clone)]
struct Carried {
    space: Arc<Space>,
    tokens: Arc<OnceLock<Arc<Tokens>>>,
    snaps: Arc<SnapDir>,
    observer: Arc<OnceLock<Observer>>,
    audit: Option<Arc<crate::auth::audit::AuditLog>>,
    /// How the environment is written: `None` chooses by its file system (`Writes::for_dir`).
    writes: Option<Writes>,
}

impl State {
    /// Opens the environment at `kv_dir` and the state on it.
    fn open(kv_dir: &Path, carried: Carried) -> Result<State, heed::Error> {
        let [live, revs, index, kv_meta] = KvStore::TABLES;
        let [leases, lease_keys] = LeaseStore::TABLES;
        let [users, roles, auth_meta] = AuthStore::TABLES;
        let [alarms] = AlarmStore::TABLES;
        let names = [
            live,
            revs,
            index,
            kv_meta,
            leases,
            lease_keys,
            users,
            roles,
            auth_meta,
            alarms,
            LongKeys::TABLE,
            "sm_meta",
        ];
        let existing = std::fs::metadata(kv_dir.join("data.mdb")).map_or(0, |m| m.len());
        let ceiling = crate::space::map_size(carried.space.quota(), existing);
        crate::storage::data_dir::create_private_dir(kv_dir)?;
        let wanted = carried.writes.unwrap_or_else(|| Writes::for_dir(kv_dir));
        let (writes, map_size) = mapping::plan(kv_dir, wanted, existing, ceiling as u64)?;
        let (env, dbs) = storage::open_with(kv_dir, names, storage::Durability::Deferred, writes, map_size as usize)?;
        let mapping = Mapping::new(kv_dir, &env, writes, ceiling as u64)?;
        tracing::info!(dir = %kv_dir.display(), ?writes, reserved = mapping.reserved(), "kv environment opened");
        let [live, revs, index, kv_meta, leases, lease_keys, users, roles, auth_meta, alarms, long_keys, meta] = dbs;
        let long = LongKeys::new(long_keys);
        let state = State {
            env,
            mapping,
            kv: KvStore::new([live, revs, index, kv_meta], long),
            leases: LeaseStore::new([leases, lease_keys], long),
            auth: AuthStore::new([users, roles, auth_meta], long),
            alarms: AlarmStore::new([alarms]),
            space: carried.space,
            long,
            active_alarms: Default::default(),
            meta,
            tokens: carried.tokens,
            snaps: carried.snaps,
            observer: carried.observer,
            #[cfg(test)]
            inject_full: Default::default(),
            #[cfg(test)]
            inject_failure: Default::default(),
        };
        state.install_current_if_newer().map_err(|e| heed::Error::Io(std::io::Error::other(e)))?;
        {
            let txn = state.read_txn()?;
            state.after_commit(&txn)?;
        }
        if let Some(audit) = carried.audit {
            let _ = state.auth.audit.set(audit);
        }
        Ok(state)
    }

    /// What the `State` that replaces this one keeps.
    fn carried(&self) -> Carried {
        Carried {
            space: self.space.clone(),
            tokens: self.tokens.clone(),
            snaps: self.snaps.clone(),
            observer: self.observer.clone(),
            audit: self.auth.audit.get().cloned(),
            writes: Some(self.mapping.writes()),
        }
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
    pub fn tables(&self) -> Vec<Db> {
        let tables = self.kv.tables().into_iter().chain(self.leases.tables()).chain(self.auth.tables());
        tables.chain(self.alarms.tables()).chain([self.long.db()]).collect()
    }

    /// etcd's `Hash`: every replicated table — the kv store (its keys hashed whole, `mvcc/hash.rs`),
    /// then leases, users, roles, the auth revision and alarms as stored — so members that applied the
    /// same entries agree, and a member whose auth state diverged (etcd #11651) does not.
    pub fn hash_all(&self, txn: &heed::RoTxn) -> Result<u32, EtcdError> {
        let mut crc = self.kv.view(txn)?.hash_all()?;
        let rest = self.leases.tables().into_iter().chain(self.auth.tables()).chain(self.alarms.tables());
        for db in rest.chain([self.long.db()]) {
            for record in db.iter(txn)? {
                let (k, v) = record?;
                crc = crc32c::crc32c_append(crc32c::crc32c_append(crc, k), v);
            }
        }
        Ok(crc)
    }

    /// Every alarm active as of the latest commit.
    pub fn active_alarms(&self) -> Arc<Vec<AlarmMember>> {
        self.active_alarms.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Whether a NOSPACE alarm is active as of the latest commit.
    pub fn nospace(&self) -> bool {
        self.active_alarms().iter().any(|a| a.alarm == AlarmType::Nospace as i32)
    }

    /// Records `applied` and `membership` as the applied state, whatever it was (`keyward snapshot
    /// restore` and `keyward migrate` make a new cluster's data dir from another cluster's tables).
    pub fn restart_at(&self, applied: LogId, membership: StoredMembership) -> Result<(), BoxError> {
        let mut txn = self.env.write_txn()?;
        self.meta.put(&mut txn, APPLIED, &postcard::to_allocvec(&Some(applied))?)?;
        self.meta.put(&mut txn, MEMBERSHIP, &postcard::to_allocvec(&membership)?)?;
        txn.commit()?;
        self.sync()?;
        Ok(())
    }

    /// The applied log id recorded in the tables (the source cluster's, before `restart_at`).
    pub fn applied_log_id(&self) -> Result<Option<LogId>, BoxError> {
        Ok(self.applied_state()?.0)
    }

    /// Refreshes what readers without a transaction see: the size in use and the active alarms.
    fn after_commit(&self, txn: &heed::RoTxn<heed::WithoutTls>) -> heed::Result<()> {
        self.refresh_size_in_use(txn)?;
        let alarms = Arc::new(self.alarms.list(txn, AlarmType::None as i32)?);
        *self.active_alarms.write().unwrap_or_else(std::sync::PoisonError::into_inner) = alarms;
        Ok(())
    }

    fn refresh_size_in_use(&self, txn: &heed::RoTxn<heed::WithoutTls>) -> heed::Result<()> {
        let dbs: Vec<Db> = self.tables().into_iter().chain([self.meta]).collect();
        self.space.set_in_use(crate::space::pages_in_use(&self.env, &dbs, txn)?);
        Ok(())
    }

    pub fn page_size(&self) -> u64 {
        self.mapping.page_size()
    }

    /// A read transaction on the applied state, holding the map pinned (`storage::mapping`).
    pub fn read_txn(&self) -> heed::Result<ReadTxn<'_>> {
        self.mapping.read_txn(&self.env)
    }

    /// A write transaction, for offline tools (`keyward migrate`) on an environment opened with
    /// copied writes, whose map does not need to grow. Apply writes through `apply_batch`.
    pub fn offline_write_txn(&self) -> heed::Result<heed::RwTxn<'_>> {
        debug_assert_eq!(self.mapping.writes(), Writes::Copied, "a mapped environment grows in apply only");
        self.env.write_txn()
    }

    /// Flushes every commit to disk.
    pub fn sync(&self) -> heed::Result<()> {
        let _pin = self.mapping.pin();
        self.env.force_sync()
    }

    /// The size of `data.mdb`: with mapped writes, every byte reserved for it.
    pub fn disk_size(&self) -> heed::Result<u64> {
        self.env.real_disk_size()
    }

    /// Writes a copy of the environment to `file`, as `compaction` says (`etcdctl snapshot save`).
    pub fn copy_to_file(&self, file: &mut File, compaction: heed::CompactionOption) -> heed::Result<()> {
        let _pin = self.mapping.pin();
        self.env.copy_to_file(file, compaction).map(drop)
    }

    /// The environment's directory.
    pub fn dir(&self) -> &Path {
        self.env.path()
    }

    /// How this environment's pages reach its file.
    pub fn writes(&self) -> Writes {
        self.mapping.writes()
    }

    fn read_meta<T: serde::de::DeserializeOwned>(&self, txn: &heed::RoTxn, name: &[u8]) -> Result<Option<T>, BoxError> {
        Ok(self.meta.get(txn, name)?.map(postcard::from_bytes).transpose()?)
    }

    fn applied_state(&self) -> Result<(Option<LogId>, StoredMembership), BoxError> {
        let txn = self.read_txn()?;
        let applied = self.read_meta::<Option<LogId>>(&txn, APPLIED)?.flatten();
        let membership = self.read_meta(&txn, MEMBERSHIP)?.unwrap_or_default();
        Ok((applied, membership))
    }

    /// Applies `entries` once; on `Full` nothing changed.
    fn apply_once(&self, entries: &[Entry]) -> Result<Vec<BatchResults>, ApplyFailure> {
        let results = self.apply_batch(entries)?;
        if self.space.stalled() {
            self.space.set_stalled(false);
            tracing::warn!("storage has room again: applying resumed");
        }
        Ok(results)
    }

    /// Applies `entries`; while storage is full, applies them again (unchanged) until they fit.
    fn apply_until_applied(&self, entries: &[Entry]) -> Result<Vec<BatchResults>, BoxError> {
        let mut wait = Duration::from_millis(100);
        loop {
            match self.apply_once(entries) {
                Ok(results) => return Ok(results),
                Err(ApplyFailure::Storage(e)) => return Err(e),
                Err(ApplyFailure::Full(mut kind)) => {
                    if kind == Full::Map {
                        match self.grow_map(0) {
                            Ok(true) => continue, // a larger map: apply the batch again
                            Ok(false) => {}       // at its ceiling
                            Err(ApplyFailure::Full(disk)) => kind = disk,
                            Err(ApplyFailure::Storage(e)) => return Err(e),
                        }
                    }
                    if self.space.report_full(kind, self.env.path()) {
                        continue; // the ballast is gone: there is room for this batch now
                    }
                    self.space.set_stalled(true);
                    match kind {
                        Full::Disk => tracing::error!(
                            retry_in = ?wait,
                            "disk full: cannot apply committed entries; free disk space (the member \
                             keeps retrying and reports unhealthy meanwhile)"
                        ),
                        Full::Map => tracing::error!(
                            retry_in = ?wait,
                            "the LMDB map of the kv database is full: cannot apply committed entries; \
                             restart the member to reserve a larger map"
                        ),
                    }
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(FULL_RETRY_MAX);
                }
            }
        }
    }

    /// Grows the map of a mapped environment after `MDB_MAP_FULL` (`storage::mapping`), to at least
    /// `at_least` bytes: false when it cannot grow (copied writes, or at its ceiling); a full disk is
    /// `Full::Disk`. Call with no write transaction open.
    fn grow_map(&self, at_least: u64) -> Result<bool, ApplyFailure> {
        match self.mapping.grow(&self.env, at_least) {
            Ok(Some(grown)) => {
                tracing::info!(from = grown.from, to = grown.to, "kv file reservation grown");
                Ok(true)
            }
            Ok(None) => Ok(false),
            Err(e) => Err(self.write_failure(e)),
        }
    }

    /// A write transaction with the snapshot in `path` loaded into it (`load`). A mapped environment
    /// first grows to hold the old state and the new one side by side (the old pages are freed only
    /// at the commit), and again whenever the load still finds its map full.
    fn load_growing(&self, path: &Path, meta: &Meta) -> Result<heed::RwTxn<'_>, BoxError> {
        if let Some(reserved) = self.mapping.reserved() {
            let incoming = std::fs::metadata(path)?.len();
            self.grow_map(reserved.saturating_add(2 * incoming)).map_err(ApplyFailure::into_error)?;
        }
        loop {
            let mut txn = self.env.write_txn()?;
            match self.load(&mut txn, File::open(path)?, meta) {
                Ok(()) => return Ok(txn),
                Err(e) if matches!(e.downcast_ref(), Some(heed::Error::Mdb(heed::MdbError::MapFull))) => {
                    drop(txn);
                    if !self.grow_map(0).map_err(ApplyFailure::into_error)? {
                        return Err(e);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn apply_batch(&self, entries: &[Entry]) -> Result<Vec<BatchResults>, ApplyFailure> {
        #[cfg(test)]
        {
            use std::sync::atomic::Ordering::SeqCst;
            if self.inject_full.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_ok() {
                return Err(ApplyFailure::Full(Full::Disk));
            }
            if self.inject_failure.swap(false, SeqCst) {
                return Err(ApplyFailure::Storage("injected storage failure".into()));
            }
        }
        let mut txn = self.env.write_txn()?;
        let previous_revision = self.kv.view(&txn)?.rev;
        let mut results = Vec::with_capacity(entries.len());
        let mut applied = None;
        let mut effects = Effects::default();
        let mut requests = 0u64;
        let stores = Stores {
            kv: &self.kv,
            leases: &self.leases,
            auth: &self.auth,
            alarms: &self.alarms,
            simple_tokens: self.tokens.get().and_then(|t| t.simple()),
        };
        for entry in entries {
            applied = Some(entry.log_id);
            let entry_results = match &entry.payload {
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
                                effects.alarms_changed |= done.alarms_changed;
                                Ok(applied)
                            }
                            // A storage failure leaves the transaction unusable: abort the batch, stop the node.
                            Err(EtcdError::Internal) => return Err("storage failure while applying".into()),
                            // Full storage: abort the batch, to be applied again, unchanged, once it fits.
                            Err(EtcdError::StorageFull { map }) => {
                                return Err(ApplyFailure::Full(if map { Full::Map } else { Full::Disk }))
                            }
                            Err(refused) => Err(refused),
                        });
                    }
                    entry_results
                }
                EntryPayload::Membership(membership) => {
                    let stored = StoredMembership::new(Some(entry.log_id), membership.clone());
                    self.meta
                        .put(&mut txn, MEMBERSHIP, &postcard::to_allocvec(&stored)?)
                        .map_err(|e| self.write_failure(e))?;
                    Vec::new()
                }
            };
            requests += entry_results.len().max(1) as u64;
            results.push(entry_results);
        }
        self.meta.put(&mut txn, APPLIED, &postcard::to_allocvec(&applied)?).map_err(|e| self.write_failure(e))?;
        let revision = self.kv.view(&txn)?.rev;
        let (auth_enabled, auth_revision) = (self.auth.enabled(&txn)?, self.auth.revision(&txn)?);
        self.refresh_size_in_use(&txn)?;
        let alarms = effects.alarms_changed.then(|| self.alarms.list(&txn, AlarmType::None as i32)).transpose()?;
        let committing = std::time::Instant::now();
        txn.commit().map_err(|e| self.write_failure(e))?;
        crate::metrics::BACKEND_COMMIT_SECONDS.observe(committing.elapsed().as_secs_f64());
        if let Some(grown) = self.mapping.grow_early(&self.env) {
            tracing::info!(from = grown.from, to = grown.to, "kv file reservation grown ahead of need");
        }
        count_mvcc_ops(entries, &results);
        if let Some(alarms) = alarms {
            *self.active_alarms.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(alarms);
        }
        // Only after the commit: observers must never see effects that a crash could undo.
        if let Some(observer) = self.observer.get() {
            observer(Committed {
                revision,
                previous_revision,
                auth_enabled,
                auth_revision,
                effects,
                requests,
                installed: None,
                encoded: Default::default(),
            });
        }
        Ok(results)
    }

    /// Streams every table into a new snapshot file and makes it current. Returns its metadata and
    /// the file, open for reading.
    fn build_snapshot(&self) -> Result<(Meta, File), BoxError> {
        // The log is purged behind a snapshot: everything the snapshot covers must be durable first.
        self.sync()?;
        let txn = self.read_txn()?;
        let last_log_id = self.read_meta::<Option<LogId>>(&txn, APPLIED)?.flatten();
        let last_membership: StoredMembership = self.read_meta(&txn, MEMBERSHIP)?.unwrap_or_default();
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let snapshot_id = match last_log_id {
            Some(id) => format!("{}-{}-{nanos}", id.leader_id, id.index),
            None => format!("empty-{nanos}"),
        };
        let meta = SnapshotMeta { last_log_id, last_membership, snapshot_id };
        let (temp, file) = self.snaps.temp("build")?;
        snapshot_file::write(file, &meta, &self.tables(), &txn)?;
        drop(txn);
        // Opened before it is published: if a newer snapshot is installed meanwhile, this one is not
        // made current, and the open file stays readable after its name is gone.
        let reading = File::open(temp.path())?;
        self.snaps.publish(temp, &meta)?;
        Ok((meta, reading))
    }

    /// Installs the snapshot in `file` (received into `received`, or from elsewhere): its records replace
    /// every table in one write transaction, and the file becomes the current snapshot.
    fn install_snapshot(&self, meta: &Meta, file: File, received: Option<TempFile>) -> Result<(), BoxError> {
        let temp = match received {
            Some(temp) if temp.path().parent() == Some(self.snaps.path()) => temp,
            // Not received into this snap dir (openraft's storage suite hands over another state
            // machine's snapshot): copied in, so that it can become current.
            _ => self.copy_in(file)?,
        };
        let txn = self.load_growing(temp.path(), meta)?;
        // Current before the commit: a crash in between leaves a snapshot newer than the applied
        // state, which `open` installs (`install_current_if_newer`); the other order could leave a
        // member whose current snapshot is older than its purged log.
        self.snaps.publish(temp, meta)?;
        txn.commit()?;
        // openraft purges the log behind the snapshot: the installed state must survive a power loss.
        self.sync()?;
        self.rebuild_after_install()
    }

    /// Copies a snapshot file into a synced temp file of the snap dir.
    fn copy_in(&self, mut file: File) -> Result<TempFile, BoxError> {
        let (temp, out) = self.snaps.temp("copy")?;
        let mut out = std::io::BufWriter::new(out);
        std::io::copy(&mut file, &mut out)?;
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        Ok(temp)
    }

    /// Replaces every table with the snapshot's records and records its log id and membership as
    /// applied, in `txn`. The file must hold the snapshot `expected` describes.
    fn load(&self, txn: &mut heed::RwTxn, file: File, expected: &Meta) -> Result<(), BoxError> {
        let (meta, records) = snapshot_file::Reader::open(file)?;
        if meta != *expected {
            return Err(format!("the snapshot file holds {meta}, not {expected}").into());
        }
        snapshot_file::load(records, &self.tables(), txn)?;
        self.meta.put(txn, APPLIED, &postcard::to_allocvec(&meta.last_log_id)?)?;
        self.meta.put(txn, MEMBERSHIP, &postcard::to_allocvec(&meta.last_membership)?)?;
        Ok(())
    }

    /// At open: a current snapshot newer than the applied state (a crash between making an installed
    /// snapshot current and committing it) is installed again.
    fn install_current_if_newer(&self) -> Result<(), BoxError> {
        let Some((meta, _)) = self.snaps.current()? else { return Ok(()) };
        let (applied, _) = self.applied_state()?;
        if meta.last_log_id <= applied {
            return Ok(());
        }
        tracing::warn!(snapshot = %meta, "the current snapshot is newer than the applied state: installing it");
        // Nothing else uses the snap dir while the state opens: the current file stays this one.
        self.load_growing(&self.snaps.current_path(), &meta)?.commit()?;
        self.sync()?;
        Ok(())
    }

    /// After an install, everything derived from the applied state is derived again from the installed
    /// state (etcd #14571 restored a snapshot and kept serving from an emptied permission cache): the
    /// permission cache, the size in use, the active alarms and the simple tokens here; the observer
    /// rebuilds the rest (the node's auth state and revision, the lease clock, watchers).
    fn rebuild_after_install(&self) -> Result<(), BoxError> {
        self.auth.cache.clear();
        let txn = self.read_txn()?;
        self.after_commit(&txn)?;
        let revision = self.kv.view(&txn)?.rev;
        let (auth_enabled, auth_revision) = (self.auth.enabled(&txn)?, self.auth.revision(&txn)?);
        if let Some(simple) = self.tokens.get().and_then(|t| t.simple()) {
            // Entries this member never applied may have deleted a user, changed a password or
            // disabled auth: only the tokens that still stand in the installed state are kept.
            if auth_enabled {
                simple.retain(|user, issued| self.auth.token_valid(&txn, user, issued).unwrap_or(false));
            } else {
                simple.clear();
            }
        }
        let leases = self.leases.all(&txn)?;
        drop(txn);
        if let Some(observer) = self.observer.get() {
            let installed = Some(Installed { leases });
            observer(Committed { revision, auth_enabled, auth_revision, installed, ..Default::default() });
        }
        Ok(())
    }
}

/// etcd's mvcc counters for the requests of a committed batch that the store executed
/// (`mvcc/counts.rs`).
fn count_mvcc_ops(entries: &[Entry], results: &[BatchResults]) {
    use crate::apply::Applied;
    use crate::mvcc::counts::Ops;
    for (entry, results) in entries.iter().zip(results) {
        let EntryPayload::Normal(batch) = &entry.payload else { continue };
        for (req, result) in batch.0.requests.iter().zip(results) {
            match (result, &req.put, &req.txn) {
                (Ok(Applied::Put(_)), Some(put), _) => Ops::put(put).record(),
                (Ok(Applied::DeleteRange(_)), ..) => Ops::delete().record(),
                (Ok(Applied::Txn(resp)), _, Some(txn)) => Ops::record_txn(Ops::txn(txn, resp), false),
                _ => {}
            }
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

fn to_snapshot((meta, file): (Meta, File)) -> Snapshot<TypeConfig> {
    Snapshot { meta, snapshot: Box::new(SnapshotData::reading(file)) }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let kv = self.kv.clone();
        blocking(move || {
            kv.current().build_snapshot().map_err(|e| StorageIOError::write_snapshot(None, any_error(e)).into())
        })
        .await
        .map(to_snapshot)
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let kv = self.kv.clone();
        blocking(move || {
            kv.current().applied_state().map_err(|e| StorageIOError::read_state_machine(any_error(e)).into())
        })
        .await
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<BatchResults>, StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let last = entries.last().map_or(0, |entry| entry.log_id.index);
        let applied = self.applied.clone();
        let done = move |results| {
            applied.fetch_max(last, Ordering::Release);
            Ok(results)
        };
        // Inline on the raft thread (`raft/thread.rs`) unless that could block it for long: when a
        // defragment holds writes, or the disk is full, the blocking pool waits instead, so the raft
        // thread goes on heartbeating and appending.
        let inline = self.kv.try_write(|state| state.apply_once(&entries));
        let failed = |e: BoxError| StorageIOError::write_state_machine(any_error(e)).into();
        match inline {
            Some(Ok(results)) => return done(results),
            Some(Err(ApplyFailure::Storage(e))) => return Err(failed(e)),
            Some(Err(ApplyFailure::Full(_))) | None => {}
        }
        let kv = self.kv.clone();
        blocking(move || kv.write(|state| state.apply_until_applied(&entries)).map_err(failed).and_then(done)).await
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapshotData>, StorageError> {
        let kv = self.kv.clone();
        blocking(move || {
            let (temp, file) =
                kv.current().snaps.temp("receive").map_err(|e| StorageIOError::write_snapshot(None, any_error(e)))?;
            Ok(Box::new(SnapshotData::receiving(temp, file)))
        })
        .await
    }

    async fn install_snapshot(&mut self, meta: &Meta, snapshot: Box<SnapshotData>) -> Result<(), StorageError> {
        fn failed(meta: &Meta, e: impl std::fmt::Display) -> StorageError {
            StorageIOError::write_snapshot(Some(meta.signature()), any_error(e)).into()
        }
        let (file, received) = snapshot.finish().await.map_err(|e| failed(meta, e))?;
        let (kv, meta) = (self.kv.clone(), meta.clone());
        blocking(move || kv.write(|state| state.install_snapshot(&meta, file, received)).map_err(|e| failed(&meta, e)))
            .await
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let kv = self.kv.clone();
        blocking(move || {
            kv.current().snaps.current().map_err(|e| StorageIOError::read_snapshot(None, any_error(e)).into())
        })
        .await
        .map(|current| current.map(to_snapshot))
    }
}

/// Every table's records, in snapshot order (tests).
#[cfg(test)]
pub(crate) type TableRecords = Vec<Vec<(Vec<u8>, Vec<u8>)>>;

/// Helpers for tests here and elsewhere in the crate (the node's, the watchers').
#[cfg(test)]
impl State {
    /// Every table's records, in snapshot order.
    pub(crate) fn table_records(&self) -> TableRecords {
        let txn = self.read_txn().expect("read txn");
        let records = |db: &Db| -> Vec<(Vec<u8>, Vec<u8>)> {
            db.iter(&txn).expect("iter").map(|kv| kv.map(|(k, v)| (k.to_vec(), v.to_vec())).expect("record")).collect()
        };
        self.tables().iter().map(records).collect()
    }

    /// Applies `requests` as the entry at log index `index`.
    pub(crate) fn apply_requests(
        &self,
        index: u64,
        requests: Vec<crate::proto::etcdserverpb::InternalRaftRequest>,
    ) -> BatchResults {
        let entry = Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(super::RaftBatch::new(crate::proto::etcdserverpb::InternalRaftBatch {
                requests,
            })),
        };
        self.apply_until_applied(&[entry]).expect("apply").remove(0)
    }

    /// Builds a snapshot of `source` and installs it here as `install_snapshot` installs one from
    /// outside the snap dir, without openraft (which owns a node's state machine).
    pub(crate) fn install_snapshot_of(&self, source: &State) -> Result<Meta, BoxError> {
        let (meta, file) = source.build_snapshot()?;
        self.install_snapshot(&meta, file, None)?;
        Ok(meta)
    }
}

#[cfg(test)]
mod space_tests {
    use std::os::unix::fs::PermissionsExt;

    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;
    use crate::proto::etcdserverpb::alarm_request::AlarmAction;
    use crate::proto::etcdserverpb::request_op::Request;
    use crate::proto::etcdserverpb::{
        AlarmRequest, CompactionRequest, DeleteRangeRequest, InternalRaftBatch, InternalRaftRequest, LeaseGrantRequest,
        PutRequest, RangeRequest, RequestOp, TxnRequest,
    };
    use crate::raft::{Applied, RaftBatch};
    use crate::space::ballast::Ballast;
    use crate::space::Quota;

    fn open(dir: &Path, space: Space) -> Arc<State> {
        StateMachine::open_with(&dir.join("kv"), &dir.join("snap"), Arc::new(space)).expect("open").state()
    }

    fn entry(index: u64, requests: Vec<InternalRaftRequest>) -> Entry {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(RaftBatch::new(InternalRaftBatch { requests })),
        }
    }

    fn put(key: &str, value: &[u8]) -> InternalRaftRequest {
        InternalRaftRequest {
            put: Some(Box::new(PutRequest { key: key.into(), value: value.to_vec(), ..Default::default() })),
            ..Default::default()
        }
    }

    fn delete(key: &str) -> InternalRaftRequest {
        InternalRaftRequest {
            delete_range: Some(Box::new(DeleteRangeRequest { key: key.into(), ..Default::default() })),
            ..Default::default()
        }
    }

    fn alarm(action: AlarmAction) -> InternalRaftRequest {
        let alarm = AlarmRequest { action: action as i32, member_id: 42, alarm: AlarmType::Nospace as i32 };
        InternalRaftRequest { alarm: Some(Box::new(alarm)), ..Default::default() }
    }

    fn txn(success: Vec<RequestOp>) -> InternalRaftRequest {
        InternalRaftRequest { txn: Some(Box::new(TxnRequest { success, ..Default::default() })), ..Default::default() }
    }

    fn apply(state: &State, index: u64, requests: Vec<InternalRaftRequest>) -> Vec<Result<Applied, EtcdError>> {
        state.apply_until_applied(&[entry(index, requests)]).expect("apply").remove(0)
    }

    fn value(state: &State, key: &str) -> Option<Vec<u8>> {
        let txn = state.read_txn().unwrap();
        let view = state.kv.view(&txn).unwrap();
        let resp = crate::mvcc::kv::range(&view, &RangeRequest { key: key.into(), ..Default::default() }).unwrap();
        resp.kvs.first().map(|kv| kv.value.clone())
    }

    #[test]
    fn a_batch_that_finds_the_disk_full_is_applied_unchanged_after_the_ballast_goes() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let ballast = Ballast::new(a.path().join("ballast"), 1 << 20);
        assert!(ballast.ensure().unwrap());
        let full = open(a.path(), Space::new(Quota::Bytes(1 << 30), ballast));
        let clean = open(b.path(), Space::without_ballast());
        let batch = vec![put("k", b"v1"), put("k", b"v2"), delete("missing"), put("other", b"x")];
        full.inject_full.store(1, std::sync::atomic::Ordering::SeqCst);
        let got = apply(&full, 1, batch.clone());
        assert_eq!(got, apply(&clean, 1, batch), "same results as a member whose disk was never full");
        assert!(!full.space.ballast().present(), "the ballast made the room");
        assert!(!full.space.stalled());
        assert_eq!(value(&full, "k"), Some(b"v2".to_vec()));
        assert_eq!(full.kv.view(&full.read_txn().unwrap()).unwrap().rev, 4, "applied exactly once");
    }

    #[test]
    fn without_a_ballast_apply_waits_and_retries_until_the_batch_fits() {
        let dir = tempfile::tempdir().unwrap();
        let state = open(dir.path(), Space::without_ballast());
        state.inject_full.store(2, std::sync::atomic::Ordering::SeqCst);
        let results = apply(&state, 1, vec![put("k", b"v")]);
        assert!(matches!(results[0], Ok(Applied::Put(_))), "{results:?}");
        assert_eq!(state.inject_full.load(std::sync::atomic::Ordering::SeqCst), 0, "both full attempts were retried");
        assert!(!state.space.stalled(), "no longer waiting once applied");
        assert_eq!(state.kv.view(&state.read_txn().unwrap()).unwrap().rev, 2);
    }

    #[test]
    fn nospace_alarm_refuses_writes_that_take_space_on_every_member_until_disarmed() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let members = [open(a.path(), Space::without_ballast()), open(b.path(), Space::without_ballast())];
        let lease = |id| InternalRaftRequest {
            lease_grant: Some(Box::new(LeaseGrantRequest { ttl: 60, id })),
            ..Default::default()
        };
        let put_op = |k: &str| RequestOp {
            request: Some(Request::RequestPut(PutRequest {
                key: k.into(),
                value: b"v".to_vec(),
                ..Default::default()
            })),
        };
        let del_op = |k: &str| RequestOp {
            request: Some(Request::RequestDeleteRange(DeleteRangeRequest { key: k.into(), ..Default::default() })),
        };
        let compact = |revision| InternalRaftRequest {
            compaction: Some(Box::new(CompactionRequest { revision, physical: false })),
            ..Default::default()
        };
        let nested_put = txn(vec![RequestOp {
            request: Some(Request::RequestTxn(TxnRequest { success: vec![put_op("n")], ..Default::default() })),
        }]);
        let mut outcomes = Vec::new();
        for state in &members {
            assert!(matches!(apply(state, 1, vec![put("a", b"1"), put("b", b"2")])[..], [Ok(_), Ok(_)]));
            let raised = apply(state, 2, vec![alarm(AlarmAction::Activate)]);
            let Ok(Applied::Alarm(resp)) = &raised[0] else { panic!("{raised:?}") };
            assert_eq!(resp.alarms.len(), 1);
            assert!(state.nospace());
            let capped = apply(
                state,
                3,
                vec![
                    put("c", b"3"),
                    txn(vec![put_op("d")]),
                    nested_put.clone(),
                    lease(7),
                    delete("a"),
                    txn(vec![del_op("b")]),
                    compact(2),
                ],
            );
            let refused: Vec<bool> = capped.iter().map(|r| r == &Err(EtcdError::NoSpace)).collect();
            assert_eq!(refused, [true, true, true, true, false, false, false], "{capped:?}");
            assert!(capped[4..].iter().all(Result::is_ok), "{capped:?}");
            assert_eq!(value(state, "a"), None);
            assert_eq!(value(state, "c"), None);
            let cleared = apply(state, 4, vec![alarm(AlarmAction::Deactivate), put("c", b"3"), lease(7)]);
            assert!(cleared.iter().all(Result::is_ok), "{cleared:?}");
            assert!(!state.nospace());
            assert_eq!(value(state, "c"), Some(b"3".to_vec()));
            outcomes.push((raised, capped, cleared));
        }
        assert_eq!(outcomes[0], outcomes[1], "every member decides alike");
    }

    #[test]
    fn with_auth_on_only_root_or_the_member_itself_changes_alarms_at_apply() {
        use crate::proto::etcdserverpb::{
            AuthEnableRequest, AuthRoleAddRequest, AuthUserAddRequest, AuthUserGrantRoleRequest, RequestHeader,
        };
        let dir = tempfile::tempdir().unwrap();
        let state = open(dir.path(), Space::without_ballast());
        let member = Some(RequestHeader { member_internal: true, ..Default::default() });
        let as_member = |req: InternalRaftRequest| InternalRaftRequest { header: member.clone(), ..req };
        let user_add = AuthUserAddRequest { name: "root".into(), hashed_password: "x".into(), ..Default::default() };
        let setup = apply(
            &state,
            1,
            vec![
                as_member(InternalRaftRequest { auth_user_add: Some(Box::new(user_add)), ..Default::default() }),
                as_member(InternalRaftRequest {
                    auth_role_add: Some(Box::new(AuthRoleAddRequest { name: "root".into() })),
                    ..Default::default()
                }),
                as_member(InternalRaftRequest {
                    auth_user_grant_role: Some(Box::new(AuthUserGrantRoleRequest {
                        user: "root".into(),
                        role: "root".into(),
                    })),
                    ..Default::default()
                }),
                as_member(InternalRaftRequest {
                    auth_enable: Some(Box::new(AuthEnableRequest {})),
                    ..Default::default()
                }),
            ],
        );
        assert!(setup.iter().all(Result::is_ok), "{setup:?}");
        let revision = state.auth.revision(&state.read_txn().unwrap()).unwrap();
        let bob = Some(RequestHeader { username: "bob".into(), auth_revision: revision, ..Default::default() });
        let refused = apply(
            &state,
            2,
            vec![alarm(AlarmAction::Activate), InternalRaftRequest { header: bob, ..alarm(AlarmAction::Activate) }],
        );
        assert_eq!(refused, [Err(EtcdError::UserEmpty), Err(EtcdError::UserNotFound)]);
        assert!(!state.nospace());
        let raised = apply(&state, 3, vec![as_member(alarm(AlarmAction::Activate))]);
        assert!(raised[0].is_ok() && state.nospace(), "{raised:?}");
        let root = Some(RequestHeader { username: "root".into(), auth_revision: revision, ..Default::default() });
        let cleared = apply(
            &state,
            4,
            vec![
                alarm(AlarmAction::Deactivate),
                InternalRaftRequest { header: root, ..alarm(AlarmAction::Deactivate) },
            ],
        );
        assert_eq!(cleared[0], Err(EtcdError::UserEmpty));
        assert!(cleared[1].is_ok(), "{cleared:?}");
        assert!(!state.nospace());
    }

    #[test]
    fn size_in_use_falls_after_deletes_and_compaction_while_the_file_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let state = open(dir.path(), Space::without_ballast());
        let empty = state.space.in_use();
        let value = vec![7u8; 64 << 10];
        let puts: Vec<_> = (0..64).map(|i| put(&format!("k{i:03}"), &value)).collect();
        apply(&state, 1, puts);
        let full = state.space.in_use();
        assert!(full > empty + 64 * (64 << 10), "{empty} -> {full}");
        let file = state.disk_size().unwrap();
        let mut requests: Vec<_> = (0..64).map(|i| delete(&format!("k{i:03}"))).collect();
        requests.push(InternalRaftRequest {
            compaction: Some(Box::new(CompactionRequest { revision: 129, physical: false })),
            ..Default::default()
        });
        apply(&state, 2, requests);
        let after = state.space.in_use();
        assert!(after < full / 4, "compaction frees the pages: {full} -> {after}");
        assert!(state.disk_size().unwrap() >= file, "LMDB keeps its file, reusing the pages");
    }

    #[test]
    fn snapshots_carry_alarms_and_are_owner_only() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let source = open(a.path(), Space::without_ballast());
        apply(&source, 1, vec![put("k", b"v"), alarm(AlarmAction::Activate)]);
        let (meta, file) = source.build_snapshot().unwrap();
        let path = a.path().join("snap").join("current.snap");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        for dir in [a.path().join("kv"), a.path().join("snap")] {
            assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700, "{}", dir.display());
        }
        let target = open(b.path(), Space::without_ballast());
        target.install_snapshot(&meta, file, None).unwrap();
        assert!(target.nospace(), "the alarm is replicated state");
        assert_eq!(value(&target, "k"), Some(b"v".to_vec()));
        assert_eq!(target.space.in_use(), source.space.in_use());
    }
}
