//! Reading the whole history out as etcd's backend holds it (the `key` bucket of an etcd backup,
//! `backup/export/`): every change a finished compaction keeps, in revision order, a put as its
//! `mvccpb.KeyValue` bytes and a deletion as etcd records one (a `KeyValue` holding only the key).
//! Changes a pending removal has not reached yet are left out, so the backup is the same whatever
//! pace removal runs at (as `HashKV`, `hash.rs`).

use prost::Message;

use super::revision::Revision;
use super::store::{corrupt, decode_change, TAG_PUT, TAG_TOMBSTONE};
use super::ReadView;
use crate::error::EtcdError;
use crate::proto::mvccpb::KeyValue;

/// One change of the history, as etcd's `key` bucket holds it.
pub(crate) struct Change {
    pub at: Revision,
    /// A deletion (etcd marks its revision key with `t`).
    pub tombstone: bool,
    /// The encoded `mvccpb.KeyValue`.
    pub value: Vec<u8>,
}

impl<'t> ReadView<'t> {
    /// Calls `f` with every change kept, oldest first. `f`'s error type takes the store's errors.
    pub(crate) fn for_each_kept_change<E: From<EtcdError>>(
        &self,
        mut f: impl FnMut(Change) -> Result<(), E>,
    ) -> Result<(), E> {
        let pending = self.removal_pending()?;
        for entry in self.store.revs.iter(self.txn).map_err(EtcdError::from)? {
            let (k, v) = entry.map_err(EtcdError::from)?;
            let at = Revision::from_bytes(k).ok_or_else(|| corrupt("revision"))?;
            // Since kv layout 3 a record is not protobuf (`record.rs`): each change is decoded and
            // encoded as the `mvccpb.KeyValue` etcd stores.
            let (tag, kv) = decode_change(at, v)?;
            if pending && at.main <= self.compact_rev && !self.kept_by_compaction(at, &kv.key, tag)? {
                continue;
            }
            let change = match tag {
                TAG_PUT => Change { at, tombstone: false, value: kv.encode_to_vec() },
                TAG_TOMBSTONE => {
                    let only_key = KeyValue { key: kv.key, ..Default::default() };
                    Change { at, tombstone: true, value: only_key.encode_to_vec() }
                }
                _ => return Err(corrupt("change tag").into()),
            };
            f(change)?;
        }
        Ok(())
    }
}
