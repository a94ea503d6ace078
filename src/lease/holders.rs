//! Who may use a lease once it is granted: see it listed, read its TTL, keep it alive, revoke it, attach
//! keys to it. etcd lets any authenticated user do all but the last two (and those whenever the user
//! may write every key already attached, so also on a lease with no keys); keyward keeps a lease to:
//! - its holder, the user who granted it (`LeaseRecord::owner`, recorded at apply with auth on);
//! - a user who may read or write every key attached to it (there is at least one): whoever may
//!   delete or read all a lease keeps alive gains nothing more by using it. This also keeps an
//!   owner-less lease (granted with auth off, or recorded before owners were) usable by those who use
//!   its keys;
//! - root (and everyone while auth is off).
//!
//! The key checks are quiet (`Authorizer::permits`): a listing filters with them; the callers that
//! refuse a request record the refusal (`Authorizer::refuse`).

use heed::RoTxn;

use super::store::{LeaseRecord, LeaseStore};
use crate::auth::check::Authorizer;
use crate::auth::permissions::Access;
use crate::error::EtcdError;
use crate::identity::Requester;
use crate::keyrange::KeyRange;

/// Whether `who` may use lease `id` (whose record is `record`).
pub(crate) fn may_use(
    authz: &Authorizer,
    leases: &LeaseStore,
    txn: &RoTxn,
    who: &Requester,
    id: i64,
    record: &LeaseRecord,
) -> Result<bool, EtcdError> {
    if authz.is_root(who)? {
        return Ok(true);
    }
    if let (Some(owner), Requester::Client { username, .. }) = (&record.owner, who) {
        if owner == username {
            return Ok(true);
        }
    }
    let keys = leases.attached_keys(txn, id)?;
    if keys.is_empty() {
        return Ok(false);
    }
    for key in keys {
        let key = KeyRange::Single(key);
        if !authz.permits(who, Access::Read, &key)? && !authz.permits(who, Access::Write, &key)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The owner a lease granted by `who` records: the user, with auth on (whose identity the grant's
/// check established); nobody with auth off, when any name could be claimed.
pub(crate) fn owner_of_grant(authz: &Authorizer, who: &Requester) -> Option<String> {
    match who {
        Requester::Client { username, .. } if authz.enabled() && !username.is_empty() => Some(username.clone()),
        _ => None,
    }
}
