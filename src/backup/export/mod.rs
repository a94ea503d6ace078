//! keyward's applied state as an etcd 3.4/3.5 backend (a bbolt file): what the Snapshot RPC streams,
//! so that `etcdctl snapshot status` and `etcdctl snapshot restore` take a keyward backup as an etcd
//! one, and `keyward snapshot restore` / `keyward migrate` read it back (`backup/migrate/etcd.rs`).
//!
//! - `bolt_writer.rs`: bbolt's file format, written by sorted bulk load.
//!
//! The buckets, as etcd's own code writes them (and in bbolt's byte order):
//! - `alarm`: each active alarm's `AlarmMember` as the key, no value;
//! - `auth`: `authEnabled` (one byte), `authRevision` (u64 big-endian);
//! - `authRoles`, `authUsers`: name → `authpb.Role` / `authpb.User` (bcrypt hashes, which etcd checks
//!   as it checks its own);
//! - `cluster`: empty (etcd records its cluster version there once the cluster decided it);
//! - `key`: every change compaction keeps, revision (`main u64 BE, '_', sub u64 BE`, `t` appended for
//!   a deletion) → `mvccpb.KeyValue` (a deletion holds only the key, as etcd's);
//! - `lease`: id (u64 BE) → `leasepb.Lease` (ID, TTL, checkpointed remaining TTL);
//! - `members`: member id in hex → etcd's member JSON (`id`, `peerURLs`, `name`, `clientURLs`);
//!   `members_removed`: empty;
//! - `meta`: `consistent_index` (the applied raft index), `finishedCompactRev` and
//!   `scheduledCompactRev` once compacted, `term` (the applied entry's term, as etcd 3.5 records it).
//!
//! keyward-only state rides in fields etcd skips when it decodes: a lease's owner (the user who
//! granted it, for auth) is field 100 of `leasepb.Lease`, a user's credentials revision field 100 of
//! `authpb.User` (keyward's own field number there).
//!
//! Everything comes from one read transaction, so the backup is one revision's state, and one record
//! at a time is in memory (a tree level's open page each, `bolt_writer.rs`). The transaction lives as
//! long as writing the file takes (a local file, at disk speed), not as long as the client takes to
//! read it: the caller streams the finished file after the transaction ended, so a slow client never
//! holds LMDB's old pages from reuse.

pub(crate) mod bolt_writer;

use std::fs::File;

use prost::Message;

use self::bolt_writer::{BoltWriter, BucketBuilder, BucketValue, WriteError};
use crate::backup::migrate::etcd::EtcdLease;
use crate::error::EtcdError;
use crate::proto::etcdserverpb::AlarmType;
use crate::raft::state_machine::State;

