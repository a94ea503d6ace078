//! `keyward serve` flags, named as etcd names them, parsed once into a typed `Config`.
//!
//! Every flag can also come from the matching `ETCD_*` environment variable, as with etcd. Anything that
//! keyward cannot honour yet is refused here with a clear message, never silently ignored.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::identity::certificate::IdentitySource;

pub(crate) mod auto_compaction;
pub(crate) mod file;

#[derive(Parser, Debug)]
#[command(name = "keyward", version, about = "An etcd-v3-compatible key-value store with authentication done right")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a cluster member.
    Serve(Box<ServeArgs>),
    /// gRPC proxy in front of the members (etcd's `grpc-proxy`), keeping each client's certificate
    /// identity; also the sidecar.
    #[command(subcommand)]
    GrpcProxy(GrpcProxyCommand),
    /// Backups: save a member's, restore one into a new data dir, show one's status (etcdctl's and
    /// etcdutl's `snapshot`).
    #[command(subcommand)]
    Snapshot(crate::cli::backup::SnapshotCommand),
    /// A new data dir from an etcd 3.4/3.5 snapshot: keys with their revisions, leases, users, roles.
    Migrate(Box<crate::cli::backup::MigrateArgs>),
}

#[derive(Subcommand, Debug)]
pub enum GrpcProxyCommand {
    /// Start the gRPC proxy.
    Start(Box<crate::proxy::config::StartArgs>),
}

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Path to etcd's YAML configuration file. When given, the other flags and ETCD_* variables are
    /// ignored, as etcd does; settings keyward does not have are refused unless left at etcd's defaults.
    #[arg(long, env = "ETCD_CONFIG_FILE")]
    pub config_file: Option<PathBuf>,
    /// Human-readable name for this member.
    #[arg(long, env = "ETCD_NAME", default_value = "default")]
    pub name: String,
    /// Path to the data directory.
    #[arg(long, env = "ETCD_DATA_DIR", default_value = "default.keyward")]
    pub data_dir: PathBuf,
    /// List of URLs to listen on for client traffic.
    #[arg(long, env = "ETCD_LISTEN_CLIENT_URLS", default_value = "http://127.0.0.1:2379", value_delimiter = ',')]
    pub listen_client_urls: Vec<String>,
    /// List of this member's client URLs to advertise to the rest of the cluster.
    #[arg(long, env = "ETCD_ADVERTISE_CLIENT_URLS", default_value = "http://127.0.0.1:2379", value_delimiter = ',')]
    pub advertise_client_urls: Vec<String>,
    /// List of URLs to listen on for peer traffic.
    #[arg(long, env = "ETCD_LISTEN_PEER_URLS", default_value = "http://127.0.0.1:2380", value_delimiter = ',')]
    pub listen_peer_urls: Vec<String>,
    /// List of this member's peer URLs to advertise to the rest of the cluster.
    #[arg(
        long,
        env = "ETCD_INITIAL_ADVERTISE_PEER_URLS",
        default_value = "http://127.0.0.1:2380",
        value_delimiter = ','
    )]
    pub initial_advertise_peer_urls: Vec<String>,
    /// Initial cluster configuration for bootstrapping (default: NAME=INITIAL-ADVERTISE-PEER-URLS).
    #[arg(long, env = "ETCD_INITIAL_CLUSTER")]
    pub initial_cluster: Option<String>,
    /// Initial cluster state ('new' or 'existing').
    #[arg(long, env = "ETCD_INITIAL_CLUSTER_STATE", default_value = "new")]
    pub initial_cluster_state: String,
    /// Initial cluster token for the cluster during bootstrap.
    #[arg(long, env = "ETCD_INITIAL_CLUSTER_TOKEN", default_value = "etcd-cluster")]
    pub initial_cluster_token: String,
    /// Maximum client request size in bytes the server will accept.
    #[arg(long, env = "ETCD_MAX_REQUEST_BYTES", default_value_t = 1_572_864)]
    pub max_request_bytes: u32,
    /// Minimum duration interval that a client should wait before pinging server (accepted as etcd's;
    /// keyward's HTTP/2 server cannot enforce a client ping policy).
    #[arg(long, env = "ETCD_GRPC_KEEPALIVE_MIN_TIME", default_value = "5s")]
    pub grpc_keepalive_min_time: String,
    /// Frequency duration of server-to-client ping to check if a connection is alive (0 to disable).
    #[arg(long, env = "ETCD_GRPC_KEEPALIVE_INTERVAL", default_value = "2h")]
    pub grpc_keepalive_interval: String,
    /// Additional duration of wait before closing a non-responsive connection (0 to disable).
    #[arg(long, env = "ETCD_GRPC_KEEPALIVE_TIMEOUT", default_value = "20s")]
    pub grpc_keepalive_timeout: String,
    /// Maximum concurrent streams that each client can open at a time.
    #[arg(long, env = "ETCD_MAX_CONCURRENT_STREAMS", default_value_t = u32::MAX)]
    pub max_concurrent_streams: u32,
    /// Client connections each client listener holds at most; more are closed on accept (keyward).
    #[arg(long, env = "KEYWARD_MAX_CLIENT_CONNECTIONS", default_value_t = 10_000)]
    pub max_client_connections: usize,
    /// A client connection on which the client sends nothing for this long is closed (keyward; a
    /// live client answers the keepalive pings, so keep it above the keepalive interval + timeout).
    #[arg(long, env = "KEYWARD_CLIENT_IDLE_TIMEOUT", default_value = "3h")]
    pub client_idle_timeout: String,
    /// Number of committed entries that trigger a snapshot of the state (and let the raft log be
    /// compacted behind it). Counts requests, also when several share one entry (group commit).
    #[arg(long, env = "ETCD_SNAPSHOT_COUNT", default_value_t = 100_000)]
    pub snapshot_count: u64,
    /// Maximum number of operations permitted in a transaction.
    #[arg(long, env = "ETCD_MAX_TXN_OPS", default_value_t = 128)]
    pub max_txn_ops: u32,
    /// Raise alarms when the backend size exceeds the given quota (0 defaults to 2 GiB; a negative
    /// value disables the quota).
    #[arg(long, env = "ETCD_QUOTA_BACKEND_BYTES", default_value_t = 0, allow_negative_numbers = true)]
    pub quota_backend_bytes: i64,
    /// Size of the disk-full ballast kept in the data dir: deleted when a write finds the disk full, so
    /// the member can finish that write and raise a NOSPACE alarm instead of stopping (0 = none).
    #[arg(long, env = "KEYWARD_BALLAST_BYTES", default_value_t = crate::space::ballast::DEFAULT_BALLAST_BYTES)]
    pub ballast_bytes: u64,
    /// Specify auth token type and its options, e.g. "simple" or
    /// "jwt,pub-key=PATH,priv-key=PATH,sign-method=RS256,ttl=5m".
    #[arg(long, env = "ETCD_AUTH_TOKEN", default_value = "simple")]
    pub auth_token: String,
    /// The lifetime in seconds of an unused simple auth token.
    #[arg(long, env = "ETCD_AUTH_TOKEN_TTL", default_value_t = 300)]
    pub auth_token_ttl: u64,
    /// Cost of bcrypt password hashing (4 to 31).
    #[arg(long, env = "ETCD_BCRYPT_COST", default_value_t = 10)]
    pub bcrypt_cost: u32,
    /// Write every auth decision as a JSON line to this file (keyward; see docs/audit-log.md).
    #[arg(long, env = "KEYWARD_AUDIT_LOG")]
    pub audit_log: Option<std::path::PathBuf>,
    /// Rotate the audit log when it would grow past this many bytes.
    #[arg(long, env = "KEYWARD_AUDIT_LOG_MAX_SIZE", default_value_t = 100 * 1024 * 1024)]
    pub audit_log_max_size: u64,
    /// Rotated audit logs kept (PATH.1 ... PATH.N).
    #[arg(long, env = "KEYWARD_AUDIT_LOG_MAX_BACKUPS", default_value_t = 5)]
    pub audit_log_max_backups: u32,
    /// Login attempts per user and source (certificate identity, else client address) checked at
    /// once before further ones queue and wait (keyward; four times as many for one source trying
    /// several users).
    #[arg(long, env = "KEYWARD_LOGIN_THROTTLE_FREE_FAILURES", default_value_t = 5)]
    pub login_throttle_free_failures: u32,
    /// The first throttled attempt's wait, in milliseconds; it doubles with every further failure.
    #[arg(long, env = "KEYWARD_LOGIN_THROTTLE_BASE_DELAY", default_value_t = 200)]
    pub login_throttle_base_delay: u64,
    /// The longest wait, in milliseconds; an attempt that would wait longer is refused ("too many
    /// requests").
    #[arg(long, env = "KEYWARD_LOGIN_THROTTLE_MAX_DELAY", default_value_t = 30_000)]
    pub login_throttle_max_delay: u64,
    /// Path to the client server TLS cert file.
    #[arg(long, env = "ETCD_CERT_FILE")]
    pub cert_file: Option<PathBuf>,
    /// Path to the client server TLS key file.
    #[arg(long, env = "ETCD_KEY_FILE")]
    pub key_file: Option<PathBuf>,
    /// Path to the client server TLS trusted CA cert file.
    #[arg(long, env = "ETCD_TRUSTED_CA_FILE")]
    pub trusted_ca_file: Option<PathBuf>,
    /// Require and verify client certificates; their Common Name becomes the user.
    #[arg(long, env = "ETCD_CLIENT_CERT_AUTH", num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub client_cert_auth: bool,
    /// Path to a CRL (PEM) of revoked client certificates, refused at the handshake.
    #[arg(long, env = "ETCD_CLIENT_CRL_FILE")]
    pub client_crl_file: Option<PathBuf>,
    /// Allowed Common Names of client certificates (comma-separated); others are refused.
    #[arg(long, env = "ETCD_CLIENT_CERT_ALLOWED_CN", value_delimiter = ',')]
    pub client_cert_allowed_cn: Vec<String>,
    /// Allowed host names of client certificates: DNS or IP SANs, not the CN (comma-separated).
    #[arg(long, env = "ETCD_CLIENT_CERT_ALLOWED_HOSTNAME", value_delimiter = ',')]
    pub client_cert_allowed_hostname: Vec<String>,
    /// Client-certificate Common Names of the proxies allowed to forward a client's certificate
    /// (gRPC metadata keyward-forwarded-client-cert; comma-separated). Needs --client-cert-auth.
    #[arg(long, env = "KEYWARD_TRUSTED_PROXY_CN", value_delimiter = ',')]
    pub trusted_proxy_cn: Vec<String>,
    /// What names the user in a verified client certificate: cn (its subject Common Name, as etcd),
    /// uri-san (its one URI SAN, e.g. a SPIFFE ID) or dns-san (its one DNS SAN). With a SAN rule a
    /// certificate with none or several such SANs names nobody, and --trusted-proxy-cn lists the
    /// proxies' SANs.
    #[arg(long, env = "KEYWARD_CLIENT_CERT_IDENTITY", default_value = "cn")]
    pub client_cert_identity: IdentitySource,
    /// Path to the peer server TLS cert file.
    #[arg(long, env = "ETCD_PEER_CERT_FILE")]
    pub peer_cert_file: Option<PathBuf>,
    /// Path to the peer server TLS key file.
    #[arg(long, env = "ETCD_PEER_KEY_FILE")]
    pub peer_key_file: Option<PathBuf>,
    /// Path to the peer server TLS trusted CA file.
    #[arg(long, env = "ETCD_PEER_TRUSTED_CA_FILE")]
    pub peer_trusted_ca_file: Option<PathBuf>,
    /// Require and verify peer client certificates. (An https:// peer URL always does: keyward admits
    /// a peer only by a server certificate of --peer-trusted-ca-file that names another member's peer
    /// URL host, or what --peer-cert-allowed-cn / --peer-cert-allowed-hostname list.)
    #[arg(long, env = "ETCD_PEER_CLIENT_CERT_AUTH", num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub peer_client_cert_auth: bool,
    /// Allowed Common Names of peer certificates (comma-separated): instead of the member-host rule,
    /// only server certificates with one of these CNs may call the peer port.
    #[arg(long, env = "ETCD_PEER_CERT_ALLOWED_CN", value_delimiter = ',')]
    pub peer_cert_allowed_cn: Vec<String>,
    /// Allowed host names of peer certificates (comma-separated; DNS or IP SANs as Go's VerifyHostname
    /// matches them, not the CN): instead of the member-host rule, only server certificates naming one
    /// of these may call the peer port. Exclusive with --peer-cert-allowed-cn, as in etcd.
    #[arg(long, env = "ETCD_PEER_CERT_ALLOWED_HOSTNAME", value_delimiter = ',')]
    pub peer_cert_allowed_hostname: Vec<String>,
    /// Accept an http:// --listen-peer-urls on a non-loopback address (keyward). Plain-text peer
    /// traffic proves no one's identity: anyone who reaches the port can act as a member. Use only on
    /// a network only the members reach.
    #[arg(long, env = "KEYWARD_PEER_ALLOW_PLAINTEXT", num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub peer_allow_plaintext: bool,
    /// Path to a CRL (PEM) of revoked peer certificates, refused at the handshake.
    #[arg(long, env = "ETCD_PEER_CRL_FILE")]
    pub peer_crl_file: Option<PathBuf>,
    /// Time (in milliseconds) of a heartbeat interval.
    #[arg(long, env = "ETCD_HEARTBEAT_INTERVAL", default_value_t = 100)]
    pub heartbeat_interval: u64,
    /// Time (in milliseconds) for an election to timeout.
    #[arg(long, env = "ETCD_ELECTION_TIMEOUT", default_value_t = 1000)]
    pub election_timeout: u64,
    /// Log level: debug, info, warn, error, panic, or fatal.
    #[arg(long, env = "ETCD_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Log format: 'zap' (JSON lines, as etcd's zap logger) or 'capnslog' (keyward's text lines).
    #[arg(long, env = "ETCD_LOGGER", default_value = "capnslog")]
    pub logger: String,
    /// Where logs go: 'default' or 'stderr', 'stdout', or file paths (comma-separated).
    #[arg(long, env = "ETCD_LOG_OUTPUTS", default_value = "default", value_delimiter = ',')]
    pub log_outputs: Vec<String>,
    /// Additional URLs to serve /metrics and /health on (http:// or https:// with the client TLS
    /// settings), e.g. for a scraper that must not reach the client port.
    #[arg(long, env = "ETCD_LISTEN_METRICS_URLS", value_delimiter = ',')]
    pub listen_metrics_urls: Vec<String>,
    /// Interpret --auto-compaction-retention as a time period ('periodic') or a number of revisions
    /// ('revision').
    #[arg(long, env = "ETCD_AUTO_COMPACTION_MODE", default_value = "periodic")]
    pub auto_compaction_mode: String,
    /// Auto compaction retention: periodic mode a duration ('1h', '30m'; a bare number is hours),
    /// revision mode a number of revisions. 0 disables auto compaction.
    #[arg(long, env = "ETCD_AUTO_COMPACTION_RETENTION", default_value = "0")]
    pub auto_compaction_retention: String,
    /// etcd's v2 API: keyward serves only v3, so only false is accepted.
    #[arg(long, env = "ETCD_ENABLE_V2", num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub enable_v2: bool,
}

