//! One watcher: what it watches and how (its range, filters, `prev_kv`, `fragment`), `next` (the
//! first revision it has not delivered), and its loop: while synced, it waits for the hub to wake it
//! (`from_hub.rs`); while unsynced, it catches up from the hub's backlog (`from_hub.rs`) or the store
//! (`from_store.rs`) until the hub lets it join. Before it sends anything it checks its permission
//! again if the auth state moved; it ends canceled when that fails or `next` was compacted away.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch, Notify};
use tokio::task::JoinHandle;

use super::fragments::fragments;
use super::outbox::Outbox;
use super::wire::WatchReply;
use crate::auth::check::Authorizer;
use crate::auth::permissions::Access;
use crate::error::EtcdError;
use crate::identity::Requester;
use crate::keyrange::KeyRange;
use crate::node::Node;
use crate::proto::etcdserverpb::watch_create_request::FilterType;
use crate::proto::etcdserverpb::{WatchCreateRequest, WatchResponse};
use crate::proto::mvccpb::event::EventType;
use crate::proto::mvccpb::Event;
use crate::server::stream_credential::StreamCredential;
use crate::watch_hub::Registration;

/// One watcher: what it watches and how, and how far it got.
pub(super) struct Watcher {
    pub(super) id: i64,
    pub(super) range: KeyRange,
    /// The first revision not yet delivered.
    pub(super) next: i64,
    pub(super) prev_kv: bool,
    no_put: bool,
    no_delete: bool,
    progress_notify: bool,
    /// How often it gets a progress notification when idle, if it asked for them (`progress_notify`).
    progress_interval: Duration,
    /// The start revision the client asked for (0: none): no progress may report less.
    start_revision: i64,
    /// Told each time this watcher has queued all it owes (joined, or sent what touched it): its
    /// stream may then answer a deferred progress request (`stream.rs`).
    settled: Arc<Notify>,
    pub(super) fragment: bool,
    credential: StreamCredential,
    /// The auth revision (and whether auth was on) at which this watcher's permission was last confirmed.
    auth_checked: (u64, bool),
    /// Wakes the watcher at each auth change, so that a change that ends it (a permission revoked, its
    /// token voided) does so at its apply even when nothing it watches is written.
    auth_changes: watch::Receiver<(u64, bool)>,
}

/// Why a watcher stopped on its own.
pub(super) enum End {
    /// The stream or the watcher was closed.
    Closed,
    /// `next` was compacted away; the client must be told.
    Compacted(i64),
    /// The watcher's user lost read permission on its range (or was deleted), or the token the stream
    /// was opened with is void: keyward cancels it with the reason rather than keep streaming what the
    /// user may no longer read.
    Denied(String),
}

/// What became of a broadcast batch (`from_hub.rs`).
pub(super) enum Live {
    Delivered,
    /// Not delivered: its revisions are to be replayed from the store.
    Missed,
    Stop(End),
}

impl Watcher {
    /// A watcher `id` of `range` as `req` asks, created when the store was at `rev`: it starts at
    /// `req.start_revision`, or after `rev` when none is given. `settled` is its stream's.
    pub(super) fn new(
        id: i64,
        range: KeyRange,
        req: &WatchCreateRequest,
        rev: i64,
        credential: StreamCredential,
        node: &Node,
        settled: Arc<Notify>,
    ) -> Watcher {
        Watcher {
            id,
            range,
            next: if req.start_revision <= 0 { rev + 1 } else { req.start_revision },
            prev_kv: req.prev_kv,
            no_put: req.filters.contains(&(FilterType::Noput as i32)),
            no_delete: req.filters.contains(&(FilterType::Nodelete as i32)),
            progress_notify: req.progress_notify,
            progress_interval: node.watch_progress_notify_interval,
            start_revision: req.start_revision.max(0),
            settled,
            fragment: req.fragment,
            credential,
            auth_checked: (node.auth_revision(), node.auth_enabled()),
            auth_changes: node.auth_changes(),
        }
    }

