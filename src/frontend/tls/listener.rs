//! The TLS accept loop for one client listener.
//!
//! Each accepted socket gets its own task: the handshake must finish within `HANDSHAKE_DEADLINE`
//! (a client that connects and sends nothing costs a task for a few seconds, never forever —
//! etcd's GHSA-6vch-q96h-7gc3), then the client certificate is checked against the allow-lists.
//! Failures are logged at debug with the reason and counted; they never affect other connections.
//! Certificates are re-read when their files change (`reload.rs`): new connections get the new
//! configuration, connections already open keep theirs (and their identity).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::ServerConfig;
use rustls_pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tonic::transport::server::Connected;

use super::reload::{Reload, Reloading};
use super::settings::{NotAllowed, TlsSettings};
use crate::identity::certificate::{cert_names, CertNames, NoIdentity, PeerIdentity};
use crate::logging::limit::LogLimit;

/// How long a client may take to complete the TLS handshake.
pub(crate) const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);
/// Established connections waiting for tonic to pick them up.
const ACCEPTED_BACKLOG: usize = 128;

/// An established TLS connection and the identity its certificate established.
pub struct TlsConnection {
    stream: TlsStream<TcpStream>,
    identity: PeerIdentity,
    certificate: Option<Arc<CertNames>>,
}

/// What tonic attaches to every request on a TLS connection (`frontend::connection` reads it).
#[derive(Clone, Debug)]
pub struct TlsConnectInfo {
    pub identity: PeerIdentity,
    pub remote_addr: Option<std::net::SocketAddr>,
    /// The names of the client's verified leaf certificate, if it presented one (the peer port
    /// decides by them whether the caller is a member: `cluster/admission.rs`).
    pub certificate: Option<Arc<CertNames>>,
}

impl TlsConnection {
    /// The identity the connection's certificate established at the handshake.
    pub fn identity(&self) -> &PeerIdentity {
        &self.identity
    }

    /// The client's address.
    pub fn remote_addr(&self) -> Option<std::net::SocketAddr> {
        self.stream.get_ref().0.peer_addr().ok()
    }

    /// The client's verified leaf certificate, if it presented one (a proxy forwards it).
    pub fn client_certificate(&self) -> Option<&CertificateDer<'static>> {
        self.stream.get_ref().1.peer_certificates().and_then(|certs| certs.first())
    }
}

impl Connected for TlsConnection {
    type ConnectInfo = TlsConnectInfo;

    fn connect_info(&self) -> TlsConnectInfo {
        TlsConnectInfo {
            identity: self.identity.clone(),
            remote_addr: self.remote_addr(),
            certificate: self.certificate.clone(),
        }
    }
}

