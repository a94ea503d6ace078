//! `keyward serve`'s flags, named as etcd names them, each also read from its `ETCD_*` (or
//! `KEYWARD_*`) environment variable, as with etcd. `config/` checks them into a `Config`.

use std::path::PathBuf;

use clap::Args;

use crate::identity::certificate::IdentitySource;

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
    /// Duration of periodic watch progress notifications (0: etcd's default, 10m).
    #[arg(long, env = "ETCD_WATCH_PROGRESS_NOTIFY_INTERVAL")]
    pub watch_progress_notify_interval: Option<String>,
    /// etcd 3.4's name of --watch-progress-notify-interval.
    #[arg(long, env = "ETCD_EXPERIMENTAL_WATCH_PROGRESS_NOTIFY_INTERVAL")]
    pub experimental_watch_progress_notify_interval: Option<String>,
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
    /// Minimum TLS version supported by keyward: TLS1.2 or TLS1.3 (client and peer listeners, and
    /// the peer connections a member dials). Empty: TLS1.2.
    #[arg(long, env = "ETCD_TLS_MIN_VERSION", default_value = "")]
    pub tls_min_version: String,
    /// Maximum TLS version supported by keyward: TLS1.2 or TLS1.3. Empty: TLS1.3.
    #[arg(long, env = "ETCD_TLS_MAX_VERSION", default_value = "")]
    pub tls_max_version: String,
    /// Comma-separated list of supported TLS 1.2 cipher suites, by Go's names, in order of
    /// preference, between client/server and peers (empty: rustls' defaults).
    #[arg(long, env = "ETCD_CIPHER_SUITES", value_delimiter = ',')]
    pub cipher_suites: Vec<String>,
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
    /// Serve linearizable reads on the leader under a read lease instead of a heartbeat round per
    /// read index (keyward; docs/architecture.md "read"; `false` for a heartbeat round per read
    /// index, as etcd): every member must set the same value and --election-timeout.
    #[arg(long, env = "KEYWARD_LEADER_LEASE_READS", num_args = 0..=1, default_missing_value = "true", default_value = "true")]
    pub leader_lease_reads: bool,
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

impl ServeArgs {
    /// Parses `args` (`--flag=value` only) with every default but without reading `ETCD_*`
    /// variables: with a configuration file etcd ignores them (`config/file.rs`).
    pub(crate) fn parse_without_environment(args: &[String]) -> Result<ServeArgs, String> {
        use clap::FromArgMatches;
        let command = ServeArgs::augment_args(clap::Command::new("config-file"))
            .mut_args(|arg| arg.env(None::<&str>))
            .no_binary_name(true);
        let matches = command.try_get_matches_from(args).map_err(|e| clap_message(&e))?;
        ServeArgs::from_arg_matches(&matches).map_err(|e| clap_message(&e))
    }
}

/// Every long flag of `keyward serve`.
pub(crate) fn serve_flag_names() -> std::collections::BTreeSet<String> {
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
