//! The Watch service: one bidirectional stream carries many watchers.
//!
//! Each watcher is a task that owns `next`, the first revision it has not delivered yet, which makes
//! delivery exactly-once and in order:
//! 1. it registers with the member's watch hub (`watch_hub/`), unsynced,
//! 2. catches up while `next` is behind the hub: from the hub's backlog of recent batches, else from
//!    LMDB, a bounded batch at a time,
//! 3. then joins the hub's synced watchers, which the hub wakes only for the batches that touch their
//!    range; if it cannot keep up (its client does not read, and the stream's queue, bounded in bytes,
//!    `outbox.rs`, stays full), the hub drops it back to step 2 instead of holding events for it.
//!
//! A watcher whose `next` has been compacted away is canceled with `compact_revision` set, never
//! silently skipped forward.
//!
//! Its files, top down:
//! - `mod.rs`: the service, and the tonic server that serves it on `wire.rs`'s codec.
//! - `stream.rs`: one client stream: reads its requests, creates and cancels its watchers, answers
//!   progress requests once its watchers have settled.
//! - `watcher.rs`: one watcher: its state, its loop (synced or catching up), the permission re-check,
//!   sending its events.
//! - `from_hub.rs`: delivering the hub's batches: live while synced, from the hub's backlog to catch up.
//! - `from_store.rs`: replaying from LMDB what the hub no longer holds.
//! - `fragments.rs`: etcd's splitting of a large response, for a watcher created with `fragment`.
//! - `outbox.rs`: the stream's queue of responses, bounded in count and in bytes.
//! - `wire.rs`: the responses' encoding (a batch's events are encoded once for every watcher).
//!
//! `watcher.rs`, `from_hub.rs` and `from_store.rs` each hold an `impl Watcher` block: one watcher's
//! methods, split by where the events come from.

mod fragments;
mod from_hub;
mod from_store;
mod outbox;
mod stream;
mod watcher;
mod wire;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use tonic::codegen::{http, Body, BoxFuture, Service, StdError};
use tonic::server::{Grpc, NamedService, StreamingService};
use tonic::{Request, Response, Status, Streaming};

use self::outbox::{outbox, STREAM_BYTES, STREAM_RESPONSES};
use self::stream::WatchStream;
use self::wire::{WatchCodec, WatchReply};
use super::read_ahead::read_ahead;
use super::require_leader::{leader_lost, stream_requires_leader};
use super::stream_credential::StreamCredential;
use crate::node::Node;
use crate::proto::etcdserverpb::WatchRequest;
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
        if stream_requires_leader(request.metadata()) {
            let (node, out) = (self.node.clone(), out.clone());
            tokio::spawn(async move {
                tokio::select! {
                    status = leader_lost(&node) => out.end_with(status),
                    _ = out.closed() => {}
                }
            });
        }
        let stream = WatchStream::new(self.node.clone(), who, out);
        tokio::spawn(stream.run(read_ahead(request.into_inner())));
        Ok(Response::new(Box::pin(replies)))
    }
}

pub(crate) type ReplyStream = Pin<Box<dyn Stream<Item = Result<WatchReply, Status>> + Send>>;

/// etcd's `etcdserverpb.Watch` service on `WatchCodec` (`wire.rs`): what tonic generates for a
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
