//! An etcd 3.4/3.5 backend's buckets written into keyward's tables, as they are:
//!
//! - `key`: revision (`main u64 BE, '_', sub u64 BE`, plus `t` for a deletion) → `mvccpb.KeyValue`;
//!   every change at its own revision, with its create/mod revisions, version and lease
//!   (`KvStore::import_change`), then the compaction of `meta`'s `scheduledCompactRev` /
//!   `finishedCompactRev` (a compaction etcd had scheduled but not finished is finished here, as
//!   etcd does at start);
//! - `lease`: lease id → `leasepb.Lease` (TTL, checkpointed remaining TTL); keys are attached to their
//!   lease from the key history, as etcd rebuilds attachments at start;
//! - `auth`, `authUsers`, `authRoles`: the enabled flag and auth revision, users with their bcrypt
//!   hashes and roles, roles with their permissions (`authpb`, which keyward shares);
//! - `alarm`: active alarms, kept as etcd's own restore keeps them;
//! - `meta`'s `consistent_index`: the raft index the new data dir starts at.
//!
//! Everything read is untrusted: a record that does not decode is an error naming the bucket and
//! key, never a panic.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Context as _};
use prost::Message;

use super::bolt::{Bolt, Bucket};
use crate::lease::store::LeaseRecord;
use crate::mvcc::revision::Revision;
use crate::proto::authpb::{Role, User};
use crate::proto::etcdserverpb::AlarmMember;
use crate::proto::mvccpb::KeyValue;
use crate::raft::state_machine::State;

/// Changes written per LMDB transaction: one transaction for a whole large store would meet LMDB's
/// dirty-page spilling (docs/architecture.md, Known limits).
const CHANGES_PER_COMMIT: usize = 20_000;

/// etcd's `leasepb.Lease`, with keyward's lease owner in a field etcd skips (`backup/export/`).
#[derive(Clone, PartialEq, Message)]
pub(crate) struct EtcdLease {
    #[prost(int64, tag = "1")]
    pub id: i64,
    #[prost(int64, tag = "2")]
    pub ttl: i64,
    #[prost(int64, tag = "3")]
    pub remaining_ttl: i64,
    /// The user who granted the lease with auth on (keyward's backups only).
    #[prost(string, optional, tag = "100")]
    pub owner: Option<String>,
}

/// What was imported.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Imported {
    pub revision: i64,
    pub compacted: Option<i64>,
    pub changes: u64,
    pub leases: u64,
    pub users: u64,
    pub roles: u64,
    pub auth_enabled: bool,
    pub auth_revision: u64,
    pub alarms: u64,
    pub consistent_index: u64,
}

pub(crate) fn import(bolt: &Bolt, state: &State) -> anyhow::Result<Imported> {
    let bucket = |name: &str| -> anyhow::Result<Option<Bucket>> {
        bolt.bucket(name.as_bytes()).with_context(|| format!("bucket {name:?}"))
    };
    let Some(keys) = bucket("key")? else {
        bail!("no \"key\" bucket: not an etcd v3 backend");
    };
    let mut imported = Imported::default();
    read_meta(bolt, bucket("meta")?, &mut imported)?;
    let attached = import_keys(bolt, &keys, state, &mut imported)?;
    let mut txn = state.offline_write_txn()?;
    let current = imported.revision.max(imported.compacted.unwrap_or(0));
    state.kv.import_finish(&mut txn, current, imported.compacted).map_err(|e| anyhow!("compaction: {e}"))?;
    imported.revision = current.max(1);
    if let Some(leases) = bucket("lease")? {
        bolt.for_each(&leases, |id, value| {
            let lease = EtcdLease::decode(value).map_err(|e| bad("lease", id, e))?;
            let record = LeaseRecord { ttl: lease.ttl, remaining_ttl: lease.remaining_ttl, owner: lease.owner };
            state.leases.put(&mut txn, lease.id, &record).map_err(|e| bad("lease", id, e))?;
            imported.leases += 1;
            Ok(())
        })?;
    }
    for (key, lease) in attached {
        if state.leases.get(&txn, lease)?.is_some() {
            state.leases.attach(&mut txn, lease, &key)?;
        } else {
            // etcd logs the same at start and serves the key with its lease id.
            tracing::warn!(key = %crate::logging::text::Quoted::bytes(&key), lease = format!("{lease:x}"), "key's lease does not exist");
        }
    }
    import_auth(bolt, bucket("auth")?, bucket("authUsers")?, bucket("authRoles")?, state, &mut txn, &mut imported)?;
    if let Some(alarms) = bucket("alarm")? {
        bolt.for_each(&alarms, |key, _| {
            let alarm = AlarmMember::decode(key).map_err(|e| bad("alarm", key, e))?;
            state.alarms.activate(&mut txn, alarm.member_id, alarm.alarm).map_err(|e| bad("alarm", key, e))?;
            imported.alarms += 1;
            Ok(())
        })?;
    }
    txn.commit()?;
    Ok(imported)
}

