//! `keyward-bench` options, parsed with clap, and their checks beyond what clap checks.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};

/// `keyward-bench` options. The connection and sizing options are global: they may come before or
/// after the workload name.
#[derive(Args, Debug, Clone)]
pub(crate) struct BenchArgs {
    /// Comma-separated endpoints: `host:port`, `http://host:port` or `https://host:port`
    /// (without a scheme, https when --cacert or --cert is given).
    #[arg(long, global = true, value_delimiter = ',', default_value = "127.0.0.1:2379")]
    pub endpoints: Vec<String>,
    /// Number of gRPC connections (HTTP/2 channels), assigned round-robin over the endpoints.
    #[arg(long, global = true, default_value_t = 1)]
    pub conns: usize,
    /// Number of concurrent clients (each with one request in flight), sharing the connections.
    #[arg(long, global = true, default_value_t = 1)]
    pub clients: usize,
    /// Total number of requests (default 10000 unless --duration is given).
    #[arg(long, global = true)]
    pub total: Option<u64>,
    /// Run for this long instead (`5s`, `500ms`, `1m`); with --total, stops at whichever comes first.
    #[arg(long, global = true, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Key size in bytes: the prefix followed by the key's index, zero-padded to this size.
    #[arg(long, global = true, default_value_t = 8)]
    pub key_size: usize,
    /// Value size in bytes.
    #[arg(long, global = true, default_value_t = 8)]
    pub val_size: usize,
    /// Number of distinct keys written (keys are drawn uniformly from it).
    #[arg(long, global = true, alias = "key-space-size", default_value_t = 1)]
    pub key_space: u64,
    /// Write keys in order (index = request number modulo --key-space) instead of at random.
    #[arg(long, global = true)]
    pub sequential_keys: bool,
    /// Prefix of every key the workloads touch.
    #[arg(long, global = true, default_value = "")]
    pub prefix: String,
    /// CA bundle that signs the server certificates.
    #[arg(long, global = true)]
    pub cacert: Option<PathBuf>,
    /// Client certificate (PEM) for TLS client authentication.
    #[arg(long, global = true, requires = "key")]
    pub cert: Option<PathBuf>,
    /// Private key (PEM) of --cert.
    #[arg(long, global = true, requires = "cert")]
    pub key: Option<PathBuf>,
    /// User name for password authentication (`name` or `name:password`).
    #[arg(long, global = true)]
    pub user: Option<String>,
    /// Password of --user (when not given as `name:password`).
    #[arg(long, global = true)]
    pub password: Option<String>,
    /// Connection timeout.
    #[arg(long, global = true, value_parser = parse_duration, default_value = "5s")]
    pub dial_timeout: Duration,
    /// Watchers opened before the load and kept open, idle: one per key `idle-watch/NNNNNN`, which
    /// no workload writes (what many idle watchers cost other clients' requests).
    #[arg(long, global = true, default_value_t = 0)]
    pub idle_watchers: usize,
    /// Streams the --idle-watchers are spread over (round-robin over the connections).
    #[arg(long, global = true, default_value_t = 30)]
    pub idle_watch_streams: usize,
    /// Output format.
    #[arg(short = 'w', long = "write-out", global = true, value_enum, default_value = "simple")]
    pub write_out: OutputFormat,
    #[command(subcommand)]
    pub workload: Workload,
}

