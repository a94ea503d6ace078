//! Responses that complete together leave in one write.
//!
//! Under load a committed entry answers many requests at once, and each answer is finished by its own
//! stream task. The connection task, woken by the first of them, would write that one response at
//! once (tokio runs a task woken by the running one next), paying a `writev` and a client-side read
//! per response. Before writing, a connection lets the tasks already waiting to run go first (one
//! yield): the responses they finish join the same write.
//!
//! A member's connections give way only while answers are on their way to other handlers
//! (`frontend/answers.rs`). A response finished alone goes out at once: a task that wakes itself is queued as
//! work another worker may steal, and tokio wakes a parked worker for it, which with one client cost a
//! futex or eventfd wake-up for nothing on every response. The proxy cannot tell when its upstream's
//! responses are about to finish together, so its connections give way before every write.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

use crate::frontend::answers::Answers;

/// A connection whose writes wait for one turn of the scheduler first.
pub struct Coalesced<T> {
    io: T,
    /// This write already gave way once: the next attempt goes to the socket.
    yielded: bool,
    /// Gives way only while these have some on their way; `None`: before every write.
    answers: Option<&'static Answers>,
}

impl<T> Coalesced<T> {
    /// Gives way before every write.
    pub fn new(io: T) -> Coalesced<T> {
        Coalesced { io, yielded: false, answers: None }
    }

    /// Gives way while `answers` has some on their way.
    pub fn watching(io: T, answers: &'static Answers) -> Coalesced<T> {
        Coalesced { io, yielded: false, answers: Some(answers) }
    }

    /// `Pending` once per write (while answers are on their way, if it watches them), with this task
    /// woken again behind the tasks ready to run (a task that wakes itself is queued last); `Ready` the
    /// second time, and at once when no answer it watches is on its way.
    fn give_way(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.yielded || self.answers.is_some_and(|answers| !answers.on_their_way()) {
            return Poll::Ready(());
        }
        self.yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    fn wrote<R>(&mut self, result: Poll<R>) -> Poll<R> {
        if result.is_ready() {
            self.yielded = false;
        }
        result
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Coalesced<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Coalesced<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        std::task::ready!(self.give_way(cx));
        let result = Pin::new(&mut self.io).poll_write(cx, buf);
        self.wrote(result)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        std::task::ready!(self.give_way(cx));
        let result = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.wrote(result)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<T: Connected> Connected for Coalesced<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> T::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use futures::task::{waker, ArcWake};
    use tokio::io::AsyncReadExt;

    use super::*;

    struct Count(AtomicUsize);

    impl ArcWake for Count {
        fn wake_by_ref(this: &Arc<Self>) {
            this.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn a_response_finished_alone_goes_out_at_once() {
        static ANSWERS: Answers = Answers::new();
        let (near, mut far) = tokio::io::duplex(1024);
        let mut conn = Coalesced::watching(near, &ANSWERS);
        let wakes = Arc::new(Count(AtomicUsize::new(0)));
        let waker = waker(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        match Pin::new(&mut conn).poll_write(&mut cx, b"alone") {
            Poll::Ready(Ok(n)) => assert_eq!(n, 5),
            other => panic!("no answer is on its way, so nothing to wait for: {other:?}"),
        }
        assert_eq!(wakes.0.load(Ordering::SeqCst), 0, "and no wake-up");
        let mut got = [0; 5];
        far.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"alone");
    }

    #[tokio::test]
    async fn a_connection_watching_no_answers_gives_way_before_every_write() {
        let (near, _far) = tokio::io::duplex(1024);
        let mut conn = Coalesced::new(near);
        let wakes = Arc::new(Count(AtomicUsize::new(0)));
        let waker = waker(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut conn).poll_write(&mut cx, b"proxied").is_pending(), "gives way");
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
        assert!(matches!(Pin::new(&mut conn).poll_write(&mut cx, b"proxied"), Poll::Ready(Ok(7))));
    }

    #[tokio::test]
    async fn each_write_gives_way_once_and_then_goes_out_whole() {
        static ANSWERS: Answers = Answers::new();
        let _another = ANSWERS.hand();
        let (near, mut far) = tokio::io::duplex(1024);
        let mut conn = Coalesced::watching(near, &ANSWERS);
        let wakes = Arc::new(Count(AtomicUsize::new(0)));
        let waker = waker(wakes.clone());
        let mut cx = Context::from_waker(&waker);

        for message in [&b"first"[..], b"second"] {
            let before = wakes.0.load(Ordering::SeqCst);
            assert!(Pin::new(&mut conn).poll_write(&mut cx, message).is_pending(), "gives way first");
            assert_eq!(wakes.0.load(Ordering::SeqCst), before + 1, "and asks to be polled again");
            match Pin::new(&mut conn).poll_write(&mut cx, message) {
                Poll::Ready(Ok(n)) => assert_eq!(n, message.len()),
                other => panic!("the second attempt writes: {other:?}"),
            }
            let mut got = vec![0; message.len()];
            far.read_exact(&mut got).await.unwrap();
            assert_eq!(got, message);
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn responses_finished_meanwhile_share_the_write() {
        // The connection's task is ready to write one response while another task, ready too,
        // finishes a second one (as stream tasks do in tonic): the write waits and carries both.
        static ANSWERS: Answers = Answers::new();
        let (near, mut far) = tokio::io::duplex(1024);
        let queued = Arc::new(std::sync::Mutex::new(b"one;".to_vec()));
        let second = ANSWERS.hand(); // the answer the second stream task is about to take
        let connection = tokio::spawn({
            let queued = queued.clone();
            let mut conn = Coalesced::watching(near, &ANSWERS);
            async move {
                std::future::poll_fn(|cx| {
                    let mut queued = queued.lock().unwrap();
                    let written = std::task::ready!(Pin::new(&mut conn).poll_write(cx, &queued))?;
                    queued.drain(..written);
                    Poll::Ready(Ok::<_, io::Error>(written))
                })
                .await
            }
        });
        let stream = tokio::spawn({
            let queued = queued.clone();
            async move {
                drop(second);
                queued.lock().unwrap().extend_from_slice(b"two;")
            }
        });
        stream.await.unwrap();
        assert_eq!(connection.await.unwrap().unwrap(), 8, "one write for both responses");
        let mut got = [0; 8];
        far.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"one;two;");
    }
}