/// What stops a backup: the store's error, or the file's.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ExportError {
    #[error("{0}")]
    Store(#[from] EtcdError),
    #[error("{0}")]
    Write(#[from] WriteError),
}

impl From<heed::Error> for ExportError {
    fn from(e: heed::Error) -> Self {
        ExportError::Store(e.into())
    }
}

/// What was written.
#[derive(Debug)]
pub(crate) struct Exported {
    pub file: File,
    /// The file's length (a whole number of 4 KiB pages).
    pub len: u64,
    pub revision: i64,
}

/// Writes `state` as an etcd backend into `file` (opened read-write; its content is replaced).
pub(crate) fn write_etcd_backend(state: &State, file: File) -> Result<Exported, ExportError> {
    let txn = state.read_txn()?;
    let (applied, membership) = state.applied_in(&txn).map_err(|e| {
        tracing::error!(error = %e, "cannot read the applied state");
        EtcdError::Internal
    })?;
    let view = state.kv.view(&txn)?;
    let mut writer = BoltWriter::new(file)?;
    let mut top = writer.bucket("");

    let mut alarms: Vec<Vec<u8>> =
        state.alarms.list(&txn, AlarmType::None as i32)?.iter().map(Message::encode_to_vec).collect();
    alarms.sort();
    let mut bucket = writer.bucket("alarm");
    for alarm in &alarms {
        bucket.put(&mut writer, alarm, &[])?;
    }
    add(&mut top, &mut writer, "alarm", bucket)?;

    let mut bucket = writer.bucket("auth");
    bucket.put(&mut writer, b"authEnabled", &[u8::from(state.auth.enabled(&txn)?)])?;
    bucket.put(&mut writer, b"authRevision", &state.auth.revision(&txn)?.to_be_bytes())?;
    add(&mut top, &mut writer, "auth", bucket)?;

    let mut bucket = writer.bucket("authRoles");
    for name in state.auth.role_names(&txn)? {
        if let Some(role) = state.auth.role(&txn, &name)? {
            bucket.put(&mut writer, &role.name, &role.encode_to_vec())?;
        }
    }
    add(&mut top, &mut writer, "authRoles", bucket)?;

    let mut bucket = writer.bucket("authUsers");
    for name in state.auth.user_names(&txn)? {
        if let Some(user) = state.auth.user(&txn, &name)? {
            bucket.put(&mut writer, &user.name, &user.encode_to_vec())?;
        }
    }
    add(&mut top, &mut writer, "authUsers", bucket)?;

    let bucket = writer.bucket("cluster");
    add(&mut top, &mut writer, "cluster", bucket)?;

    let mut bucket = writer.bucket("key");
    let mut revision = 0;
    view.for_each_kept_change(|change| -> Result<(), ExportError> {
        bucket.put(&mut writer, &revision_key(change.at.main, change.at.sub, change.tombstone), &change.value)?;
        revision = change.at.main;
        Ok(())
    })?;
    add(&mut top, &mut writer, "key", bucket)?;

    let mut bucket = writer.bucket("lease");
    state.leases.for_each(&txn, |id, record| -> Result<(), ExportError> {
        let lease = EtcdLease { id, ttl: record.ttl, remaining_ttl: record.remaining_ttl, owner: record.owner };
        bucket.put(&mut writer, &(id as u64).to_be_bytes(), &lease.encode_to_vec())?;
        Ok(())
    })?;
    add(&mut top, &mut writer, "lease", bucket)?;

    let mut members: Vec<(String, Vec<u8>)> = membership
        .membership()
        .nodes()
        .map(|(id, node)| {
            let json = serde_json::json!({
                "id": id,
                "peerURLs": node.peer_urls,
                "name": node.name,
                "clientURLs": node.client_urls,
            });
            (format!("{id:x}"), json.to_string().into_bytes())
        })
        .collect();
    members.sort();
    let mut bucket = writer.bucket("members");
    for (id, json) in &members {
        bucket.put(&mut writer, id.as_bytes(), json)?;
    }
    add(&mut top, &mut writer, "members", bucket)?;
    let bucket = writer.bucket("members_removed");
    add(&mut top, &mut writer, "members_removed", bucket)?;

    let mut bucket = writer.bucket("meta");
    bucket.put(&mut writer, b"consistent_index", &applied.map_or(0, |id| id.index).to_be_bytes())?;
    if view.compact_rev > 0 {
        // Removal is as good as finished: the `key` bucket holds only what it keeps.
        bucket.put(&mut writer, b"finishedCompactRev", &revision_key(view.compact_rev, 0, false))?;
        bucket.put(&mut writer, b"scheduledCompactRev", &revision_key(view.compact_rev, 0, false))?;
    }
    bucket.put(&mut writer, b"term", &applied.map_or(0, |id| id.leader_id.term).to_be_bytes())?;
    add(&mut top, &mut writer, "meta", bucket)?;

    let revision = revision.max(view.compact_rev);
    // The rest is the file's own pages: the transaction ends first.
    drop(txn);
    let (file, len) = writer.finish(top)?;
    Ok(Exported { file, len, revision })
}

fn add(top: &mut BucketBuilder, writer: &mut BoltWriter, name: &str, bucket: BucketBuilder) -> Result<(), WriteError> {
    let value: BucketValue = bucket.finish(writer)?;
    top.put_bucket(writer, name.as_bytes(), value)
}

/// etcd's revision key (`revToBytes`, with `appendMarkTombstone` for a deletion).
pub(crate) fn revision_key(main: i64, sub: i64, tombstone: bool) -> Vec<u8> {
    let mut key = Vec::with_capacity(18);
    key.extend_from_slice(&(main as u64).to_be_bytes());
    key.push(b'_');
    key.extend_from_slice(&(sub as u64).to_be_bytes());
    if tombstone {
        key.push(b't');
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::migrate::bolt::Bolt;
    use crate::keyrange::KeyRange;
    use crate::lease::store::LeaseRecord;
    use crate::raft::state_machine::StateMachine;

    fn state(dir: &std::path::Path) -> std::sync::Arc<State> {
        StateMachine::open_offline(&dir.join("kv"), &dir.join("snap")).unwrap().state()
    }

    /// A store with history, a deletion, a compaction whose removal has not run, and a lease with an
    /// owner goes out and comes back (through migrate's reader) with the same history, revisions and
    /// lease owner. Removal pending on the way out is applied: `HashKV` agrees, as between members.
    #[test]
    fn exported_state_imports_back_with_its_history_compaction_and_lease_owner() {
        let dir = tempfile::tempdir().unwrap();
        let source = state(&dir.path().join("source"));
        {
            let mut txn = source.offline_write_txn().unwrap();
            for (key, value) in [("a", "1"), ("a", "2"), ("b", "x"), ("a", "3"), ("c", "long")] {
                let mut write = source.kv.begin(&mut txn).unwrap();
                write.put(key.as_bytes(), value.as_bytes().to_vec(), 0).unwrap();
                write.finish().unwrap();
            }
            let mut write = source.kv.begin(&mut txn).unwrap();
            write.delete_range(&KeyRange::new(b"b", b""), false).unwrap();
            write.finish().unwrap();
            let mut write = source.kv.begin(&mut txn).unwrap();
            write.put(b"leased", b"v".to_vec(), 7).unwrap();
            write.finish().unwrap();
            let mut write = source.kv.begin(&mut txn).unwrap();
            write.compact(5).unwrap();
            write.finish().unwrap();
            source.leases.put(&mut txn, 7, &LeaseRecord::granted(60, Some("alice".into()))).unwrap();
            source.leases.attach(&mut txn, 7, b"leased").unwrap();
            txn.commit().unwrap();
        }
        let file = tempfile::tempfile().unwrap();
        let exported = write_etcd_backend(&source, file).unwrap();
        assert_eq!(exported.revision, 8);
        let path = dir.path().join("backup.db");
        let mut out = std::fs::File::create(&path).unwrap();
        let mut file = exported.file;
        std::io::Seek::rewind(&mut file).unwrap();
        std::io::copy(&mut file, &mut out).unwrap();

        let bolt = Bolt::open(&path, exported.len).unwrap();
        let (_, revision, _, size) = crate::backup::migrate::etcd::status(&bolt).unwrap();
        assert_eq!((revision, size), (8, exported.len));
        let target = state(&dir.path().join("target"));
        let imported = crate::backup::migrate::etcd::import(&bolt, &target).unwrap();
        assert_eq!((imported.revision, imported.compacted), (8, Some(5)));

        let (source_txn, target_txn) = (source.read_txn().unwrap(), target.read_txn().unwrap());
        let (was, now) = (source.kv.view(&source_txn).unwrap(), target.kv.view(&target_txn).unwrap());
        assert_eq!((now.rev, now.compact_rev), (was.rev, was.compact_rev));
        assert_eq!(now.hash_kv(0).unwrap(), was.hash_kv(0).unwrap());
        let all = KeyRange::new(b"\0", b"\0");
        for rev in [0, 5, 6, 7] {
            assert_eq!(now.range(&all, rev, 0, false).unwrap().kvs, was.range(&all, rev, 0, false).unwrap().kvs);
        }
        assert_eq!(now.range(&all, 4, 0, false).unwrap_err(), EtcdError::Compacted);
        let lease = target.leases.get(&target_txn, 7).unwrap().unwrap();
        assert_eq!(lease.owner.as_deref(), Some("alice"));
        assert_eq!(target.leases.attached_keys(&target_txn, 7).unwrap(), vec![b"leased".to_vec()]);
    }
}
