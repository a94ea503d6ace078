//! Bounds on client connections: how many a listener holds, how long one may stay silent, and the
//! HTTP/2 settings etcd's flags name (`--grpc-keepalive-*`, `--max-concurrent-streams`).
//!
//! Each accepted connection takes a slot of its listener's `--max-client-connections` at once. A
//! connection *proves* itself when the server answers one of its requests (`answered.rs`) or when
//! its TLS handshake verified a client certificate. When the listener is full, a new connection
//! takes the slot of the oldest connection that has not proved itself, which is closed (and
//! counted); only when every slot is held by a proved connection is the new one closed instead. So
//! connections holding half-sent requests cannot lock real clients out, while clients that were
//! answered (an idle watch among them) are never closed for a newcomer. Each connection is
//! `Watched`: one that sends no
//! byte for `--client-idle-timeout` is closed; until its first byte (the HTTP/2 preface, after the
//! TLS handshake on a TLS listener) the limit is `FIRST_BYTES_DEADLINE`, so a connection that never
//! speaks is gone within seconds. A live client that is quiet (an idle watch) still answers the
//! server's keepalive pings (`--grpc-keepalive-interval`), which counts as traffic: keep the idle
//! timeout above the keepalive interval plus its timeout (checked at startup, `config/connections.rs`).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use futures::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};
use tonic::transport::server::Connected;

use super::answered::AnswerScan;
use super::coalesce::Coalesced;
use super::tls::listener::TlsConnection;
use crate::frontend::answers::Answers;

/// How long a new connection may take to send its first byte.
pub(crate) const FIRST_BYTES_DEADLINE: Duration = Duration::from_secs(10);

/// The limits of every client listener (from the flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// `--max-client-connections`, per listener.
    pub max_connections: usize,
    /// `--client-idle-timeout`.
    pub idle_timeout: Duration,
    /// `--grpc-keepalive-interval`, `--grpc-keepalive-timeout`.
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    /// `--max-concurrent-streams`, per connection.
    pub max_concurrent_streams: u32,
}

impl Default for ConnectionLimits {
    fn default() -> ConnectionLimits {
        ConnectionLimits {
            max_connections: 10_000,
            idle_timeout: Duration::from_secs(3 * 3600),
            keepalive_interval: Duration::from_secs(2 * 3600),
            keepalive_timeout: Duration::from_secs(20),
            max_concurrent_streams: u32::MAX,
        }
    }
}

impl ConnectionLimits {
    /// The server's keepalive ping interval, if pings are on (`--grpc-keepalive-interval` 0: off).
    pub fn ping_interval(&self) -> Option<Duration> {
        (!self.keepalive_interval.is_zero()).then_some(self.keepalive_interval)
    }

    /// How long a ping may go unanswered before the connection is closed (0: no limit).
    pub fn ping_timeout(&self) -> Option<Duration> {
        (!self.keepalive_timeout.is_zero()).then_some(self.keepalive_timeout)
    }
}

/// The slots of one listener.
#[derive(Clone)]
pub struct Admission {
    slots: Arc<Slots>,
    limits: ConnectionLimits,
    /// What the connections' writes wait for (`coalesce.rs`): `None`, a turn before every write.
    answers: Option<&'static Answers>,
}

/// Whether a connection comes with a client certificate its TLS handshake verified: such a
/// connection has proved itself from the start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vouched {
    Certificate,
    Nothing,
}

impl Admission {
    pub fn new(limits: ConnectionLimits) -> Admission {
        Admission { slots: Arc::new(Slots::new(limits.max_connections)), limits, answers: None }
    }

    /// The connections' writes give way only while `answers` has some on their way (a member's
    /// listeners, whose answers come from its proposer and read rounds).
    pub fn giving_way_while(self, answers: &'static Answers) -> Admission {
        Admission { answers: Some(answers), ..self }
    }

    /// No cap and no idle timeout (peer listeners: raft's own timers judge peers).
    pub fn unbounded() -> Admission {
        let limits = ConnectionLimits {
            max_connections: usize::MAX,
            idle_timeout: Duration::from_secs(100 * 365 * 24 * 3600),
            ..ConnectionLimits::default()
        };
        Admission::new(limits)
    }

    /// The connection, watched and with its writes coalesced (`coalesce.rs`), if the listener has
    /// room for it (made by closing the oldest connection that has not proved itself, if need be);
    /// `None` closes it.
    pub fn admit<T>(&self, io: T, vouched: Vouched) -> Option<Watched<Coalesced<T>>> {
        match self.slots.take(vouched == Vouched::Certificate) {
            Some(slot) => {
                let io = match self.answers {
                    Some(answers) => Coalesced::watching(io, answers),
                    None => Coalesced::new(io),
                };
                Some(Watched::new(io, self.limits.idle_timeout, slot))
            }
            None => {
                crate::metrics::CLIENT_CONNECTIONS_REFUSED.inc();
                tracing::debug!(
                    limit = self.limits.max_connections,
                    "client connection refused: --max-client-connections reached, every connection answered"
                );
                None
            }
        }
    }
}

