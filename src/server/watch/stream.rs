//! One client's watch stream: reads its requests in order, creates and cancels its watchers (each a
//! task of its own, `watcher.rs`), answers progress requests, and stops its watchers when the client
//! is gone. Creation is where a watch is refused: an empty range, a duplicate id, a credential that
//! does not stand or lacks read permission on the whole range.
//!
//! A progress request (`RequestProgress`) is answered as etcd 3.5.13 answers it: at a revision up to
//! which every watcher of the stream has had all its events queued (`WatchHub::progress`), so the
//! response is never ahead of an event not yet sent (etcd #15695). While one is catching up or
//! sending, the answer is deferred (more requests meanwhile get that one answer) until the watchers
//! have settled, whether or not events came through (etcd #17566). A stream without watchers gets no
//! answer, as in etcd 3.5.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use tokio::sync::{oneshot, Notify};
use tokio::task::JoinHandle;
use tonic::Status;

use super::outbox::Outbox;
use super::watcher::Watcher;
use crate::auth::permissions::Access;
use crate::keyrange::KeyRange;
use crate::node::Node;
use crate::proto::etcdserverpb::watch_request::RequestUnion;
use crate::proto::etcdserverpb::{WatchCreateRequest, WatchRequest, WatchResponse};
use crate::server::read_ahead::ReadAhead;
use crate::server::stream_credential::StreamCredential;
use crate::watch_hub::index::WatcherId;

/// etcd's id for responses that belong to no watcher (progress responses to a progress request).
const INVALID_WATCH_ID: i64 = -1;

struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
    /// Its id in the member's watch hub.
    in_hub: WatcherId,
}

/// What woke a stream: a request (or the end of them), or a change a deferred progress waits for.
enum Woken {
    Request(Option<Result<WatchRequest, Status>>),
    Progress,
}

/// One client stream: reads requests, starts and stops watchers.
pub(super) struct WatchStream {
    node: Arc<Node>,
    who: Result<StreamCredential, String>,
    out: Outbox,
    watchers: HashMap<i64, Running>,
    next_id: i64,
    /// A progress request waits for the watchers to settle and for the hub to reach this revision
    /// (the member's when the request came).
    progress_deferred: Option<i64>,
    /// Told by a watcher each time it settles (`Watcher::settled`).
    settled: Arc<Notify>,
}

impl WatchStream {
    pub(super) fn new(node: Arc<Node>, who: Result<StreamCredential, String>, out: Outbox) -> Self {
        let settled = Arc::new(Notify::new());
        WatchStream { node, who, out, watchers: HashMap::new(), next_id: 0, progress_deferred: None, settled }
    }

    /// Serves the stream's requests (read ahead of their handling: `read_ahead.rs`) until the client
    /// is gone. A request the stream cannot take (an error reading it, too many waiting) ends it with
    /// that error.
    pub(super) async fn run(mut self, mut requests: ReadAhead<WatchRequest>) {
        let mut hub_revision = self.node.watch_hub.revisions();
        loop {
            let settled = self.settled.clone();
            let deferred = self.progress_deferred.is_some();
            let woken = tokio::select! {
                req = requests.next() => Woken::Request(req),
                _ = settled.notified(), if deferred => Woken::Progress,
                _ = hub_revision.changed(), if deferred => Woken::Progress,
            };
            let req = match woken {
                Woken::Progress => {
                    if self.progress().await {
                        continue;
                    }
                    break;
                }
                Woken::Request(Some(Ok(req))) => req,
                Woken::Request(Some(Err(status))) => {
                    self.end_with(status);
                    break;
                }
                Woken::Request(None) => break,
            };
            let sent = match req.request_union {
                Some(RequestUnion::CreateRequest(create)) => self.create(create).await,
                Some(RequestUnion::CancelRequest(cancel)) => self.cancel(cancel.watch_id).await,
                // One answer for the requests made while one is deferred, as etcd.
                Some(RequestUnion::ProgressRequest(_)) if self.progress_deferred.is_some() => true,
                Some(RequestUnion::ProgressRequest(_)) => {
                    self.progress_deferred = Some(self.node.revision());
                    self.progress().await
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

    /// Ends the stream with `status` ahead of what it still has queued.
    fn end_with(&self, status: Status) {
        self.out.end_with(status);
    }

    /// Answers the deferred progress request if every watcher has settled and the hub has reached
    /// the request's revision; false when the client is gone.
    async fn progress(&mut self) -> bool {
        let Some(wanted) = self.progress_deferred else { return true };
        let watchers: Vec<WatcherId> = self.watchers.values().map(|running| running.in_hub).collect();
        if watchers.is_empty() {
            // etcd 3.5 (`progressIfSync` over no watchers) answers nothing.
            self.progress_deferred = None;
            return true;
        }
        let Some(revision) = self.node.watch_hub.progress(&watchers).filter(|&at| at >= wanted) else { return true };
        self.progress_deferred = None;
        self.send(WatchResponse {
            header: self.node.header(revision),
            watch_id: INVALID_WATCH_ID,
            ..Default::default()
        })
        .await
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
        let watcher = Watcher::new(id, range.clone(), &req, rev, who, &self.node, self.settled.clone());
        let hub = self.node.watch_hub.register(range);
        let in_hub = hub.id();
        let (stop, stopped) = oneshot::channel();
        let task = watcher.spawn(self.node.clone(), hub, self.out.clone(), stopped);
        self.watchers.insert(id, Running { stop, task, in_hub });
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
