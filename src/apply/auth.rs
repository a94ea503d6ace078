//! The permission layer of apply, and the auth entries themselves.
//!
//! Every check runs against the auth state in the entry's own transaction, at the auth revision the
//! entry is ordered at, before anything is written (etcd's `authApplierV3`, as a set of checks the
//! dispatch in `apply/mod.rs` calls in order rather than a wrapping applier). The auth entries are a
//! login (`authenticate`) and the user and role management that needs root (`change`).

use heed::{RoTxn, RwTxn};

use super::outcome::{Applied, Effects};
use super::request::{AuthChange, Kind};
use super::stores::Stores;
use crate::auth::check::Authorizer;
use crate::auth::permissions::Access;
use crate::error::EtcdError;
use crate::identity::Requester;
use crate::keyrange::KeyRange;
use crate::lease::holders;
use crate::lease::store::{LeaseRecord, LeaseStore};
use crate::mvcc::kv;
use crate::proto::etcdserverpb::{LeaseRevokeRequest, PutRequest, TxnRequest};

/// Runs permission checks against the auth state in `txn`, before anything is written.
pub(super) fn authorize<T>(
    stores: &Stores,
    txn: &RoTxn,
    index: u64,
    check: impl FnOnce(&Authorizer) -> Result<T, EtcdError>,
) -> Result<T, EtcdError> {
    check(&Authorizer::new(stores.auth, txn)?.at_index(index))
}

/// A put needs write on its key; with `prev_kv` also read; attaching a lease also needs write on every
/// key already attached to that lease, since revoking the lease will delete them all (CVE-2026-44283).
pub(super) fn check_put(
    authz: &Authorizer,
    leases: &LeaseStore,
    txn: &RoTxn,
    who: &Requester,
    put: &PutRequest,
) -> Result<(), EtcdError> {
    if !authz.enabled() {
        return Ok(());
    }
    let op = Kind::Put(put).name();
    let key = KeyRange::Single(put.key.clone());
    authz.check(who, op, Access::Write, &key)?;
    if put.prev_kv {
        authz.check(who, op, Access::Read, &key)?;
    }
    if put.lease != 0 {
        for attached in leases.attached_keys(txn, put.lease)? {
            authz.check(who, op, Access::Write, &KeyRange::Single(attached))?;
        }
        // Attaching a key to a lease uses it: only a lease the requester may use (`lease/holders.rs`),
        // or another user's lease would become the attacher's by the key attached.
        if let Some(record) = leases.get(txn, put.lease)? {
            if !holders::may_use(authz, leases, txn, who, put.lease, &record)? {
                return Err(authz.refuse(who, op));
            }
        }
    }
    Ok(())
}

/// A txn's compares, ranges and deletes are checked by `Authorizer::check_txn`; each of its puts, at
/// any depth, as a put on its own.
pub(super) fn check_txn(
    authz: &Authorizer,
    leases: &LeaseStore,
    txn: &RoTxn,
    who: &Requester,
    t: &TxnRequest,
) -> Result<(), EtcdError> {
    authz.check_txn(who, t, &mut |put| check_put(authz, leases, txn, who, put))
}

/// Revoking a lease (whose record and attached keys the caller looked up) needs an existing user,
/// write on every attached key, and a lease the requester may use.
pub(super) fn check_lease_revoke(
    authz: &Authorizer,
    leases: &LeaseStore,
    txn: &RoTxn,
    who: &Requester,
    revoke: &LeaseRevokeRequest,
    record: &LeaseRecord,
    keys: &[Vec<u8>],
) -> Result<(), EtcdError> {
    let op = Kind::LeaseRevoke(revoke).name();
    authz.check_user(who, op)?;
    // Revoking deletes every attached key: the requester must be allowed to delete each.
    keys.iter().try_for_each(|k| authz.check(who, op, Access::Write, &KeyRange::Single(k.clone())))?;
    // And the lease must be one the requester may use (a lease with no keys is its holder's).
    match holders::may_use(authz, leases, txn, who, revoke.id, record)? {
        true => Ok(()),
        false => Err(authz.refuse(who, op)),
    }
}