/// gRPC overhead allowed on top of `--max-request-bytes` (etcd's `grpcOverheadBytes`), so an oversized
/// request reaches the handler and gets etcd's "request is too large" rather than a transport error.
/// Watch responses are split into fragments at the same limit (`server/watch.rs`), as etcd does.
pub(crate) const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;

/// A validated member configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub name: String,
    pub data_dir: PathBuf,
    pub listen_client: Vec<Listener>,
    pub advertise_client_urls: Vec<String>,
    /// This member's advertised peer URLs (`--initial-advertise-peer-urls`).
    pub peer_urls: Vec<String>,
    /// `--listen-peer-urls`.
    pub listen_peer: Vec<Listener>,
    /// `--initial-cluster`: every initial member's name and peer URLs, in the order given.
    pub initial_cluster: Vec<(String, Vec<String>)>,
    /// `--initial-cluster-state`.
    pub cluster_state: ClusterState,
    pub cluster_token: String,
    pub heartbeat_interval: std::time::Duration,
    pub election_timeout: std::time::Duration,
    pub max_request_bytes: usize,
    /// Client connection bounds and HTTP/2 settings (`server/connections.rs`).
    pub connections: crate::frontend::connection_limits::ConnectionLimits,
    pub max_txn_ops: usize,
    pub snapshot_count: u64,
    /// `--quota-backend-bytes`.
    pub quota: crate::space::Quota,
    pub ballast_bytes: u64,
    pub auth_token: crate::auth::token_config::TokenConfig,
    pub auth_token_ttl: std::time::Duration,
    pub bcrypt_cost: u32,
    pub login_throttle: crate::auth::throttle::Limits,
    /// `--audit-log*`.
    pub audit: Option<crate::auth::audit::AuditConfig>,
    /// TLS for `https://` client listeners.
    pub client_tls: Option<crate::frontend::tls::settings::TlsSettings>,
    /// Peer TLS: the peer listener's settings, and the certificate this member presents to its peers.
    pub peer_tls: Option<crate::frontend::tls::settings::TlsSettings>,
    /// `--peer-cert-allowed-cn` and `--peer-cert-allowed-hostname` (at most one of them is set): part
    /// of the rule of who is a member on the peer port (`cluster/admission.rs`), not of the handshake.
    pub peer_cert_allowed_cn: Vec<String>,
    pub peer_cert_allowed_hostname: Vec<String>,
    pub log_filter: &'static str,
    /// `--logger`, `--log-outputs`.
    pub log: crate::logging::LogSettings,
    /// `--listen-metrics-urls`: listeners serving only `/metrics` and `/health`.
    pub listen_metrics: Vec<Listener>,
    /// `--auto-compaction-mode` / `--auto-compaction-retention`; `None` when off.
    pub auto_compaction: Option<auto_compaction::AutoCompaction>,
    /// `--config-file`, when the settings came from it.
    pub config_file: Option<PathBuf>,
    /// What the configuration file's reading found worth a warning, for the log once it is up.
    pub warnings: Vec<String>,
}

