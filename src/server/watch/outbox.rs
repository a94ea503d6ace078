//! A watch stream's queue of responses to its client, bounded in count and in bytes.
//!
//! Every watcher of a stream and the stream itself queue here; the client's reads (tonic pulling the
//! stream) drain it. A queue bounded in count only holds 256 responses of any size (two never-read
//! streams with `prev_kv` over 400 KB values pinned 641 MiB); here each response also takes its
//! encoded size from the stream's byte budget, given back when tonic takes it out. A sender waits for
//! room: a watcher that waits leaves the live fan-out and later catches up (`watch_hub/`). A response
//! larger than the whole budget takes all of it, and so goes alone.
//!
//! The stream can also be ended with an error (`Outbox::end_with`: no leader, too many requests):
//! the error goes out ahead of what is queued, as etcd's handler returns it, and ends the stream.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use futures::Stream;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tonic::Status;

use super::wire::WatchReply;

/// Responses queued per stream at most.
pub(crate) const STREAM_RESPONSES: usize = 256;
/// Bytes of encoded responses queued per stream at most (a larger response goes alone).
pub(crate) const STREAM_BYTES: usize = 4 << 20;

/// The sending side, shared by the stream's watchers.
#[derive(Clone)]
pub(crate) struct Outbox {
    queue: mpsc::Sender<Queued>,
    room: Arc<Semaphore>,
    bytes: usize,
    /// Ends the stream with an error (taken by the first `end_with`).
    end: Arc<Mutex<Option<oneshot::Sender<Status>>>>,
}

/// The receiving side: the response stream tonic sends.
pub(crate) struct Replies {
    queue: mpsc::Receiver<Queued>,
    /// `None` once it fired or can no longer fire.
    ended: Option<oneshot::Receiver<Status>>,
    /// The stream ended with an error: nothing follows it.
    failed: bool,
}

struct Queued {
    reply: Result<WatchReply, Status>,
    /// Its share of the byte budget, given back when the reply is taken out.
    _room: OwnedSemaphorePermit,
}

/// The client is gone.
#[derive(Debug)]
pub(crate) struct Gone;

/// A queue of at most `responses` responses and `bytes` bytes.
pub(crate) fn outbox(responses: usize, bytes: usize) -> (Outbox, Replies) {
    let (queue, receiver) = mpsc::channel(responses);
    let bytes = bytes.clamp(1, u32::MAX as usize);
    let (end, ended) = oneshot::channel();
    let end = Arc::new(Mutex::new(Some(end)));
    (
        Outbox { queue, room: Arc::new(Semaphore::new(bytes)), bytes, end },
        Replies { queue: receiver, ended: Some(ended), failed: false },
    )
}

impl Outbox {
    /// Queues `reply` once there is room for it; `Gone` when the client went away first.
    pub(crate) async fn send(&self, reply: Result<WatchReply, Status>) -> Result<(), Gone> {
        let size = reply.as_ref().map_or(0, WatchReply::encoded_len).clamp(1, self.bytes);
        // `bytes` fits in u32 (see `outbox`).
        let size = u32::try_from(size).unwrap_or(u32::MAX);
        let room = tokio::select! {
            room = self.room.clone().acquire_many_owned(size) => room.map_err(|_| Gone)?,
            _ = self.queue.closed() => return Err(Gone),
        };
        self.queue.send(Queued { reply, _room: room }).await.map_err(|_| Gone)
    }

    /// Resolves when the client is gone.
    pub(crate) async fn closed(&self) {
        self.queue.closed().await
    }

    /// Ends the stream with `status`, ahead of what is still queued (only the first call counts).
    pub(crate) fn end_with(&self, status: Status) {
        if let Some(end) = self.end.lock().unwrap_or_else(PoisonError::into_inner).take() {
            let _ = end.send(status);
        }
    }
}

impl Stream for Replies {
    type Item = Result<WatchReply, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(ended) = self.ended.as_mut() {
            if let Poll::Ready(status) = Pin::new(ended).poll(cx) {
                self.ended = None;
                if let Ok(status) = status {
                    // Closing the queue tells every sender that the client is gone.
                    self.queue.close();
                    self.failed = true;
                    return Poll::Ready(Some(Err(status)));
                }
            }
        }
        if self.failed {
            return Poll::Ready(None);
        }
        self.queue.poll_recv(cx).map(|queued| queued.map(|q| q.reply))
    }
}

#[cfg(test)]
impl Replies {
    pub(crate) async fn recv(&mut self) -> Option<Result<WatchReply, Status>> {
        self.queue.recv().await.map(|q| q.reply)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn reply(bytes: usize) -> Result<WatchReply, Status> {
        let header = None;
        let events = vec![bytes::Bytes::from(vec![0u8; bytes])];
        Ok(WatchReply::Events { header, watch_id: 0, events })
    }

    #[tokio::test]
    async fn waits_for_room_in_bytes_and_goes_on_once_read() {
        let (out, mut replies) = outbox(100, 1000);
        out.send(reply(600)).await.unwrap();
        out.send(reply(300)).await.unwrap();
        // 900 of 1,000 bytes queued: 200 more do not fit.
        let blocked = tokio::time::timeout(Duration::from_millis(100), out.send(reply(200))).await;
        assert!(blocked.is_err(), "queued past the byte bound");
        assert!(replies.recv().await.is_some());
        tokio::time::timeout(Duration::from_secs(10), out.send(reply(200))).await.unwrap().unwrap();
        // Larger than the whole budget: waits for an empty queue, then goes alone.
        let big = tokio::spawn({
            let out = out.clone();
            async move { out.send(reply(5000)).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!big.is_finished());
        replies.recv().await.unwrap().unwrap();
        replies.recv().await.unwrap().unwrap();
        big.await.unwrap().unwrap();
        let whole = replies.recv().await.unwrap().unwrap();
        assert!(matches!(whole, WatchReply::Events { events, .. } if events[0].len() == 5000));
        drop(replies);
        assert!(out.send(reply(10)).await.is_err(), "the client is gone");
    }
}
