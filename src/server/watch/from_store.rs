//! A watcher's replay from the store (LMDB): the revisions from its `next` that the hub's backlog no
//! longer holds (it fell behind, or started from an old revision), a bounded batch at a time. A
//! `next` that was compacted away ends the watcher, canceled with the compaction's revision.

use tokio::sync::oneshot;

use super::outbox::Outbox;
use super::watcher::{End, Watcher};
use crate::error::EtcdError;
use crate::keyrange::KeyRange;
use crate::node::Node;
use crate::proto::mvccpb::Event;

/// Revisions replayed from LMDB per response (etcd's `watchBatchMaxRevs`).
pub(super) const REPLAY_BATCH_REVISIONS: usize = 1000;
/// Bytes of keys and values a catch-up puts in one response (or reads from LMDB at once) before it
/// closes it: 1,000 revisions of large values would otherwise make one response of gigabytes.
pub(super) const CATCH_UP_BYTES: usize = 1 << 20;

impl Watcher {
    /// Replays the next batch of revisions from the store, from `next` on; `Err` with why the watcher
    /// ends.
    pub(super) async fn replay(
        &mut self,
        node: &Node,
        out: &Outbox,
        stopped: &mut oneshot::Receiver<()>,
    ) -> Result<(), End> {
        let (range, from, prev_kv) = (self.range.clone(), self.next, self.prev_kv);
        let replay = node
            .read_state(move |state, txn| {
                let view = state.kv.view(txn)?;
                if from < view.compact_rev {
                    return Ok(Err(view.compact_rev));
                }
                let (mut events, next) =
                    view.changes_since_within(from, &range, REPLAY_BATCH_REVISIONS, CATCH_UP_BYTES)?;
                if prev_kv {
                    attach_prev_kvs(&view, &mut events)?;
                }
                Ok(Ok((events, next, view.rev)))
            })
            .await;
        match replay {
            Ok(Ok((events, next, rev))) => {
                self.next = next;
                if let Err(e) = self.still_permitted(node).await {
                    return Err(End::Denied(e.go_status_text()));
                }
                if !self.send_events(node, events, rev, out, stopped).await {
                    return Err(End::Closed);
                }
                Ok(())
            }
            Ok(Err(compacted)) => Err(End::Compacted(compacted)),
            Err(e) => {
                tracing::error!(error = %e, watch_id = self.id, "watch replay failed");
                Err(End::Closed)
            }
        }
    }
}

/// Looks up each event's previous version (the key at the revision before the event).
fn attach_prev_kvs(view: &crate::mvcc::ReadView, events: &mut [Event]) -> Result<(), EtcdError> {
    for event in events {
        let Some(kv) = &event.kv else { continue };
        let before = kv.mod_revision - 1;
        if before < view.compact_rev.max(1) {
            continue;
        }
        event.prev_kv = view.range(&KeyRange::Single(kv.key.clone()), before, 1, false)?.kvs.pop();
    }
    Ok(())
}
