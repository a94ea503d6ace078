//! `keyward grpc-proxy start`'s flags (`cli/proxy.rs`) checked once into a typed `ProxyConfig`.
//!
//! Whose identity reaches the member (the one rule, also in the README):
//! - **with `--client-cert-auth`** (forwarding proxy): the listener requires a client certificate
//!   verified against `--trusted-ca-file` (and `--client-crl-file`), and every request carries that
//!   certificate to the member as `keyward-forwarded-client-cert`; the member, trusting the proxy's
//!   own certificate by `--trusted-proxy-cn`, derives the user from it.
//! - **without it** (sidecar): nothing is forwarded; the member sees the proxy's own certificate
//!   (`--cert`/`--key`, the workload's) as the client. Anyone who can reach the listener acts as that
//!   identity, so a sidecar listens on 127.0.0.1 or a Unix socket.
//!
//! Either way a `keyward-forwarded-client-cert` sent by a client is removed, and tokens pass through.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use super::client_tls::ClientTlsFiles;
use super::endpoint::Endpoint;
use crate::cli::proxy::StartArgs;
use crate::config::connections::connection_limits;
use crate::frontend::connection_limits::ConnectionLimits;
use crate::frontend::tls::policy::TlsPolicy;
use crate::frontend::tls::settings::TlsSettings;
use crate::identity::certificate::IdentitySource;

/// Where the proxy listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

/// Whose identity the members see (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `--client-cert-auth`: each client's verified certificate is forwarded.
    ForwardClientCertificates,
    /// No `--client-cert-auth`: the proxy's own certificate is the identity (sidecar).
    OwnIdentity,
}

/// A validated proxy configuration.
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    pub endpoints: Vec<Endpoint>,
    pub listen: ListenAddr,
    /// TLS towards the members (`None`: every endpoint is plain text).
    pub client_tls: Option<ClientTlsFiles>,
    /// The client-facing TLS listener (`None`: plain text).
    pub listener_tls: Option<TlsSettings>,
    pub mode: Mode,
    /// The gateway's request limit (`--max-request-bytes`).
    pub max_request_bytes: usize,
    /// The client listener's connection cap, idle timeout and keepalive pings (no stream limit of
    /// the proxy's own, as etcd's grpc-proxy).
    pub connections: ConnectionLimits,
    pub log_filter: &'static str,
}

impl StartArgs {
    /// The checked configuration; a refusal names the flags at fault.
    pub fn into_config(self) -> Result<ProxyConfig, String> {
        let (endpoints, client_tls) = members(&self)?;
        let listen = parse_listen_addr(&self.listen_addr)?;
        let listener_tls = listener_tls(&self, &listen)?;
        let mode = if self.client_cert_auth { Mode::ForwardClientCertificates } else { Mode::OwnIdentity };
        let connections = connection_limits(
            self.max_client_connections,
            &self.client_idle_timeout,
            &self.grpc_keepalive_interval,
            &self.grpc_keepalive_timeout,
            u32::MAX,
        )?;
        Ok(ProxyConfig {
            endpoints,
            listen,
            client_tls,
            listener_tls,
            mode,
            max_request_bytes: self.max_request_bytes,
            connections,
            log_filter: if self.debug { "debug" } else { "info" },
        })
    }
}

/// The members (`--endpoints`) and the TLS the proxy speaks to them (`--cert`, `--key`, `--cacert`).
fn members(args: &StartArgs) -> Result<(Vec<Endpoint>, Option<ClientTlsFiles>), String> {
    let tls_flag = args.cert.is_some() || args.key.is_some() || args.cacert.is_some();
    let endpoints = args
        .endpoints
        .iter()
        .filter(|e| !e.is_empty())
        .map(|e| Endpoint::parse(e, tls_flag))
        .collect::<Result<Vec<_>, _>>()?;
    if endpoints.is_empty() {
        return Err("--endpoints names no member".into());
    }
    let identity = match (args.cert.clone(), args.key.clone()) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => return Err("--cert and --key go together".into()),
    };
    let client_tls = match (args.cacert.clone(), endpoints.iter().any(|e| e.tls)) {
        (Some(cacert), _) => Some(ClientTlsFiles { identity, cacert }),
        (None, true) => return Err("TLS endpoints need --cacert (the CA that signs the members' certificates)".into()),
        (None, false) if identity.is_some() => {
            return Err("--cert/--key identify the proxy to TLS endpoints, but every endpoint is http://".into())
        }
        (None, false) => None,
    };
    if let Some(files) = &client_tls {
        // Fail at startup, not at the first request, when a file is missing or malformed.
        files.config()?;
    }
    Ok((endpoints, client_tls))
}