/// Issues a token for a user whose password the API layer checked at the auth revision in the entry's
/// header. If the user's credentials changed since (a password change, the user deleted and added
/// again, or auth disabled), the check is stale and the entry is refused; the API layer checks again.
/// This closes the time-of-check/time-of-use gap. Other auth changes since the check do not matter.
pub(super) fn authenticate(
    stores: &Stores,
    txn: &RoTxn,
    who: &Requester,
    name: &str,
    simple_token: &str,
    index: u64,
) -> Result<(Applied, Effects), EtcdError> {
    let auth = stores.auth;
    if !auth.enabled(txn)? {
        return Err(EtcdError::AuthNotEnabled);
    }
    let revision = auth.revision(txn)?;
    match who {
        Requester::Client { username, revision: checked_at, .. } if username == name => {
            if !auth.token_valid(txn, name, *checked_at)? {
                return Err(EtcdError::AuthOldRevision);
            }
        }
        _ => return Err(EtcdError::AuthFailed),
    }
    let user = auth.user(txn, name)?.ok_or(EtcdError::AuthFailed)?;
    if user.options.is_some_and(|o| o.no_password) {
        return Err(EtcdError::AuthFailed);
    }
    if let Some(tokens) = stores.simple_tokens {
        // `simple_token` is the digest of the token's prefix (`auth/simple.rs`); the proposer, who
        // alone knows the prefix, makes the token from it and this entry's index.
        tokens.assign(simple_token, index, name, revision);
    }
    // JWT: the API layer signs a token for (name, revision) once this entry is applied.
    Ok((Applied::Authenticated { index, auth_revision: revision }, Effects::default()))
}

/// User and role management, once the requester was found to be root (`apply/mod.rs`). Tokens a
/// change voids are dropped from the member-local simple token table here.
pub(super) fn change(stores: &Stores, txn: &mut RwTxn, change: AuthChange) -> Result<(Applied, Effects), EtcdError> {
    let auth = stores.auth;
    let affected = match change {
        AuthChange::AuthEnable => auth.enable(txn)?,
        AuthChange::AuthDisable => {
            let affected = auth.disable(txn)?;
            if let Some(tokens) = stores.simple_tokens {
                tokens.clear();
            }
            affected
        }
        AuthChange::UserAdd(r) => auth.user_add(txn, &r.name, &r.hashed_password, r.options)?,
        AuthChange::UserDelete(r) => {
            let affected = auth.user_delete(txn, &r.name)?;
            if let Some(tokens) = stores.simple_tokens {
                tokens.invalidate_user(&r.name);
            }
            affected
        }
        AuthChange::UserChangePassword(r) => {
            let affected = auth.user_change_password(txn, &r.name, &r.hashed_password)?;
            if let Some(tokens) = stores.simple_tokens {
                tokens.invalidate_user(&r.name);
            }
            affected
        }
        AuthChange::UserGrantRole(r) => auth.user_grant_role(txn, &r.user, &r.role)?,
        AuthChange::UserRevokeRole(r) => auth.user_revoke_role(txn, &r.name, &r.role)?,
        AuthChange::RoleAdd(r) => auth.role_add(txn, &r.name)?,
        AuthChange::RoleDelete(r) => auth.role_delete(txn, &r.role)?,
        AuthChange::RoleGrantPermission(r) => {
            let perm = r.perm.clone().ok_or(EtcdError::PermissionNotGranted)?;
            auth.role_grant_permission(txn, &r.name, perm)?
        }
        AuthChange::RoleRevokePermission(r) => auth.role_revoke_permission(txn, &r.role, &r.key, &r.range_end)?,
    };
    let header = kv::header(stores.kv.view(txn)?.rev);
    Ok((Applied::AuthChanged { header }, Effects { auth: Some(affected), ..Default::default() }))
}
