//! Replicated lease state in the kv environment:
//! - `leases`: lease id → `LeaseRecord` (postcard; a record written before leases had owners decodes
//!   as owner-less)
//! - `lease_keys`: lease id ++ key → (empty): the keys attached to each lease (a [`Table`]: keys may be
//!   longer than LMDB's key limit)

use std::ops::Bound;

use heed::{RoTxn, RwTxn};
use serde::{Deserialize, Serialize};

use crate::error::EtcdError;
use crate::storage::table::{LongKeys, Table};
use crate::storage::Db;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LeaseRecord {
    pub ttl: i64,
    /// Remaining TTL at the last checkpoint; 0 when never checkpointed.
    pub remaining_ttl: i64,
    /// The user who granted it, with auth on (`lease/holders.rs`). `None` for a lease granted with
    /// auth off, or recorded before owners were (older data dirs and snapshots). Last, so that an
    /// older record is a prefix of a newer one (and an older member reads a newer record).
    pub owner: Option<String>,
}

impl LeaseRecord {
    /// A lease of `ttl` seconds, never checkpointed, granted by `owner`.
    pub(crate) fn granted(ttl: i64, owner: Option<String>) -> LeaseRecord {
        LeaseRecord { ttl, remaining_ttl: 0, owner }
    }

    fn decode(bytes: &[u8]) -> Result<LeaseRecord, EtcdError> {
        if let Ok(record) = postcard::from_bytes(bytes) {
            return Ok(record);
        }
        // Written before leases had owners: `ttl` and `remaining_ttl` only.
        let (ttl, remaining_ttl): (i64, i64) = postcard::from_bytes(bytes).map_err(|_| corrupt())?;
        Ok(LeaseRecord { ttl, remaining_ttl, owner: None })
    }
}

pub(crate) struct LeaseStore {
    leases: Db,
    keys: Table,
}

fn id_key(id: i64) -> [u8; 8] {
    (id as u64).to_be_bytes()
}

fn attachment(id: i64, key: &[u8]) -> Vec<u8> {
    let mut out = id_key(id).to_vec();
    out.extend_from_slice(key);
    out
}

fn corrupt() -> EtcdError {
    tracing::error!("corrupt lease record");
    EtcdError::Internal
}

impl LeaseStore {
    pub(crate) const TABLES: [&'static str; 2] = ["leases", "lease_keys"];

    pub(crate) fn new([leases, keys]: [Db; 2], long: LongKeys) -> Self {
        LeaseStore { leases, keys: Table::new(keys, long) }
    }

    pub(crate) fn tables(&self) -> [Db; 2] {
        [self.leases, self.keys.main_db()]
    }

    pub(crate) fn get(&self, txn: &RoTxn, id: i64) -> Result<Option<LeaseRecord>, EtcdError> {
        match self.leases.get(txn, &id_key(id))? {
            None => Ok(None),
            Some(bytes) => LeaseRecord::decode(bytes).map(Some),
        }
    }

    pub(crate) fn all(&self, txn: &RoTxn) -> Result<Vec<(i64, LeaseRecord)>, EtcdError> {
        let mut out = Vec::new();
        for item in self.leases.iter(txn)? {
            let (id, bytes) = item?;
            let id = i64::from_be_bytes(id.try_into().map_err(|_| corrupt())?);
            out.push((id, LeaseRecord::decode(bytes)?));
        }
        Ok(out)
    }

    /// Calls `f` with every lease in id order (as big-endian bytes: etcd's `lease` bucket order), one
    /// record in memory at a time (a backup of any number of leases).
    pub(crate) fn for_each<E: From<EtcdError>>(
        &self,
        txn: &RoTxn,
        mut f: impl FnMut(i64, LeaseRecord) -> Result<(), E>,
    ) -> Result<(), E> {
        for item in self.leases.iter(txn).map_err(EtcdError::from)? {
            let (id, bytes) = item.map_err(EtcdError::from)?;
            let id = i64::from_be_bytes(id.try_into().map_err(|_| corrupt())?);
            f(id, LeaseRecord::decode(bytes)?)?;
        }
        Ok(())
    }

    pub(crate) fn put(&self, txn: &mut RwTxn, id: i64, record: &LeaseRecord) -> Result<(), EtcdError> {
        let bytes = postcard::to_allocvec(record).map_err(|_| EtcdError::Internal)?;
        Ok(self.leases.put(txn, &id_key(id), &bytes)?)
    }

    /// Removes the lease and its attachment records (not the keys themselves).
    pub(crate) fn remove(&self, txn: &mut RwTxn, id: i64) -> Result<(), EtcdError> {
        self.leases.delete(txn, &id_key(id))?;
        let (from, to) = (id_key(id), id_key(id.wrapping_add(1)));
        let bounds = (Bound::Included(&from[..]), if id == -1 { Bound::Unbounded } else { Bound::Excluded(&to[..]) });
        self.keys.delete_range(txn, bounds.0, bounds.1)?;
        Ok(())
    }

    pub(crate) fn attached_keys(&self, txn: &RoTxn, id: i64) -> Result<Vec<Vec<u8>>, EtcdError> {
        let prefix = id_key(id);
        let mut out = Vec::new();
        for item in self.keys.prefix(txn, &prefix)? {
            let (raw, _) = item?;
            out.push(raw[8..].to_vec());
        }
        Ok(out)
    }

    /// How many keys are attached to lease `id`, and their bytes, without holding them.
    pub(crate) fn attached_footprint(&self, txn: &RoTxn, id: i64) -> Result<(u64, u64), EtcdError> {
        let (mut keys, mut bytes) = (0, 0);
        for item in self.keys.prefix(txn, &id_key(id))? {
            let (raw, _) = item?;
            keys += 1;
            bytes += raw.len().saturating_sub(8) as u64;
        }
        Ok((keys, bytes))
    }

    pub(crate) fn attach(&self, txn: &mut RwTxn, id: i64, key: &[u8]) -> Result<(), EtcdError> {
        Ok(self.keys.put(txn, &attachment(id, key), &[])?)
    }

    pub(crate) fn detach(&self, txn: &mut RwTxn, id: i64, key: &[u8]) -> Result<(), EtcdError> {
        self.keys.delete(txn, &attachment(id, key))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record of an older data dir or snapshot (no owner) reads as owner-less; a record with an owner
    /// begins with the older layout, so an older member reads its TTLs.
    #[test]
    fn records_without_an_owner_still_decode() {
        let old = postcard::to_allocvec(&(60i64, 20i64)).unwrap();
        let decoded = LeaseRecord::decode(&old).unwrap();
        assert_eq!(decoded, LeaseRecord { ttl: 60, remaining_ttl: 20, owner: None });
        let new = LeaseRecord { ttl: 60, remaining_ttl: 20, owner: Some("alice".into()) };
        let bytes = postcard::to_allocvec(&new).unwrap();
        assert_eq!(LeaseRecord::decode(&bytes).unwrap(), new);
        assert_eq!(postcard::from_bytes::<(i64, i64)>(&bytes).unwrap(), (60, 20), "as an older member reads it");
        assert!(LeaseRecord::decode(&[0x80]).is_err(), "a truncated record is corrupt");
    }
}
