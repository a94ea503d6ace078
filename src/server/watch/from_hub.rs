//! A watcher's delivery of the hub's batches (`watch_hub/`): while synced, the batches that touched
//! its range, each revision in a response of its own; while unsynced, a catch-up from the hub's
//! backlog, many revisions per response. The batches are in memory and shared by every watcher, and
//! so are their encoded events (`wire.rs`): taking an event copies no bytes.

use std::sync::Arc;

use tokio::sync::oneshot;

use super::from_store::{CATCH_UP_BYTES, REPLAY_BATCH_REVISIONS};
use super::outbox::Outbox;
use super::watcher::{send_reply, End, Live, Watcher};
use super::wire::WatchReply;
use crate::node::Node;
use crate::proto::mvccpb::Event;
use crate::raft::state_machine::Committed;
use crate::watch_hub::{Pending, Registration};

/// Batches a synced watcher may have pending and still send each revision on its own, as etcd sends
/// a synced watcher's (`Watcher::take_pending`). Further behind, it sends many revisions per
/// response, as etcd's unsynced watchers get them: under load (a thousand watchers of busy keys)
/// that is what keeps up, fewer responses for the same events.
const SYNCED_LAG: usize = 2;

impl Watcher {
    /// Delivers the batches that touched this synced watcher since it last looked: each revision on
    /// its own, as etcd sends a synced watcher's, or merged when more than `SYNCED_LAG` are pending
    /// (it fell behind: as etcd's unsynced watchers get them). `Missed` when the hub unsynced it.
    pub(super) async fn take_pending(
        &mut self,
        node: &Node,
        hub: &Registration,
        out: &Outbox,
        stopped: &mut oneshot::Receiver<()>,
    ) -> Live {
        let Pending::Batches { batches, through } = hub.take() else { return Live::Missed };
        if batches.len() > SYNCED_LAG {
            if let Live::Stop(end) = self.send_merged(node, batches, true, out, stopped).await {
                return Live::Stop(end);
            }
        } else {
            for batch in batches {
                // Synced: the batches between held nothing for it.
                self.next = self.next.max(batch.previous_revision + 1);
                match self.take_live(node, &batch, out, stopped).await {
                    Live::Delivered => {}
                    missed_or_stop => return missed_or_stop,
                }
            }
        }
        self.next = self.next.max(through + 1);
        Live::Delivered
    }

    /// Delivers a broadcast batch's events, one response per revision, unless it does not follow on
    /// from what this watcher delivered.
    async fn take_live(
        &mut self,
        node: &Node,
        batch: &Arc<Committed>,
        out: &Outbox,
        stopped: &mut oneshot::Receiver<()>,
    ) -> Live {
        if batch.revision < self.next {
            return Live::Delivered; // delivered already (by a replay)
        }
        if !self.follows_on(batch) {
            return Live::Missed;
        }
        let mut taken = Vec::new();
        self.take(batch, &mut taken);
        self.next = batch.revision + 1;
        if let Err(e) = self.still_permitted(node).await {
            return Live::Stop(End::Denied(e.go_status_text()));
        }
        // etcd tells a live watcher of each revision on its own (a txn's or a multi-key delete's
        // events share one response, two revisions never do), even when group commit applied several
        // revisions in one batch.
        for (revision, taken) in by_revision(taken, |(batch, i)| revision_of(&batch.effects.events[*i])) {
            if !self.send_taken(node, taken, revision, out, stopped).await {
                return Live::Stop(End::Closed);
            }
        }
        Live::Delivered
    }

    /// Catches up an unsynced watcher from the batches the hub's backlog still holds: they are in
    /// memory and shared by every watcher, so catching up costs no read of the store per watcher. As a
    /// replay from the store does (and etcd does for an unsynced watcher), the events of up to
    /// `REPLAY_BATCH_REVISIONS` revisions (and about `CATCH_UP_BYTES`) share one response. `Missed`
    /// when the backlog no longer holds what comes next (it dropped it, or a snapshot install broke
    /// the run): what was taken until then is delivered, the rest is replayed.
    pub(super) async fn catch_up(
        &mut self,
        node: &Node,
        hub: &Registration,
        out: &Outbox,
        stopped: &mut oneshot::Receiver<()>,
    ) -> Live {
        let batches = hub.backlog_from(self.next, REPLAY_BATCH_REVISIONS);
        if batches.is_empty() {
            return Live::Missed;
        }
        self.send_merged(node, batches, false, out, stopped).await
    }

