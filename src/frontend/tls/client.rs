//! The client side of TLS: the configuration a member (towards its peers) or a proxy (towards the
//! members) dials with, and a tonic connector over tokio-rustls (tonic's own TLS feature is not
//! enabled: one TLS stack, rustls with ring, for every listener and every dialer).

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tonic::codegen::Service;
use tonic::transport::{Channel, Endpoint, Uri};

use super::policy::TlsPolicy;

/// A client configuration trusting `ca` and, when given, presenting `cert`/`key` (mTLS), offering the
/// versions and cipher suites of `policy`. `flags` names the flags the files came from, for error
/// messages (e.g. `"--peer-trusted-ca-file"`).
pub fn client_config(
    ca: &Path,
    cert_and_key: Option<(&Path, &Path)>,
    flags: (&str, &str, &str),
    policy: &TlsPolicy,
) -> Result<Arc<ClientConfig>, String> {
    let (ca_flag, cert_flag, key_flag) = flags;
    let provider = policy.provider();
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).map_err(|e| format!("{ca_flag} {}: {e}", ca.display()))? {
        let cert = cert.map_err(|e| format!("{ca_flag} {}: {e}", ca.display()))?;
        roots.add(cert).map_err(|e| format!("{ca_flag} {}: {e}", ca.display()))?;
    }
    if roots.is_empty() {
        return Err(format!("{ca_flag} {}: no CA certificate found", ca.display()));
    }
    let builder = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&policy.versions())
        .map_err(|e| format!("TLS protocol versions and cipher suites: {e}"))?
        .with_root_certificates(roots);
    let mut config = match cert_and_key {
        Some((cert, key)) => {
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
                .and_then(|certs| certs.collect())
                .map_err(|e| format!("{cert_flag} {}: {e}", cert.display()))?;
            if certs.is_empty() {
                return Err(format!("{cert_flag} {}: no certificate found", cert.display()));
            }
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{key_flag} {}: {e}", key.display()))?;
            builder.with_client_auth_cert(certs, key).map_err(|e| format!("{cert_flag}/{key_flag}: {e}"))?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// A lazily connected gRPC channel to `url` (`http://` or `https://host:port`); `https://` needs
/// `tls`. Nothing is dialed until the first request, and a broken connection is dialed again.
pub fn lazy_channel(url: &str, tls: Option<&Arc<ClientConfig>>, connect_timeout: Duration) -> Result<Channel, String> {
    let uri: Uri = url.parse().map_err(|e| format!("URL {url:?}: {e}"))?;
    let endpoint = Endpoint::from(plain_scheme(&uri)?)
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5));
    match uri.scheme_str() {
        Some("https") => {
            let config = tls.ok_or_else(|| format!("{url} is https:// but no TLS client configuration is set"))?;
            let host = host_of(&uri);
            let server_name =
                ServerName::try_from(host.clone()).map_err(|e| format!("server name {host:?} of {url}: {e}"))?;
            Ok(endpoint.connect_with_connector_lazy(TlsConnector { config: config.clone(), server_name }))
        }
        Some("http") => Ok(endpoint.connect_lazy()),
        _ => Err(format!("URL {url:?}: the scheme must be http or https")),
    }
}

/// The URI tonic is given: `http://` even when `TlsConnector` does TLS underneath. When tonic's own
/// TLS feature is compiled in (test builds unify it in through the `etcd-client` dev-dependency), it
/// refuses an `https://` URI that it has no TLS configuration of its own for.
fn plain_scheme(uri: &Uri) -> Result<Uri, String> {
    let authority = uri.authority().ok_or_else(|| format!("URL {uri}: no host and port"))?;
    format!("http://{authority}").parse().map_err(|e| format!("URL {uri}: {e}"))
}

fn host_of(uri: &Uri) -> String {
    uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']').to_string()
}

/// A tower connector for tonic: TCP (no Nagle), then a rustls client handshake offering h2.
#[derive(Clone)]
pub struct TlsConnector {
    config: Arc<ClientConfig>,
    server_name: ServerName<'static>,
}

impl TlsConnector {
    /// Dials with `config`, expecting the server's certificate to name `server_name`.
    pub fn new(config: Arc<ClientConfig>, server_name: ServerName<'static>) -> Self {
        TlsConnector { config, server_name }
    }
}

type ConnectFuture = Pin<Box<dyn Future<Output = std::io::Result<TokioIo<TlsStream<TcpStream>>>> + Send>>;

impl Service<Uri> for TlsConnector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = ConnectFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connector = tokio_rustls::TlsConnector::from(self.config.clone());
        let server_name = self.server_name.clone();
        Box::pin(async move {
            let port = uri.port_u16().unwrap_or(443);
            let tcp = TcpStream::connect((host_of(&uri).as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            // HTTP/2 with prior knowledge follows, whether or not the server answered the ALPN offer.
            Ok(TokioIo::new(connector.connect(server_name, tcp).await?))
        })
    }
}
