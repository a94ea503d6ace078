//! Connections for `keyward-bench`: tonic channels over plain TCP or tokio-rustls TLS (a custom
//! connector, since tonic's own TLS feature is not enabled), and the per-connection auth token.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use anyhow::{anyhow, bail, Context as _};
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::{Code, Status};

use crate::args::BenchArgs;
use keyward::proto::etcdserverpb::auth_client::AuthClient;
use keyward::proto::etcdserverpb::AuthenticateRequest;
use keyward::TlsConnector;

/// One gRPC connection and, with `--user`, the token every request on it carries.
pub(crate) struct Conn {
    pub channel: Channel,
    pub auth: Option<ConnAuth>,
}

pub(crate) struct ConnAuth {
    name: String,
    password: String,
    /// The token and a generation number that grows with each re-authentication.
    token: RwLock<(u64, AsciiMetadataValue)>,
    refresh: tokio::sync::Mutex<()>,
    pub reauths: AtomicU64,
}

impl Conn {
    /// The current token generation (0 without auth) to pass to `reauthenticate` after a failure.
    pub(crate) fn attach(&self, metadata: &mut MetadataMap) -> u64 {
        match &self.auth {
            Some(auth) => {
                let guard = auth.token.read().unwrap_or_else(|e| e.into_inner());
                metadata.insert("token", guard.1.clone());
                guard.0
            }
            None => 0,
        }
    }

    /// Whether a failed request should be retried after authenticating again: the server refused the
    /// token as stale (etcd: "revision of auth store is old") or unknown (an expired simple token).
    pub(crate) fn should_reauthenticate(&self, status: &Status) -> bool {
        self.auth.is_some()
            && (status.message().contains("revision of auth store is old")
                || status.message().contains("invalid auth token"))
    }