/// The client-facing listener's TLS (`--cert-file`, `--key-file`, `--trusted-ca-file`,
/// `--client-crl-file`, `--client-cert-auth`; `None`: plain text).
fn listener_tls(args: &StartArgs, listen: &ListenAddr) -> Result<Option<TlsSettings>, String> {
    let listener_tls = match (args.cert_file.clone(), args.key_file.clone()) {
        (Some(cert_file), Some(key_file)) => Some(TlsSettings {
            cert_file,
            key_file,
            trusted_ca_file: args.trusted_ca_file.clone(),
            client_cert_auth: args.client_cert_auth,
            crl_file: args.client_crl_file.clone(),
            allowed_cns: Vec::new(),
            allowed_hostnames: Vec::new(),
            trusted_proxy_cns: Vec::new(),
            identity_source: args.client_cert_identity,
            policy: TlsPolicy::from_flags(&args.tls_min_version, &args.tls_max_version, &args.cipher_suites)?,
        }),
        (None, None) => None,
        _ => return Err("--cert-file and --key-file go together".into()),
    };
    if listener_tls.is_none()
        && (!args.tls_min_version.is_empty() || !args.tls_max_version.is_empty() || !args.cipher_suites.is_empty())
    {
        return Err(
            "--tls-min-version, --tls-max-version and --cipher-suites need a TLS listener (--cert-file, --key-file)"
                .into(),
        );
    }
    if listener_tls.is_none() && (args.trusted_ca_file.is_some() || args.client_crl_file.is_some()) {
        return Err("--trusted-ca-file and --client-crl-file need a TLS listener (--cert-file, --key-file)".into());
    }
    if args.client_cert_auth && (listener_tls.is_none() || args.trusted_ca_file.is_none()) {
        return Err("--client-cert-auth needs --cert-file, --key-file and --trusted-ca-file".into());
    }
    if args.client_cert_identity != IdentitySource::CommonName && !args.client_cert_auth {
        return Err("--client-cert-identity names clients by certificate: it needs --client-cert-auth".into());
    }
    if let Some(tls) = &listener_tls {
        if matches!(listen, ListenAddr::Unix(_)) {
            return Err(
                "a unix:// --listen-addr is plain text (a sidecar's socket): drop --cert-file/--key-file".into()
            );
        }
        tls.server_config()?;
    }
    Ok(listener_tls)
}

fn parse_listen_addr(text: &str) -> Result<ListenAddr, String> {
    if let Some(path) = text.strip_prefix("unix://") {
        if path.is_empty() {
            return Err(format!("--listen-addr {text:?} names no socket path"));
        }
        return Ok(ListenAddr::Unix(PathBuf::from(path)));
    }
    if text.contains("://") {
        return Err(format!("--listen-addr {text:?} must be host:port or unix://PATH"));
    }
    let addr = text
        .to_socket_addrs()
        .map_err(|e| format!("--listen-addr {text:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("--listen-addr {text:?} resolves to no address"))?;
    Ok(ListenAddr::Tcp(addr))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: StartArgs,
    }

    fn parse(args: &[&str]) -> Result<ProxyConfig, String> {
        let cli =
            Cli::try_parse_from(std::iter::once("start").chain(args.iter().copied())).map_err(|e| e.to_string())?;
        cli.args.into_config()
    }

    #[test]
    fn defaults_are_etcds() {
        let config = parse(&[]).unwrap();
        assert_eq!(config.listen, ListenAddr::Tcp("127.0.0.1:23790".parse().unwrap()));
        assert_eq!(config.endpoints.len(), 1);
        assert_eq!((config.endpoints[0].port, config.endpoints[0].tls), (2379, false));
        assert_eq!(config.mode, Mode::OwnIdentity);
        assert!(config.client_tls.is_none() && config.listener_tls.is_none());
        assert_eq!(config.connections, ConnectionLimits { max_concurrent_streams: u32::MAX, ..Default::default() });
    }

    /// Asserts that `args` are refused with an error that says `why`.
    fn refused(args: &[&str], why: &str) {
        let err = parse(args).unwrap_err();
        assert!(err.contains(why), "{args:?}: {err:?} lacks {why:?}");
    }

    #[test]
    fn connection_bounds_are_checked_as_a_members() {
        let bounds =
            ["--max-client-connections", "5", "--client-idle-timeout", "90s", "--grpc-keepalive-interval", "30s"];
        let config = parse(&bounds).unwrap();
        assert_eq!(config.connections.max_connections, 5);
        assert_eq!(config.connections.idle_timeout, std::time::Duration::from_secs(90));
        refused(&["--max-client-connections", "0"], "must be at least 1");
        refused(&["--client-idle-timeout", "0s"], "--client-idle-timeout must be above 0");
        refused(&["--client-idle-timeout", "10s", "--grpc-keepalive-interval", "9s"], "must be above --grpc-keepalive");
        refused(&["--grpc-keepalive-timeout", "soon"], "--grpc-keepalive-timeout");
    }

    #[test]
    fn a_sidecar_listens_on_a_unix_socket_in_plain_text() {
        let config =
            parse(&["--listen-addr", "unix:///run/keyward.sock", "--endpoints", "http://10.0.0.1:2379"]).unwrap();
        assert_eq!(config.listen, ListenAddr::Unix("/run/keyward.sock".into()));
        assert_eq!(config.mode, Mode::OwnIdentity);
    }

    #[test]
    fn inconsistent_flags_are_refused() {
        refused(&["--endpoints", "https://127.0.0.1:2379"], "need --cacert");
        refused(&["--cert", "c.pem"], "--cert and --key go together");
        refused(&["--cert", "c.pem", "--key", "k.pem"], "TLS endpoints need --cacert");
        refused(
            &["--endpoints", "http://127.0.0.1:2379", "--cert", "c.pem", "--key", "k.pem"],
            "every endpoint is http://",
        );
        refused(&["--cert-file", "c.pem"], "--cert-file and --key-file go together");
        refused(&["--client-cert-auth"], "--client-cert-auth needs");
        refused(&["--trusted-ca-file", "ca.pem"], "need a TLS listener");
        refused(&["--client-cert-identity", "uri-san"], "needs --client-cert-auth");
        refused(&["--client-cert-identity", "spiffe"], "want cn, uri-san or dns-san");
        refused(&["--listen-addr", "http://127.0.0.1:1"], "host:port or unix://");
        refused(&["--endpoints", ""], "names no member");
        refused(&["--cacert", "/nonexistent/ca.pem"], "--cacert");
        assert!(parse(&["--namespace", "x"]).is_err(), "etcd flags keyward does not implement are refused");
    }
}