#[derive(Subcommand, Debug, Clone)]
pub(crate) enum Workload {
    /// Put keys of --key-size with values of --val-size.
    Put,
    /// Range one key, or [KEY, RANGE_END) (default key: the first key of the key space).
    Range {
        /// Key to read (default: --prefix followed by index 0 padded to --key-size).
        #[arg(id = "range_key", value_name = "KEY")]
        key: Option<String>,
        /// End of the range (exclusive); omitted: the single key.
        #[arg(value_name = "RANGE_END")]
        range_end: Option<String>,
        /// l: linearizable, s: serializable.
        #[arg(long, value_enum, default_value = "l")]
        consistency: Consistency,
        /// Maximum number of keys returned (0: no limit).
        #[arg(long, default_value_t = 0)]
        limit: i64,
    },
    /// Txn with --txn-ops puts of distinct keys and no compares.
    TxnPut {
        /// Puts per transaction.
        #[arg(long, default_value_t = 1)]
        txn_ops: usize,
    },
    /// --streams watch streams with --watchers-per-stream watchers each on the prefix, while --clients
    /// put keys under it; reports events delivered per second and put-to-event latency.
    Watch {
        /// Number of watch streams (spread round-robin over the connections).
        #[arg(long, default_value_t = 10)]
        streams: usize,
        /// Watchers created on each stream.
        #[arg(long, default_value_t = 10)]
        watchers_per_stream: usize,
        /// How long to wait for outstanding events after the last put.
        #[arg(long, value_parser = parse_duration, default_value = "10s")]
        drain_timeout: Duration,
    },
    /// Authenticate as --user with --password, repeatedly.
    Authenticate,
    /// Prepare auth for benchmarking (run before auth is enabled): root user, users with roles that
    /// grant readwrite on --prefix plus N single-key grants each, then optionally auth enable.
    SetupAuth {
        /// Password of the root user to create (with the root role).
        #[arg(long)]
        root_password: String,
        /// `NAME:PASSWORD:EXTRA_GRANTS`: a user with role `NAME-role`, granted readwrite on the
        /// --prefix range plus EXTRA_GRANTS single-key grants (keys `kw-perm/NAME/00000`, ...).
        #[arg(long = "new-user", value_parser = parse_new_user)]
        new_users: Vec<NewUser>,
        /// Enable auth at the end.
        #[arg(long)]
        enable: bool,
    },
    /// Serve KV.Put on keyward's front-end stack, answering each Put at once with no raft or storage:
    /// the most any server on that stack can reach on this machine (`ceiling.rs`). Runs until killed.
    CeilingServer {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:2379")]
        listen: std::net::SocketAddr,
    },
    /// One linearizable get and one put every --every, each on its own connection, until
    /// --until-file exists or --duration is up; reports each one's longest wait, counted from when the
    /// request was due (`probe.rs`).
    Probe(ProbeArgs),
    /// Local bcrypt verification throughput at a cost, on --clients threads (no server involved).
    Bcrypt {
        /// bcrypt cost.
        #[arg(long, default_value_t = 10)]
        cost: u32,
    },
}

