//! `State`: the applied state on one kv environment (`<data-dir>/member/kv`), shared by apply, the
//! read path (which opens its own read transactions on it) and snapshots: the stores on their tables,
//! the applied log id and membership (`sm_meta`), and what readers without a transaction see (the size
//! in use, the active alarms).
//!
//! Opening a `State` also installs a current snapshot newer than the applied state
//! (`snapshot/install.rs`); a defragment opens the next one with what this one `Carried`.

use std::path::Path;
use std::sync::{Arc, OnceLock, RwLock};

use super::committed::Observer;
use super::snapshot::dir::SnapDir;
use crate::auth::store::AuthStore;
use crate::auth::tokens::Tokens;
use crate::error::EtcdError;
use crate::lease::store::LeaseStore;
use crate::mvcc::KvStore;
use crate::proto::etcdserverpb::{AlarmMember, AlarmType};
use crate::raft::awaited::Awaited;
use crate::raft::{LogId, StoredMembership};
use crate::space::alarm::AlarmStore;
use crate::space::Space;
use crate::storage::mapping::{self, Mapping, ReadTxn};
use crate::storage::paced_writeback::PacedWriteback;
use crate::storage::table::{LongKeys, Table};
use crate::storage::{self, Db, LmdbEnv, Writes};

/// Any error: what the state machine's own operations return (openraft's traits wrap it).
pub(super) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The keys of `sm_meta`: the applied log id, and the membership as of it (the layout's version is
/// `layout.rs`'s).
pub(super) const APPLIED: &[u8] = b"applied";
pub(super) const MEMBERSHIP: &[u8] = b"membership";

/// The applied state, shared with the read path (which opens its own read transactions on `env`).
pub(crate) struct State {
    /// Not public: every use of the map goes through `mapping`'s pin (`read_txn`, `sync`, ...).
    pub(super) env: LmdbEnv,
    pub(super) mapping: Mapping,
    /// Writes `data.mdb` back in paced slices, so that the kernel never has a burst of it to write
    /// ahead of the raft log's `fdatasync` (`storage/paced_writeback.rs`). Held for its thread, which
    /// stops when the `State` is dropped; only tests read it. None for a fresh environment a snapshot
    /// is loaded into (`Paced::Not`).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(super) writeback: Option<PacedWriteback>,
    pub kv: KvStore,
    pub leases: LeaseStore,
    pub auth: AuthStore,
    pub alarms: AlarmStore,
    pub space: Arc<Space>,
    /// The remainders of keys longer than LMDB's limit, for every table above (`storage/table.rs`).
    pub(super) long: LongKeys,
    /// Every active alarm as of the latest commit, for readers that must not open a transaction
    /// (`/health`, `/metrics`, the quota check).
    pub(super) active_alarms: RwLock<Arc<Vec<AlarmMember>>>,
    pub(super) meta: Db,
    /// `kv_live`, which layouts before 2 kept (`layout.rs`): empty once the state is open.
    pub(super) legacy_live: Table,
    /// What this environment's `State` hands on to the one that replaces it (`defrag.rs`).
    pub(super) tokens: Arc<OnceLock<Arc<Tokens>>>,
    pub(super) snaps: Arc<SnapDir>,
    pub(super) observer: Arc<OnceLock<Observer>>,
    /// The writes this member forwarded that wait for their apply here.
    pub(super) awaited: Arc<Awaited>,
    /// Tests: how many more batches find storage full before anything is written.
    #[cfg(test)]
    pub(crate) inject_full: std::sync::atomic::AtomicU32,
    /// Tests: the next batch meets a storage failure (the raft core stops).
    #[cfg(test)]
    pub(crate) inject_failure: std::sync::atomic::AtomicBool,
}

/// What a `State` hands on to the one that replaces it after a defragment: everything that is not
/// tied to the environment (the permission cache is rebuilt on use, alarms and size are re-read).
#[derive(Clone)]
pub(super) struct Carried {
    pub(super) space: Arc<Space>,
    pub(super) tokens: Arc<OnceLock<Arc<Tokens>>>,
    pub(super) snaps: Arc<SnapDir>,
    pub(super) observer: Arc<OnceLock<Observer>>,
    pub(super) awaited: Arc<Awaited>,
    pub(super) audit: Option<Arc<crate::auth::audit::AuditLog>>,
    /// How the environment is written: `None` chooses by its file system (`Writes::for_dir`).
    pub(super) writes: Option<Writes>,
}

/// Whether an environment's file is written back in paced slices while it is open.
pub(super) enum Paced {
    /// A member's environment: its dirty pages never pile up ahead of the raft log's `fdatasync`.
    WrittenBack,
    /// A fresh environment a snapshot is loaded into, all at once and by nothing else: written back
    /// while it loads, each page written back had to be waited for when the load came back to it
    /// (1.7 s against 2.5 s for 1 GB, issue 30). Written back once it is the member's.
    Not,
}

impl State {
    /// Opens the environment at `kv_dir` and the state on it: brought to this version's layout, a
    /// newer current snapshot installed (a crash between an install's two steps), derived state read.
    pub(super) fn open(kv_dir: &Path, carried: Carried) -> Result<State, heed::Error> {
        let state = State::open_bare(kv_dir, carried, Paced::WrittenBack)?;
        state.migrate_layout().map_err(|e| heed::Error::Io(std::io::Error::other(e)))?;
        state.install_current_if_newer().map_err(|e| heed::Error::Io(std::io::Error::other(e)))?;
        {
            let txn = state.read_txn()?;
            state.after_commit(&txn)?;
        }
        Ok(state)
    }

    /// Opens the environment at `kv_dir` and its tables, nothing read: also the fresh environment a
    /// snapshot is loaded into before it replaces the current one (`snapshot/install.rs`).
    pub(super) fn open_bare(kv_dir: &Path, carried: Carried, paced: Paced) -> Result<State, heed::Error> {
        let [revs, index, kv_meta] = KvStore::TABLES;
        let [leases, lease_keys] = LeaseStore::TABLES;
        let [users, roles, auth_meta] = AuthStore::TABLES;
        let [alarms] = AlarmStore::TABLES;
        let names = [
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
            KvStore::LEGACY_LIVE,
        ];
        let existing = std::fs::metadata(kv_dir.join("data.mdb")).map_or(0, |m| m.len());
        let ceiling = crate::space::map_size(carried.space.quota(), existing);
        crate::storage::data_dir::create_private_dir(kv_dir)?;
        let wanted = carried.writes.unwrap_or_else(|| Writes::for_dir(kv_dir));
        let (writes, map_size) = mapping::plan(kv_dir, wanted, existing, ceiling as u64)?;
        let (env, dbs) = storage::open_with(kv_dir, names, storage::Durability::Deferred, writes, map_size as usize)?;
        let mapping = Mapping::new(kv_dir, &env, writes, ceiling as u64)?;
        tracing::info!(dir = %kv_dir.display(), ?writes, reserved = mapping.reserved(), "kv environment opened");
        let writeback = match paced {
            Paced::WrittenBack => Some(PacedWriteback::start(&kv_dir.join("data.mdb"))?),
            Paced::Not => None,
        };
        let [revs, index, kv_meta, leases, lease_keys, users, roles, auth_meta, alarms, long_keys, meta, legacy_live] =
            dbs;
        let long = LongKeys::new(long_keys);
        let state = State {
            env,
            mapping,
            writeback,
            kv: KvStore::new([revs, index, kv_meta], long),
            leases: LeaseStore::new([leases, lease_keys], long),
            auth: AuthStore::new([users, roles, auth_meta], long),
            alarms: AlarmStore::new([alarms]),
            space: carried.space,
            long,
            active_alarms: Default::default(),
            meta,
            legacy_live: Table::new(legacy_live, long),
            tokens: carried.tokens,
            snaps: carried.snaps,
            observer: carried.observer,
            awaited: carried.awaited,
            #[cfg(test)]
            inject_full: Default::default(),
            #[cfg(test)]
            inject_failure: Default::default(),
        };
        if let Some(audit) = carried.audit {
            let _ = state.auth.audit.set(audit);
        }
        Ok(state)
    }

    /// What the `State` that replaces this one keeps.
    pub(super) fn carried(&self) -> Carried {
        Carried {
            space: self.space.clone(),
            tokens: self.tokens.clone(),
            snaps: self.snaps.clone(),
            observer: self.observer.clone(),
            awaited: self.awaited.clone(),
            audit: self.auth.audit.get().cloned(),
            writes: Some(self.mapping.writes()),
        }
    }
}

impl State {
    /// Sets who is told about each committed batch (once; later calls are ignored).
    pub(crate) fn observe(&self, observer: Observer) {
        let _ = self.observer.set(observer);
    }

    /// The writes this member forwarded that wait for their apply here.
    pub(crate) fn awaited(&self) -> &Arc<Awaited> {
        &self.awaited
    }

    /// Sets the token provider Authenticate entries issue simple tokens into (once).
    pub(crate) fn use_tokens(&self, tokens: Arc<Tokens>) {
        let _ = self.tokens.set(tokens);
    }

    /// Every replicated table, in snapshot order.
    pub(crate) fn tables(&self) -> Vec<Db> {
        let tables = self.kv.tables().into_iter().chain(self.leases.tables()).chain(self.auth.tables());
        tables.chain(self.alarms.tables()).chain([self.long.db()]).collect()
    }

    /// etcd's `Hash`: every replicated table — the kv store (its keys hashed whole, `mvcc/hash.rs`),
    /// then leases, users, roles, the auth revision and alarms as stored — so members that applied the
    /// same entries agree, and a member whose auth state diverged (etcd #11651) does not.
    pub(crate) fn hash_all(&self, txn: &heed::RoTxn) -> Result<u32, EtcdError> {
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
    pub(crate) fn active_alarms(&self) -> Arc<Vec<AlarmMember>> {
        self.active_alarms.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Whether a NOSPACE alarm is active as of the latest commit.
    pub(crate) fn nospace(&self) -> bool {
        self.active_alarms().iter().any(|a| a.alarm == AlarmType::Nospace as i32)
    }

    /// Records `applied` and `membership` as the applied state, whatever it was (`keyward snapshot
    /// restore` and `keyward migrate` make a new cluster's data dir from another cluster's tables).
    pub(crate) fn restart_at(&self, applied: LogId, membership: StoredMembership) -> Result<(), BoxError> {
        let mut txn = self.env.write_txn()?;
        self.meta.put(&mut txn, APPLIED, &postcard::to_allocvec(&Some(applied))?)?;
        self.meta.put(&mut txn, MEMBERSHIP, &postcard::to_allocvec(&membership)?)?;
        txn.commit()?;
        self.sync()?;
        Ok(())
    }

    /// The applied log id recorded in the tables (the source cluster's, before `restart_at`).
    pub(crate) fn applied_log_id(&self) -> Result<Option<LogId>, BoxError> {
        Ok(self.applied_state()?.0)
    }

    /// Refreshes what readers without a transaction see: the size in use and the active alarms.
    pub(super) fn after_commit(&self, txn: &heed::RoTxn<heed::WithoutTls>) -> heed::Result<()> {
        self.refresh_size_in_use(txn)?;
        let alarms = Arc::new(self.alarms.list(txn, AlarmType::None as i32)?);
        *self.active_alarms.write().unwrap_or_else(std::sync::PoisonError::into_inner) = alarms;
        Ok(())
    }

    pub(super) fn refresh_size_in_use(&self, txn: &heed::RoTxn<heed::WithoutTls>) -> heed::Result<()> {
        let dbs: Vec<Db> = self.tables().into_iter().chain([self.meta]).collect();
        self.space.set_in_use(crate::space::pages_in_use(&self.env, &dbs, txn)?);
        Ok(())
    }

    /// A read transaction on the applied state, holding the map pinned (`storage::mapping`).
    pub(crate) fn read_txn(&self) -> heed::Result<ReadTxn<'_>> {
        self.mapping.read_txn(&self.env)
    }

    /// A write transaction, for offline tools (`keyward migrate`) on an environment opened with
    /// copied writes, whose map does not need to grow. Apply writes through `apply_batch`.
    pub(crate) fn offline_write_txn(&self) -> heed::Result<heed::RwTxn<'_>> {
        debug_assert_eq!(self.mapping.writes(), Writes::Copied, "a mapped environment grows in apply only");
        self.env.write_txn()
    }

    /// Flushes every commit to disk.
    pub(crate) fn sync(&self) -> heed::Result<()> {
        let _pin = self.mapping.pin();
        self.env.force_sync()
    }

    /// The size of `data.mdb`: with mapped writes, every byte reserved for it.
    pub(crate) fn disk_size(&self) -> heed::Result<u64> {
        self.env.real_disk_size()
    }

    /// Writes a copy of the environment to `file`, as `compaction` says (tests: a data dir's copy).
    #[cfg(test)]
    pub(crate) fn copy_to_file(
        &self,
        file: &mut std::fs::File,
        compaction: heed::CompactionOption,
    ) -> heed::Result<()> {
        let _pin = self.mapping.pin();
        self.env.copy_to_file(file, compaction).map(drop)
    }

    /// The environment's directory.
    pub(crate) fn dir(&self) -> &Path {
        self.env.path()
    }

    #[cfg(test)]
    /// How this environment's pages reach its file.
    pub(crate) fn writes(&self) -> Writes {
        self.mapping.writes()
    }

    pub(super) fn read_meta<T: serde::de::DeserializeOwned>(
        &self,
        txn: &heed::RoTxn,
        name: &[u8],
    ) -> Result<Option<T>, BoxError> {
        Ok(self.meta.get(txn, name)?.map(postcard::from_bytes).transpose()?)
    }

    pub(super) fn applied_state(&self) -> Result<(Option<LogId>, StoredMembership), BoxError> {
        let txn = self.read_txn()?;
        self.applied_in(&txn)
    }

    /// The applied log id and membership as of `txn` (a backup's consistent index and members, read
    /// with the tables they go with).
    pub(crate) fn applied_in(&self, txn: &heed::RoTxn) -> Result<(Option<LogId>, StoredMembership), BoxError> {
        let applied = self.read_meta::<Option<LogId>>(txn, APPLIED)?.flatten();
        let membership = self.read_meta(txn, MEMBERSHIP)?.unwrap_or_default();
        Ok((applied, membership))
    }
}