/// `--initial-cluster-state`: bootstrap a new cluster from `--initial-cluster`, or join a running one
/// that has already added this member (`etcdctl member add`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterState {
    New,
    Existing,
}

#[derive(Debug, Clone)]
pub struct Listener {
    pub url: String,
    pub addr: SocketAddr,
    pub tls: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

fn invalid(msg: impl Into<String>) -> ConfigError {
    ConfigError(msg.into())
}

impl ServeArgs {
    /// The validated configuration: from these flags, or — with `--config-file` — from the file alone,
    /// as etcd reads it (`config/file.rs`).
    pub fn into_config(self) -> Result<Config, ConfigError> {
        let Some(path) = self.config_file.clone() else {
            return self.validate(None, Vec::new());
        };
        let known = serve_flag_names();
        let file = file::load(&path, |flag| flag != "config-file" && known.contains(flag)).map_err(invalid)?;
        let args = ServeArgs::parse_without_environment(&file.args)
            .map_err(|e| invalid(format!("--config-file {}: {e}", path.display())))?;
        args.validate(Some(path), file.warnings)
    }

    /// Parses `args` (`--flag=value` only) with every default but without reading `ETCD_*`
    /// variables: with a configuration file etcd ignores them.
    fn parse_without_environment(args: &[String]) -> Result<ServeArgs, String> {
        use clap::FromArgMatches;
        let command = ServeArgs::augment_args(clap::Command::new("config-file"))
            .mut_args(|arg| arg.env(None::<&str>))
            .no_binary_name(true);
        let matches = command.try_get_matches_from(args).map_err(|e| clap_message(&e))?;
        ServeArgs::from_arg_matches(&matches).map_err(|e| clap_message(&e))
    }

