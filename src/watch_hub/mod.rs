//! The watch hub: one per member, between the applied batches and the watchers.
//!
//! The apply observer offers it each committed batch (`offer`) and has the offered batches committed
//! on the gRPC runtime (`commit_offered`, through the relay of `raft/relay.rs`: no task of its own to
//! wake per batch). Each batch goes to the backlog (`backlog.rs`) and, for each of its keys, the hub
//! finds the synced watchers whose range holds the key in the index (`index.rs`), as etcd's
//! `watchableStore.notify` does with its synced `watcherGroup`. Only those are told (their `touched`
//! revisions, a wake-up): a commit costs O(log n) per key plus the watchers it touches, not a wake-up
//! of every watcher.
//!
//! A watcher is *synced* while the hub tells it of every batch in its range: it has delivered
//! everything up to the hub's revision but the batches in its `touched`. It is *unsynced* (not in the
//! index) until it has caught up on its own, from the backlog or the store, to the hub's revision;
//! then it joins (`Registration::try_sync`). A synced watcher leaves the index when it cannot keep up
//! (`TOUCHED_LIMIT` batches pending: its client does not read), when a batch it needs left the
//! backlog, on a snapshot install, or when the hub itself lost batches: it then catches up from the
//! store later, as etcd's unsynced watchers do. What a slow watcher costs the member is thus bounded
//! by the backlog and its stream's queue, not by what is written meanwhile. At most `INBOX_LIMIT`
//! batches wait to be committed; past that the oldest is dropped, and the hub, seeing the gap, has its
//! watchers catch up from the store: a stalled runtime costs a bounded number of batches.
//!
//! A stream's progress (etcd's `RequestProgress`, `progressIfSync`): the hub answers at which
//! revision every watcher of a stream has had all its events queued (`WatchHub::progress`), only once
//! each is synced with nothing pending or being sent. A progress response at that revision is thus
//! never ahead of an event not yet sent on the stream (etcd #15695).
//!
//! Why a top-level folder and not beside the Watch service (`server/watch/`), its one user: the hub
//! belongs to the member, not to a client stream. `Node` makes it before anything is applied (so that
//! it sees every batch) and holds it; the service only registers
//! watchers with it. Under `server/` it would make `node` import `server`, which imports `node`.
//! It imports neither: only the committed batches (`raft`), key ranges and the wire types.

pub(crate) mod backlog;
pub(crate) mod index;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{watch, Notify};

use self::backlog::Backlog;
use self::index::{WatchIndex, WatcherId};
use crate::keyrange::KeyRange;
use crate::raft::state_machine::Committed;

/// Batches a synced watcher may have pending before it leaves the index to catch up on its own
/// (8 bytes each: 30,000 watchers of a busy prefix that nobody reads hold 30 MiB of them at most).
pub(crate) const TOUCHED_LIMIT: usize = 128;

/// Batches offered and not yet committed that the hub keeps; past it the oldest is dropped.
const INBOX_LIMIT: usize = 1024;

pub(crate) struct WatchHub {
    state: Mutex<Hub>,
    /// The hub's revision, for streams waiting to answer a progress request (`revisions`).
    revision: watch::Sender<i64>,
    /// Batches offered and not yet committed, oldest first, and how many were dropped.
    inbox: Mutex<(VecDeque<Arc<Committed>>, u64)>,
}

struct Hub {
    /// The revision of the last batch committed.
    revision: i64,
    backlog: Backlog,
    /// The synced watchers, by range.
    index: WatchIndex,
    watchers: HashMap<WatcherId, Entry>,
    next_id: WatcherId,
    /// Scratch for the watchers a batch touches.
    found: Vec<WatcherId>,
}

struct Entry {
    range: KeyRange,
    wake: Arc<Notify>,
    /// `Some` while synced.
    synced: Option<Synced>,
}

