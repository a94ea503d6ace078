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
//! decoded, counted in bytes.
//!
//! The queue is bounded twice: per stream (`STREAM_BYTES`) and for the whole member
//! (`MEMBER_BYTES`), since a client may open as many streams as `--max-concurrent-streams` allows
//! and flow control no longer holds it back once its requests are read. A stream out of room waits
//! until its handler has taken every request queued before, then queues one alone: it reads one
//! request at a time, as without read-ahead, and h2's flow control holds the client back again.
//! Nothing is refused and no stream is ended for sending fast.

use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tonic::Status;

/// Bytes of requests one stream may have waiting (decoded size plus `PER_REQUEST_BYTES` each): at
/// 90 bytes a watch create, about 27,000 creates.
const STREAM_BYTES: u32 = 4 << 20;
/// Bytes of requests all the member's streams together may have waiting.
const MEMBER_BYTES: usize = 64 << 20;
/// What a waiting request costs beyond its encoded size (its allocation and its place in the queue).
const PER_REQUEST_BYTES: usize = 64;

/// The member's room for requests read ahead, shared by every stream of every connection.
static MEMBER_ROOM: LazyLock<Arc<Semaphore>> = LazyLock::new(|| Arc::new(Semaphore::new(MEMBER_BYTES)));

/// The requests of a stream, read ahead.
pub(crate) struct ReadAhead<T> {
    queue: mpsc::UnboundedReceiver<Waiting<T>>,
}

struct Waiting<T> {
    request: Result<T, Status>,
    /// Its share of the stream's and the member's room, given back when the handler takes it.
    _room: Vec<OwnedSemaphorePermit>,
}

/// Starts reading `incoming` (a client stream's requests) into a queue.
pub(crate) fn read_ahead<T, S>(incoming: S) -> ReadAhead<T>
where
    T: prost::Message + Send + 'static,
    S: Stream<Item = Result<T, Status>> + Send + Unpin + 'static,
{
    read_ahead_within(incoming, STREAM_BYTES, MEMBER_ROOM.clone())
}

fn read_ahead_within<T, S>(mut incoming: S, stream_bytes: u32, member: Arc<Semaphore>) -> ReadAhead<T>
where
    T: prost::Message + Send + 'static,
    S: Stream<Item = Result<T, Status>> + Send + Unpin + 'static,
{
    let (queue, receiver) = mpsc::unbounded_channel();
    let stream_bytes = stream_bytes.max(1);
    let stream = Arc::new(Semaphore::new(stream_bytes as usize));
    tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                next = incoming.next() => next,
                // The handler is gone: stop reading.
                _ = queue.closed() => return,
            };
            let Some(request) = next else { return };
            let Ok(request) = request else {
                let _ = queue.send(Waiting { request, _room: Vec::new() });
                return;
            };
            let size = u32::try_from(request.encoded_len() + PER_REQUEST_BYTES).unwrap_or(u32::MAX);
            let room = match room_for(&stream, &member, size) {
                Some(room) => room,
                // Out of room: once the handler has taken everything queued before (the stream's
                // whole room is back), this one goes alone, holding that room so the next waits too.
                None => tokio::select! {
                    all = stream.clone().acquire_many_owned(stream_bytes) => match all {
                        Ok(all) => vec![all],
                        Err(_) => return,
                    },
                    _ = queue.closed() => return,
                },
            };
            if queue.send(Waiting { request: Ok(request), _room: room }).is_err() {
                return;
            }
        }
    });
    ReadAhead { queue: receiver }
}

/// `size` bytes of both the stream's and the member's room, or none of either.
fn room_for(stream: &Arc<Semaphore>, member: &Arc<Semaphore>, size: u32) -> Option<Vec<OwnedSemaphorePermit>> {
    let own = stream.clone().try_acquire_many_owned(size).ok()?;
    let shared = member.clone().try_acquire_many_owned(size).ok()?;
    Some(vec![own, shared])
}

impl<T> Stream for ReadAhead<T> {
    type Item = Result<T, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.queue.poll_recv(cx).map(|waiting| waiting.map(|w| w.request))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use prost::Message;

    use super::*;
    use crate::proto::etcdserverpb::LeaseKeepAliveRequest;

    /// A client sending keep-alives 1..=n as fast as the member reads them; `read` counts those read.
    fn flooding_client(
        n: i64,
        read: Arc<AtomicUsize>,
    ) -> impl Stream<Item = Result<LeaseKeepAliveRequest, Status>> + Send + Unpin + 'static {
        futures::stream::iter(1..=n).map(move |id| {
            read.fetch_add(1, Ordering::SeqCst);
            Ok(LeaseKeepAliveRequest { id })
        })
    }

    /// Eight streams flood a member whose room is smaller than their rooms together, and no handler
    /// takes anything: what is read stays within the rooms (the member's memory is bounded however
    /// many streams a client opens). Then every stream gets all its requests, in order, none refused
    /// (before, a stream out of room was ended with `too many requests`).
    #[tokio::test]
    async fn a_flood_on_many_streams_is_held_within_the_rooms_and_loses_nothing() {
        let (streams, requests, stream_room, member_room) = (8, 5_000, 1_000, 4_000);
        let member = Arc::new(Semaphore::new(member_room));
        let reads: Vec<_> = (0..streams).map(|_| Arc::new(AtomicUsize::new(0))).collect();
        let mut queues: Vec<_> = reads
            .iter()
            .map(|read| read_ahead_within(flooding_client(requests, read.clone()), stream_room, member.clone()))
            .collect();
        for _ in 0..10_000 {
            tokio::task::yield_now().await;
        }
        let size = LeaseKeepAliveRequest { id: requests }.encoded_len() + PER_REQUEST_BYTES;
        // Per stream: its room's worth, one queued alone, one read and waiting for room.
        let per_stream = stream_room as usize / size + 2;
        let total: usize = reads.iter().map(|r| r.load(Ordering::SeqCst)).sum();
        for read in &reads {
            assert!(read.load(Ordering::SeqCst) <= per_stream, "a stream read {read:?} requests ahead");
        }
        assert!(total <= member_room / size + 2 * streams, "the streams read {total} requests ahead together");
        assert!(total >= streams, "every stream reads ahead");
        for queue in &mut queues {
            let mut ids = Vec::new();
            while let Some(request) = queue.next().await {
                ids.push(request.expect("no request is refused").id);
            }
            assert_eq!(ids, (1..=requests).collect::<Vec<_>>());
        }
        assert_eq!(member.available_permits(), member_room, "every byte of room is given back");
    }
}