    fn validate(self, config_file: Option<PathBuf>, warnings: Vec<String>) -> Result<Config, ConfigError> {
        if self.enable_v2 {
            return Err(invalid("--enable-v2: keyward serves only etcd's v3 API; remove the flag or set it to false"));
        }
        let log = crate::logging::LogSettings::from_flags(&self.logger, &self.log_outputs).map_err(invalid)?;
        let auto_compaction =
            auto_compaction::AutoCompaction::from_flags(&self.auto_compaction_mode, &self.auto_compaction_retention)
                .map_err(invalid)?;
        let listen_metrics = self
            .listen_metrics_urls
            .iter()
            .map(|u| parse_listener(u, "--listen-metrics-urls"))
            .collect::<Result<Vec<_>, _>>()?;
        if listen_metrics.iter().any(|l| l.tls) && (self.cert_file.is_none() || self.key_file.is_none()) {
            return Err(invalid("an https:// --listen-metrics-urls needs --cert-file and --key-file"));
        }
        let log_filter = match self.log_level.as_str() {
            "debug" => "debug",
            "info" => "info",
            "warn" => "warn",
            "error" | "dpanic" | "panic" | "fatal" => "error",
            other => {
                return Err(invalid(format!(
                    "unknown log level {other:?} (want debug, info, warn, error, panic, or fatal)"
                )))
            }
        };
        if self.name.is_empty() {
            return Err(invalid("--name must not be empty"));
        }
        let listen_client = self
            .listen_client_urls
            .iter()
            .map(|u| parse_listener(u, "--listen-client-urls"))
            .collect::<Result<Vec<_>, _>>()?;
        let client_tls = match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => Some(crate::frontend::tls::settings::TlsSettings {
                cert_file: cert.clone(),
                key_file: key.clone(),
                trusted_ca_file: self.trusted_ca_file.clone(),
                client_cert_auth: self.client_cert_auth,
                crl_file: self.client_crl_file.clone(),
                allowed_cns: self.client_cert_allowed_cn.clone(),
                allowed_hostnames: self.client_cert_allowed_hostname.clone(),
                trusted_proxy_cns: self.trusted_proxy_cn.clone(),
                identity_source: self.client_cert_identity,
            }),
            (None, None) => None,
            _ => return Err(invalid("--cert-file and --key-file go together")),
        };
        if listen_client.iter().any(|l| l.tls) && client_tls.is_none() {
            return Err(invalid("an https:// client URL needs --cert-file and --key-file"));
        }
        if self.client_cert_auth && self.trusted_ca_file.is_none() {
            return Err(invalid("--client-cert-auth needs --trusted-ca-file"));
        }
        if client_tls.is_none()
            && (self.client_crl_file.is_some()
                || !self.client_cert_allowed_cn.is_empty()
                || !self.client_cert_allowed_hostname.is_empty()
                || !self.trusted_proxy_cn.is_empty())
        {
            return Err(invalid(
                "--client-crl-file, --client-cert-allowed-cn, --client-cert-allowed-hostname and --trusted-proxy-cn need client TLS (--cert-file, --key-file, --trusted-ca-file)",
            ));
        }
        if self.client_cert_identity != IdentitySource::CommonName && !self.client_cert_auth {
            return Err(invalid("--client-cert-identity names users by certificate: it needs --client-cert-auth"));
        }
        if !self.trusted_proxy_cn.is_empty() {
            // A proxy is trusted by its verified certificate, and what it forwards names a user only
            // where certificates do.
            if !self.client_cert_auth {
                return Err(invalid("--trusted-proxy-cn needs --client-cert-auth (and --trusted-ca-file)"));
            }
            if self.trusted_proxy_cn.iter().any(String::is_empty) {
                return Err(invalid("--trusted-proxy-cn: a Common Name must not be empty"));
            }
        }
        if let Some(tls) = &client_tls {
            // Fail at startup, not at the first connection, when a file is missing or malformed.
            tls.server_config().map_err(invalid)?;
        }
        if !self.peer_cert_allowed_cn.is_empty() && !self.peer_cert_allowed_hostname.is_empty() {
            return Err(invalid(format!(
                "--peer-cert-allowed-cn and --peer-cert-allowed-hostname are mutually exclusive (cn={:?}, hostname={:?})",
                self.peer_cert_allowed_cn.join(","),
                self.peer_cert_allowed_hostname.join(",")
            )));
        }
        let peer_tls = match (&self.peer_cert_file, &self.peer_key_file) {
            (Some(cert), Some(key)) => {
                let tls = crate::frontend::tls::settings::TlsSettings {
                    cert_file: cert.clone(),
                    key_file: key.clone(),
                    trusted_ca_file: self.peer_trusted_ca_file.clone(),
                    client_cert_auth: self.peer_client_cert_auth,
                    crl_file: self.peer_crl_file.clone(),
                    // The peer allow-lists are part of the member rule every peer request is held
                    // to (`cluster/admission.rs`), not of the handshake.
                    allowed_cns: Vec::new(),
                    allowed_hostnames: Vec::new(),
                    trusted_proxy_cns: Vec::new(),
                    identity_source: IdentitySource::CommonName,
                };
                tls.server_config().map_err(|e| invalid(format!("peer TLS: {e}")))?;
                Some(tls)
            }
            (None, None)
                if self.peer_client_cert_auth
                    || self.peer_trusted_ca_file.is_some()
                    || self.peer_crl_file.is_some()
                    || !self.peer_cert_allowed_cn.is_empty()
                    || !self.peer_cert_allowed_hostname.is_empty() =>
            {
                return Err(invalid("peer TLS flags need --peer-cert-file and --peer-key-file"))
            }
            (None, None) => None,
            _ => return Err(invalid("--peer-cert-file and --peer-key-file go together")),
        };
        for url in
            self.advertise_client_urls.iter().chain(&self.listen_peer_urls).chain(&self.initial_advertise_peer_urls)
        {
            parse_url(url)?;
        }
        let listen_peer = self
            .listen_peer_urls
            .iter()
            .map(|u| parse_listener(u, "--listen-peer-urls"))
            .collect::<Result<Vec<_>, _>>()?;
        let peer_urls_use_tls = listen_peer.iter().any(|l| l.tls)
            || self.initial_advertise_peer_urls.iter().any(|u| u.starts_with("https://"));
        if peer_urls_use_tls && (peer_tls.is_none() || self.peer_trusted_ca_file.is_none()) {
            return Err(invalid(
                "https:// peer URLs need --peer-cert-file, --peer-key-file and --peer-trusted-ca-file",
            ));
        }
        if let Some(listener) =
            listen_peer.iter().find(|l| !l.tls && !l.addr.ip().is_loopback() && !self.peer_allow_plaintext)
        {
            return Err(invalid(format!(
                "--listen-peer-urls {}: plain-text peer traffic beyond loopback proves no one's identity, so \
                 anyone who reaches the port could act as a member; use an https:// peer URL with \
                 --peer-cert-file, --peer-key-file and --peer-trusted-ca-file, or pass --peer-allow-plaintext \
                 if only the members can reach this address",
                listener.url
            )));
        }
        let cluster_state = match self.initial_cluster_state.as_str() {
            "new" => ClusterState::New,
            "existing" => ClusterState::Existing,
            other => {
                return Err(invalid(format!(
                    "invalid --initial-cluster-state {other:?} (want \"new\" or \"existing\")"
                )))
            }
        };
        if self.heartbeat_interval == 0 {
            return Err(invalid("--heartbeat-interval must be at least 1 ms"));
        }
        // etcd's rule: an election timeout of at least 5 heartbeats and at most 50 s.
        if self.election_timeout < 5 * self.heartbeat_interval {
            return Err(invalid(format!(
                "--election-timeout[{}ms] should be at least as 5 times as --heartbeat-interval[{}ms]",
                self.election_timeout, self.heartbeat_interval
            )));
        }
        if self.election_timeout > 50_000 {
            return Err(invalid(format!(
                "--election-timeout[{}ms] is too long, and should be set less than 50000ms",
                self.election_timeout
            )));
        }
        let initial_cluster = self.initial_cluster.clone().unwrap_or_else(|| {
            format!("{}={}", self.name, self.initial_advertise_peer_urls.join(&format!(",{}=", self.name)))
        });
        let mut members = Vec::<(String, Vec<String>)>::new();
        for entry in initial_cluster.split(',').filter(|e| !e.is_empty()) {
            let (name, url) = entry
                .split_once('=')
                .ok_or_else(|| invalid(format!("--initial-cluster entry {entry:?} is not NAME=URL")))?;
            parse_url(url)?;
            match members.iter_mut().find(|(n, _)| n == name) {
                Some((_, urls)) => urls.push(url.to_string()),
                None => members.push((name.to_string(), vec![url.to_string()])),
            }
        }
        let mut seen = std::collections::BTreeMap::new();
        for (name, urls) in &members {
            for url in urls {
                if let Some(other) = seen.insert(url.as_str(), name.as_str()) {
                    return Err(invalid(format!("--initial-cluster has duplicate url {url} ({other} and {name})")));
                }
            }
        }
        let Some((_, own)) = members.iter().find(|(n, _)| n == &self.name) else {
            return Err(invalid(format!(
                "--initial-cluster has no member named {:?} (this member's --name)",
                self.name
            )));
        };
        let mut own_sorted = own.clone();
        let mut advertised = self.initial_advertise_peer_urls.clone();
        own_sorted.sort();
        advertised.sort();
        if own_sorted != advertised {
            return Err(invalid(format!(
                "--initial-cluster has {}={} but --initial-advertise-peer-urls is {}",
                self.name,
                own.join(","),
                self.initial_advertise_peer_urls.join(",")
            )));
        }
        let auth_token =
            crate::auth::token_config::parse(&self.auth_token).map_err(|e| invalid(format!("--auth-token: {e}")))?;
        if !(4..=31).contains(&self.bcrypt_cost) {
            return Err(invalid(format!("--bcrypt-cost {} is out of range [4, 31]", self.bcrypt_cost)));
        }
        let duration = |flag: &str, text: &str| {
            crate::auth::token_config::parse_go_duration(text).map_err(|e| invalid(format!("--{flag}: {e}")))
        };
        duration("grpc-keepalive-min-time", &self.grpc_keepalive_min_time)?;
        let connections = crate::frontend::connection_limits::ConnectionLimits::from_flags(
            self.max_client_connections,
            &self.client_idle_timeout,
            &self.grpc_keepalive_interval,
            &self.grpc_keepalive_timeout,
            self.max_concurrent_streams,
        )
        .map_err(invalid)?;
        if self.login_throttle_base_delay > self.login_throttle_max_delay {
            return Err(invalid(format!(
                "--login-throttle-base-delay {} is above --login-throttle-max-delay {}",
                self.login_throttle_base_delay, self.login_throttle_max_delay
            )));
        }
        if self.auth_token_ttl == 0 {
            return Err(invalid("--auth-token-ttl must be at least 1 second"));
        }
        if self.max_txn_ops == 0 {
            return Err(invalid("--max-txn-ops must be at least 1"));
        }
        let quota = crate::space::Quota::from_flag(self.quota_backend_bytes);
        Ok(Config {
            name: self.name,
            data_dir: self.data_dir,
            listen_client,
            advertise_client_urls: self.advertise_client_urls,
            peer_urls: self.initial_advertise_peer_urls,
            listen_peer,
            initial_cluster: members,
            cluster_state,
            cluster_token: self.initial_cluster_token,
            heartbeat_interval: std::time::Duration::from_millis(self.heartbeat_interval),
            election_timeout: std::time::Duration::from_millis(self.election_timeout),
            max_request_bytes: self.max_request_bytes as usize,
            connections,
            max_txn_ops: self.max_txn_ops as usize,
            snapshot_count: self.snapshot_count.max(1),
            quota,
            ballast_bytes: self.ballast_bytes,
            auth_token,
            auth_token_ttl: std::time::Duration::from_secs(self.auth_token_ttl),
            bcrypt_cost: self.bcrypt_cost,
            audit: self.audit_log.clone().map(|path| crate::auth::audit::AuditConfig {
                path,
                max_size: self.audit_log_max_size,
                max_backups: self.audit_log_max_backups,
            }),
            login_throttle: crate::auth::throttle::Limits {
                free_failures: self.login_throttle_free_failures,
                base_delay: std::time::Duration::from_millis(self.login_throttle_base_delay),
                max_delay: std::time::Duration::from_millis(self.login_throttle_max_delay),
            },
            client_tls,
            peer_tls,
            peer_cert_allowed_cn: self.peer_cert_allowed_cn.clone(),
            peer_cert_allowed_hostname: self.peer_cert_allowed_hostname.clone(),
            log_filter,
            log,
            listen_metrics,
            auto_compaction,
            config_file,
            warnings,
        })
    }
}

