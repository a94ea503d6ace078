//! The Watch service: one bidirectional stream carries many watchers.
//!
//! Each watcher is a task that owns `next`, the first revision it has not delivered yet, which makes
//! delivery exactly-once and in order:
//! 1. it registers with the member's watch hub (`watch_hub/`), unsynced,
//! 2. catches up while `next` is behind the hub: from the hub's backlog of recent batches, else from
//!    LMDB, a bounded batch at a time,
//! 3. then joins the hub's synced watchers, which the hub wakes only for the batches that touch their
//!    range; if it cannot keep up (its client does not read, and the stream's queue, bounded in bytes,
//!    `watch_outbox.rs`, stays full), the hub drops it back to step 2 instead of holding events for it.
//!
//! A watcher whose `next` has been compacted away is canceled with `compact_revision` set, never
//! silently skipped forward.

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use prost::Message;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tonic::codegen::{http, Body, BoxFuture, Service, StdError};
use tonic::server::{Grpc, NamedService, StreamingService};
use tonic::{Request, Response, Status, Streaming};

use super::stream_credential::StreamCredential;
use super::watch_outbox::{outbox, Outbox, STREAM_BYTES, STREAM_RESPONSES};
use super::watch_wire::{WatchCodec, WatchReply};
use crate::auth::check::{Authorizer, Requester};
use crate::auth::permissions::Access;
use crate::error::EtcdError;
use crate::keyrange::KeyRange;
use crate::node::Node;
use crate::proto::etcdserverpb::watch_create_request::FilterType;
use crate::proto::etcdserverpb::watch_request::RequestUnion;
use crate::proto::etcdserverpb::{ResponseHeader, WatchCreateRequest, WatchRequest, WatchResponse};
use crate::proto::mvccpb::event::EventType;
use crate::proto::mvccpb::Event;
use crate::raft::state_machine::Committed;
use crate::watch_hub::{Pending, Registration};

/// Revisions replayed from LMDB per response (etcd's `watchBatchMaxRevs`).
const REPLAY_BATCH_REVISIONS: usize = 1000;
/// Bytes of keys and values a catch-up puts in one response (or reads from LMDB at once) before it
/// closes it: 1,000 revisions of large values would otherwise make one response of gigabytes.
const CATCH_UP_BYTES: usize = 1 << 20;
/// How often a watcher that asked for progress notifications gets one when idle (etcd's default).
const PROGRESS_NOTIFY_INTERVAL: Duration = Duration::from_secs(600);
/// etcd's id for responses that belong to no watcher (progress responses to a progress request).
const INVALID_WATCH_ID: i64 = -1;

type Out = Outbox;

pub(crate) struct WatchService {
    node: Arc<Node>,
}

impl WatchService {
    pub(crate) fn new(node: Arc<Node>) -> Self {
        WatchService { node }
    }

    /// etcd's `Watch`, served by `WatchServer` below.
    pub(crate) async fn watch(
        &self,
        request: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<ReplyStream>, Status> {
        let (out, replies) = outbox(STREAM_RESPONSES, STREAM_BYTES);
        // The stream's identity comes from its metadata; a bad token refuses each create, as in etcd.
        // etcd puts Go's status text of the refusal in the cancel reason.
        let who = StreamCredential::of(&self.node, &request)
            .map_err(|s| format!("rpc error: code = {:?} desc = {}", s.code(), s.message()));
        let stream = WatchStream { node: self.node.clone(), who, out, watchers: HashMap::new(), next_id: 0 };
        tokio::spawn(stream.run(request.into_inner()));
        Ok(Response::new(Box::pin(replies)))
    }
}

pub(crate) type ReplyStream = Pin<Box<dyn Stream<Item = Result<WatchReply, Status>> + Send>>;

/// etcd's `etcdserverpb.Watch` service on `WatchCodec` (`watch_wire.rs`): what tonic generates for a
/// streaming method, with that codec in place of prost's.
#[derive(Clone)]
pub(crate) struct WatchServer {
    service: Arc<WatchService>,
}

impl WatchServer {
    pub(crate) fn new(service: WatchService) -> Self {
        WatchServer { service: Arc::new(service) }
    }
}

impl NamedService for WatchServer {
    const NAME: &'static str = "etcdserverpb.Watch";
}

impl<B> Service<http::Request<B>> for WatchServer
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != "/etcdserverpb.Watch/Watch" {
            return Box::pin(async { Ok(Status::unimplemented("").into_http()) });
        }
        let streams = Streams(self.service.clone());
        Box::pin(async move { Ok(Grpc::new(WatchCodec).streaming(streams, request).await) })
    }
}