fn bad(bucket: &str, key: &[u8], e: impl std::fmt::Display) -> super::bolt::BoltError {
    super::bolt::BoltError::Corrupt(format!("bucket {bucket:?}, key {}: {e}", hex(key)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `etcdctl snapshot status` of an etcd backup, computed as etcd computes it: CRC-32C over every
/// bucket's name, then its keys and values in order; the revision of the `key` bucket's last key; the
/// number of keys of every bucket; the database's size.
pub(crate) fn status(bolt: &Bolt) -> Result<(u32, i64, u64, u64), super::bolt::BoltError> {
    let (mut hash, mut revision, mut keys) = (0u32, 0i64, 0u64);
    for (name, bucket) in bolt.buckets()? {
        hash = crc32c::crc32c_append(hash, &name);
        bolt.for_each(&bucket, |key, value| {
            hash = crc32c::crc32c_append(crc32c::crc32c_append(hash, key), value);
            if name == b"key" {
                revision = etcd_revision(key).map_or(revision, |(at, _)| at.main);
            }
            keys += 1;
            Ok(())
        })?;
    }
    Ok((hash, revision, keys, bolt.size()))
}

/// The main revision of an etcd revision key (`main, '_', sub`, optionally `t`).
fn etcd_revision(key: &[u8]) -> Option<(Revision, bool)> {
    let tombstone = match key.len() {
        17 => false,
        18 if key[17] == b't' => true,
        _ => return None,
    };
    if key[8] != b'_' {
        return None;
    }
    let main = i64::try_from(u64::from_be_bytes(key[..8].try_into().ok()?)).ok()?;
    let sub = i64::try_from(u64::from_be_bytes(key[9..17].try_into().ok()?)).ok()?;
    Some((Revision::new(main, sub), tombstone))
}

fn read_meta(bolt: &Bolt, meta: Option<Bucket>, imported: &mut Imported) -> anyhow::Result<()> {
    let Some(meta) = meta else { return Ok(()) };
    bolt.for_each(&meta, |key, value| {
        match key {
            b"consistent_index" => {
                let bytes: [u8; 8] = value.try_into().map_err(|_| bad("meta", key, "not 8 bytes"))?;
                imported.consistent_index = u64::from_be_bytes(bytes);
            }
            b"scheduledCompactRev" | b"finishedCompactRev" => {
                let (rev, _) = etcd_revision(value).ok_or_else(|| bad("meta", key, "not a revision"))?;
                imported.compacted = imported.compacted.max(Some(rev.main));
            }
            _ => {}
        }
        Ok(())
    })?;
    Ok(())
}

/// Writes every change of the `key` bucket; returns the live keys that have a lease.
fn import_keys(
    bolt: &Bolt,
    keys: &Bucket,
    state: &State,
    imported: &mut Imported,
) -> anyhow::Result<BTreeMap<Vec<u8>, i64>> {
    let mut leased = BTreeMap::new();
    let mut txn = Some(state.offline_write_txn()?);
    let mut last = None;
    let mut in_txn = 0;
    bolt.for_each(keys, |key, value| {
        let (at, deleted) = etcd_revision(key).ok_or_else(|| bad("key", key, "not a revision"))?;
        if last.is_some_and(|l| at <= l) {
            return Err(bad("key", key, "revisions out of order"));
        }
        last = Some(at);
        let kv = KeyValue::decode(value).map_err(|e| bad("key", key, e))?;
        if kv.key.is_empty() {
            return Err(bad("key", key, "empty key"));
        }
        let wtxn = txn.as_mut().ok_or_else(|| bad("key", key, "no transaction"))?;
        state.kv.import_change(wtxn, at, &kv, deleted).map_err(|e| bad("key", key, e))?;
        match (deleted, kv.lease) {
            (false, 0) | (true, _) => {
                leased.remove(&kv.key);
            }
            (false, lease) => {
                leased.insert(kv.key.clone(), lease);
            }
        }
        imported.changes += 1;
        imported.revision = at.main;
        in_txn += 1;
        if in_txn == CHANGES_PER_COMMIT {
            in_txn = 0;
            let full = txn.take().ok_or_else(|| bad("key", key, "no transaction"))?;
            full.commit().map_err(|e| bad("key", key, e))?;
            txn = Some(state.offline_write_txn().map_err(|e| bad("key", key, e))?);
        }
        Ok(())
    })?;
    if let Some(txn) = txn {
        txn.commit()?;
    }
    Ok(leased)
}

fn import_auth(
    bolt: &Bolt,
    auth: Option<Bucket>,
    users: Option<Bucket>,
    roles: Option<Bucket>,
    state: &State,
    txn: &mut heed::RwTxn,
    imported: &mut Imported,
) -> anyhow::Result<()> {
    if let Some(auth) = auth {
        bolt.for_each(&auth, |key, value| {
            match key {
                b"authEnabled" => imported.auth_enabled = value == [1],
                b"authRevision" => {
                    let bytes: [u8; 8] = value.try_into().map_err(|_| bad("auth", key, "not 8 bytes"))?;
                    imported.auth_revision = u64::from_be_bytes(bytes);
                }
                _ => {}
            }
            Ok(())
        })?;
    }
    // etcd starts at auth revision 1 too.
    imported.auth_revision = imported.auth_revision.max(1);
    if let Some(users) = users {
        bolt.for_each(&users, |key, value| {
            let mut user = User::decode(value).map_err(|e| bad("authUsers", key, e))?;
            if user.name != key {
                return Err(bad("authUsers", key, "the record names another user"));
            }
            // No etcd token survives the move; tokens issued by keyward from now on stand.
            user.credentials_revision = imported.auth_revision;
            user.options = Some(user.options.unwrap_or_default());
            user.roles.sort();
            state.auth.import_user(txn, &user).map_err(|e| bad("authUsers", key, e))?;
            imported.users += 1;
            Ok(())
        })?;
    }
    if let Some(roles) = roles {
        bolt.for_each(&roles, |key, value| {
            let mut role = Role::decode(value).map_err(|e| bad("authRoles", key, e))?;
            if role.name != key {
                return Err(bad("authRoles", key, "the record names another role"));
            }
            role.key_permission.sort_by(|a, b| a.key.cmp(&b.key));
            state.auth.import_role(txn, &role).map_err(|e| bad("authRoles", key, e))?;
            imported.roles += 1;
            Ok(())
        })?;
    }
    state.auth.import_state(txn, imported.auth_enabled, imported.auth_revision)?;
    Ok(())
}