    /// Sends the events of `batches` (in order) with many revisions per response. `synced`: the hub
    /// picked them for this watcher, and those between held nothing for it; otherwise each must
    /// follow on from the one before (`Missed` at the first that does not).
    async fn send_merged(
        &mut self,
        node: &Node,
        batches: Vec<Arc<Committed>>,
        synced: bool,
        out: &Outbox,
        stopped: &mut oneshot::Receiver<()>,
    ) -> Live {
        let mut taken = Vec::new();
        let (mut revisions, mut bytes, mut upto) = (0, 0, None);
        let mut missed = false;
        for batch in batches {
            if batch.revision < self.next {
                continue; // delivered already (by a replay)
            }
            if synced {
                self.next = self.next.max(batch.previous_revision + 1);
            }
            if !self.follows_on(&batch) {
                missed = true;
                break;
            }
            if revisions >= REPLAY_BATCH_REVISIONS || bytes >= CATCH_UP_BYTES {
                if let Some(end) = self.flush(node, &mut taken, upto.take(), out, stopped).await {
                    return Live::Stop(end);
                }
                (revisions, bytes) = (0, 0);
            }
            let before = taken.len();
            self.take(&batch, &mut taken);
            bytes += taken[before..].iter().map(|(batch, i)| event_bytes(&batch.effects.events[*i])).sum::<usize>();
            revisions += (batch.revision + 1 - self.next) as usize;
            self.next = batch.revision + 1;
            upto = Some(batch.revision);
        }
        if let Some(end) = self.flush(node, &mut taken, upto, out, stopped).await {
            return Live::Stop(end);
        }
        if missed {
            Live::Missed
        } else {
            Live::Delivered
        }
    }

    /// Sends what `send_merged` took, in one response at `upto`, after checking permission.
    async fn flush(
        &mut self,
        node: &Node,
        taken: &mut Vec<Taken>,
        upto: Option<i64>,
        out: &Outbox,
        stopped: &mut oneshot::Receiver<()>,
    ) -> Option<End> {
        let revision = upto?;
        if let Err(e) = self.still_permitted(node).await {
            return Some(End::Denied(e.go_status_text()));
        }
        if !self.send_taken(node, std::mem::take(taken), revision, out, stopped).await {
            return Some(End::Closed);
        }
        None
    }

    /// Whether `batch` follows on from what this watcher delivered. A snapshot install carries no
    /// events, and a batch after a gap (broadcast before this watcher subscribed) lacks the revisions
    /// in between: a replay reads them from the store.
    fn follows_on(&self, batch: &Committed) -> bool {
        batch.installed.is_none() && batch.previous_revision < self.next
    }

    /// Takes the events of a broadcast batch that this watcher has not delivered, that fall in its
    /// range and that its filters let through.
    fn take(&self, batch: &Arc<Committed>, taken: &mut Vec<Taken>) {
        for (i, event) in batch.effects.events.iter().enumerate() {
            let Some(kv) = &event.kv else { continue };
            if kv.mod_revision >= self.next && self.range.contains(&kv.key) && self.lets_through(event) {
                taken.push((batch.clone(), i));
            }
        }
    }

    /// Sends events taken from broadcast batches: their shared encoding, or (for a watcher that asked
    /// for fragments, which are cut by encoded size) copies of them.
    async fn send_taken(
        &self,
        node: &Node,
        taken: Vec<Taken>,
        revision: i64,
        out: &Outbox,
        stopped: &mut oneshot::Receiver<()>,
    ) -> bool {
        if taken.is_empty() {
            return true;
        }
        if self.fragment {
            let events = taken.iter().map(|(batch, i)| batch.effects.events[*i].clone()).collect();
            return self.send_events(node, events, revision, out, stopped).await;
        }
        let events =
            taken.iter().map(|(batch, i)| batch.encoded.get(&batch.effects.events, self.prev_kv)[*i].clone()).collect();
        let reply = WatchReply::Events { header: node.header(revision), watch_id: self.id, events };
        send_reply(reply, out, stopped).await
    }
}

/// An event of a broadcast batch, by its place in the batch: sending it copies no bytes.
type Taken = (Arc<Committed>, usize);

/// What an event weighs in a response, roughly: its keys and values.
fn event_bytes(event: &Event) -> usize {
    let kv_bytes =
        |kv: &Option<crate::proto::mvccpb::KeyValue>| kv.as_ref().map_or(0, |kv| kv.key.len() + kv.value.len());
    kv_bytes(&event.kv) + kv_bytes(&event.prev_kv)
}

/// The revision an event happened at.
fn revision_of(event: &Event) -> i64 {
    event.kv.as_ref().map_or(0, |kv| kv.mod_revision)
}

/// Splits events in revision order into runs of one revision each: `(revision, its events)`.
fn by_revision<T>(events: Vec<T>, revision_of: impl Fn(&T) -> i64) -> Vec<(i64, Vec<T>)> {
    let mut runs: Vec<(i64, Vec<T>)> = Vec::new();
    for event in events {
        let revision = revision_of(&event);
        match runs.last_mut() {
            Some((last, run)) if *last == revision => run.push(event),
            _ => runs.push((revision, vec![event])),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::mvccpb::KeyValue;

    #[test]
    fn events_of_a_group_committed_batch_go_out_one_revision_at_a_time() {
        let at = |key: &[u8], mod_revision| Event {
            kv: Some(KeyValue { key: key.to_vec(), mod_revision, ..Default::default() }),
            ..Default::default()
        };
        // A put at 5, a txn of two keys at 6, a put at 7.
        let runs = by_revision(vec![at(b"a", 5), at(b"b", 6), at(b"c", 6), at(b"d", 7)], revision_of);
        let shape: Vec<(i64, usize)> = runs.iter().map(|(rev, events)| (*rev, events.len())).collect();
        assert_eq!(shape, [(5, 1), (6, 2), (7, 1)]);
        assert!(by_revision(Vec::new(), revision_of).is_empty());
    }
}