struct Synced {
    /// The watcher's first undelivered revision when it joined: batches before it are not its own.
    from: i64,
    /// Revisions of the batches that touched it since it last took them.
    touched: Vec<i64>,
    /// It took batches and has not said it queued their events yet (`Registration::settled`).
    sending: bool,
    /// The lowest revision a progress may report for it (`Registration::try_sync`).
    progress_floor: i64,
}

/// What a watcher has to deliver (`Registration::take`).
pub(crate) enum Pending {
    /// Not synced: it catches up on its own.
    Unsynced,
    /// The batches that touched it, in order; it has seen everything else up to `through`.
    Batches { batches: Vec<Arc<Committed>>, through: i64 },
}

impl WatchHub {
    /// A hub of a store at `revision`.
    pub(crate) fn new(revision: i64) -> Arc<WatchHub> {
        Arc::new(WatchHub {
            state: Mutex::new(Hub {
                revision,
                backlog: Backlog::default(),
                index: WatchIndex::default(),
                watchers: HashMap::new(),
                next_id: 0,
                found: Vec::new(),
            }),
            revision: watch::Sender::new(revision),
            inbox: Mutex::new((VecDeque::new(), 0)),
        })
    }

    /// Hands over `batch`, the next one applied (the apply observer, on the raft thread). Returns
    /// whether the inbox was empty: the caller then has `commit_offered` run, on the gRPC runtime.
    #[must_use]
    pub(crate) fn offer(&self, batch: Arc<Committed>) -> bool {
        let mut inbox = self.inbox.lock().unwrap_or_else(PoisonError::into_inner);
        let (batches, dropped) = &mut *inbox;
        let was_empty = batches.is_empty();
        if batches.len() == INBOX_LIMIT {
            // The next one committed starts after a gap: the hub sees it and its watchers replay
            // from the store (a dropped install too: the batch after it does not follow the hub).
            batches.pop_front();
            *dropped += 1;
        }
        batches.push_back(batch);
        was_empty
    }

    /// Commits the batches offered so far, in order.
    pub(crate) fn commit_offered(&self) {
        let (batches, dropped) = {
            let mut inbox = self.inbox.lock().unwrap_or_else(PoisonError::into_inner);
            (std::mem::take(&mut inbox.0), std::mem::take(&mut inbox.1))
        };
        if dropped > 0 {
            tracing::warn!(dropped, "watch hub fell behind the applied batches; watchers replay from the store");
        }
        if batches.is_empty() {
            return;
        }
        let revision = {
            let mut state = self.lock();
            for batch in batches {
                state.commit(batch);
            }
            state.revision
        };
        self.revision.send_if_modified(|seen| std::mem::replace(seen, revision) != revision);
    }

    /// A watcher of `range`, unsynced until it catches up.
    pub(crate) fn register(self: &Arc<Self>, range: KeyRange) -> Registration {
        let wake = Arc::new(Notify::new());
        let mut hub = self.lock();
        let id = hub.next_id;
        hub.next_id += 1;
        hub.watchers.insert(id, Entry { range, wake: wake.clone(), synced: None });
        Registration { hub: self.clone(), id, wake, since: hub.revision }
    }

    /// The hub's revision if each of `watchers` (of one stream) has had all its events up to it
    /// queued: synced, nothing touched it that it has not sent, and the revision not below its
    /// progress floor.
    /// `None` while one of them is catching up or sending: the stream asks again later.
    pub(crate) fn progress(&self, watchers: &[WatcherId]) -> Option<i64> {
        let hub = self.lock();
        let quiet = |id: &WatcherId| match hub.watchers.get(id) {
            // Gone: it ended (its registration dropped) and owes nothing.
            None => true,
            Some(Entry { synced: Some(s), .. }) => {
                s.touched.is_empty() && !s.sending && s.progress_floor <= hub.revision
            }
            Some(Entry { synced: None, .. }) => false,
        };
        watchers.iter().all(quiet).then_some(hub.revision)
    }

    /// The hub's revision as it moves: a progress request waits for it to reach the revision the
    /// member had applied when the request came (etcd answers at its store's revision).
    pub(crate) fn revisions(&self) -> watch::Receiver<i64> {
        self.revision.subscribe()
    }

