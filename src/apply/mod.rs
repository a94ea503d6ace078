//! The single place that turns a committed raft entry into effects on the store.
//!
//! Plain and synchronous: it runs inside the state machine's LMDB write transaction, which also records
//! the applied log id, so an entry is applied whole or not at all. For every entry, in this order:
//! 0. the request's shape, checked again as the API layer checks it: whatever a committed entry holds,
//!    applying it gives an etcd error, never a storage error (an empty key would reach LMDB);
//! 1. who asked (`Requester`, from the entry's header) and whether auth is on;
//! 2. every permission the operation needs, decided at the auth revision the entry is ordered at —
//!    a permission revoked by an earlier entry is already gone;
//! 3. the operation's own checks (compacted revision, lease exists, ...);
//! 4. the writes.
//!
//! Steps 1–3 never write, so a refused entry changes nothing.
//!
//! While a NOSPACE alarm is active, step 3 refuses requests that would take space (`capped.rs`).
//!
//! `apply` below decodes the entry's request once (`request.rs`) and dispatches on its kind; each arm
//! reads as the steps above, with one file per concern: the permission checks and the auth entries
//! (`auth.rs`), what a full cluster refuses (`capped.rs`), the writes (`kv.rs`, `lease.rs`,
//! `alarm.rs`). What applying produces is `outcome.rs`'s, the tables it writes `stores.rs`'s.

mod alarm;
mod auth;
mod capped;
pub(crate) mod footprint;
mod kv;
mod lease;
mod outcome;
mod request;
mod stores;

use heed::RwTxn;

use self::auth::authorize;
use self::capped::refuse_if_capped;
use self::request::Kind;
use crate::error::EtcdError;
use crate::identity::Requester;
use crate::lease::holders;
use crate::mvcc;
use crate::proto::etcdserverpb::InternalRaftRequest;

pub(crate) use self::outcome::{Applied, Effects};
pub(crate) use self::stores::Stores;

/// Applies one entry (`index` is its raft log index). `Err` is the etcd error for the proposer; the
/// transaction then holds no change from this entry. `EtcdError::Internal` means storage failed and the
/// whole batch must abort; `EtcdError::StorageFull` means the batch must abort and be applied again
/// once there is room.
pub(crate) fn apply(
    stores: &Stores,
    txn: &mut RwTxn,
    req: &InternalRaftRequest,
    index: u64,
) -> Result<(Applied, Effects), EtcdError> {
    let who = Requester::from_header(req.header.as_ref());
    let kind = Kind::of(req).ok_or_else(|| EtcdError::Unsupported("request not supported by this member".into()))?;
    let op = kind.name();
    match kind {
        Kind::Put(put) => {
            mvcc::txn::validate_put(put)?;
            authorize(stores, txn, index, |authz| auth::check_put(authz, stores.leases, txn, &who, put))?;
            refuse_if_capped(stores, txn, req)?;
            kv::put(stores, txn, put)
        }
        Kind::DeleteRange(del) => {
            authorize(stores, txn, index, |authz| authz.check_delete(&who, op, del))?;
            kv::delete_range(stores, txn, del)
        }
        Kind::Txn(t) => {
            // The op-count limit is each member's own flag, so it stays in the API layer.
            mvcc::txn::validate(t, usize::MAX)?;
            authorize(stores, txn, index, |authz| auth::check_txn(authz, stores.leases, txn, &who, t))?;
            refuse_if_capped(stores, txn, req)?;
            kv::txn(stores, txn, t)
        }
        Kind::Compaction(compaction) => {
            authorize(stores, txn, index, |authz| authz.check_compaction(&who, op))?;
            kv::compact(stores, txn, compaction)
        }
        Kind::LeaseGrant(grant) => {
            let owner = authorize(stores, txn, index, |authz| {
                authz.check_user(&who, op)?;
                Ok(holders::owner_of_grant(authz, &who))
            })?;
            refuse_if_capped(stores, txn, req)?;
            lease::grant(stores, txn, grant, owner)
        }
        Kind::LeaseRevoke(revoke) => {
            // Looked up before any permission check: an unknown lease is "not found" to everyone.
            let Some(record) = stores.leases.get(txn, revoke.id)? else {
                return Err(EtcdError::LeaseNotFound);
            };
            let keys = stores.leases.attached_keys(txn, revoke.id)?;
            authorize(stores, txn, index, |authz| {
                auth::check_lease_revoke(authz, stores.leases, txn, &who, revoke, &record, &keys)
            })?;
            lease::revoke(stores, txn, revoke.id, &keys)
        }
        Kind::LeaseCheckpoint(checkpoint) => {
            authorize(stores, txn, index, |authz| authz.check_admin(&who, op))?;
            lease::checkpoint(stores, txn, checkpoint)
        }
        Kind::Alarm(alarm) => {
            // Raising or clearing an alarm changes what the whole cluster accepts: root's, with auth on.
            authorize(stores, txn, index, |authz| authz.check_admin(&who, op))?;
            alarm::apply(stores, txn, alarm)
        }
        // A login checks the requester's credentials itself (`auth::authenticate`).
        Kind::Authenticate(login) => auth::authenticate(stores, txn, &who, &login.name, &login.simple_token, index),
        Kind::AuthChange(change) => {
            // User and role management: root only when auth is on.
            authorize(stores, txn, index, |authz| authz.check_admin(&who, op))?;
            auth::change(stores, txn, change)
        }
    }
}
