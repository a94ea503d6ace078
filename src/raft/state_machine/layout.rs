//! The layout of the kv tables in a data dir, and the migration from the older one, run once as the
//! state opens.
//!
//! - Layout 1 (no version recorded in `sm_meta`): `kv_live` held each existing key's current
//!   `KeyValue`, a second copy of its newest record in `kv_revs`.
//! - Layout 2: each value is stored once, in `kv_revs`; current reads go through `kv_index`
//!   (`mvcc/store.rs`). `kv_live` is empty: its database stays in data dirs that had it (LMDB frees
//!   its pages; removing the name itself would take heed's `unsafe` `remove`).
//!
//! The migration empties `kv_live` (with the groups its long keys had in `long_keys`) and records the
//! version, in one write transaction, synced: a crash before the commit leaves layout 1 whole, to be
//! migrated at the next open; after it, layout 2. Snapshots of layout 1 carry `kv_live`'s records:
//! installing one skips them (`snapshot/format.rs`) and removes the groups they named
//! (`skip_legacy_live`), so an installed state is layout 2 as well.

use super::state::{BoxError, State};
use crate::storage::table::LongKeys;

/// The `sm_meta` key of the layout's version.
const LAYOUT: &[u8] = b"layout";
/// The layout this version writes.
const CURRENT: u32 = 2;

impl State {
    /// Brings the tables to the current layout if they are of an older one; refuses a newer one.
    pub(super) fn migrate_layout(&self) -> Result<(), BoxError> {
        let recorded = {
            let txn = self.read_txn()?;
            self.read_meta::<u32>(&txn, LAYOUT)?
        };
        match recorded {
            Some(CURRENT) => return Ok(()),
            Some(newer) if newer > CURRENT => {
                return Err(format!("the kv tables have layout {newer}; this keyward reads layout {CURRENT}").into())
            }
            _ => {}
        }
        let started = std::time::Instant::now();
        let mut txn = self.env.write_txn()?;
        let live = self.legacy_live.main_db().len(&txn)?;
        self.legacy_live.clear(&mut txn)?;
        self.meta.put(&mut txn, LAYOUT, &postcard::to_allocvec(&CURRENT)?)?;
        txn.commit()?;
        self.sync()?;
        if live > 0 {
            tracing::info!(
                from = recorded.unwrap_or(1),
                to = CURRENT,
                dropped = live,
                elapsed = ?started.elapsed(),
                "kv tables migrated: kv_live emptied, each value stored once"
            );
        }
        Ok(())
    }
}

/// The groups in `long_keys` that a layout-1 snapshot's `kv_live` records open, collected while its
/// records are skipped, to be removed once `long_keys` is loaded.
#[derive(Default)]
pub(super) struct SkippedLive {
    groups: Vec<u64>,
}

impl SkippedLive {
    /// Notes one skipped `kv_live` record.
    pub(super) fn skip(&mut self, long: &LongKeys, key: &[u8], value: &[u8]) -> heed::Result<()> {
        if let Some(id) = long.marker_group(key, value)? {
            self.groups.push(id);
        }
        Ok(())
    }

    /// Removes the groups the skipped records opened, and records the current layout, in `txn`.
    pub(super) fn finish(self, state: &State, txn: &mut heed::RwTxn) -> Result<(), BoxError> {
        for id in self.groups {
            state.long.remove_group(txn, id)?;
        }
        state.meta.put(txn, LAYOUT, &postcard::to_allocvec(&CURRENT)?)?;
        Ok(())
    }
}
