//! One batch of committed entries applied in one LMDB write transaction: each request through
//! `crate::apply`, the applied log id and membership recorded with them, the observer told after the
//! commit.

use std::sync::Arc;

use openraft::EntryPayload;

use super::committed::Committed;
use super::full_retry::ApplyFailure;
use super::state::{State, APPLIED, MEMBERSHIP};
use crate::apply::{Effects, Stores};
use crate::error::EtcdError;
use crate::logging::slow;
use crate::proto::etcdserverpb::{AlarmType, InternalRaftRequest};
use crate::raft::{BatchResults, Entry, StoredMembership};
use crate::space::Full;

impl State {
    /// Applies `entries` in one write transaction, records the last one's log id as applied, commits,
    /// and then tells the observer. On `ApplyFailure::Full` nothing of the batch was kept.
    pub(super) fn apply_batch(&self, entries: &[Entry]) -> Result<Vec<BatchResults>, ApplyFailure> {
        #[cfg(test)]
        {
            use std::sync::atomic::Ordering::SeqCst;
            if self.inject_full.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_ok() {
                return Err(ApplyFailure::Full(Full::Disk));
            }
            if self.inject_failure.swap(false, SeqCst) {
                return Err(ApplyFailure::Storage("injected storage failure".into()));
            }
        }
        let started = std::time::Instant::now();
        let mut txn = self.env.write_txn()?;
        let previous_revision = self.kv.view(&txn)?.rev;
        let mut results = Vec::with_capacity(entries.len());
        let mut applied = None;
        let mut effects = Effects::default();
        let mut requests = 0u64;
        let stores = Stores {
            kv: &self.kv,
            leases: &self.leases,
            auth: &self.auth,
            alarms: &self.alarms,
            simple_tokens: self.tokens.get().and_then(|t| t.simple()),
        };
        for entry in entries {
            applied = Some(entry.log_id);
            let entry_results = match &entry.payload {
                EntryPayload::Blank => Vec::new(),
                EntryPayload::Normal(batch) => {
                    apply_entry(&stores, &mut txn, &batch.0.requests, entry.log_id.index, &mut effects)?
                }
                EntryPayload::Membership(membership) => {
                    let stored = StoredMembership::new(Some(entry.log_id), membership.clone());
                    self.meta
                        .put(&mut txn, MEMBERSHIP, &postcard::to_allocvec(&stored)?)
                        .map_err(|e| self.write_failure(e))?;
                    Vec::new()
                }
            };
            requests += entry_results.len().max(1) as u64;
            results.push(entry_results);
        }
        self.meta.put(&mut txn, APPLIED, &postcard::to_allocvec(&applied)?).map_err(|e| self.write_failure(e))?;
        let revision = self.kv.view(&txn)?.rev;
        let (auth_enabled, auth_revision) = (self.auth.enabled(&txn)?, self.auth.revision(&txn)?);
        self.refresh_size_in_use(&txn)?;
        let alarms = effects.alarms_changed.then(|| self.alarms.list(&txn, AlarmType::None as i32)).transpose()?;
        let committing = std::time::Instant::now();
        txn.commit().map_err(|e| self.write_failure(e))?;
        let committed = std::time::Instant::now();
        crate::metrics::BACKEND_COMMIT_SECONDS.observe((committed - committing).as_secs_f64());
        if slow::worth_logging(committed - started) {
            tracing::debug!(
                target: slow::TARGET,
                entries = entries.len(),
                requests,
                work_ms = slow::ms(committing - started),
                commit_ms = slow::ms(committed - committing),
                "slow apply batch"
            );
        }
        if let Some(grown) = self.mapping.grow_early(&self.env) {
            tracing::info!(from = grown.from, to = grown.to, "kv file reservation grown ahead of need");
        }
        count_mvcc_ops(entries, &results);
        // Committed: the writes this member forwarded and waits for get their results from here.
        let mut owed = Vec::new();
        if self.awaited.any() {
            for (entry, entry_results) in entries.iter().zip(&results) {
                if let EntryPayload::Normal(batch) = &entry.payload {
                    self.awaited.take_answers(&batch.0.requests, entry_results, &mut owed);
                }
            }
        }
        if let Some(alarms) = alarms {
            *self.active_alarms.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(alarms);
        }
        // Only after the commit: observers must never see effects that a crash could undo.
        if let Some(observer) = self.observer.get() {
            observer(Committed {
                revision,
                previous_revision,
                auth_enabled,
                auth_revision,
                effects,
                requests,
                last_index: applied.map_or(0, |id| id.index),
                installed: None,
                answers: owed.into(),
                encoded: Default::default(),
            });
        }
        Ok(results)
    }
}

