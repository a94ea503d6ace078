//! The URL flags: where the member listens (`--listen-client-urls`, `--listen-peer-urls`,
//! `--listen-metrics-urls`) and what it advertises, each URL checked as etcd accepts them; and the
//! rule that plain-text peer traffic stays on loopback unless `--peer-allow-plaintext` says otherwise.

use std::net::{SocketAddr, ToSocketAddrs};

use super::error::{invalid, ConfigError};
use crate::cli::member::ServeArgs;
use crate::frontend::tls::settings::TlsSettings;

/// A URL to listen on, resolved to its socket address.
#[derive(Debug, Clone)]
pub struct Listener {
    pub url: String,
    pub addr: SocketAddr,
    pub tls: bool,
}

/// `--listen-metrics-urls`: an https:// one is served with the client TLS files.
pub(super) fn metrics_listeners(args: &ServeArgs) -> Result<Vec<Listener>, ConfigError> {
    let listen_metrics = parse_listeners(&args.listen_metrics_urls, "--listen-metrics-urls")?;
    if listen_metrics.iter().any(|l| l.tls) && (args.cert_file.is_none() || args.key_file.is_none()) {
        return Err(invalid("an https:// --listen-metrics-urls needs --cert-file and --key-file"));
    }
    Ok(listen_metrics)
}

/// `--listen-peer-urls`, after every advertised and peer URL is checked: https:// peer URLs need the
/// peer TLS files (`peer_tls`), and plain text beyond loopback needs `--peer-allow-plaintext`.
pub(super) fn peer_listeners(args: &ServeArgs, peer_tls: Option<&TlsSettings>) -> Result<Vec<Listener>, ConfigError> {
    for url in args.advertise_client_urls.iter().chain(&args.listen_peer_urls).chain(&args.initial_advertise_peer_urls)
    {
        parse_url(url)?;
    }
    let listen_peer = parse_listeners(&args.listen_peer_urls, "--listen-peer-urls")?;
    let peer_urls_use_tls =
        listen_peer.iter().any(|l| l.tls) || args.initial_advertise_peer_urls.iter().any(|u| u.starts_with("https://"));
    if peer_urls_use_tls && (peer_tls.is_none() || args.peer_trusted_ca_file.is_none()) {
        return Err(invalid("https:// peer URLs need --peer-cert-file, --peer-key-file and --peer-trusted-ca-file"));
    }
    if let Some(listener) =
        listen_peer.iter().find(|l| !l.tls && !l.addr.ip().is_loopback() && !args.peer_allow_plaintext)
    {
        return Err(invalid(format!(
            "--listen-peer-urls {}: plain-text peer traffic beyond loopback proves no one's identity, so \
             anyone who reaches the port could act as a member; use an https:// peer URL with \
             --peer-cert-file, --peer-key-file and --peer-trusted-ca-file, or pass --peer-allow-plaintext \
             if only the members can reach this address",
            listener.url
        )));
    }
    Ok(listen_peer)
}

/// Every URL of `flag`, each a listener.
pub(super) fn parse_listeners(urls: &[String], flag: &str) -> Result<Vec<Listener>, ConfigError> {
    urls.iter().map(|u| parse_listener(u, flag)).collect()
}

/// Checks a `scheme://host:port` URL as etcd accepts them.
pub(super) fn parse_url(url: &str) -> Result<(&str, &str), ConfigError> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| invalid(format!("URL {url:?} has no scheme (want http:// or https://)")))?;
    if !matches!(scheme, "http" | "https" | "unix" | "unixs") {
        return Err(invalid(format!("URL scheme must be http, https, unix, or unixs: {url}")));
    }
    let host_port = rest.trim_end_matches('/');
    if host_port.rsplit_once(':').is_none_or(|(_, port)| port.parse::<u16>().is_err()) {
        return Err(invalid(format!("URL {url:?} must have a host and a numeric port")));
    }
    Ok((scheme, host_port))
}

fn parse_listener(url: &str, flag: &str) -> Result<Listener, ConfigError> {
    let (scheme, host_port) = parse_url(url)?;
    if !matches!(scheme, "http" | "https") {
        return Err(invalid(format!("{flag}: {scheme}:// listeners are not supported yet (use http:// or https://)")));
    }
    let addr = host_port
        .to_socket_addrs()
        .map_err(|e| invalid(format!("{flag}: cannot resolve {host_port:?}: {e}")))?
        .next()
        .ok_or_else(|| invalid(format!("{flag}: {host_port:?} resolves to no address")))?;
    Ok(Listener { url: url.to_string(), addr, tls: scheme == "https" })
}
