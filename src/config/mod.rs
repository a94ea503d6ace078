//! A member's settings: `keyward serve`'s flags (`cli/member.rs`), or etcd's configuration file
//! (`file.rs`), checked once into a typed `Config`.
//!
//! Anything that keyward cannot honour yet is refused here with a clear message, never silently
//! ignored. `validate` runs the checks in a fixed order (the first refusal is the one reported), each
//! concern in its own file: `listeners.rs` (URLs), `tls.rs`, `cluster.rs` (bootstrap and raft timing),
//! `auth.rs` (tokens, login throttle, audit log), `connections.rs`, `logging.rs`,
//! `auto_compaction.rs`; `duration.rs` reads Go's durations for all of them.

use std::path::PathBuf;

use crate::cli::member::{serve_flag_names, ServeArgs};

mod auth;
mod auth_token;
pub(crate) mod auto_compaction;
mod cluster;
pub(crate) mod connections;
pub(crate) mod duration;
mod error;
mod file;
mod listeners;
mod logging;
mod tls;
pub(crate) mod watch_progress;

pub(crate) use cluster::ClusterState;
pub(crate) use error::ConfigError;
pub(crate) use listeners::Listener;

use error::invalid;

/// gRPC overhead allowed on top of `--max-request-bytes` (etcd's `grpcOverheadBytes`), so an oversized
/// request reaches the handler and gets etcd's "request is too large" rather than a transport error.
/// Watch responses are split into fragments at the same limit (`server/watch/fragments.rs`), as etcd does.
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
    /// `--leader-lease-reads` (`node/read_lease.rs`).
    pub leader_lease_reads: bool,
    pub max_request_bytes: usize,
    /// `--watch-progress-notify-interval` (`watch_progress.rs`).
    pub watch_progress_notify_interval: std::time::Duration,
    /// Client connection bounds and HTTP/2 settings (`frontend/connection_limits.rs`).
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

    fn validate(self, config_file: Option<PathBuf>, warnings: Vec<String>) -> Result<Config, ConfigError> {
        if self.enable_v2 {
            return Err(invalid("--enable-v2: keyward serves only etcd's v3 API; remove the flag or set it to false"));
        }
        let log = crate::logging::LogSettings::from_flags(&self.logger, &self.log_outputs).map_err(invalid)?;
        let auto_compaction =
            auto_compaction::AutoCompaction::from_flags(&self.auto_compaction_mode, &self.auto_compaction_retention)
                .map_err(invalid)?;
        let listen_metrics = listeners::metrics_listeners(&self)?;
        let log_filter = logging::log_filter(&self.log_level)?;
        if self.name.is_empty() {
            return Err(invalid("--name must not be empty"));
        }
        let listen_client = listeners::parse_listeners(&self.listen_client_urls, "--listen-client-urls")?;
        // Checked whether or not a listener uses TLS, as etcd checks them.
        tls::tls_policy(&self)?;
        let client_tls = tls::client_tls(&self, &listen_client)?;
        let peer_tls = tls::peer_tls(&self)?;
        let listen_peer = listeners::peer_listeners(&self, peer_tls.as_ref())?;
        let cluster_state = cluster::cluster_state(&self.initial_cluster_state)?;
        cluster::check_raft_timing(self.heartbeat_interval, self.election_timeout)?;
        let initial_cluster = cluster::initial_members(&self)?;
        let auth_token = auth::auth_token(&self.auth_token)?;
        auth::check_bcrypt_cost(self.bcrypt_cost)?;
        let connections = member_connection_limits(&self)?;
        let login_throttle = auth::login_throttle(&self)?;
        let auth_token_ttl = auth::auth_token_ttl(self.auth_token_ttl)?;
        if self.max_txn_ops == 0 {
            return Err(invalid("--max-txn-ops must be at least 1"));
        }
        let quota = crate::space::Quota::from_flag(self.quota_backend_bytes);
        let watch_progress_notify_interval = watch_progress::interval(
            self.watch_progress_notify_interval.as_deref(),
            self.experimental_watch_progress_notify_interval.as_deref(),
        )
        .map_err(invalid)?;
        Ok(Config {
            audit: auth::audit(&self), // before the fields move out of `self`
            name: self.name,
            data_dir: self.data_dir,
            listen_client,
            advertise_client_urls: self.advertise_client_urls,
            peer_urls: self.initial_advertise_peer_urls,
            listen_peer,
            initial_cluster,
            cluster_state,
            cluster_token: self.initial_cluster_token,
            heartbeat_interval: std::time::Duration::from_millis(self.heartbeat_interval),
            election_timeout: std::time::Duration::from_millis(self.election_timeout),
            leader_lease_reads: self.leader_lease_reads,
            max_request_bytes: self.max_request_bytes as usize,
            watch_progress_notify_interval,
            connections,
            max_txn_ops: self.max_txn_ops as usize,
            snapshot_count: self.snapshot_count.max(1),
            quota,
            ballast_bytes: self.ballast_bytes,
            auth_token,
            auth_token_ttl,
            bcrypt_cost: self.bcrypt_cost,
            login_throttle,
            client_tls,
            peer_tls,
            peer_cert_allowed_cn: self.peer_cert_allowed_cn,
            peer_cert_allowed_hostname: self.peer_cert_allowed_hostname,
            log_filter,
            log,
            listen_metrics,
            auto_compaction,
            config_file,
            warnings,
        })
    }
}

/// A member's connection limits (here, not in `connections.rs`, which the proxy also uses and which
/// must not reach the member's flags). `--grpc-keepalive-min-time` is only checked: keyward's HTTP/2 server
/// cannot enforce a client ping policy.
fn member_connection_limits(
    args: &ServeArgs,
) -> Result<crate::frontend::connection_limits::ConnectionLimits, ConfigError> {
    duration::parse_go_duration(&args.grpc_keepalive_min_time)
        .map_err(|e| invalid(format!("--grpc-keepalive-min-time: {e}")))?;
    connections::connection_limits(
        args.max_client_connections,
        &args.client_idle_timeout,
        &args.grpc_keepalive_interval,
        &args.grpc_keepalive_timeout,
        args.max_concurrent_streams,
    )
    .map_err(invalid)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

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

    /// Each `--auth-token` refusal names the flag once (it once read `--auth-token: --auth-token: ...`).
    #[test]
    fn auth_token_errors_name_the_flag_once() {
        for flag in ["jwt,sign-method=XX", "jwt,ttl=abc,priv-key=k,sign-method=RS256", "simple,ttl=1s", "bogus", "jwt"]
        {
            let e = parse(&["--auth-token", flag]).unwrap_err();
            assert!(e.starts_with("--auth-token: "), "{flag}: {e}");
            assert_eq!(e.matches("--auth-token:").count(), 1, "{flag}: {e}");
        }
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
}