/// Applies the requests of the entry at log index `index`, each in order, adding what each changed to
/// `effects`: one result each, or the whole batch aborted on a storage failure or full storage.
fn apply_entry(
    stores: &Stores,
    txn: &mut heed::RwTxn,
    requests: &[InternalRaftRequest],
    index: u64,
    effects: &mut Effects,
) -> Result<BatchResults, ApplyFailure> {
    let mut entry_results = Vec::with_capacity(requests.len());
    for req in requests {
        entry_results.push(match crate::apply::apply(stores, txn, req, index) {
            Ok((applied, done)) => {
                if effects.events.is_empty() {
                    // Moved, not copied: a delete of a million keys has a million events.
                    effects.events = done.events;
                } else {
                    effects.events.extend(done.events);
                }
                effects.granted.extend(done.granted);
                effects.revoked.extend(done.revoked);
                effects.auth = merge_affected(effects.auth.take(), done.auth);
                effects.alarms_changed |= done.alarms_changed;
                effects.compacted |= done.compacted;
                Ok(applied)
            }
            // A storage failure leaves the transaction unusable: abort the batch, stop the node.
            Err(EtcdError::Internal) => return Err("storage failure while applying".into()),
            // Full storage: abort the batch, to be applied again, unchanged, once it fits.
            Err(EtcdError::StorageFull { map }) => {
                return Err(ApplyFailure::Full(if map { Full::Map } else { Full::Disk }))
            }
            Err(refused) => Err(refused),
        });
    }
    Ok(entry_results)
}

/// etcd's mvcc counters for the requests of a committed batch that the store executed
/// (`mvcc/counts.rs`).
fn count_mvcc_ops(entries: &[Entry], results: &[BatchResults]) {
    use crate::apply::Applied;
    use crate::mvcc::counts::Ops;
    for (entry, results) in entries.iter().zip(results) {
        let EntryPayload::Normal(batch) = &entry.payload else { continue };
        for (req, result) in batch.0.requests.iter().zip(results) {
            match (result, &req.put, &req.txn) {
                (Ok(Applied::Put(_)), Some(put), _) => Ops::put(put).record(),
                (Ok(Applied::DeleteRange(_)), ..) => Ops::delete().record(),
                (Ok(Applied::Txn(resp)), _, Some(txn)) => Ops::record_txn(Ops::txn(txn, resp), false),
                _ => {}
            }
        }
    }
}

fn merge_affected(
    a: Option<crate::auth::cache::Affected>,
    b: Option<crate::auth::cache::Affected>,
) -> Option<crate::auth::cache::Affected> {
    use crate::auth::cache::Affected;
    match (a, b) {
        (None, x) | (x, None) => x,
        (Some(Affected::Everyone), _) | (_, Some(Affected::Everyone)) => Some(Affected::Everyone),
        (Some(Affected::Nobody), x) | (x, Some(Affected::Nobody)) => x,
        (Some(Affected::Users(mut a)), Some(Affected::Users(b))) => {
            a.extend(b);
            Some(Affected::Users(a))
        }
    }
}