    /// Runs as a task of its own, registered with the member's watch hub as `hub` (unsynced), until
    /// it ends or `stopped` fires.
    pub(super) fn spawn(
        self,
        node: Arc<Node>,
        hub: Registration,
        out: Outbox,
        stopped: oneshot::Receiver<()>,
    ) -> JoinHandle<()> {
        tokio::spawn(self.run(node, hub, out, stopped))
    }

    async fn run(mut self, node: Arc<Node>, hub: Registration, out: Outbox, mut stopped: oneshot::Receiver<()>) {
        let end = self.deliver(&node, &hub, &out, &mut stopped).await;
        drop(hub);
        let canceled = WatchResponse {
            header: node.header(node.revision()),
            watch_id: self.id,
            canceled: true,
            ..Default::default()
        };
        let resp = match end {
            End::Closed => return,
            // etcd's compaction cancel carries no revision in its header.
            End::Compacted(compact_revision) => WatchResponse { header: node.header(0), compact_revision, ..canceled },
            End::Denied(reason) => {
                tracing::info!(watch_id = self.id, reason = %reason, "watch canceled: permission no longer granted");
                WatchResponse { cancel_reason: reason, ..canceled }
            }
        };
        let _ = out.send(Ok(resp.into())).await;
    }

    async fn deliver(
        &mut self,
        node: &Arc<Node>,
        hub: &Registration,
        out: &Outbox,
        stopped: &mut oneshot::Receiver<()>,
    ) -> End {
        let mut progress = tokio::time::interval(self.progress_interval);
        progress.tick().await;
        let mut synced = false;
        loop {
            if let Err(e) = self.still_permitted(node).await {
                return End::Denied(e.go_status_text());
            }
            if synced {
                // Woken only when a batch touches this watcher's range (or the hub unsynced it).
                let tick = tokio::select! {
                    _ = hub.notified() => false,
                    _ = progress.tick(), if self.progress_notify => true,
                    // An auth change: the top of the loop checks the credential and permission again
                    // (a wake-up of the hub meanwhile keeps its permit).
                    Ok(()) = self.auth_changes.changed() => continue,
                    _ = &mut *stopped => return End::Closed,
                };
                // What is pending goes first: a progress response says all before it was delivered.
                match self.take_pending(node, hub, out, stopped).await {
                    Live::Delivered => {
                        hub.settled();
                        self.settled.notify_one();
                    }
                    Live::Missed => {
                        hub.unsync();
                        synced = false;
                        continue;
                    }
                    Live::Stop(end) => return end,
                }
                if tick {
                    let resp =
                        WatchResponse { header: node.header(self.next - 1), watch_id: self.id, ..Default::default() };
                    if out.send(Ok(resp.into())).await.is_err() {
                        return End::Closed;
                    }
                }
                continue;
            }
            // Unsynced: nothing left before the hub's revision, it joins; else it catches up from the
            // hub's backlog (in memory, shared by every watcher), or from the store.
            if hub.try_sync(self.next, self.start_revision.max(self.next - 1)) {
                synced = true;
                self.settled.notify_one();
                continue;
            }
            match self.catch_up(node, hub, out, stopped).await {
                Live::Delivered => continue,
                Live::Missed => {} // replayed below
                Live::Stop(end) => return end,
            }
            if self.next <= node.revision() {
                if let Err(end) = self.replay(node, out, stopped).await {
                    return end;
                }
                continue;
            }
            // The hub has yet to take a batch the store already holds (try_sync refuses only a `next`
            // at or below the hub's revision, which the store is never behind): wait a moment.
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(1)) => {}
                _ = &mut *stopped => return End::Closed,
            }
        }
    }

    /// Whether this watcher's filters (`NOPUT`, `NODELETE`) let `event` through.
    pub(super) fn lets_through(&self, event: &Event) -> bool {
        match EventType::try_from(event.r#type) {
            Ok(EventType::Put) => !self.no_put,
            Ok(EventType::Delete) => !self.no_delete,
            Err(_) => false,
        }
    }

    /// Re-checks read permission on the range whenever the auth state has moved since the last check.
    /// A token the stream was opened with must still stand (not voided by a password change, its
    /// user's deletion or an auth disable); the permission is the user's now (an unrelated auth
    /// change does not make the token "old" here: the stream stays open as long as the user may
    /// still read what it watches).
    pub(super) async fn still_permitted(&mut self, node: &Node) -> Result<(), EtcdError> {
        let current = (node.auth_revision(), node.auth_enabled());
        if current == self.auth_checked {
            return Ok(());
        }
        let (credential, range) = (self.credential.clone(), self.range.clone());
        node.read_state(move |state, txn| {
            let authz = Authorizer::new(&state.auth, txn)?;
            credential.stands(&authz, "watch")?;
            let now = match credential.requester().clone() {
                Requester::Client { username, origin, .. } => {
                    Requester::Client { username, revision: authz.revision(), origin }
                }
                member => member,
            };
            authz.check(&now, "watch", Access::Read, &range)
        })
        .await?;
        self.auth_checked = current;
        Ok(())
    }

    /// Sends the events this watcher's filters let through (nothing when none do).
    pub(super) async fn send_events(
        &self,
        node: &Node,
        mut events: Vec<Event>,
        revision: i64,
        out: &Outbox,
        stopped: &mut oneshot::Receiver<()>,
    ) -> bool {
        events.retain(|e| self.lets_through(e));
        if events.is_empty() {
            return true;
        }
        if !self.prev_kv {
            events.iter_mut().for_each(|e| e.prev_kv = None);
        }
        let header = node.header(revision);
        let responses = if self.fragment {
            fragments(self.id, header, events, node.max_request_bytes)
        } else {
            vec![WatchResponse { header, watch_id: self.id, events, ..Default::default() }]
        };
        for resp in responses {
            if !send_reply(resp.into(), out, stopped).await {
                return false;
            }
        }
        true
    }
}

