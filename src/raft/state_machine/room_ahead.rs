//! Room in the kv map for a batch whose writes depend on the store (a delete of a range, a lease
//! revoke: `apply::footprint`), made before its write transaction.
//!
//! A batch that meets a full map is aborted whole and applied again once the map grew
//! (`full_retry.rs`), by a sixth of it, then doubling: a delete of most of the store, which writes new
//! pages for about half the store's size, ran two or three times before it fitted. Estimated first,
//! the map grows once, to what the batch needs, and the batch runs once.

use openraft::EntryPayload;

use super::state::State;
use crate::apply::footprint::UnboundedWrites;
use crate::raft::Entry;

/// Below this many estimated bytes the map's usual headroom (`storage::mapping`: a sixth of it at
/// least) is left to cover the batch, and nothing is counted twice for nothing.
const WORTH_RESERVING: u64 = 1 << 20;

impl State {
    /// Grows the map ahead of `entries` when what their unbounded requests will write does not fit
    /// beside the pages in use. Never waits for readers: if one holds the map, the batch runs as it
    /// would have, and a full map is handled after (`apply_after_map_full`).
    pub(super) fn make_room_for(&self, entries: &[Entry]) {
        if self.mapping.reserved().is_none() {
            return; // copied writes: the map is address space only
        }
        let mut writes = UnboundedWrites::default();
        for entry in entries {
            if let EntryPayload::Normal(batch) = &entry.payload {
                batch.0.requests.iter().for_each(|req| writes.add(req));
            }
        }
        if writes.is_empty() {
            return; // the common batch: no read of the store on the apply path
        }
        let estimate = || -> Result<u64, crate::error::EtcdError> {
            let txn = self.mapping.read_txn(&self.env)?;
            writes.bytes(&self.kv, &self.leases, &txn)
        };
        // Only advice: a store that cannot be read fails the batch itself, with its own error.
        let wanted = match estimate() {
            Ok(wanted) if wanted >= WORTH_RESERVING => wanted,
            _ => return,
        };
        // The read transaction above has ended: LMDB remaps only with none open in the process.
        if let Some(grown) = self.mapping.grow_for(&self.env, wanted) {
            tracing::info!(
                from = grown.from,
                to = grown.to,
                wanted,
                "kv file reservation grown ahead of a large batch"
            );
        }
    }
}