impl AsyncRead for TlsConnection {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConnection {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Starts accepting on `listener`; established connections arrive on the returned channel.
pub(crate) fn accept(
    listener: TcpListener,
    settings: TlsSettings,
) -> Result<mpsc::Receiver<io::Result<TlsConnection>>, String> {
    let settings = Arc::new(settings);
    let config = Arc::new(server_config(&settings)?);
    config.spawn_checks(report_reload);
    let (tx, rx) = mpsc::channel(ACCEPTED_BACKLOG);
    tokio::spawn(async move {
        loop {
            let (socket, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a client connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            if tx.is_closed() {
                return;
            }
            let _ = socket.set_nodelay(true);
            let acceptor = TlsAcceptor::from(config.current().0);
            let (tx, settings) = (tx.clone(), settings.clone());
            tokio::spawn(async move {
                match handshake(acceptor, socket, &settings).await {
                    Ok(conn) => {
                        let _ = tx.send(Ok(conn)).await;
                    }
                    Err(reason) => {
                        crate::metrics::TLS_HANDSHAKE_FAILURES.with_label_values(&[reason.label()]).inc();
                        if matches!(reason, Refused::PortCheck) {
                            return; // counted, not logged: no handshake was tried
                        }
                        // Any client can cause these: at most 10 lines per reason per 10 s.
                        static LIMIT: LogLimit = LogLimit::new(10, Duration::from_secs(10));
                        if let Some(suppressed) = LIMIT.admit(reason.label()) {
                            tracing::info!(%peer, reason = %reason, suppressed_before = suppressed, "TLS connection refused");
                        }
                    }
                }
            });
        }
    });
    Ok(rx)
}

/// Why a connection was refused.
#[derive(Debug, thiserror::Error)]
enum Refused {
    /// Closed before its first byte: a check that the port is open (a follower's probe of its
    /// leader, `raft/leader_probe.rs`; a load balancer's or Kubernetes' TCP probe), not a handshake.
    #[error("closed before the handshake began")]
    PortCheck,
    #[error("handshake not completed within {HANDSHAKE_DEADLINE:?}")]
    Deadline,
    #[error("handshake failed: {0}")]
    Handshake(io::Error),
    #[error("{0}")]
    NotAllowed(#[from] NotAllowed),
    #[error("verified client certificate could not be parsed")]
    Unreadable,
}

impl Refused {
    fn label(&self) -> &'static str {
        match self {
            Refused::PortCheck => "closed_before_hello",
            Refused::Deadline => "deadline",
            Refused::Handshake(_) => "handshake",
            Refused::NotAllowed(NotAllowed::CommonName(_)) => "cn_not_allowed",
            Refused::NotAllowed(NotAllowed::Hostname) => "hostname_not_allowed",
            Refused::Unreadable => "unreadable_certificate",
        }
    }
}

async fn handshake(acceptor: TlsAcceptor, socket: TcpStream, settings: &TlsSettings) -> Result<TlsConnection, Refused> {
    let handshake = async {
        // A peek leaves the first byte for the handshake; a connection that ends before it sends
        // one is a port check, told apart from a failed handshake.
        if socket.peek(&mut [0u8; 1]).await.map_err(Refused::Handshake)? == 0 {
            return Err(Refused::PortCheck);
        }
        acceptor.accept(socket).await.map_err(Refused::Handshake)
    };
    let stream = tokio::time::timeout(HANDSHAKE_DEADLINE, handshake).await.map_err(|_| Refused::Deadline)??;
    let Some(leaf) = stream.get_ref().1.peer_certificates().and_then(|certs| certs.first()) else {
        return Ok(TlsConnection { stream, identity: PeerIdentity::None(NoIdentity::NoClientCert), certificate: None });
    };
    // rustls verified the chain (and the CRL) already; only the allow-lists remain. A verified
    // certificate that cannot be read is refused: the allow-lists must never be skipped.
    let names = cert_names(leaf).ok_or(Refused::Unreadable)?;
    settings.allows(&names)?;
    let identity = settings.identity_source.identify(&names);
    Ok(TlsConnection { stream, identity, certificate: Some(Arc::new(names)) })
}

/// The server configuration, rebuilt when any of its files changes; a broken new file keeps the old
/// configuration in place (and says so).
fn server_config(settings: &Arc<TlsSettings>) -> Result<Reloading<Arc<ServerConfig>>, String> {
    let files = [
        Some(&settings.cert_file),
        Some(&settings.key_file),
        settings.trusted_ca_file.as_ref(),
        settings.crl_file.as_ref(),
    ]
    .into_iter()
    .flatten()
    .cloned()
    .collect();
    let settings = settings.clone();
    Reloading::load(files, move || settings.server_config())
}

fn report_reload(reload: Reload) {
    match reload {
        Reload::Unchanged => {}
        Reload::Reloaded { .. } => {
            tracing::info!("TLS certificate files changed; new connections use the new configuration")
        }
        Reload::Failed(e) => {
            tracing::error!(error = %e, "TLS certificate files changed but could not be loaded; keeping the previous configuration")
        }
    }
}
