//! Space: etcd's backend quota (`--quota-backend-bytes`) and what a member does when storage fills up.
//!
//! - **Quota** (etcd's `quotaKVServer`/`quotaLeaseServer`): a put, a txn with a put, or a lease grant
//!   whose cost would take the kv database's size in use to the quota is refused at the API layer with
//!   "database space exceeded", and the member raises a NOSPACE alarm through raft. While the alarm is
//!   active, apply refuses those requests on every member (`apply/capped.rs`); reads, deletes, compaction and
//!   defragment still work, and `etcdctl alarm disarm` clears it.
//! - **Size in use** is LMDB's pages in use (every table's branch, leaf and overflow pages), not the
//!   file size. Unlike bbolt, LMDB reuses freed pages in place: once deletes and a compaction free
//!   pages, writes fit again without a defragment (etcd must defragment first, or its quota check,
//!   which uses bbolt's file size, raises the alarm again at once).
//! - **Storage full** (the disk: ENOSPC/EDQUOT, or LMDB's map: MapFull) while applying a batch never
//!   changes what the batch does: the batch is aborted and applied again, unchanged. The first time,
//!   the ballast (`space/ballast.rs`) is deleted to make room; the member then raises NOSPACE. If there is
//!   still no room, apply waits and retries with backoff, `/health` reports unhealthy, and the member
//!   never exits on its own for this.

pub(crate) mod alarm;
pub(crate) mod ballast;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use heed::{MdbError, RoTxn};

use crate::error::EtcdError;
use crate::proto::etcdserverpb::request_op::Request;
use crate::proto::etcdserverpb::{InternalRaftRequest, PutRequest, RequestOp};
use crate::space::ballast::Ballast;
use crate::storage::{Db, LmdbEnv, MAP_SIZE};

/// etcd's `DefaultQuotaBytes`: the quota when the flag is 0.
pub(crate) const DEFAULT_QUOTA_BYTES: u64 = 2 << 30;
/// etcd's `MaxQuotaBytes`: above it etcd (and keyward) warn that performance may degrade.
pub(crate) const MAX_RECOMMENDED_QUOTA_BYTES: u64 = 8 << 30;
/// etcd's estimates of what storing a lease and a key's metadata costs.
const LEASE_OVERHEAD: u64 = 64;
const KV_OVERHEAD: u64 = 256;

/// `--quota-backend-bytes`, as etcd reads it: 0 means the default, a negative value disables the quota.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quota {
    Bytes(u64),
    Disabled { flag: i64 },
}

impl Quota {
    pub fn from_flag(flag: i64) -> Quota {
        match flag {
            0 => Quota::Bytes(DEFAULT_QUOTA_BYTES),
            n if n < 0 => Quota::Disabled { flag: n },
            n => Quota::Bytes(n as u64),
        }
    }

    /// The value of `etcd_server_quota_backend_bytes` (etcd exports the flag when it disables the quota).
    pub fn gauge(self) -> i64 {
        match self {
            Quota::Bytes(n) => n as i64,
            Quota::Disabled { flag } => flag,
        }
    }
}

/// Address space for the kv environment: always well above the quota, so that LMDB's map is never
/// the first limit hit, and above twice the existing file (an environment filled under a larger quota
/// still opens, with room to grow).
pub(crate) fn map_size(quota: Quota, existing_file_bytes: u64) -> usize {
    let for_quota = match quota {
        Quota::Bytes(n) => n.saturating_mul(4),
        Quota::Disabled { .. } => 0,
    };
    let bytes = for_quota.max(existing_file_bytes.saturating_mul(2)).max(MAP_SIZE as u64);
    usize::try_from(bytes).unwrap_or(usize::MAX)
}

/// What a request is charged against the quota (etcd's `backendQuota.Cost`): puts and lease grants
/// cost, everything else is free. A txn costs its costlier branch. Unlike etcd 3.4, puts inside a
/// nested txn count too (etcd charges them nothing, so a nested put slips past a full quota).
pub(crate) fn cost(req: &InternalRaftRequest) -> u64 {
    if let Some(put) = &req.put {
        put_cost(put)
    } else if let Some(txn) = &req.txn {
        txn_cost(&txn.success).max(txn_cost(&txn.failure))
    } else if req.lease_grant.is_some() {
        LEASE_OVERHEAD
    } else {
        0
    }
}

fn put_cost(put: &PutRequest) -> u64 {
    KV_OVERHEAD + put.key.len() as u64 + put.value.len() as u64
}