/// The probe's options (`keyward-bench probe --help`).
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct ProbeArgs {
    /// Interval between ticks: each tick is due one get and one put.
    #[arg(long, value_parser = parse_duration, default_value = "100ms")]
    pub every: Duration,
    /// Stop when this file exists (checked at every tick; a request in flight is waited for, so its
    /// wait is counted in full). With --duration, stops at whichever comes first.
    #[arg(long)]
    pub until_file: Option<PathBuf>,
    /// The key read and written (its value is the tick number).
    #[arg(id = "probe_key", long = "probe-key", default_value = "keyward-bench/probe")]
    pub key: String,
    /// A request not answered after this long counts as an error (with this long as its wait).
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    pub request_timeout: Duration,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Consistency {
    /// Linearizable.
    L,
    /// Serializable.
    S,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OutputFormat {
    Simple,
    Json,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NewUser {
    pub name: String,
    pub password: String,
    pub extra_grants: usize,
}

fn parse_new_user(s: &str) -> Result<NewUser, String> {
    let mut parts = s.splitn(3, ':');
    let (Some(name), Some(password), Some(n)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(format!("{s:?} is not NAME:PASSWORD:EXTRA_GRANTS"));
    };
    if name.is_empty() {
        return Err("the user name is empty".into());
    }
    let extra_grants = n.parse().map_err(|_| format!("EXTRA_GRANTS {n:?} is not a number"))?;
    Ok(NewUser { name: name.into(), password: password.into(), extra_grants })
}

/// A duration as Go's `time.ParseDuration` reads it (`5s`, `1m30s`, `1.5s`), or a bare number of
/// seconds; it must be positive.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let duration = match s.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs >= 0.0 => Duration::from_secs_f64(secs),
        Ok(_) => return Err(format!("invalid duration {s:?}: must be positive")),
        Err(_) => keyward::parse_go_duration(s)?,
    };
    if duration.is_zero() {
        return Err(format!("invalid duration {s:?}: must be positive"));
    }
    Ok(duration)
}

pub(crate) fn validate(args: &BenchArgs) -> Result<(), String> {
    if args.conns == 0 || args.clients == 0 {
        return Err("--conns and --clients must be at least 1".into());
    }
    if args.key_space == 0 {
        return Err("--key-space must be at least 1".into());
    }
    if args.total == Some(0) {
        return Err("--total must be at least 1".into());
    }
    if args.idle_watchers > 0 && args.idle_watch_streams == 0 {
        return Err("--idle-watch-streams must be at least 1".into());
    }
    if args.endpoints.iter().all(|e| e.is_empty()) {
        return Err("--endpoints is empty".into());
    }
    match &args.workload {
        Workload::TxnPut { txn_ops } if *txn_ops == 0 || *txn_ops as u64 > args.key_space => {
            Err(format!("--txn-ops must be between 1 and --key-space ({})", args.key_space))
        }
        Workload::Watch { streams, watchers_per_stream, .. } if *streams == 0 || *watchers_per_stream == 0 => {
            Err("--streams and --watchers-per-stream must be at least 1".into())
        }
        Workload::Probe(probe) if probe.until_file.is_none() && args.duration.is_none() => {
            Err("probe needs --until-file or --duration".into())
        }
        Workload::Authenticate if args.user.is_none() => Err("authenticate needs --user".into()),
        Workload::Bcrypt { cost } if !(4..=31).contains(cost) => Err(format!("bcrypt cost {cost} is out of [4, 31]")),
        _ => Ok(()),
    }
}

/// The user name and password from `--user name[:password]` and `--password`.
pub(crate) fn credentials(args: &BenchArgs) -> Option<(String, String)> {
    let user = args.user.as_ref()?;
    match (&args.password, user.split_once(':')) {
        (Some(password), _) => Some((user.clone(), password.clone())),
        (None, Some((name, password))) => Some((name.to_string(), password.to_string())),
        (None, None) => Some((user.clone(), String::new())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct TestCli {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn parse(argv: &[&str]) -> BenchArgs {
        use clap::Parser;
        TestCli::try_parse_from(std::iter::once("bench").chain(argv.iter().copied())).unwrap().args
    }

    #[test]
    fn options_parse_before_and_after_the_workload() {
        use clap::CommandFactory;
        TestCli::command().debug_assert();
        let args = parse(&["--cacert", "ca", "--cert", "c", "--key", "k", "range", "a", "b", "--consistency", "s"]);
        assert_eq!(args.key, Some(PathBuf::from("k")));
        let Workload::Range { key, range_end, consistency, .. } = args.workload else { panic!("not range") };
        assert_eq!((key.as_deref(), range_end.as_deref(), consistency), (Some("a"), Some("b"), Consistency::S));
        let args = parse(&["put", "--clients", "100", "--conns", "10", "--duration", "5s", "-w", "json"]);
        assert_eq!(
            (args.clients, args.conns, args.duration, args.write_out),
            (100, 10, Some(Duration::from_secs(5)), OutputFormat::Json)
        );
        let args = parse(&["--user", "u:p", "authenticate"]);
        assert_eq!(credentials(&args), Some(("u".into(), "p".into())));
    }

    #[test]
    fn probe_options_parse_beside_the_global_ones() {
        let argv: Vec<&str> =
            "--key k --cert c probe --every 50ms --until-file /tmp/stop --probe-key p".split(' ').collect();
        let args = parse(&argv);
        assert_eq!(args.key, Some(PathBuf::from("k")), "--key stays the TLS key");
        let Workload::Probe(probe) = &args.workload else { panic!("not probe") };
        assert_eq!(
            (probe.every, probe.until_file.as_deref(), probe.key.as_str()),
            (Duration::from_millis(50), Some(std::path::Path::new("/tmp/stop")), "p")
        );
        assert_eq!(validate(&args), Ok(()));
        let args = parse(&["probe"]);
        assert_eq!(validate(&args), Err("probe needs --until-file or --duration".into()));
        assert_eq!(validate(&parse(&["probe", "--duration", "2s"])), Ok(()));
        use clap::Parser;
        assert!(TestCli::try_parse_from(["bench", "probe", "--every", "0s", "--duration", "1s"]).is_err());
    }

    #[test]
    fn durations_parse_like_go() {
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn new_user_specs_parse() {
        assert_eq!(
            parse_new_user("u:p:w:10").unwrap_err(),
            "EXTRA_GRANTS \"w:10\" is not a number",
            "the password may not contain ':'"
        );
        assert_eq!(
            parse_new_user("bench:pw:10000").unwrap(),
            NewUser { name: "bench".into(), password: "pw".into(), extra_grants: 10000 }
        );
        assert!(parse_new_user("bench:pw").is_err());
    }
}