    /// Synced watchers, for tests and metrics.
    #[cfg(test)]
    pub(crate) fn synced(&self) -> usize {
        self.lock().watchers.values().filter(|e| e.synced.is_some()).count()
    }

    fn lock(&self) -> MutexGuard<'_, Hub> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Hub {
    fn commit(&mut self, batch: Arc<Committed>) {
        if batch.installed.is_none() {
            if batch.revision <= self.revision || batch.effects.events.is_empty() {
                return; // before the subscription's start, or nothing for watchers
            }
            if batch.previous_revision != self.revision {
                self.lost(); // a gap: what was in it is in the store only
            } else {
                self.notify(&batch);
            }
        } else {
            // The whole state was replaced: every watcher replays from the installed store.
            self.unsync_all();
        }
        self.revision = batch.revision;
        self.backlog.push(batch);
    }

    /// Tells each synced watcher whose range holds a key of `batch`.
    fn notify(&mut self, batch: &Committed) {
        let mut found = std::mem::take(&mut self.found);
        found.clear();
        for event in &batch.effects.events {
            if let Some(kv) = &event.kv {
                self.index.touching(&kv.key, &mut |id| found.push(id));
            }
        }
        found.sort_unstable();
        found.dedup();
        for &id in &found {
            let Some(entry) = self.watchers.get_mut(&id) else { continue };
            let Some(synced) = &mut entry.synced else { continue };
            if batch.revision < synced.from {
                continue;
            }
            synced.touched.push(batch.revision);
            entry.wake.notify_one();
            if synced.touched.len() > TOUCHED_LIMIT {
                self.unsync(id);
            }
        }
        self.found = found;
    }

    /// The hub missed batches: nobody can be told of them.
    fn lost(&mut self) {
        self.unsync_all();
        self.backlog.clear();
    }

    fn unsync(&mut self, id: WatcherId) {
        let Some(entry) = self.watchers.get_mut(&id) else { return };
        if entry.synced.take().is_some() {
            self.index.remove(id, &entry.range);
            entry.wake.notify_one();
        }
    }

    fn unsync_all(&mut self) {
        for entry in self.watchers.values_mut() {
            if entry.synced.take().is_some() {
                entry.wake.notify_one();
            }
        }
        self.index.clear();
    }
}

/// A watcher's place in the hub; dropping it removes the watcher.
pub(crate) struct Registration {
    hub: Arc<WatchHub>,
    id: WatcherId,
    wake: Arc<Notify>,
    /// The hub's revision when the watcher registered: only batches taken after it are its to catch
    /// up from in memory. Older ones may have been compacted since, which only the store tells.
    since: i64,
}

impl Registration {
    /// This watcher's id in the hub (for `WatchHub::progress`).
    pub(crate) fn id(&self) -> WatcherId {
        self.id
    }

    /// Joins the synced watchers if `next`, the watcher's first undelivered revision, is past the
    /// hub's revision (nothing the hub has taken is left for it); false when it must catch up first.
    /// `progress_floor`: the lowest revision a progress may report for it: what it covered before
    /// joining (a replay from the store may read past the hub: a progress below it would go back),
    /// and the start revision it asked for (a progress below it would make a client resume before
    /// it: etcd #20229).
    pub(crate) fn try_sync(&self, next: i64, progress_floor: i64) -> bool {
        let mut hub = self.hub.lock();
        if next <= hub.revision {
            return false;
        }
        let Hub { index, watchers, .. } = &mut *hub;
        let Some(entry) = watchers.get_mut(&self.id) else { return false };
        if entry.synced.is_none() {
            index.insert(self.id, &entry.range);
            entry.synced = Some(Synced { from: next, touched: Vec::new(), sending: false, progress_floor });
        }
        true
    }

    /// Leaves the synced watchers (to catch up on its own).
    pub(crate) fn unsync(&self) {
        self.hub.lock().unsync(self.id);
    }