fn txn_cost(ops: &[RequestOp]) -> u64 {
    ops.iter()
        .map(|op| match &op.request {
            Some(Request::RequestPut(put)) => put_cost(put),
            Some(Request::RequestTxn(inner)) => txn_cost(&inner.success).max(txn_cost(&inner.failure)),
            _ => 0,
        })
        .sum()
}

/// Which limit a write ran into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Full {
    /// The file system is full (ENOSPC) or the user's disk quota is used up (EDQUOT).
    Disk,
    /// LMDB's map (the address space reserved at open) is used up; a restart reserves more.
    Map,
}

/// Below this many free bytes, an I/O error from a write is taken for a full disk: LMDB reports a
/// short write (the file system ran out of space part-way) as EIO.
const SHORT_WRITE_FREE_BYTES: u64 = 1 << 20;

/// Whether `err` means storage is full, and which storage.
pub(crate) fn full_kind(err: &heed::Error) -> Option<Full> {
    let disk_full =
        |code: i32| code == rustix::io::Errno::NOSPC.raw_os_error() || code == rustix::io::Errno::DQUOT.raw_os_error();
    match err {
        heed::Error::Mdb(MdbError::MapFull) => Some(Full::Map),
        heed::Error::Mdb(MdbError::Other(code)) if disk_full(*code) => Some(Full::Disk),
        heed::Error::Io(e) if e.raw_os_error().is_some_and(disk_full) => Some(Full::Disk),
        _ => None,
    }
}

/// `full_kind` for an error from a write to the environment in `dir`: also a full disk when LMDB
/// reports EIO while the file system holding `dir` has (next to) no free space left — LMDB turns a
/// short write into EIO ("short write, filesystem full?").
pub(crate) fn full_kind_at(err: &heed::Error, dir: &Path) -> Option<Full> {
    let eio = rustix::io::Errno::IO.raw_os_error();
    let is_eio = match err {
        heed::Error::Mdb(MdbError::Other(code)) => *code == eio,
        heed::Error::Io(e) => e.raw_os_error() == Some(eio),
        _ => false,
    };
    full_kind(err).or_else(|| {
        let out_of_space = || crate::space::ballast::free_bytes(dir).is_ok_and(|free| free < SHORT_WRITE_FREE_BYTES);
        (is_eio && out_of_space()).then_some(Full::Disk)
    })
}

/// Storage errors never reach a client in detail: they are logged where they happen and surface as
/// `Internal`, or `StorageFull` when storage is full. (Here rather than in `error.rs`, which names no
/// store: the client-facing error stays a leaf the proxy can use without LMDB.)
impl From<heed::Error> for EtcdError {
    fn from(err: heed::Error) -> EtcdError {
        match err {
            full if full_kind(&full).is_some() => {
                tracing::warn!(error = %full, "storage full");
                EtcdError::StorageFull { map: full_kind(&full) == Some(Full::Map) }
            }
            other => {
                tracing::error!(error = %other, "storage error");
                EtcdError::Internal
            }
        }
    }
}

/// Bytes of the environment's pages that hold data: every table in `dbs` and the main database that
/// names them, plus LMDB's two meta pages. Free pages (reusable after deletes and compaction) are not
/// counted. `mdb_stat` reads each table's root record in the transaction: no tree is walked.
pub(crate) fn pages_in_use(env: &LmdbEnv, dbs: &[Db], txn: &RoTxn<heed::WithoutTls>) -> heed::Result<u64> {
    let main = env.unnamed_database_stat();
    let mut bytes = main.non_free_page_size() as u64 + 2 * u64::from(main.page_size);
    for db in dbs {
        bytes += db.stat(txn)?.non_free_page_size() as u64;
    }
    Ok(bytes)
}

/// A member's space state, shared by the API layer (quota checks), the state machine (size in use,
/// storage-full retries), the raft log (storage-full retry) and the node (raising the alarm).
pub(crate) struct Space {
    quota: Quota,
    ballast: Ballast,
    in_use: AtomicU64,
    /// Apply is waiting for storage space.
    stalled: AtomicBool,
    /// Told whenever a write finds storage full: the node raises the NOSPACE alarm.
    full: tokio::sync::Notify,
}

impl Space {
    pub(crate) fn new(quota: Quota, ballast: Ballast) -> Space {
        Space {
            quota,
            ballast,
            in_use: AtomicU64::new(0),
            stalled: AtomicBool::new(false),
            full: tokio::sync::Notify::new(),
        }
    }

