//! `keyward grpc-proxy start`'s flags, named as etcd's grpc-proxy names them; `proxy/config.rs` checks
//! them into a `ProxyConfig` and states whose identity reaches the members.
//!
//! etcd's grpc-proxy flags keyward takes: `--endpoints`, `--listen-addr`, `--cert`/`--key`/`--cacert`
//! (the proxy's TLS towards the members), `--cert-file`/`--key-file`/`--trusted-ca-file` and
//! `--client-crl-file` (the client-facing listener), `--debug`. keyward's own: `--client-cert-auth`,
//! `--client-cert-identity` and `--max-request-bytes` (the HTTP/JSON gateway's limit). Any other etcd grpc-proxy flag is refused by the parser rather than
//! silently ignored.

use std::path::PathBuf;

use clap::Args;

use crate::identity::certificate::IdentitySource;

#[derive(Args, Debug, Clone)]
pub struct StartArgs {
    /// Comma-separated member client URLs (https://host:port, http://host:port, or host:port: TLS
    /// when --cacert, --cert or --key is given).
    #[arg(long, default_value = "127.0.0.1:2379", value_delimiter = ',')]
    pub endpoints: Vec<String>,
    /// Listen address: host:port, or unix://PATH for a sidecar's socket.
    #[arg(long, default_value = "127.0.0.1:23790")]
    pub listen_addr: String,
    /// Identify secure connections with the members using this TLS certificate file (a sidecar:
    /// the workload's certificate; re-read when it changes).
    #[arg(long)]
    pub cert: Option<PathBuf>,
    /// Identify secure connections with the members using this TLS key file.
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// Verify certificates of TLS-enabled members using this CA bundle.
    #[arg(long)]
    pub cacert: Option<PathBuf>,
    /// Identify secure connections to the proxy using this TLS certificate file.
    #[arg(long)]
    pub cert_file: Option<PathBuf>,
    /// Identify secure connections to the proxy using this TLS key file.
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// Verify client certificates of connections to the proxy using this CA bundle.
    #[arg(long)]
    pub trusted_ca_file: Option<PathBuf>,
    /// Proxy client certificate revocation list file (PEM).
    #[arg(long)]
    pub client_crl_file: Option<PathBuf>,
    /// Require and verify client certificates, and forward each client's certificate to the members
    /// (keyward-forwarded-client-cert) so that they act as that client. Without it the members see
    /// the proxy's own certificate (sidecar mode).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub client_cert_auth: bool,
    /// What names the client in its certificate (cn, uri-san or dns-san), for the proxy's logs. The
    /// member decides the user from the forwarded certificate by its own --client-cert-identity: set
    /// both alike.
    #[arg(long, default_value = "cn")]
    pub client_cert_identity: IdentitySource,
    /// Minimum TLS version the listener accepts: TLS1.2 or TLS1.3 (empty: TLS1.2).
    #[arg(long, default_value = "")]
    pub tls_min_version: String,
    /// Maximum TLS version the listener accepts: TLS1.2 or TLS1.3 (empty: TLS1.3).
    #[arg(long, default_value = "")]
    pub tls_max_version: String,
    /// Comma-separated TLS 1.2 cipher suites the listener accepts, by Go's names, in order of
    /// preference (empty: rustls' defaults).
    #[arg(long, value_delimiter = ',')]
    pub cipher_suites: Vec<String>,
    /// Largest request the HTTP/JSON gateway accepts, as the members' --max-request-bytes (the
    /// members enforce their own limit on every call).
    #[arg(long, default_value_t = 1_572_864)]
    pub max_request_bytes: usize,
    /// Client connections the proxy holds at most; more are closed on accept (as the member's flag).
    #[arg(long, default_value_t = 10_000)]
    pub max_client_connections: usize,
    /// A client connection on which the client sends nothing for this long is closed (a live client
    /// answers the keepalive pings, so keep it above the keepalive interval + timeout).
    #[arg(long, default_value = "3h")]
    pub client_idle_timeout: String,
    /// How often the proxy pings a client connection (0 disables the pings).
    #[arg(long, default_value = "2h")]
    pub grpc_keepalive_interval: String,
    /// How long a ping may go unanswered before the connection is closed.
    #[arg(long, default_value = "20s")]
    pub grpc_keepalive_timeout: String,
    /// Enable debug-level logging.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub debug: bool,
}