/// The one method: a stream of requests in, a stream of replies out.
struct Streams(Arc<WatchService>);

impl StreamingService<WatchRequest> for Streams {
    type Response = WatchReply;
    type ResponseStream = ReplyStream;
    type Future = BoxFuture<Response<ReplyStream>, Status>;

    fn call(&mut self, request: Request<Streaming<WatchRequest>>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move { service.watch(request).await })
    }
}

struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

/// One client stream: reads requests, starts and stops watchers.
struct WatchStream {
    node: Arc<Node>,
    who: Result<StreamCredential, String>,
    out: Out,
    watchers: HashMap<i64, Running>,
    next_id: i64,
}

impl WatchStream {
    async fn run(mut self, mut requests: Streaming<WatchRequest>) {
        while let Some(Ok(req)) = requests.next().await {
            let sent = match req.request_union {
                Some(RequestUnion::CreateRequest(create)) => self.create(create).await,
                Some(RequestUnion::CancelRequest(cancel)) => self.cancel(cancel.watch_id).await,
                Some(RequestUnion::ProgressRequest(_)) => {
                    let header = self.node.header(self.node.revision());
                    self.send(WatchResponse { header, watch_id: INVALID_WATCH_ID, ..Default::default() }).await
                }
                None => true,
            };
            if !sent {
                break;
            }
        }
        // A client may half-close its side and keep reading events (etcd keeps sending): watchers
        // stop only when the client is gone.
        self.out.closed().await;
        for (_, running) in self.watchers.drain() {
            let _ = running.stop.send(());
            running.task.abort();
        }
    }

    async fn send(&self, resp: WatchResponse) -> bool {
        self.out.send(Ok(resp.into())).await.is_ok()
    }

    async fn create(&mut self, req: WatchCreateRequest) -> bool {
        let rev = self.node.revision();
        let refuse = |reason: &str| WatchResponse {
            header: self.node.header(rev),
            watch_id: INVALID_WATCH_ID,
            created: true,
            canceled: true,
            cancel_reason: reason.to_string(),
            ..Default::default()
        };
        // etcd treats an empty key as "\0" (the first possible key).
        let key = if req.key.is_empty() { vec![0] } else { req.key.clone() };
        let range = KeyRange::new(&key, &req.range_end);
        if range.is_empty() || matches!(&range, KeyRange::Span { start, end } if start == end) {
            return self.send(refuse("mvcc: watcher range is empty")).await;
        }
        // Read permission on the whole watched range, at creation. A from-key watch needs a from-key
        // permission (GHSA-xg4h-6gfc-h4m8), which the interval check enforces.
        let who = match &self.who {
            Ok(who) => who.clone(),
            Err(reason) => return self.send(refuse(reason)).await,
        };
        let (checked, check_range) = (who.clone(), range.clone());
        let permitted = self
            .node
            .read(false, move |_, authz| {
                // A void token refuses the create even with auth off (it was disabled since the stream opened).
                checked.stands(authz, "watch")?;
                authz.check(checked.requester(), "watch", Access::Read, &check_range)
            })
            .await;
        if let Err(e) = permitted {
            return self.send(refuse(&e.go_status_text())).await;
        }
        let id = if req.watch_id != 0 {
            if self.watchers.contains_key(&req.watch_id) {
                return self.send(refuse("mvcc: duplicate watch ID provided on the WatchStream")).await;
            }
            req.watch_id
        } else {
            while self.watchers.contains_key(&self.next_id) {
                self.next_id += 1;
            }
            self.next_id += 1;
            self.next_id - 1
        };
        let created =
            WatchResponse { header: self.node.header(rev), watch_id: id, created: true, ..Default::default() };
        if !self.send(created).await {
            return false;
        }
        let spec = Watcher {
            id,
            range,
            next: if req.start_revision <= 0 { rev + 1 } else { req.start_revision },
            prev_kv: req.prev_kv,
            no_put: req.filters.contains(&(FilterType::Noput as i32)),
            no_delete: req.filters.contains(&(FilterType::Nodelete as i32)),
            progress_notify: req.progress_notify,
            fragment: req.fragment,
            credential: who,
            auth_checked: (self.node.auth_revision(), self.node.auth_enabled()),
            auth_changes: self.node.auth_changes(),
        };
        let (stop, stopped) = oneshot::channel();
        let hub = self.node.watch_hub.register(spec.range.clone());
        let task = tokio::spawn(spec.run(self.node.clone(), hub, self.out.clone(), stopped));
        self.watchers.insert(id, Running { stop, task });
        true
    }