    /// A member's space at start: the quota as etcd announces it, and the disk-full ballast put in
    /// place in `member_dir` (if it cannot be yet, the node tries again later).
    pub(crate) fn open(member_dir: &Path, quota: Quota, ballast_bytes: u64) -> Space {
        let space = Space::new(quota, Ballast::new(member_dir.join("ballast"), ballast_bytes));
        match quota {
            Quota::Bytes(bytes) if bytes > MAX_RECOMMENDED_QUOTA_BYTES => {
                tracing::warn!(
                    quota_bytes = bytes,
                    maximum_recommended_bytes = MAX_RECOMMENDED_QUOTA_BYTES,
                    "quota exceeds the maximum value"
                );
            }
            Quota::Bytes(bytes) => tracing::info!(quota_bytes = bytes, "enabled backend quota"),
            Quota::Disabled { .. } => tracing::info!("disabled backend quota"),
        }
        if let Err(e) = space.ballast().ensure() {
            tracing::warn!(error = %e, "cannot put the disk-full ballast in place; will try again later");
        }
        space
    }

    /// etcd's default quota and no ballast (tests, tools).
    pub(crate) fn without_ballast() -> Space {
        Space::new(Quota::Bytes(DEFAULT_QUOTA_BYTES), Ballast::new(Path::new("").to_path_buf(), 0))
    }

    pub(crate) fn quota(&self) -> Quota {
        self.quota
    }

    pub(crate) fn ballast(&self) -> &Ballast {
        &self.ballast
    }

    /// The kv database's size in use after the latest applied batch.
    pub(crate) fn in_use(&self) -> u64 {
        self.in_use.load(Ordering::Relaxed)
    }

    pub(crate) fn set_in_use(&self, bytes: u64) {
        self.in_use.store(bytes, Ordering::Relaxed);
    }

    /// etcd's `backendQuota.Available`: a request that costs nothing always fits; one that costs
    /// fits while the size in use plus its cost stays below the quota.
    pub(crate) fn admits(&self, cost: u64) -> bool {
        match self.quota {
            _ if cost == 0 => true,
            Quota::Disabled { .. } => true,
            Quota::Bytes(quota) => self.in_use().saturating_add(cost) < quota,
        }
    }

    /// Whether apply is waiting for storage space.
    pub(crate) fn stalled(&self) -> bool {
        self.stalled.load(Ordering::Relaxed)
    }

    pub(crate) fn set_stalled(&self, stalled: bool) {
        self.stalled.store(stalled, Ordering::Relaxed);
    }

    /// A write to `storage` found it full. The node is told (it raises NOSPACE); a full disk gets the
    /// ballast back. Returns whether space was made, so that the write is worth retrying at once.
    pub(crate) fn report_full(&self, kind: Full, storage: &Path) -> bool {
        tracing::warn!(storage = %storage.display(), full = ?kind, "storage full");
        self.full.notify_one();
        kind == Full::Disk && self.ballast.release()
    }

    /// Resolves after a write found storage full.
    pub(crate) async fn full_reported(&self) {
        self.full.notified().await
    }

