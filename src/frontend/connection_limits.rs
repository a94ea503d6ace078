//! Bounds on client connections: how many a listener holds, how long one may stay silent, and the
//! HTTP/2 settings etcd's flags name (`--grpc-keepalive-*`, `--max-concurrent-streams`).
//!
//! Each accepted connection holds a permit of its listener's `--max-client-connections`; beyond it a
//! new connection is closed at once (and counted). Each connection is `Watched`: one that sends no
//! byte for `--client-idle-timeout` is closed; until its first byte (the HTTP/2 preface, after the
//! TLS handshake on a TLS listener) the limit is `FIRST_BYTES_DEADLINE`, so a connection that never
//! speaks is gone within seconds. A live client that is quiet (an idle watch) still answers the
//! server's keepalive pings (`--grpc-keepalive-interval`), which counts as traffic: keep the idle
//! timeout above the keepalive interval plus its timeout (checked at startup).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tonic::transport::server::Connected;

use super::coalesce::Coalesced;
use crate::answers::Answers;

/// How long a new connection may take to send its first byte.
pub const FIRST_BYTES_DEADLINE: Duration = Duration::from_secs(10);

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
    /// The limits from their flags' values (durations in Go's syntax, as etcd takes them), checked
    /// as the member and the proxy both need them: errors name the flag.
    pub fn from_flags(
        max_connections: usize,
        idle_timeout: &str,
        keepalive_interval: &str,
        keepalive_timeout: &str,
        max_concurrent_streams: u32,
    ) -> Result<ConnectionLimits, String> {
        let duration = |flag: &str, text: &str| {
            crate::auth::token_config::parse_go_duration(text).map_err(|e| format!("--{flag}: {e}"))
        };
        let limits = ConnectionLimits {
            max_connections,
            idle_timeout: duration("client-idle-timeout", idle_timeout)?,
            keepalive_interval: duration("grpc-keepalive-interval", keepalive_interval)?,
            keepalive_timeout: duration("grpc-keepalive-timeout", keepalive_timeout)?,
            max_concurrent_streams,
        };
        if limits.max_connections == 0 || limits.max_concurrent_streams == 0 {
            return Err("--max-client-connections and --max-concurrent-streams must be at least 1".into());
        }
        if limits.idle_timeout.is_zero() {
            return Err("--client-idle-timeout must be above 0".into());
        }
        if !limits.keepalive_interval.is_zero()
            && limits.idle_timeout <= limits.keepalive_interval + limits.keepalive_timeout
        {
            return Err(format!(
                "--client-idle-timeout {idle_timeout} must be above --grpc-keepalive-interval + --grpc-keepalive-timeout, \
                 or quiet live clients (an idle watch) are cut off"
            ));
        }
        Ok(limits)
    }

    /// The server's keepalive ping interval, if pings are on (`--grpc-keepalive-interval` 0: off).
    pub fn ping_interval(&self) -> Option<Duration> {
        (!self.keepalive_interval.is_zero()).then_some(self.keepalive_interval)
    }

    /// How long a ping may go unanswered before the connection is closed (0: no limit).
    pub fn ping_timeout(&self) -> Option<Duration> {
        (!self.keepalive_timeout.is_zero()).then_some(self.keepalive_timeout)
    }
}

/// The permits of one listener.
#[derive(Clone)]
pub struct Admission {
    permits: Arc<Semaphore>,
    limits: ConnectionLimits,
    /// What the connections' writes wait for (`coalesce.rs`): `None`, a turn before every write.
    answers: Option<&'static Answers>,
}

impl Admission {
    pub fn new(limits: ConnectionLimits) -> Admission {
        Admission { permits: Arc::new(Semaphore::new(limits.max_connections)), limits, answers: None }
    }

    /// The connections' writes give way only while `answers` has some on their way (a member's
    /// listeners, whose answers come from its proposer and read rounds).
    pub fn giving_way_while(self, answers: &'static Answers) -> Admission {
        Admission { answers: Some(answers), ..self }
    }

    /// No cap and no idle timeout (peer listeners: raft's own timers judge peers).
    pub fn unbounded() -> Admission {
        let limits = ConnectionLimits {
            max_connections: Semaphore::MAX_PERMITS,
            idle_timeout: Duration::from_secs(100 * 365 * 24 * 3600),
            ..ConnectionLimits::default()
        };
        Admission::new(limits)
    }

    /// The connection, watched and with its writes coalesced (`coalesce.rs`), if the listener has
    /// room for it; `None` closes it.
    pub fn admit<T>(&self, io: T) -> Option<Watched<Coalesced<T>>> {
        match self.permits.clone().try_acquire_owned() {
            Ok(permit) => {
                let io = match self.answers {
                    Some(answers) => Coalesced::watching(io, answers),
                    None => Coalesced::new(io),
                };
                Some(Watched::new(io, self.limits.idle_timeout, permit))
            }
            Err(_) => {
                crate::metrics::CLIENT_CONNECTIONS_REFUSED.inc();
                tracing::debug!(
                    limit = self.limits.max_connections,
                    "client connection refused: --max-client-connections reached"
                );
                None
            }
        }
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
            .map(|tcp| admission.admit(tcp))
            .transpose();
        std::future::ready(admitted)
    })
}

/// A client connection that is closed when the client stays silent too long.
pub struct Watched<T> {
    io: T,
    idle_timeout: Duration,
    /// When the client last sent bytes (`None`: never yet).
    last_read: Option<Instant>,
    /// Fires at the latest possible close; on firing the close is re-armed from `last_read` if the
    /// client spoke since (cheaper than resetting the timer on every read).
    deadline: Pin<Box<Sleep>>,
    _permit: OwnedSemaphorePermit,
}

impl<T> Watched<T> {
    fn new(io: T, idle_timeout: Duration, permit: OwnedSemaphorePermit) -> Watched<T> {
        let first = if idle_timeout > FIRST_BYTES_DEADLINE { FIRST_BYTES_DEADLINE } else { idle_timeout };
        Watched { io, idle_timeout, last_read: None, deadline: Box::pin(tokio::time::sleep(first)), _permit: permit }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
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
        Pin::new(&mut self.io).poll_write(cx, buf)
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
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
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
        let mut server = admission.admit(server).expect("room");
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
        let mut server = admission.admit(server).expect("room");
        let started = Instant::now();
        let mut buf = [0u8; 8];
        assert!(server.read(&mut buf).await.is_err());
        assert_eq!(started.elapsed(), FIRST_BYTES_DEADLINE);
    }

    #[tokio::test]
    async fn beyond_the_cap_connections_are_refused_until_one_closes() {
        let admission = Admission::new(limits(2, Duration::from_secs(60)));
        let first = admission.admit(tokio::io::duplex(8).1).expect("1");
        let _second = admission.admit(tokio::io::duplex(8).1).expect("2");
        assert!(admission.admit(tokio::io::duplex(8).1).is_none(), "the third is refused");
        drop(first);
        assert!(admission.admit(tokio::io::duplex(8).1).is_some(), "room again once one closed");
    }
}