    async fn cancel(&mut self, id: i64) -> bool {
        let Some(running) = self.watchers.remove(&id) else { return true };
        // Wait for the watcher to stop so no event of it can follow the cancel response.
        let _ = running.stop.send(());
        let _ = running.task.await;
        let canceled = WatchResponse {
            header: self.node.header(self.node.revision()),
            watch_id: id,
            canceled: true,
            ..Default::default()
        };
        self.send(canceled).await
    }
}

struct Watcher {
    id: i64,
    range: KeyRange,
    /// The first revision not yet delivered.
    next: i64,
    prev_kv: bool,
    no_put: bool,
    no_delete: bool,
    progress_notify: bool,
    fragment: bool,
    credential: StreamCredential,
    /// The auth revision (and whether auth was on) at which this watcher's permission was last confirmed.
    auth_checked: (u64, bool),
    /// Wakes the watcher at each auth change, so that a change that ends it (a permission revoked, its
    /// token voided) does so at its apply even when nothing it watches is written.
    auth_changes: watch::Receiver<(u64, bool)>,
}

/// Why a watcher stopped on its own.
enum End {
    /// The stream or the watcher was closed.
    Closed,
    /// `next` was compacted away; the client must be told.
    Compacted(i64),
    /// The watcher's user lost read permission on its range (or was deleted), or the token the stream
    /// was opened with is void: keyward cancels it with the reason rather than keep streaming what the
    /// user may no longer read.
    Denied(String),
}

impl Watcher {
    async fn run(mut self, node: Arc<Node>, hub: Registration, out: Out, mut stopped: oneshot::Receiver<()>) {
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
        out: &Out,
        stopped: &mut oneshot::Receiver<()>,
    ) -> End {
        let mut progress = tokio::time::interval(PROGRESS_NOTIFY_INTERVAL);
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
                    Live::Delivered => {}
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
            if hub.try_sync(self.next) {
                synced = true;
                continue;
            }
            match self.catch_up(node, hub, out, stopped).await {
                Live::Delivered => continue,
                Live::Missed => {} // replayed below
                Live::Stop(end) => return end,
            }
            if self.next <= node.revision() {
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
                            return End::Denied(e.go_status_text());
                        }
                        if !self.send_events(node, events, rev, out, stopped).await {
                            return End::Closed;
                        }
                    }
                    Ok(Err(compacted)) => return End::Compacted(compacted),
                    Err(e) => {
                        tracing::error!(error = %e, watch_id = self.id, "watch replay failed");
                        return End::Closed;
                    }
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