    /// Runs a write to the environment in `dir`; if storage is full and giving back the ballast made
    /// room, runs it once more.
    pub(crate) fn write_or_make_room<T>(
        &self,
        dir: &Path,
        mut write: impl FnMut() -> heed::Result<T>,
    ) -> heed::Result<T> {
        match write() {
            Err(e) => match full_kind_at(&e, dir) {
                Some(kind) if self.report_full(kind, dir) => write(),
                _ => Err(e),
            },
            done => done,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::etcdserverpb::{LeaseGrantRequest, TxnRequest};

    fn put(key: &str, value: &str) -> PutRequest {
        PutRequest { key: key.into(), value: value.into(), ..Default::default() }
    }

    fn op(put: PutRequest) -> RequestOp {
        RequestOp { request: Some(Request::RequestPut(put)) }
    }

    #[test]
    fn quota_flag_reads_as_etcd_reads_it() {
        assert_eq!(Quota::from_flag(0), Quota::Bytes(2 << 30));
        assert_eq!(Quota::from_flag(1 << 20), Quota::Bytes(1 << 20));
        assert_eq!(Quota::from_flag(-1), Quota::Disabled { flag: -1 });
        assert_eq!(Quota::from_flag(0).gauge(), 2 << 30);
        assert_eq!(Quota::from_flag(-1).gauge(), -1);
    }

    #[test]
    fn map_is_always_far_above_the_quota_and_the_file() {
        assert_eq!(map_size(Quota::Bytes(1 << 20), 0), MAP_SIZE);
        assert_eq!(map_size(Quota::Bytes(100 << 30), 0), 400 << 30);
        assert_eq!(map_size(Quota::Bytes(1 << 20), 50 << 30), 100 << 30);
        assert_eq!(map_size(Quota::Disabled { flag: -1 }, 0), MAP_SIZE);
    }

    #[test]
    fn costs_are_etcds_with_nested_puts_counted() {
        let p = |req: InternalRaftRequest| cost(&req);
        assert_eq!(p(InternalRaftRequest { put: Some(Box::new(put("k", "vv"))), ..Default::default() }), 256 + 1 + 2);
        let grant = LeaseGrantRequest { ttl: 5, id: 1 };
        assert_eq!(p(InternalRaftRequest { lease_grant: Some(Box::new(grant)), ..Default::default() }), 64);
        let txn = TxnRequest {
            success: vec![op(put("a", "1")), op(put("b", "2"))],
            failure: vec![op(put("c", "333333"))],
            ..Default::default()
        };
        assert_eq!(p(InternalRaftRequest { txn: Some(Box::new(txn.clone())), ..Default::default() }), 2 * 258);
        let nested =
            TxnRequest { success: vec![RequestOp { request: Some(Request::RequestTxn(txn)) }], ..Default::default() };
        assert_eq!(p(InternalRaftRequest { txn: Some(Box::new(nested)), ..Default::default() }), 2 * 258);
        assert_eq!(p(InternalRaftRequest::default()), 0);
    }

    #[test]
    fn admits_below_the_quota_only() {
        let space = Space::new(Quota::Bytes(1000), Ballast::new(Path::new("").to_path_buf(), 0));
        space.set_in_use(700);
        assert!(space.admits(299));
        assert!(!space.admits(300), "etcd refuses when size + cost reaches the quota");
        assert!(space.admits(0), "free requests always pass");
        let unlimited = Space::new(Quota::Disabled { flag: -1 }, Ballast::new(Path::new("").to_path_buf(), 0));
        unlimited.set_in_use(u64::MAX / 2);
        assert!(unlimited.admits(1 << 40));
    }

    #[test]
    fn disk_and_map_full_are_told_apart_from_other_errors() {
        let enospc = heed::Error::Mdb(MdbError::Other(rustix::io::Errno::NOSPC.raw_os_error()));
        assert_eq!(full_kind(&enospc), Some(Full::Disk));
        assert_eq!(full_kind(&heed::Error::Io(std::io::Error::from_raw_os_error(122))), Some(Full::Disk));
        assert_eq!(full_kind(&heed::Error::Mdb(MdbError::MapFull)), Some(Full::Map));
        assert_eq!(full_kind(&heed::Error::Mdb(MdbError::Other(5))), None, "EIO is a failure, not a full disk");
        assert_eq!(full_kind(&heed::Error::Mdb(MdbError::BadValSize)), None);
        // A short write shows as EIO: a full disk only if the file system is out of space.
        let eio = heed::Error::Mdb(MdbError::Other(rustix::io::Errno::IO.raw_os_error()));
        let roomy = tempfile::tempdir().unwrap();
        if crate::space::ballast::free_bytes(roomy.path()).unwrap() > SHORT_WRITE_FREE_BYTES {
            assert_eq!(full_kind_at(&eio, roomy.path()), None, "EIO with free space is a genuine failure");
        }
        assert_eq!(full_kind_at(&enospc, roomy.path()), Some(Full::Disk));
    }

    #[test]
    fn a_full_disk_gets_the_ballast_back_once() {
        let dir = tempfile::tempdir().unwrap();
        let space = Space::new(Quota::Bytes(1 << 30), Ballast::new(dir.path().join("ballast"), 1 << 20));
        assert!(space.ballast().ensure().unwrap());
        let mut tries = 0;
        let enospc = || heed::Error::Mdb(MdbError::Other(rustix::io::Errno::NOSPC.raw_os_error()));
        let result = space.write_or_make_room(dir.path(), || {
            tries += 1;
            if tries == 1 {
                Err(enospc())
            } else {
                Ok(tries)
            }
        });
        assert_eq!(result.unwrap(), 2, "retried once after the ballast was deleted");
        assert!(!space.ballast().present());
        let mut tries = 0;
        let result: heed::Result<()> = space.write_or_make_room(dir.path(), || {
            tries += 1;
            Err(enospc())
        });
        assert!(result.is_err());
        assert_eq!(tries, 1, "no ballast left: no pointless retry");
        let map_full: heed::Result<()> =
            space.write_or_make_room(dir.path(), || Err(heed::Error::Mdb(MdbError::MapFull)));
        assert!(map_full.is_err());
    }
}