    /// What touched this watcher since the last call; `Unsynced` when it is not synced, or when a
    /// batch it needs is no longer in the backlog (it then is unsynced).
    pub(crate) fn take(&self) -> Pending {
        let mut hub = self.hub.lock();
        let through = hub.revision;
        let Some(Entry { synced: Some(synced), .. }) = hub.watchers.get_mut(&self.id) else { return Pending::Unsynced };
        let touched = std::mem::take(&mut synced.touched);
        synced.sending |= !touched.is_empty();
        let batches: Option<Vec<_>> = touched.iter().map(|&revision| hub.backlog.at(revision)).collect();
        match batches {
            Some(batches) => Pending::Batches { batches, through },
            None => {
                hub.unsync(self.id);
                Pending::Unsynced
            }
        }
    }

    /// The watcher queued the events of what it took (`take`): a stream's progress may count it.
    pub(crate) fn settled(&self) {
        let mut hub = self.hub.lock();
        if let Some(Entry { synced: Some(synced), .. }) = hub.watchers.get_mut(&self.id) {
            synced.sending = false;
        }
    }

    /// Up to `max` batches of the backlog, in order, from the first that ends at or after `revision`,
    /// among those taken since the watcher registered.
    pub(crate) fn backlog_from(&self, revision: i64, max: usize) -> Vec<Arc<Committed>> {
        let mut batches = self.hub.lock().backlog.from(revision, max);
        let before = batches.partition_point(|b| b.previous_revision < self.since);
        batches.drain(..before);
        batches
    }