    /// Delivers the batches that touched this synced watcher since it last looked: each revision on
    /// its own, as etcd sends a synced watcher's, or merged when more than `SYNCED_LAG` are pending
    /// (it fell behind: as etcd's unsynced watchers get them). `Missed` when the hub unsynced it.
    async fn take_pending(
        &mut self,
        node: &Node,
        hub: &Registration,
        out: &Out,
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
        out: &Out,
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
    async fn catch_up(
        &mut self,
        node: &Node,
        hub: &Registration,
        out: &Out,
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
        out: &Out,
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
        out: &Out,
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

    /// Whether this watcher's filters (`NOPUT`, `NODELETE`) let `event` through.
    fn lets_through(&self, event: &Event) -> bool {
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
    async fn still_permitted(&mut self, node: &Node) -> Result<(), EtcdError> {
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
    async fn send_events(
        &self,
        node: &Node,
        mut events: Vec<Event>,
        revision: i64,
        out: &Out,
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

    /// Sends events taken from broadcast batches: their shared encoding, or (for a watcher that asked
    /// for fragments, which are cut by encoded size) copies of them.
    async fn send_taken(
        &self,
        node: &Node,
        taken: Vec<Taken>,
        revision: i64,
        out: &Out,
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

/// Sends one reply, unless the watcher is stopped first; false when it was not sent.
async fn send_reply(reply: WatchReply, out: &Out, stopped: &mut oneshot::Receiver<()>) -> bool {
    tokio::select! {
        sent = out.send(Ok(reply)) => sent.is_ok(),
        _ = &mut *stopped => false,
    }
}

/// What an event weighs in a response, roughly: its keys and values.
fn event_bytes(event: &Event) -> usize {
    let kv_bytes =
        |kv: &Option<crate::proto::mvccpb::KeyValue>| kv.as_ref().map_or(0, |kv| kv.key.len() + kv.value.len());
    kv_bytes(&event.kv) + kv_bytes(&event.prev_kv)
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

/// Batches a synced watcher may have pending and still send each revision on its own, as etcd sends
/// a synced watcher's (`Watcher::take_pending`). Further behind, it sends many revisions per
/// response, as etcd's unsynced watchers get them: under load (a thousand watchers of busy keys)
/// that is what keeps up, fewer responses for the same events.
const SYNCED_LAG: usize = 2;

/// What became of a broadcast batch (`Watcher::take_live`).
enum Live {
    Delivered,
    /// Not delivered: its revisions are to be replayed from the store.
    Missed,
    Stop(End),
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

/// etcd's watch fragmentation (`sendFragments`), for a watcher created with `fragment`: the limit is
/// `--max-request-bytes` plus the gRPC overhead allowance, because etcd's watch server is handed
/// `MaxRequestBytes + grpcOverheadBytes` — with the flag alone, a large revision at a small
/// `--max-request-bytes` would come in far more (one-event) fragments than etcd sends.
fn fragments(
    id: i64,
    header: Option<ResponseHeader>,
    events: Vec<Event>,
    max_request_bytes: usize,
) -> Vec<WatchResponse> {
    let whole = WatchResponse { header, watch_id: id, events, ..Default::default() };
    split(whole, max_request_bytes + crate::config::GRPC_OVERHEAD_BYTES)
}

/// etcd's splitting rule: a response is split only when its whole encoded size (header included)
/// reaches `limit` and it has two or more events. Each fragment, counted with its header and its
/// `fragment` flag set, then takes events while it stays under `limit`, but always at least one (a
/// single oversized event travels alone); every fragment but the last has `fragment` set.
fn split(mut whole: WatchResponse, limit: usize) -> Vec<WatchResponse> {
    if whole.encoded_len() < limit || whole.events.len() < 2 {
        return vec![whole];
    }
    /// `WatchResponse.events` is field 11.
    const EVENTS_FIELD: u32 = 11;
    let events = std::mem::take(&mut whole.events);
    let template = WatchResponse { fragment: true, ..whole };
    // A repeated message field's encoded length is the sum of its elements', so a fragment's size is
    // the template's plus that of each event it holds (etcd recomputes `Size()` after each append).
    let base = template.encoded_len();
    let mut parts = Vec::new();
    let mut current = Vec::new();
    let mut size = base;
    for event in events {
        let len = prost::encoding::message::encoded_len(EVENTS_FIELD, &event);
        if !current.is_empty() && size + len >= limit {
            parts.push(std::mem::take(&mut current));
            size = base;
        }
        size += len;
        current.push(event);
    }
    parts.push(current);
    let last = parts.len() - 1;
    parts
        .into_iter()
        .enumerate()
        .map(|(i, events)| WatchResponse { events, fragment: i != last, ..template.clone() })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::mvccpb::KeyValue;
    use crate::server::watch_outbox::Replies;

    fn put_event(key: &[u8]) -> Event {
        Event { kv: Some(KeyValue { key: key.to_vec(), ..Default::default() }), ..Default::default() }
    }

    /// etcd's `createResponse`: `events` events whose keys are `key_len` bytes, no header.
    fn response(key_len: usize, events: usize) -> WatchResponse {
        let events = (0..events).map(|_| put_event(&vec![b'a'; key_len])).collect();
        WatchResponse { events, ..Default::default() }
    }

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

    fn event_counts(parts: &[WatchResponse]) -> Vec<usize> {
        parts.iter().map(|r| r.events.len()).collect()
    }

    fn assert_only_last_unflagged(parts: &[WatchResponse]) {
        let flags: Vec<bool> = parts.iter().map(|r| r.fragment).collect();
        let mut expected = vec![true; parts.len()];
        *expected.last_mut().unwrap() = false;
        assert_eq!(flags, expected);
    }

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

        node.state().install_snapshot_of(&leader).unwrap();
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

    /// etcd 3.4's `TestSendFragment` table (etcdserver/api/v3rpc/watch_test.go).
    #[test]
    fn split_matches_etcds_send_fragment_cases() {
        let cases = [
            (response(100, 1), i32::MAX as usize, 1),
            (response(10, 2), 50, 1),
            (response(1024, 1), 1, 1),
            (response(11, 5), 20, 5),
            (response(15, 5), 10, 5),
            (response(10, 4), 35, 2),
        ];
        for (i, (resp, limit, want)) in cases.into_iter().enumerate() {
            let parts = split(resp, limit);
            assert_eq!(parts.len(), want, "case {i}: {:?}", event_counts(&parts));
            assert_only_last_unflagged(&parts);
        }
    }

    /// The whole response is split when its size (header included) reaches the limit, not only above it;
    /// a fragment also closes when adding an event would bring it to the limit.
    #[test]
    fn split_at_exactly_the_limit() {
        let header = Some(ResponseHeader { cluster_id: u64::MAX, member_id: 7, revision: 9, raft_term: 2 });
        let whole = WatchResponse { header, watch_id: 3, ..response(10, 4) };
        let size = whole.encoded_len();
        assert_eq!(split(whole.clone(), size + 1), vec![whole.clone()]);
        let parts = split(whole.clone(), size);
        assert_eq!(event_counts(&parts), [3, 1]);
        assert_only_last_unflagged(&parts);
        assert!(parts.iter().all(|p| p.header == header && p.watch_id == 3));

        // Each fragment is measured with its header and `fragment: true`: a limit one byte above
        // three events' fragment keeps three together.
        let three = split(whole.clone(), size)[0].encoded_len();
        assert_eq!(event_counts(&split(whole.clone(), three + 1)), [3, 1]);
        assert_eq!(event_counts(&split(whole, three)), [2, 2]);
    }

    /// A single event larger than the limit travels alone, and so do its oversized neighbours.
    #[test]
    fn split_keeps_at_least_one_event_per_fragment() {
        let parts = split(response(1000, 3), 100);
        assert_eq!(event_counts(&parts), [1, 1, 1]);
        assert_only_last_unflagged(&parts);
    }

    /// The limit is `--max-request-bytes` plus etcd's 512 KiB gRPC overhead allowance: etcd splits a
    /// 200-key delete of 3 KB values with prev_kv at --max-request-bytes=4096 into 173 + 27 events
    /// (with the flag alone as the limit it would be 200 one-event fragments).
    #[test]
    fn fragment_limit_includes_grpc_overhead() {
        let header = Some(ResponseHeader { cluster_id: u64::MAX, member_id: u64::MAX, revision: 202, raft_term: 2 });
        let events: Vec<Event> = (0..200)
            .map(|i| {
                let key = format!("fr/{i:06}").into_bytes();
                let mut value = format!("v{i}").into_bytes();
                value.resize(3_000, b'.');
                let rev = i as i64 + 2;
                let prev =
                    KeyValue { key: key.clone(), create_revision: rev, mod_revision: rev, version: 1, value, lease: 0 };
                Event {
                    r#type: EventType::Delete as i32,
                    kv: Some(KeyValue { key, mod_revision: 202, ..Default::default() }),
                    prev_kv: Some(prev),
                }
            })
            .collect();
        let parts = fragments(0, header, events.clone(), 4096);
        assert_eq!(event_counts(&parts), [173, 27]);
        assert_only_last_unflagged(&parts);

        // Under the flag plus the allowance, a response goes whole even though it exceeds the flag.
        let small = fragments(0, header, events[..100].to_vec(), 4096);
        assert_eq!(event_counts(&small), [100]);
        assert!(!small[0].fragment);
    }
}
