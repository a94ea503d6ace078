//! What is refused while the cluster is out of space.
//!
//! While a NOSPACE alarm is active (replicated state, `space/alarm.rs`), a request that would take space
//! — a put, a txn with a put on either branch, a lease grant — is refused with "database space
//! exceeded" (etcd's `applierV3Capped`), identically on every member; deletes, compaction and
//! everything else still apply. The dispatch (`apply/mod.rs`) runs this check after the permission
//! checks.

use heed::RoTxn;

use super::stores::Stores;
use crate::error::EtcdError;
use crate::proto::etcdserverpb::{AlarmType, InternalRaftRequest};

/// While a NOSPACE alarm is active, a request that would take space (a put, a txn with a put on either
/// branch, a lease grant) is refused (etcd's `applierV3Capped`).
pub(super) fn refuse_if_capped(stores: &Stores, txn: &RoTxn, req: &InternalRaftRequest) -> Result<(), EtcdError> {
    if crate::space::cost(req) > 0 && stores.alarms.active(txn, AlarmType::Nospace)? {
        return Err(EtcdError::NoSpace);
    }
    Ok(())
}