/// Every long flag of `keyward serve`.
fn serve_flag_names() -> std::collections::BTreeSet<String> {
    serve_arguments().iter().filter_map(|arg| arg.get_long().map(str::to_string)).collect()
}

/// The arguments of `keyward serve`, as clap defines them.
fn serve_arguments() -> Vec<clap::Arg> {
    ServeArgs::augment_args(clap::Command::new("serve")).get_arguments().cloned().collect()
}

/// clap's message for a bad value, without its "error: " prefix and usage lines.
fn clap_message(error: &clap::Error) -> String {
    let text = error.to_string();
    let first = text.lines().next().unwrap_or_default();
    first.strip_prefix("error: ").unwrap_or(first).to_string()
}

/// Checks a `scheme://host:port` URL as etcd accepts them.
fn parse_url(url: &str) -> Result<(&str, &str), ConfigError> {
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

/// Go's flag package (and so etcd) accepts `-name value` as well as `--name value`; operators' scripts
/// use both. Rewrites single-dash long flags to the double-dash form clap expects — only in flag
/// positions: the value after a flag that takes one is passed on untouched, even when it starts with
/// `-` (as Go takes it; it is joined to its flag as `--flag=-value` so clap does too). Stops at `--`.
pub fn etcd_style_args(args: impl IntoIterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    use clap::CommandFactory;
    go_style_args(Cli::command(), args)
}

fn go_style_args(
    mut command: clap::Command,
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    command.build();
    let mut args = args.into_iter();
    let mut out: Vec<std::ffi::OsString> = args.next().into_iter().collect(); // the program name
    let mut command = &command;
    while let Some(arg) = args.next() {
        let Some(s) = arg.to_str() else {
            out.push(arg);
            continue;
        };
        if s == "--" {
            out.push(arg);
            out.extend(args);
            break;
        }
        let long = match s.strip_prefix("--") {
            Some(rest) => rest,
            None if s.len() > 2 && s.starts_with('-') && s.as_bytes()[1].is_ascii_alphabetic() => &s[1..],
            None => {
                // A short flag (`-h`) or a positional: a subcommand name moves to that subcommand's flags.
                if let Some(sub) = command.find_subcommand(s) {
                    command = sub;
                }
                out.push(arg);
                continue;
            }
        };
        let (name, inline_value) = match long.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (long, None),
        };
        let needs_value = command
            .get_arguments()
            .find(|a| a.get_long() == Some(name))
            .is_some_and(|a| a.get_num_args().is_some_and(|n| n.min_values() > 0));
        match (inline_value, needs_value) {
            (None, true) => match args.next() {
                Some(value) => {
                    let mut joined = std::ffi::OsString::from(format!("--{name}="));
                    joined.push(value);
                    out.push(joined);
                }
                None => out.push(format!("--{name}").into()),
            },
            _ => out.push(format!("--{long}").into()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, String> {
        let mut argv = vec!["keyward", "serve"];
        argv.extend_from_slice(args);
        let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
        let Command::Serve(args) = cli.command else { panic!("not serve") };
        args.into_config().map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_make_a_usable_single_member() {
        let config = parse(&[]).unwrap();
        assert_eq!(config.name, "default");
        assert_eq!(config.data_dir, PathBuf::from("default.keyward"));
        assert_eq!(config.listen_client[0].addr, "127.0.0.1:2379".parse().unwrap());
        assert_eq!(config.max_request_bytes, 1_572_864);
        assert_eq!(config.max_txn_ops, 128);
        assert_eq!(config.quota, crate::space::Quota::Bytes(2 << 30));
        assert_eq!(config.ballast_bytes, 64 << 20);
        assert_eq!(config.cluster_state, ClusterState::New);
        assert_eq!(config.initial_cluster, [("default".to_string(), vec!["http://127.0.0.1:2380".to_string()])]);
        assert_eq!(config.election_timeout, std::time::Duration::from_secs(1));
    }

    #[test]
    fn a_multi_member_initial_cluster_keeps_its_order_and_each_members_urls() {
        let config = parse(&[
            "--name",
            "b",
            "--initial-cluster",
            "a=http://127.0.0.1:1,b=http://127.0.0.1:2,b=http://127.0.0.2:2",
            "--initial-advertise-peer-urls",
            "http://127.0.0.2:2,http://127.0.0.1:2",
            "--initial-cluster-state=existing",
        ])
        .unwrap();
        assert_eq!(config.cluster_state, ClusterState::Existing);
        assert_eq!(config.initial_cluster[0], ("a".into(), vec!["http://127.0.0.1:1".into()]));
        assert_eq!(config.initial_cluster[1].1.len(), 2);
    }

    #[test]
    fn quota_flag_takes_etcds_values() {
        let quota = |args: &[&str]| parse(args).unwrap().quota;
        assert_eq!(quota(&["--quota-backend-bytes", "1048576"]), crate::space::Quota::Bytes(1 << 20));
        assert_eq!(quota(&["--quota-backend-bytes=0"]), crate::space::Quota::Bytes(2 << 30));
        assert_eq!(quota(&["--quota-backend-bytes", "-1"]), crate::space::Quota::Disabled { flag: -1 });
        assert!(parse(&["--quota-backend-bytes", "lots"]).is_err());
    }

    #[test]
    fn refuses_what_it_cannot_honour() {
        assert!(parse(&["--initial-cluster-state", "old"]).unwrap_err().contains("invalid --initial-cluster-state"));
        assert!(parse(&["--election-timeout", "400"]).unwrap_err().contains("at least as 5 times"));
        assert!(parse(&[
            "--initial-advertise-peer-urls",
            "https://127.0.0.1:2380",
            "--initial-cluster",
            "default=https://127.0.0.1:2380"
        ])
        .unwrap_err()
        .contains("--peer-trusted-ca-file"));
        assert!(parse(&["--initial-cluster", "default=http://127.0.0.1:2380,b=http://127.0.0.1:2380"])
            .unwrap_err()
            .contains("duplicate url"));
        assert!(parse(&["--listen-client-urls", "127.0.0.1:2379"]).unwrap_err().contains("no scheme"));
        assert!(parse(&["--log-level", "loud"]).unwrap_err().contains("unknown log level"));
        assert!(parse(&["--initial-cluster", "other=http://127.0.0.1:2380"]).unwrap_err().contains("no member named"));
        assert!(parse(&["--no-such-flag"]).is_err());
        assert!(parse(&["--client-cert-identity", "uri-san"]).unwrap_err().contains("needs --client-cert-auth"));
        assert!(parse(&["--client-cert-identity", "subject"]).unwrap_err().contains("want cn, uri-san or dns-san"));
    }

    #[test]
    fn plain_text_peer_urls_beyond_loopback_need_their_flag() {
        let peer = |url: &str, extra: &[&str]| {
            let mut args = vec!["--listen-peer-urls", url];
            args.extend_from_slice(extra);
            parse(&args)
        };
        for url in ["http://0.0.0.0:2380", "http://10.0.0.1:2380", "http://[::]:2380"] {
            let refused = peer(url, &[]).unwrap_err();
            assert!(refused.contains(url) && refused.contains("--peer-allow-plaintext"), "{refused}");
            assert!(peer(url, &["--peer-allow-plaintext"]).is_ok(), "{url} with the flag");
        }
        for url in ["http://127.0.0.1:2380", "http://localhost:2380", "http://[::1]:2380", "http://127.0.0.2:2380"] {
            assert!(peer(url, &[]).is_ok(), "{url} is loopback");
        }
    }

    #[test]
    fn peer_allow_lists_are_exclusive_and_need_peer_tls() {
        let both = parse(&["--peer-cert-allowed-cn", "a", "--peer-cert-allowed-hostname", "h"]).unwrap_err();
        assert!(both.contains("mutually exclusive"), "{both}");
        assert!(parse(&["--peer-cert-allowed-hostname", "h"]).unwrap_err().contains("need --peer-cert-file"));
    }

    fn go_style(argv: &[&str]) -> Vec<String> {
        etcd_style_args(argv.iter().map(Into::into)).into_iter().map(|a| a.into_string().unwrap()).collect()
    }

    #[test]
    fn accepts_go_style_single_dash_flags() {
        assert_eq!(
            go_style(&["keyward", "serve", "-name", "n1", "--data-dir=d", "-h"]),
            ["keyward", "serve", "--name=n1", "--data-dir=d", "-h"]
        );
        assert_eq!(
            go_style(&["keyward", "serve", "-client-cert-auth", "-log-level=warn", "-max-txn-ops", "64"]),
            ["keyward", "serve", "--client-cert-auth", "--log-level=warn", "--max-txn-ops=64"]
        );
    }

    /// A flag's value is never rewritten, also when it looks like a flag: `-initial-cluster-token -abc`
    /// is the token `-abc`, as etcd reads it.
    #[test]
    fn flag_values_that_start_with_a_dash_are_values() {
        let args =
            go_style(&["keyward", "serve", "-initial-cluster-token", "-abc", "-name", "-n1", "--data-dir", "-d"]);
        assert_eq!(args, ["keyward", "serve", "--initial-cluster-token=-abc", "--name=-n1", "--data-dir=-d"]);
        let cli = Cli::try_parse_from(args).unwrap();
        let Command::Serve(serve) = cli.command else { panic!("not serve") };
        assert_eq!(
            (serve.initial_cluster_token.as_str(), serve.name.as_str(), serve.data_dir.to_str()),
            ("-abc", "-n1", Some("-d"))
        );
        // A boolean flag takes no separate value: what follows it is the next flag.
        assert_eq!(
            go_style(&["keyward", "serve", "-client-cert-auth", "-name", "n"]),
            ["keyward", "serve", "--client-cert-auth", "--name=n"]
        );
        // After `--` nothing is a flag.
        assert_eq!(go_style(&["keyward", "serve", "--", "-name"]), ["keyward", "serve", "--", "-name"]);
        // A flag at the end with no value is left for clap to refuse.
        assert!(Cli::try_parse_from(go_style(&["keyward", "serve", "-name"])).is_err());
    }
}

/// `ETCD_*` variables in `environment` that no flag of `keyward serve` reads (etcd warns about those
/// too): a typo, or an etcd setting keyward does not have, would otherwise be ignored silently.
pub(crate) fn unknown_etcd_variables(environment: impl Iterator<Item = String>) -> Vec<String> {
    let known: std::collections::BTreeSet<String> = serve_arguments()
        .iter()
        .filter_map(|arg| arg.get_env())
        .map(|env| env.to_string_lossy().into_owned())
        .collect();
    let mut unknown: Vec<String> =
        environment.filter(|name| name.starts_with("ETCD_") && !known.contains(name)).collect();
    unknown.sort();
    unknown
}

#[cfg(test)]
mod unknown_variables {
    #[test]
    fn only_etcd_variables_no_flag_reads_are_reported() {
        let env = ["ETCD_NAME", "ETCD_DATA_DIR", "ETCD_ENABLE_V3", "ETCD_QUOTA_BACKEND_BYTZ", "ETCDCTL_API", "HOME"];
        let unknown = super::unknown_etcd_variables(env.iter().map(|s| s.to_string()));
        assert_eq!(unknown, ["ETCD_ENABLE_V3", "ETCD_QUOTA_BACKEND_BYTZ"]);
    }
}