    /// Authenticates again unless another client on this connection already did since `generation`.
    pub(crate) async fn reauthenticate(&self, generation: u64) -> Result<(), Status> {
        let Some(auth) = &self.auth else { return Ok(()) };
        let _one_at_a_time = auth.refresh.lock().await;
        if auth.token.read().unwrap_or_else(|e| e.into_inner()).0 != generation {
            return Ok(());
        }
        let token = authenticate(&self.channel, &auth.name, &auth.password).await?;
        let mut guard = auth.token.write().unwrap_or_else(|e| e.into_inner());
        *guard = (generation + 1, token);
        auth.reauths.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

async fn authenticate(channel: &Channel, name: &str, password: &str) -> Result<AsciiMetadataValue, Status> {
    let response = AuthClient::new(channel.clone())
        .authenticate(AuthenticateRequest { name: name.to_string(), password: password.to_string() })
        .await?
        .into_inner();
    AsciiMetadataValue::try_from(response.token)
        .map_err(|_| Status::new(Code::Internal, "the server returned a token that is not valid metadata"))
}

/// Opens `--conns` connections over the endpoints (round-robin); with `authenticate` and `--user`,
/// authenticates each once.
pub(crate) async fn connect_all(args: &BenchArgs, authenticate_each: bool) -> anyhow::Result<Vec<Arc<Conn>>> {
    let tls = tls_config(args)?;
    let credentials = if authenticate_each { crate::args::credentials(args) } else { None };
    let endpoints: Vec<&String> = args.endpoints.iter().filter(|e| !e.is_empty()).collect();
    let mut conns = Vec::with_capacity(args.conns);
    for i in 0..args.conns {
        let endpoint = endpoints[i % endpoints.len()];
        let channel = connect(endpoint, tls.clone(), args).await?;
        let auth = match &credentials {
            Some((name, password)) => {
                let token = authenticate(&channel, name, password)
                    .await
                    .map_err(|s| anyhow!("authenticate as {name:?} at {endpoint}: {}", s.message()))?;
                Some(ConnAuth {
                    name: name.clone(),
                    password: password.clone(),
                    token: RwLock::new((1, token)),
                    refresh: tokio::sync::Mutex::new(()),
                    reauths: AtomicU64::new(0),
                })
            }
            None => None,
        };
        conns.push(Arc::new(Conn { channel, auth }));
    }
    Ok(conns)
}

fn tls_config(args: &BenchArgs) -> anyhow::Result<Option<Arc<ClientConfig>>> {
    if args.cacert.is_none() && args.cert.is_none() {
        return Ok(None);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let mut roots = RootCertStore::empty();
    match &args.cacert {
        Some(path) => {
            for cert in CertificateDer::pem_file_iter(path).with_context(|| format!("--cacert {}", path.display()))? {
                roots
                    .add(cert.with_context(|| format!("--cacert {}", path.display()))?)
                    .with_context(|| format!("--cacert {}", path.display()))?;
            }
        }
        None => bail!("TLS needs --cacert (the CA that signs the server certificate)"),
    }
    let builder = builder.with_root_certificates(roots);
    let mut config = match (&args.cert, &args.key) {
        (Some(cert), Some(key)) => {
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
                .and_then(|certs| certs.collect())
                .with_context(|| format!("--cert {}", cert.display()))?;
            let key = PrivateKeyDer::from_pem_file(key).with_context(|| format!("--key {}", key.display()))?;
            builder.with_client_auth_cert(certs, key).context("--cert/--key")?
        }
        _ => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Some(Arc::new(config)))
}

async fn connect(endpoint: &str, tls: Option<Arc<ClientConfig>>, args: &BenchArgs) -> anyhow::Result<Channel> {
    let (scheme, host_port) = match endpoint.split_once("://") {
        Some((scheme @ ("http" | "https"), rest)) => (scheme, rest.trim_end_matches('/')),
        Some((scheme, _)) => bail!("endpoint {endpoint:?}: scheme {scheme:?} is not http or https"),
        None if tls.is_some() => ("https", endpoint),
        None => ("http", endpoint),
    };
    let uri: Uri = format!("{scheme}://{host_port}").parse().with_context(|| format!("endpoint {endpoint:?}"))?;
    // tonic is given http:// when the TLS connector below does TLS: a tonic built with its own TLS
    // feature would refuse an https:// URI it has no configuration for.
    let plain: Uri = format!("http://{host_port}").parse().with_context(|| format!("endpoint {endpoint:?}"))?;
    let ep = Endpoint::from(plain).connect_timeout(args.dial_timeout).tcp_nodelay(true);
    let channel = if scheme == "https" {
        let Some(config) = tls else { bail!("endpoint {endpoint:?} is https:// but --cacert is not given") };
        let host = uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']').to_string();
        let server_name = ServerName::try_from(host.clone()).with_context(|| format!("server name {host:?}"))?;
        ep.connect_with_connector(TlsConnector::new(config, server_name)).await
    } else {
        // hyper's HTTP/2 handshake does not wait for the server: a TLS listener would only show up as
        // "h2 protocol error" on the first request. Ask first, to say what is wrong.
        probe_plaintext(endpoint, host_port, args.dial_timeout).await?;
        ep.connect().await
    };
    channel.map_err(|e| {
        let chain = error_chain(&e);
        let hint = if chain.contains("InvalidContentType") || chain.contains("corrupt message") {
            " (the server does not speak TLS there: use http://)"
        } else if chain.contains("Connection refused") {
            " (nothing listens at that address)"
        } else {
            ""
        };
        anyhow!("connect to {endpoint}: {chain}{hint}")
    })
}

/// The HTTP/2 client preface and an empty SETTINGS frame.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// Opens a TCP connection to `host_port`, sends the HTTP/2 preface and reads what comes back: a
/// refused or unreachable address, a TLS listener, or an HTTP/1 server become errors that say so.
async fn probe_plaintext(endpoint: &str, host_port: &str, dial_timeout: std::time::Duration) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = match tokio::time::timeout(dial_timeout, tokio::net::TcpStream::connect(host_port)).await {
        Ok(Ok(tcp)) => tcp,
        Ok(Err(e)) => bail!("connect to {endpoint}: cannot open a TCP connection to {host_port}: {e}"),
        Err(_) => bail!("connect to {endpoint}: no TCP connection to {host_port} within {dial_timeout:?}"),
    };
    tcp.write_all(H2_PREFACE).await.with_context(|| format!("connect to {endpoint}: write to {host_port}"))?;
    let mut answer = [0u8; 128];
    let read = tokio::time::timeout(dial_timeout, tcp.read(&mut answer)).await;
    let Ok(read) = read else { return Ok(()) }; // a slow server: let the real connection find out
    let answer = &answer[..read.unwrap_or(0)];
    match classify_answer(answer) {
        Some(cause) => bail!("connect to {endpoint}: {cause}"),
        None => Ok(()),
    }
}

/// Why the first bytes a server sent back to the HTTP/2 preface mean it does not speak plaintext
/// gRPC; `None` when they are an HTTP/2 frame.
fn classify_answer(answer: &[u8]) -> Option<String> {
    const TLS: &str = "the server speaks TLS there: use https:// with --cacert (and --cert/--key if it asks for a \
                       client certificate)";
    match answer {
        [] => Some(format!("the server closed the connection on the HTTP/2 preface; probably a TLS listener: {TLS}")),
        // A TLS record: alert (21) or handshake (22), version 3.x.
        [21 | 22, 3, ..] => Some(TLS.to_string()),
        _ if answer.starts_with(b"HTTP/1.") => {
            let text = String::from_utf8_lossy(answer);
            if text.contains("HTTPS server") {
                Some(TLS.to_string()) // Go's TLS server answers plaintext HTTP so
            } else {
                let status = text.lines().next().unwrap_or_default().to_string();
                Some(format!("the server answers HTTP/1 ({status}), not gRPC over HTTP/2"))
            }
        }
        // An HTTP/2 frame header: 3 bytes of length, then the type (the server's SETTINGS, or GOAWAY).
        [_, _, _, 0x4 | 0x7, ..] => None,
        _ => Some(format!("the server's answer is not HTTP/2 (first bytes {:02x?})", &answer[..answer.len().min(8)])),
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// A gRPC status as the bench reports it: its code and message.
pub(crate) fn describe(status: &Status) -> String {
    format!("{:?}: {}", status.code(), status.message())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_to_the_preface_name_the_cause() {
        assert_eq!(classify_answer(&[0, 0, 6, 4, 0, 0, 0, 0, 0]), None, "an HTTP/2 SETTINGS frame");
        let tls_alert = [21, 3, 3, 0, 2, 2, 50];
        assert!(classify_answer(&tls_alert).unwrap().contains("use https://"));
        let go_tls = b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n";
        assert!(classify_answer(go_tls).unwrap().contains("speaks TLS"));
        assert!(classify_answer(b"").unwrap().contains("closed the connection"));
        let http1 = b"HTTP/1.1 505 HTTP Version Not Supported\r\n\r\n";
        assert!(classify_answer(http1).unwrap().contains("HTTP/1 (HTTP/1.1 505"));
        assert!(classify_answer(b"SSH-2.0-OpenSSH\r\n").unwrap().contains("not HTTP/2"));
    }
}