    /// Resolves when the hub has something for this watcher (or unsynced it).
    pub(crate) async fn notified(&self) {
        self.wake.notified().await
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut hub = self.hub.lock();
        hub.unsync(self.id);
        hub.watchers.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::proto::mvccpb::{Event, KeyValue};

    fn batch(revision: i64, keys: &[&str]) -> Arc<Committed> {
        let mut batch = Committed { revision, previous_revision: revision - 1, ..Default::default() };
        for key in keys {
            let kv = KeyValue { key: key.as_bytes().to_vec(), mod_revision: revision, ..Default::default() };
            batch.effects.events.push(Event { kv: Some(kv), ..Default::default() });
        }
        Arc::new(batch)
    }

    /// Whether the hub woke this watcher since the last look (a stored wake-up resolves at once).
    async fn woken(watcher: &Registration) -> bool {
        tokio::time::timeout(Duration::from_millis(20), watcher.notified()).await.is_ok()
    }

    fn touched(watcher: &Registration) -> Vec<i64> {
        match watcher.take() {
            Pending::Batches { batches, .. } => batches.iter().map(|b| b.revision).collect(),
            Pending::Unsynced => panic!("unsynced"),
        }
    }

    /// A commit wakes the synced watchers whose range holds one of its keys, and no other: not those
    /// of other keys, not an unsynced one, not one that starts after it.
    #[tokio::test]
    async fn a_commit_wakes_only_the_watchers_whose_range_it_touches() {
        let hub = WatchHub::new(10);
        let single = hub.register(KeyRange::new(b"a/1", b""));
        let prefix = hub.register(KeyRange::new(b"a/", b"a0"));
        let from_key = hub.register(KeyRange::new(b"b", b"\0"));
        let elsewhere = hub.register(KeyRange::new(b"c/", b"c0"));
        let unsynced = hub.register(KeyRange::new(b"a/", b"a0"));
        let later = hub.register(KeyRange::new(b"a/", b"a0"));
        let idle: Vec<_> =
            (0..1000).map(|i| hub.register(KeyRange::new(format!("idle/{i}").as_bytes(), b""))).collect();
        for watcher in [&single, &prefix, &from_key, &elsewhere].into_iter().chain(&idle) {
            assert!(watcher.try_sync(11, 0));
        }
        assert!(!unsynced.try_sync(10, 0), "behind the hub: must catch up first");
        assert!(later.try_sync(13, 0));
        assert_eq!(hub.synced(), 1005);

        hub.lock().commit(batch(11, &["a/1"]));
        assert!(woken(&single).await && woken(&prefix).await);
        for other in [&from_key, &elsewhere, &unsynced, &later].into_iter().chain(&idle[..10]) {
            assert!(!woken(other).await);
        }
        assert_eq!(touched(&single), [11]);
        assert_eq!(touched(&prefix), [11]);
        assert_eq!(touched(&elsewhere), Vec::<i64>::new());

        // A txn of two keys: each watcher once; a from-key watcher of "b" holds "c/x" too.
        hub.lock().commit(batch(12, &["a/2", "c/x", "a/3"]));
        assert!(!woken(&single).await);
        assert!(woken(&prefix).await && woken(&from_key).await && woken(&elsewhere).await);
        assert_eq!(touched(&prefix), [12]);
        assert_eq!(touched(&from_key), [12]);

        // A key no one watches wakes no one; a batch before a watcher's first revision is not its own.
        hub.lock().commit(batch(13, &["z"]));
        hub.lock().commit(batch(14, &["a/9"]));
        assert!(woken(&later).await);
        assert_eq!(touched(&later), [14]);
        assert!(idle
            .iter()
            .all(|w| matches!(w.take(), Pending::Batches { batches, through: 14 } if batches.is_empty())));

        // Dropped watchers leave the index.
        drop(idle);
        assert_eq!(hub.synced(), 5);
    }

    /// A synced watcher that does not take what touched it leaves the index after `TOUCHED_LIMIT`
    /// batches (it catches up on its own later); a snapshot install unsyncs every watcher.
    #[tokio::test]
    async fn a_watcher_that_does_not_keep_up_is_unsynced() {
        let hub = WatchHub::new(0);
        let slow = hub.register(KeyRange::new(b"k", b""));
        let other = hub.register(KeyRange::new(b"o", b""));
        assert!(slow.try_sync(1, 0) && other.try_sync(1, 0));
        for revision in 1..=TOUCHED_LIMIT as i64 + 1 {
            hub.lock().commit(batch(revision, &["k"]));
        }
        assert!(matches!(slow.take(), Pending::Unsynced));
        assert_eq!(hub.synced(), 1);
        let mut install = Committed { revision: 5000, previous_revision: 4000, ..Default::default() };
        install.installed = Some(Default::default());
        hub.lock().commit(Arc::new(install));
        assert!(matches!(other.take(), Pending::Unsynced));
        assert_eq!(hub.synced(), 0);
    }

    /// Batches offered while a commit is pending wait for it, and at most `INBOX_LIMIT` of them: past
    /// that the oldest are dropped, the hub sees the gap, unsyncs its watchers (they replay from the
    /// store) and still reaches the newest batch. Fails if the inbox grows without bound, or if a
    /// dropped batch goes unnoticed.
    #[tokio::test]
    async fn a_hub_behind_by_more_than_its_inbox_drops_the_oldest_and_its_watchers_replay() {
        let hub = WatchHub::new(0);
        let watcher = hub.register(KeyRange::new(b"k", b""));
        assert!(watcher.try_sync(1, 0));
        assert!(hub.offer(batch(1, &["k"])), "the first offer asks for a commit");
        assert!(!hub.offer(batch(2, &["k"])), "one commit takes both");
        hub.commit_offered();
        assert_eq!(touched(&watcher), [1, 2]);
        assert!(hub.offer(batch(3, &["k"])), "an empty inbox asks again");
        hub.commit_offered();
        assert_eq!(touched(&watcher), [3]);

        let last = 3 + INBOX_LIMIT as i64 + 5;
        for revision in 4..=last {
            let _ = hub.offer(batch(revision, &["k"]));
        }
        assert_eq!(hub.inbox.lock().unwrap().0.len(), INBOX_LIMIT);
        hub.commit_offered();
        assert!(matches!(watcher.take(), Pending::Unsynced), "batches 4 to 8 were dropped");
        assert_eq!(*hub.revisions().borrow(), last);
        assert!(hub.inbox.lock().unwrap().0.is_empty());
    }
}
