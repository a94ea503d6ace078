//! Writing another store's history into the tables as it was (`keyward migrate`): each change at its
//! own revision, with the create and mod revisions, version and lease it had, instead of a new
//! revision as `WriteTxn` assigns. Changes must come in revision order (an etcd `key` bucket's order),
//! so the last change of a key is its current entry in the index (`index.rs`), as `WriteTxn` writes
//! it (the value is stored once, in `kv_revs`).

use heed::RwTxn;

use super::record::encode_change;
use super::revision::Revision;
use super::store::{KvStore, COMPACT_REV, CURRENT_REV, TAG_PUT, TAG_TOMBSTONE};
use crate::error::EtcdError;
use crate::proto::mvccpb::KeyValue;

impl KvStore {
    /// Records `kv` (a put, or with `deleted` a deletion of `kv.key`) at revision `at`.
    pub(crate) fn import_change(
        &self,
        txn: &mut RwTxn,
        at: Revision,
        kv: &KeyValue,
        deleted: bool,
    ) -> Result<(), EtcdError> {
        let (tag, record) = if deleted {
            // keyward's tombstone: the key and the revision of the deletion, as `WriteTxn::delete_range`.
            (TAG_TOMBSTONE, KeyValue { key: kv.key.clone(), mod_revision: at.main, ..Default::default() })
        } else {
            (TAG_PUT, kv.clone())
        };
        self.revs.put(txn, &at.to_bytes(), &encode_change(at, tag, &record))?;
        self.index_change(txn, &record.key, at, tag)?;
        Ok(())
    }

    /// Sets the current revision and, when the source had compacted, compacts at its revision with
    /// keyward's own compaction, removal included (which also finishes one the source had only
    /// scheduled).
    pub(crate) fn import_finish(&self, txn: &mut RwTxn, current: i64, compacted: Option<i64>) -> Result<(), EtcdError> {
        self.meta.put(txn, CURRENT_REV, &current.max(1).to_be_bytes())?;
        match compacted {
            Some(rev) if rev > 0 => {
                let mut write = self.begin(txn)?;
                write.compact(rev)?;
                write.finish()?;
                // Offline: remove what the compaction made unreachable at once.
                self.finish_compaction(txn)?;
            }
            _ => {}
        }
        // A compaction with nothing left to remove still records the revision.
        if let Some(rev) = compacted.filter(|&rev| rev > 0) {
            self.meta.put(txn, COMPACT_REV, &rev.to_be_bytes())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyrange::KeyRange;

    fn kv(key: &str, value: &str, create: i64, modified: i64, version: i64) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: value.into(),
            create_revision: create,
            mod_revision: modified,
            version,
            lease: 0,
        }
    }

    #[test]
    fn imported_history_reads_as_it_was_written_and_compaction_applies() {
        let dir = tempfile::tempdir().unwrap();
        let (env, store) = KvStore::open_for_tests(dir.path(), 3).unwrap();
        let mut txn = env.write_txn().unwrap();
        store.import_change(&mut txn, Revision::new(2, 0), &kv("a", "1", 2, 2, 1), false).unwrap();
        store.import_change(&mut txn, Revision::new(3, 0), &kv("a", "2", 2, 3, 2), false).unwrap();
        store.import_change(&mut txn, Revision::new(4, 0), &kv("b", "x", 4, 4, 1), false).unwrap();
        store.import_change(&mut txn, Revision::new(5, 0), &kv("b", "", 0, 0, 0), true).unwrap();
        store.import_change(&mut txn, Revision::new(6, 0), &kv("c", "y", 6, 6, 1), false).unwrap();
        store.import_finish(&mut txn, 6, Some(3)).unwrap();
        txn.commit().unwrap();
        let txn = env.read_txn().unwrap();
        let view = store.view(&txn).unwrap();
        assert_eq!((view.rev, view.compact_rev), (6, 3));
        let all = KeyRange::new(b"\0", b"\0");
        let now = view.range(&all, 0, 0, false).unwrap().kvs;
        assert_eq!(now, vec![kv("a", "2", 2, 3, 2), kv("c", "y", 6, 6, 1)]);
        let at4 = view.range(&all, 4, 0, false).unwrap().kvs;
        assert_eq!(at4, vec![kv("a", "2", 2, 3, 2), kv("b", "x", 4, 4, 1)]);
        assert_eq!(view.range(&all, 2, 0, false).unwrap_err(), EtcdError::Compacted);
    }
}