/// Sends one reply, unless the watcher is stopped first; false when it was not sent.
pub(super) async fn send_reply(reply: WatchReply, out: &Outbox, stopped: &mut oneshot::Receiver<()>) -> bool {
    tokio::select! {
        sent = out.send(Ok(reply)) => sent.is_ok(),
        _ = &mut *stopped => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::watch::outbox::{outbox, Replies, STREAM_BYTES};

    /// A member of its own in `dir`, serving from the start.
    async fn member(dir: &std::path::Path) -> Arc<Node> {
        use clap::Parser;

        use crate::cli::{Cli, Command};

        let data_dir = dir.display().to_string();
        let args = ["keyward", "serve", "--data-dir", data_dir.as_str(), "--ballast-bytes", "0"];
        let Command::Serve(args) = Cli::try_parse_from(args).unwrap().command else { panic!("not serve") };
        Node::start(&args.into_config().unwrap()).await.unwrap()
    }

    /// Starts a watcher of `w/` from revision `next` whose stream holds `capacity` responses unread.
    fn watch_from(node: &Arc<Node>, next: i64, capacity: usize) -> (Replies, oneshot::Sender<()>) {
        let watcher = Watcher {
            id: next,
            range: KeyRange::new(b"w/", b"w0"),
            next,
            prev_kv: false,
            no_put: false,
            no_delete: false,
            progress_notify: false,
            progress_interval: Duration::from_secs(600),
            start_revision: 0,
            settled: Arc::new(Notify::new()),
            fragment: false,
            credential: StreamCredential::standing(Requester::Member),
            auth_checked: (node.auth_revision(), node.auth_enabled()),
            auth_changes: node.auth_changes(),
        };
        let (out, responses) = outbox(capacity, STREAM_BYTES);
        let (stop, stopped) = oneshot::channel();
        let hub = node.watch_hub.register(watcher.range.clone());
        tokio::spawn(watcher.run(node.clone(), hub, out, stopped));
        (responses, stop)
    }

    /// The next response; a deadline only so that a missing response fails the test instead of hanging it.
    async fn next_response(responses: &mut Replies) -> WatchResponse {
        let response = tokio::time::timeout(Duration::from_secs(60), responses.recv()).await;
        response.expect("a response").expect("the watcher is running").expect("not an error").into_response()
    }

    /// Reads responses until one reaches `revision`: each event's key and revision, and the number of
    /// responses they came in.
    async fn delivered_until(responses: &mut Replies, revision: i64) -> (Vec<(String, i64)>, usize) {
        let (mut delivered, mut count) = (Vec::new(), 0);
        while delivered.last().is_none_or(|&(_, last)| last < revision) {
            let response = next_response(responses).await;
            assert!(!response.canceled, "{response:?}");
            count += 1;
            for event in response.events {
                let kv = event.kv.unwrap();
                delivered.push((String::from_utf8(kv.key).unwrap(), kv.mod_revision));
            }
        }
        (delivered, count)
    }

    /// A snapshot install makes the revision jump with no events: a watcher replays what it brought from
    /// the installed store, each revision once, or is canceled if its next revision was compacted away.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_a_snapshot_install_a_watcher_gets_each_revision_once_or_is_canceled_as_compacted() {
        use crate::proto::etcdserverpb::{CompactionRequest, InternalRaftRequest};
        use crate::raft::state_machine::snapshot_tests::put;
        use crate::raft::state_machine::StateMachine;

        let dir = tempfile::tempdir().unwrap();
        let node = member(dir.path()).await;
        node.propose(put(b"w/0", b"v", 0), &Requester::Member).await.unwrap();
        // The leader went on: w/1..w/6 at revisions 3..8, then compacted at 4.
        let leader_dir = tempfile::tempdir().unwrap();
        let leader =
            StateMachine::open(&leader_dir.path().join("kv"), &leader_dir.path().join("snap")).unwrap().state();
        let mut requests: Vec<_> = (0..7).map(|i| put(format!("w/{i}").as_bytes(), b"v", 0)).collect();
        let compact = CompactionRequest { revision: 4, physical: false };
        requests.push(InternalRaftRequest { compaction: Some(Box::new(compact)), ..Default::default() });
        assert!(leader.apply_requests(1, requests).iter().all(Result::is_ok));

        let (mut from_5, _stop_5) = watch_from(&node, 5, 16);
        let (mut from_3, _stop_3) = watch_from(&node, 3, 16);

        node.kv_env().install_snapshot_of(&leader).unwrap();
        node.propose(put(b"w/7", b"v", 0), &Requester::Member).await.unwrap();

        let (delivered, _) = delivered_until(&mut from_5, 9).await;
        let expected: Vec<_> = (3..8).map(|i| (format!("w/{i}"), i as i64 + 2)).collect();
        assert_eq!(delivered, expected, "revisions 5..9, each once, in order");
        let canceled = next_response(&mut from_3).await;
        assert!(canceled.canceled && canceled.events.is_empty(), "{canceled:?}");
        assert_eq!(canceled.compact_revision, 4);
    }

    /// A watcher that fell behind while its client did not read catches up from the broadcast's backlog
    /// in memory, the revisions merged into few responses, rather than from the store: here the store
    /// was compacted past what the watcher still has to deliver, so a replay from it would cancel the
    /// watcher instead of delivering.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_watcher_behind_catches_up_from_the_broadcast_not_the_store() {
        use crate::proto::etcdserverpb::{CompactionRequest, InternalRaftRequest};
        use crate::raft::state_machine::snapshot_tests::put;

        let dir = tempfile::tempdir().unwrap();
        let node = member(dir.path()).await;
        let first = node.revision() + 1;
        // The client reads nothing: one response waits in the stream and the watcher waits to send the next.
        let (mut responses, _stop) = watch_from(&node, first, 1);
        let puts = 40;
        for i in 0..puts {
            node.propose(put(format!("w/{i}").as_bytes(), b"v", 0), &Requester::Member).await.unwrap();
        }
        let last = node.revision();
        assert_eq!(last, first + puts - 1, "one revision per put");
        let compact = CompactionRequest { revision: last, physical: false };
        node.propose(
            InternalRaftRequest { compaction: Some(Box::new(compact)), ..Default::default() },
            &Requester::Member,
        )
        .await
        .unwrap();

        let (delivered, count) = delivered_until(&mut responses, last).await;
        let expected: Vec<_> = (0..puts).map(|i| (format!("w/{i}"), first + i)).collect();
        assert_eq!(delivered, expected, "every revision once, in order");
        assert!(count < 10, "{puts} revisions in {count} responses: the backlog was not merged");
    }
}
