//! The proxy's client-facing listener: TLS on TCP (the shared `frontend/tls` accept loop, with its
//! handshake deadline, CRL and certificate reload), plain TCP, or a Unix socket for a sidecar.
//!
//! A Unix socket is owner-only (0600) whatever the umask: whoever may connect to it acts with the
//! proxy's certificate. It is bound inside a fresh 0700 directory beside its path, set to 0600
//! there, and only then renamed into place, so there is no moment at which another user can reach
//! it with a wider mode (binding under a narrowed umask would do the same, but the umask is the whole
//! process's, shared by every thread).
//!
//! Each accepted connection comes with the client certificate its TLS handshake verified, if any:
//! that certificate, and nothing the client says later, is what the proxy may forward.

use std::fs::Permissions;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustls_pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::mpsc;

use super::config::ListenAddr;
use crate::frontend::tls::listener::TlsConnection;
use crate::frontend::tls::settings::TlsSettings;
use crate::identity::certificate::PeerIdentity;

/// A byte stream hyper can serve.
pub(crate) trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// One accepted client connection.
pub(crate) struct Accepted {
    pub io: Box<dyn Io>,
    /// The client's leaf certificate, verified at the handshake.
    pub certificate: Option<CertificateDer<'static>>,
    /// What that certificate names under `--client-cert-identity` (for the proxy's logs).
    pub identity: Option<PeerIdentity>,
    /// The client's address (`None` on a Unix socket).
    pub remote_addr: Option<std::net::SocketAddr>,
}

pub(crate) enum Listener {
    Tls(mpsc::Receiver<io::Result<TlsConnection>>),
    Tcp(TcpListener),
    /// The socket file is removed when the listener is dropped.
    Unix(UnixListener, PathBuf),
}

impl Listener {
    pub(crate) async fn bind(addr: &ListenAddr, tls: Option<&TlsSettings>) -> Result<Listener, String> {
        match (addr, tls) {
            (ListenAddr::Tcp(addr), tls) => {
                let socket = TcpListener::bind(addr).await.map_err(|e| format!("listen on {addr}: {e}"))?;
                match tls {
                    Some(tls) => Ok(Listener::Tls(crate::frontend::tls::listener::accept(socket, tls.clone())?)),
                    None => Ok(Listener::Tcp(socket)),
                }
            }
            (ListenAddr::Unix(path), None) => {
                remove_stale_socket(path)?;
                let socket = bind_owner_only(path).map_err(|e| format!("listen on unix://{}: {e}", path.display()))?;
                Ok(Listener::Unix(socket, path.clone()))
            }
            (ListenAddr::Unix(_), Some(_)) => Err("a unix:// listener is plain text".into()),
        }
    }

    pub(crate) fn local_addr(&self) -> Option<SocketAddr> {
        match self {
            Listener::Tcp(socket) => socket.local_addr().ok(),
            Listener::Tls(_) | Listener::Unix(..) => None,
        }
    }

    /// The next client connection; `None` once the TLS accept loop has stopped.
    pub(crate) async fn accept(&mut self) -> Option<Accepted> {
        loop {
            let accepted = match self {
                Listener::Tls(connections) => connections.recv().await?.map(|conn| {
                    let certificate = conn.client_certificate().cloned();
                    let identity = Some(conn.identity().clone());
                    let remote_addr = conn.remote_addr();
                    Accepted { io: Box::new(conn), certificate, identity, remote_addr }
                }),
                Listener::Tcp(socket) => socket.accept().await.map(|(tcp, addr)| {
                    let _ = tcp.set_nodelay(true);
                    Accepted { io: Box::new(tcp), certificate: None, identity: None, remote_addr: Some(addr) }
                }),
                Listener::Unix(socket, _) => socket.accept().await.map(|(unix, _)| Accepted {
                    io: Box::new(unix),
                    certificate: None,
                    identity: None,
                    remote_addr: None,
                }),
            };
            match accepted {
                Ok(accepted) => return Some(accepted),
                Err(e) => {
                    // Out of file descriptors and the like: keep serving the connections already open.
                    tracing::warn!(error = %e, "accepting a client connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Binds a Unix socket at `path`, mode 0600, reachable at `path` only once that mode is set.
fn bind_owner_only(path: &Path) -> io::Result<UnixListener> {
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| io::Error::other("the socket path names no file"))?;
    let private = parent.join(format!(".{}.bind-{}", name.to_string_lossy(), std::process::id()));
    std::fs::DirBuilder::new().mode(0o700).create(&private)?;
    let bound = (|| -> io::Result<UnixListener> {
        // The umask may have narrowed the directory further; it must still be ours to use.
        std::fs::set_permissions(&private, Permissions::from_mode(0o700))?;
        let inside = private.join("s");
        let socket = UnixListener::bind(&inside)?;
        std::fs::set_permissions(&inside, Permissions::from_mode(SOCKET_MODE))?;
        std::fs::rename(&inside, path)?;
        Ok(socket)
    })();
    let _ = std::fs::remove_dir_all(&private);
    bound
}

/// Owner read and write: connecting to a Unix socket needs write permission on it.
const SOCKET_MODE: u32 = 0o600;

/// A socket file left by a proxy that did not exit cleanly is removed; a live one (something
/// accepts on it) or a file that is not a socket is an error, never deleted.
fn remove_stale_socket(path: &std::path::Path) -> Result<(), String> {
    let Ok(metadata) = std::fs::symlink_metadata(path) else { return Ok(()) };
    if !metadata.file_type().is_socket() {
        return Err(format!("unix://{} exists and is not a socket", path.display()));
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(format!("unix://{} is in use by another process", path.display()));
    }
    std::fs::remove_file(path).map_err(|e| format!("removing the stale socket unix://{}: {e}", path.display()))
}
