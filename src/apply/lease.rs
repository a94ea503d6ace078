//! Lease entries: grant, revoke (which deletes the lease's keys) and remaining-TTL checkpoints.

use heed::RwTxn;

use super::kv::write_kv;
use super::outcome::{Applied, Effects};
use super::stores::Stores;
use crate::error::EtcdError;
use crate::keyrange::KeyRange;
use crate::lease::store::LeaseRecord;
use crate::lease::{MAX_LEASE_TTL, MIN_LEASE_TTL};
use crate::mvcc::kv;
use crate::proto::etcdserverpb::{
    LeaseCheckpointRequest, LeaseCheckpointResponse, LeaseGrantRequest, LeaseGrantResponse, LeaseRevokeResponse,
};

/// A grant, once permitted: `owner` is the holder the grant's check established
/// (`lease::holders::owner_of_grant`).
pub(super) fn grant(
    stores: &Stores,
    txn: &mut RwTxn,
    grant: &LeaseGrantRequest,
    owner: Option<String>,
) -> Result<(Applied, Effects), EtcdError> {
    if stores.leases.get(txn, grant.id)?.is_some() {
        return Err(EtcdError::LeaseExists);
    }
    if grant.ttl > MAX_LEASE_TTL {
        return Err(EtcdError::LeaseTtlTooLarge);
    }
    let ttl = grant.ttl.max(MIN_LEASE_TTL);
    stores.leases.put(txn, grant.id, &LeaseRecord::granted(ttl, owner))?;
    let header = kv::header(stores.kv.view(txn)?.rev);
    let resp = LeaseGrantResponse { header, id: grant.id, ttl, error: String::new() };
    Ok((Applied::LeaseGrant(resp), Effects { granted: vec![(grant.id, ttl)], ..Default::default() }))
}

/// A revoke, once permitted: deletes `keys` (the lease's attached keys) at one new revision, then
/// the lease.
pub(super) fn revoke(
    stores: &Stores,
    txn: &mut RwTxn,
    id: i64,
    keys: &[Vec<u8>],
) -> Result<(Applied, Effects), EtcdError> {
    let (_, mut effects) = write_kv(stores, txn, &[], |w, _| {
        for key in keys {
            w.delete_range(&KeyRange::Single(key.clone()), false)?;
        }
        Ok(Applied::Nothing)
    })?;
    stores.leases.remove(txn, id)?;
    effects.revoked.push(id);
    let header = kv::header(stores.kv.view(txn)?.rev);
    Ok((Applied::LeaseRevoke(LeaseRevokeResponse { header }), effects))
}

/// Checkpoints, once permitted: each remaining TTL is recorded for a lease that still exists.
pub(super) fn checkpoint(
    stores: &Stores,
    txn: &mut RwTxn,
    checkpoint: &LeaseCheckpointRequest,
) -> Result<(Applied, Effects), EtcdError> {
    for cp in &checkpoint.checkpoints {
        if let Some(mut record) = stores.leases.get(txn, cp.id)? {
            record.remaining_ttl = cp.remaining_ttl;
            stores.leases.put(txn, cp.id, &record)?;
        }
    }
    let header = kv::header(stores.kv.view(txn)?.rev);
    Ok((Applied::LeaseCheckpoint(LeaseCheckpointResponse { header }), Effects::default()))
}