impl Admission {
    /// A TLS connection: vouched for if its handshake verified a client certificate.
    pub fn admit_tls(&self, conn: TlsConnection) -> Option<Watched<Coalesced<TlsConnection>>> {
        let vouched = if conn.client_certificate().is_some() { Vouched::Certificate } else { Vouched::Nothing };
        self.admit(conn, vouched)
    }
}

/// A listener's open connections, oldest first.
struct Slots {
    max: usize,
    open: Mutex<BTreeMap<u64, Arc<SlotState>>>,
    next_id: AtomicU64,
}

/// What a connection and its listener share.
#[derive(Default)]
struct SlotState {
    /// A request was answered on the connection, or it came with a verified certificate.
    proved: AtomicBool,
    /// The listener gave the slot to a newer connection: this one is to close.
    evicted: AtomicBool,
    /// The connection's reader, woken to close on eviction.
    reader: AtomicWaker,
}

impl Slots {
    fn new(max: usize) -> Slots {
        Slots { max, open: Mutex::new(BTreeMap::new()), next_id: AtomicU64::new(0) }
    }

    /// A slot for a new connection: a free one, or the oldest unproved connection's.
    fn take(self: &Arc<Self>, proved: bool) -> Option<Slot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.len() >= self.max {
            let oldest_unproved = open.iter().find(|(_, s)| !s.proved.load(Ordering::Acquire)).map(|(id, _)| *id)?;
            if let Some(evicted) = open.remove(&oldest_unproved) {
                evicted.evicted.store(true, Ordering::Release);
                evicted.reader.wake();
                crate::metrics::CLIENT_CONNECTIONS_EVICTED.inc();
                tracing::debug!(
                    limit = self.max,
                    "--max-client-connections reached: closed the oldest unanswered connection"
                );
            }
        }
        let state = Arc::new(SlotState { proved: AtomicBool::new(proved), ..SlotState::default() });
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        open.insert(id, state.clone());
        Some(Slot { slots: self.clone(), id, state })
    }
}

/// A connection's hold on its slot, given back when the connection is dropped.
struct Slot {
    slots: Arc<Slots>,
    id: u64,
    state: Arc<SlotState>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.open.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.id);
    }
}

/// The plain-TCP connections `socket` accepts, each with `TCP_NODELAY` set and admitted (or closed) by
/// `admission`. tonic ignores `tcp_nodelay` for custom incoming streams: unset, Nagle's algorithm
/// delays small responses (watch events) by tens of milliseconds.
pub fn admitted_tcp(
    socket: tokio::net::TcpListener,
    admission: Admission,
) -> impl futures::Stream<Item = io::Result<Watched<Coalesced<tokio::net::TcpStream>>>> {
    futures::StreamExt::filter_map(tokio_stream::wrappers::TcpListenerStream::new(socket), move |conn| {
        let admitted = conn
            .inspect(|tcp| {
                let _ = tcp.set_nodelay(true);
            })
            .map(|tcp| admission.admit(tcp, Vouched::Nothing))
            .transpose();
        std::future::ready(admitted)
    })
}

/// A client connection that is closed when the client stays silent too long, or when the listener
/// gives its slot to a newer connection before it proved itself.
pub struct Watched<T> {
    io: T,
    idle_timeout: Duration,
    /// When the client last sent bytes (`None`: never yet).
    last_read: Option<Instant>,
    /// Fires at the latest possible close; on firing the close is re-armed from `last_read` if the
    /// client spoke since (cheaper than resetting the timer on every read).
    deadline: Pin<Box<Sleep>>,
    slot: Slot,
    /// Watches the server's writes until a request is answered (then the connection has proved itself).
    scan: AnswerScan,
}

impl<T> Watched<T> {
    fn new(io: T, idle_timeout: Duration, slot: Slot) -> Watched<T> {
        let first = if idle_timeout > FIRST_BYTES_DEADLINE { FIRST_BYTES_DEADLINE } else { idle_timeout };
        let deadline = Box::pin(tokio::time::sleep(first));
        Watched { io, idle_timeout, last_read: None, deadline, slot, scan: AnswerScan::default() }
    }

    fn evicted(&self) -> bool {
        self.slot.state.evicted.load(Ordering::Acquire)
    }

    fn wrote(&mut self, bytes: &[u8]) {
        if !self.scan.answered() && self.scan.wrote(bytes) {
            self.slot.state.proved.store(true, Ordering::Release);
        }
    }
}

