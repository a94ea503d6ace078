//! A client stream's requests read as they arrive (watch creates, lease keep-alives), queued here
//! until their handler takes them.
//!
//! Why: h2 charges every small DATA frame it holds unread against a per-connection budget (its
//! defence against a peer that makes the server buffer many tiny frames) and ends the whole
//! connection with `GOAWAY(ENHANCE_YOUR_CALM)` when it runs out, at about 2,300 unread frames of a
//! 1 MiB connection window. A watch create or a keep-alive is one such frame, and its handler is
//! slower than the network (a create reads the permissions, a keep-alive may ask the leader): 10,000
//! creates sent at once ended the connection, every other stream on it with it. Here a task moves
//! each request out of h2 as soon as it arrives, so h2 holds none for long, and the requests wait
//! decoded, counted in bytes. A stream with more than `READ_AHEAD_BYTES` waiting (its client sends
//! faster than the member serves it, for long) ends alone with etcd's `too many requests`: the
//! member's memory stays bounded and the connection's other streams go on.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tonic::{Status, Streaming};

use crate::error::EtcdError;

/// Bytes of requests one stream may have waiting (decoded size plus `PER_REQUEST_BYTES` each): at
/// 90 bytes a watch create, about 180,000 creates.
pub(crate) const READ_AHEAD_BYTES: usize = 16 << 20;
/// What a waiting request costs beyond its encoded size (its allocation and its place in the queue).
const PER_REQUEST_BYTES: usize = 64;

/// The requests of a stream, read ahead.
pub(crate) struct ReadAhead<T> {
    queue: mpsc::UnboundedReceiver<Waiting<T>>,
}

struct Waiting<T> {
    request: Result<T, Status>,
    /// Its share of the stream's budget, given back when the handler takes it.
    _room: Option<OwnedSemaphorePermit>,
}

/// Starts reading `incoming` into a queue of at most `budget` bytes.
pub(crate) fn read_ahead<T>(mut incoming: Streaming<T>, budget: usize) -> ReadAhead<T>
where
    T: prost::Message + Send + 'static,
{
    let (queue, receiver) = mpsc::unbounded_channel();
    let room = Arc::new(Semaphore::new(budget.clamp(1, Semaphore::MAX_PERMITS)));
    tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                next = incoming.next() => next,
                // The handler is gone: stop reading.
                _ = queue.closed() => return,
            };
            let Some(request) = next else { return };
            let Ok(request) = request else {
                let _ = queue.send(Waiting { request, _room: None });
                return;
            };
            let size = u32::try_from(request.encoded_len() + PER_REQUEST_BYTES).unwrap_or(u32::MAX);
            let Ok(permit) = room.clone().try_acquire_many_owned(size) else {
                tracing::warn!(budget, "a client stream sent more requests than the member could queue; ending it");
                let request = Err(Status::from(EtcdError::TooManyRequests));
                let _ = queue.send(Waiting { request, _room: None });
                return;
            };
            if queue.send(Waiting { request: Ok(request), _room: Some(permit) }).is_err() {
                return;
            }
        }
    });
    ReadAhead { queue: receiver }
}

impl<T> Stream for ReadAhead<T> {
    type Item = Result<T, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.queue.poll_recv(cx).map(|waiting| waiting.map(|w| w.request))
    }
}