fn evicted_error() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "closed for a new connection: no request answered yet")
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        // Registered before the check: an eviction after it wakes this reader.
        self.slot.state.reader.register(cx.waker());
        if self.evicted() {
            return Poll::Ready(Err(evicted_error()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.last_read = Some(Instant::now());
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => loop {
                match self.deadline.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(()) => {
                        let idle_until = self.last_read.map(|at| at + self.idle_timeout);
                        match idle_until {
                            // The client spoke since the timer was armed: wait for the rest.
                            Some(until) if until > Instant::now() => self.deadline.as_mut().reset(until),
                            _ => {
                                crate::metrics::CLIENT_CONNECTIONS_IDLE_CLOSED.inc();
                                let idle = io::Error::new(io::ErrorKind::TimedOut, "client connection idle");
                                return Poll::Ready(Err(idle));
                            }
                        }
                    }
                }
            },
            other => other,
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.evicted() {
            return Poll::Ready(Err(evicted_error()));
        }
        let written = Pin::new(&mut self.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = written {
            self.wrote(&buf[..n]);
        }
        written
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.evicted() {
            return Poll::Ready(Err(evicted_error()));
        }
        let written = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(mut n)) = written {
            for buf in bufs {
                if n == 0 || self.scan.answered() {
                    break;
                }
                let part = n.min(buf.len());
                self.wrote(&buf[..part]);
                n -= part;
            }
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<T: Connected> Connected for Watched<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> T::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn limits(max_connections: usize, idle: Duration) -> ConnectionLimits {
        ConnectionLimits { max_connections, idle_timeout: idle, ..ConnectionLimits::default() }
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_is_closed_and_traffic_keeps_it_open() {
        let admission = Admission::new(limits(4, Duration::from_secs(60)));
        let (client, server) = tokio::io::duplex(64);
        let mut server = admission.admit(server, Vouched::Nothing).expect("room");
        let mut client = client;
        // Bytes within the first-bytes deadline, then within each idle timeout: still open.
        client.write_all(b"PRI").await.unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(server.read(&mut buf).await.unwrap(), 3);
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(50)).await;
            client.write_all(b"x").await.unwrap();
            assert_eq!(server.read(&mut buf).await.unwrap(), 1);
        }
        // Then silence: closed after the idle timeout.
        let err = server.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_never_speaks_is_closed_at_the_first_bytes_deadline() {
        let admission = Admission::new(limits(4, Duration::from_secs(3600)));
        let (_client, server) = tokio::io::duplex(64);
        let mut server = admission.admit(server, Vouched::Nothing).expect("room");
        let started = Instant::now();
        let mut buf = [0u8; 8];
        assert!(server.read(&mut buf).await.is_err());
        assert_eq!(started.elapsed(), FIRST_BYTES_DEADLINE);
    }

    /// An HTTP/2 DATA frame with a payload: the server answered a request.
    const ANSWER: &[u8] = b"\x00\x00\x01\x00\x00\x00\x00\x00\x01x";

    #[tokio::test]
    async fn when_full_the_oldest_unanswered_connection_gives_way_and_answered_ones_never_do() {
        let admission = Admission::new(limits(3, Duration::from_secs(60)));
        let (mut answered_client, answered) = tokio::io::duplex(64);
        let mut answered = admission.admit(answered, Vouched::Nothing).expect("1");
        let (_c2, oldest) = tokio::io::duplex(64);
        let mut oldest = admission.admit(oldest, Vouched::Nothing).expect("2");
        let (_c3, younger) = tokio::io::duplex(64);
        let mut younger = admission.admit(younger, Vouched::Nothing).expect("3");
        answered.write_all(ANSWER).await.unwrap();
        let mut buf = [0u8; 16];
        answered_client.read_exact(&mut buf[..ANSWER.len()]).await.unwrap();
        // Full: the fourth takes the oldest unanswered connection's slot, which closes.
        let (_c4, fourth) = tokio::io::duplex(64);
        let _fourth = admission.admit(fourth, Vouched::Nothing).expect("room made");
        assert_eq!(oldest.read(&mut buf).await.unwrap_err().kind(), io::ErrorKind::ConnectionAborted);
        // A verified certificate vouches from the start; the fifth takes the younger one's slot.
        let _fifth = admission.admit(tokio::io::duplex(8).1, Vouched::Certificate).expect("room made");
        assert!(younger.write_all(b"x").await.is_err(), "evicted");
        let _sixth = admission.admit(tokio::io::duplex(8).1, Vouched::Nothing).expect("the fourth gives way");
        // Now every slot is held by an answered or vouched connection, bar the sixth: it gives way,
        // then nobody does.
        let _seventh = admission.admit(tokio::io::duplex(8).1, Vouched::Certificate).expect("the sixth gives way");
        assert!(admission.admit(tokio::io::duplex(8).1, Vouched::Nothing).is_none(), "all proved: refused");
        // The answered connection was never touched.
        answered.write_all(ANSWER).await.unwrap();
        answered_client.read_exact(&mut buf[..ANSWER.len()]).await.unwrap();
        drop(answered);
        assert!(admission.admit(tokio::io::duplex(8).1, Vouched::Nothing).is_some(), "room again once one closed");
    }
}
