//! Bounded fuzzing of the flag parser (`cli/member.rs`, `config/`): proptest in place of `cargo fuzz`, so
//! that every `cargo test` run (CI included) fuzzes it for a bounded time.
//!
//! * [`arbitrary_arguments_and_environments`]: argument vectors mixing every real flag name (in the
//!   `--flag`, `--flag=v`, Go-style `-flag` forms), values from a vocabulary of good and bad ones,
//!   arbitrary strings and non-UTF-8 bytes, with arbitrary `ETCD_*` environments: the parser never
//!   panics; it gives a usage error, a refusal with a message, or a config.
//! * [`valid_configs_round_trip`]: a generated valid configuration, each flag written as an argument
//!   in one of those forms or as its `ETCD_*` variable (sometimes both, with a different value in the
//!   environment: the argument wins, as in etcd), parses to a `Config` holding exactly those values.
//!
//! Each test runs in a process of its own (`common::alone`) because it sets `ETCD_*` variables of the
//! process (one test at a time, under a lock; inherited ones are removed first). URLs come from a vocabulary of IP literals and
//! `localhost`, so no case waits on DNS. `KEYWARD_FUZZ_CASES=N` runs N cases per property instead of
//! the defaults (a few seconds together in a debug build). Failing inputs are kept in
//! `proptest-regressions/fuzz_config.txt` and replayed first.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use clap::Parser;
use keyward::{etcd_style_args, Cli, Command, Config};
use keyward::{JwtOptions, SignMethod, TokenConfig};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, FileFailurePersistence, TestCaseError, TestRunner};

use crate::common;

// ---------------------------------------------------------------------------
// harness
// ---------------------------------------------------------------------------

/// Runs `test` on `KEYWARD_FUZZ_CASES` (else `default_cases`) values of `strategy`; prints how the
/// cases ended, by the label each returned.
fn fuzz<S: Strategy>(
    name: &str,
    default_cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<String, TestCaseError>,
) {
    let cases = std::env::var("KEYWARD_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default_cases);
    let persistence = FileFailurePersistence::Direct("proptest-regressions/fuzz_config.txt");
    let config =
        ProptestConfig { cases, failure_persistence: Some(Box::new(persistence)), ..ProptestConfig::default() };
    let tally = Mutex::new(BTreeMap::<String, u64>::new());
    let result = TestRunner::new(config).run(&strategy, |value| {
        let label = test(value)?;
        *tally.lock().unwrap_or_else(|e| e.into_inner()).entry(label).or_default() += 1;
        Ok(())
    });
    if let Err(e) = result {
        panic!("{name}: {e}");
    }
    let tally = tally.into_inner().unwrap_or_else(|e| e.into_inner());
    eprintln!("fuzz {name}: {} cases passed: {tally:?}", tally.values().sum::<u64>());
}

/// The process environment is shared: one test at a time touches `ETCD_*`, starting from none.
fn environment() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("ETCD_") {
            std::env::remove_var(name);
        }
    }
    guard
}

/// What parsing gave: a usage error (clap's kind), a refusal (with its message), or a config.
enum Parsed {
    Usage(String),
    Refused(String),
    Config(Box<Config>),
}

/// `keyward ARGS` with `env` set, the way `main` parses it (Go-style flags rewritten first).
fn parse(args: &[OsString], env: &[(String, OsString)]) -> Parsed {
    for (name, value) in env {
        std::env::set_var(name, value);
    }
    let argv = etcd_style_args(std::iter::once(OsString::from("keyward")).chain(args.iter().cloned()));
    let cli = Cli::try_parse_from(argv);
    for (name, _) in env {
        std::env::remove_var(name);
    }
    match cli {
        Err(e) => Parsed::Usage(format!("{:?}", e.kind())),
        Ok(Cli { command: Command::Serve(serve) }) => match serve.into_config() {
            Ok(config) => Parsed::Config(Box::new(config)),
            Err(e) => Parsed::Refused(e.to_string()),
        },
        Ok(Cli { command: other }) => panic!("`keyward serve` arguments parsed as {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// files the flags can name
// ---------------------------------------------------------------------------

/// A temp dir (kept for the whole run) with a CA, a server certificate and key, an empty file and a
/// file of garbage.
struct Files {
    _dir: tempfile::TempDir,
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    empty: PathBuf,
    garbage: PathBuf,
    missing: PathBuf,
}

fn files() -> &'static Files {
    static FILES: OnceLock<Files> = OnceLock::new();
    FILES.get_or_init(|| {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let dir = tempfile::Builder::new().prefix("fuzz-config-").tempdir().expect("temp dir");
        let mut ca = CertificateParams::default();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(rcgen::DnType::CommonName, "fuzz CA");
        let ca_key = KeyPair::generate().expect("CA key");
        let ca_pem = ca.self_signed(&ca_key).expect("self-sign CA").pem();
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().expect("server key");
        let cert = CertificateParams::new(vec!["localhost".to_string()])
            .expect("server params")
            .signed_by(&key, &issuer)
            .expect("sign server certificate");
        let write = |name: &str, contents: &[u8]| {
            let path = dir.path().join(name);
            std::fs::write(&path, contents).expect("write a test file");
            path
        };
        Files {
            ca: write("ca.pem", ca_pem.as_bytes()),
            cert: write("server.pem", cert.pem().as_bytes()),
            key: write("server.key", key.serialize_pem().as_bytes()),
            empty: write("empty", b""),
            garbage: write("garbage.pem", b"-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n"),
            missing: dir.path().join("missing.pem"),
            _dir: dir,
        }
    })
}

fn path_text(path: &Path) -> String {
    path.display().to_string()
}

// ---------------------------------------------------------------------------
// arbitrary argument vectors and environments
// ---------------------------------------------------------------------------

/// Every `keyward serve` flag (etcd's names), plus a few `bench` ones and names that do not exist.
const FLAGS: &[&str] = &[
    "name",
    "data-dir",
    "listen-client-urls",
    "advertise-client-urls",
    "listen-peer-urls",
    "initial-advertise-peer-urls",
    "initial-cluster",
    "initial-cluster-state",
    "initial-cluster-token",
    "max-request-bytes",
    "snapshot-count",
    "max-txn-ops",
    "auth-token",
    "auth-token-ttl",
    "bcrypt-cost",
    "cert-file",
    "key-file",
    "trusted-ca-file",
    "client-cert-auth",
    "client-crl-file",
    "client-cert-allowed-cn",
    "client-cert-allowed-hostname",
    "peer-cert-file",
    "peer-key-file",
    "peer-trusted-ca-file",
    "peer-client-cert-auth",
    "peer-cert-allowed-cn",
    "peer-cert-allowed-hostname",
    "peer-allow-plaintext",
    "log-level",
    "endpoints",
    "total",
    "no-such-flag",
    "h",
    "help",
    "version",
];

/// Values worth trying for those flags: good ones, boundary numbers, malformed ones.
fn vocabulary() -> Vec<String> {
    let f = files();
    let mut words: Vec<String> = [
        "node1",
        "",
        " ",
        "default",
        "new",
        "existing",
        "bogus",
        "true",
        "false",
        "1",
        "0",
        "-1",
        "4",
        "31",
        "32",
        "3",
        "128",
        "1572864",
        "4294967295",
        "4294967296",
        "18446744073709551615",
        "99999999999999999999",
        "http://127.0.0.1:2379",
        "https://127.0.0.1:2379",
        "http://[::1]:0",
        "http://0.0.0.0:0",
        "http://localhost:2380",
        "unix://sock:1",
        "unixs://sock:1",
        "ftp://127.0.0.1:1",
        "http://127.0.0.1",
        "http://127.0.0.1:99999",
        "http://127.0.0.1:port",
        "127.0.0.1:2379",
        "http://:2379",
        "http://127.0.0.1:2379/",
        "http://127.0.0.1:1,http://127.0.0.1:2",
        ",",
        "node1=http://127.0.0.1:2380",
        "node1=http://127.0.0.1:2380,node2=http://127.0.0.1:2381",
        "=http://127.0.0.1:1",
        "node1",
        "node1=",
        "simple",
        "simple,ttl=5m",
        "jwt",
        "jwt,sign-method=RS256",
        "jwt,sign-method=RS256,pub-key=/nonexistent",
        "jwt,sign-method=HS256,priv-key=k",
        "jwt,sign-method=RS256,ttl=-5m,priv-key=k",
        "jwt,sign-method=ES256,ttl=1.5h,pub-key=a,priv-key=b",
        "jwt,ttl=0.5s,sign-method=EdDSA,pub-key=a",
        "jwt,a=b=c",
        "jwt,,",
        "debug",
        "info",
        "warn",
        "error",
        "panic",
        "fatal",
        "dpanic",
        "loud",
        "serve",
        "bench",
        "--",
        "-",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for path in [&f.ca, &f.cert, &f.key, &f.empty, &f.garbage, &f.missing] {
        words.push(path_text(path));
    }
    words
}

/// One or two elements of an argument vector: mostly a flag with its value (separate, after `=`, in
/// the `--` and Go's `-` forms), sometimes a bare flag, a bare word, or arbitrary text or bytes.
fn tokens() -> impl Strategy<Value = Vec<OsString>> {
    let flag = prop::sample::select(FLAGS);
    let word = prop::sample::select(vocabulary());
    let dashes = prop::sample::select(&["--", "-"][..]);
    prop_oneof![
        4 => (dashes.clone(), flag.clone(), word.clone())
            .prop_map(|(d, flag, value)| vec![OsString::from(format!("{d}{flag}")), OsString::from(value)]),
        4 => (dashes.clone(), flag.clone(), word.clone())
            .prop_map(|(d, flag, value)| vec![OsString::from(format!("{d}{flag}={value}"))]),
        1 => (dashes, flag).prop_map(|(d, flag)| vec![OsString::from(format!("{d}{flag}"))]),
        1 => word.prop_map(|w| vec![OsString::from(w)]),
        1 => any::<String>().prop_map(|s| vec![OsString::from(s)]),
        1 => prop::collection::vec(any::<u8>(), 0..12).prop_map(|b| vec![OsString::from_vec(b)]),
    ]
}

/// One `ETCD_*` variable: a flag's own (e.g. `ETCD_MAX_TXN_OPS`) or an unknown one; its value from
/// the vocabulary or arbitrary bytes without NUL (which no environment can hold).
fn env_var() -> impl Strategy<Value = (String, OsString)> {
    let name = prop_oneof![
        prop::sample::select(FLAGS).prop_map(|flag| format!("ETCD_{}", flag.to_uppercase().replace('-', "_"))),
        "[A-Z_]{1,12}".prop_map(|s| format!("ETCD_{s}")),
    ];
    let value = prop_oneof![
        prop::sample::select(vocabulary()).prop_map(OsString::from),
        prop::collection::vec(1u8..=255, 0..16).prop_map(OsString::from_vec),
    ];
    (name, value)
}

#[test]
fn arbitrary_arguments_and_environments() {
    if common::alone::elsewhere("fuzz_config::arbitrary_arguments_and_environments") {
        return;
    }
    let _env = environment();
    let strategy =
        (prop::bool::weighted(0.9), prop::collection::vec(tokens(), 0..8), prop::collection::vec(env_var(), 0..6));
    fuzz("arbitrary arguments and environments", 15_000, strategy, |(serve, tokens, env)| {
        let mut args: Vec<OsString> = Vec::new();
        if serve {
            args.push("serve".into());
        }
        args.extend(tokens.into_iter().flatten());
        Ok(match parse(&args, &env) {
            Parsed::Usage(kind) => format!("usage error {kind}"),
            Parsed::Refused(message) => {
                prop_assert!(!message.trim().is_empty(), "a refusal without a message");
                "refused".into()
            }
            Parsed::Config(config) => {
                prop_assert!(!config.name.is_empty() && !config.listen_client.is_empty());
                "config".into()
            }
        })
    });
}

// ---------------------------------------------------------------------------
// valid configurations round-trip
// ---------------------------------------------------------------------------

/// A valid `keyward serve` configuration, as the values an operator means.
#[derive(Clone, Debug)]
struct Spec {
    name: String,
    data_dir: String,
    listen: Vec<(String, u16)>,
    advertise: Vec<String>,
    peers: Vec<(String, u16)>,
    /// Write `--initial-cluster` out (else the default, derived from the name and peer URLs, is used).
    explicit_cluster: bool,
    cluster_token: String,
    max_request_bytes: u32,
    max_txn_ops: u32,
    snapshot_count: u64,
    auth_token: TokenSpec,
    auth_token_ttl: u64,
    bcrypt_cost: u32,
    log_level: &'static str,
    /// Client TLS from the test's files, and whether `--client-cert-auth` is on.
    tls: Option<bool>,
}

#[derive(Clone, Debug)]
enum TokenSpec {
    Simple,
    Jwt { public_key: Option<String>, private_key: Option<String>, method: SignMethod, ttl_secs: Option<u64> },
}

/// An IP literal as a URL host, and the address it must resolve to.
const HOSTS: &[(&str, &str)] =
    &[("127.0.0.1", "127.0.0.1"), ("0.0.0.0", "0.0.0.0"), ("[::1]", "::1"), ("127.0.0.2", "127.0.0.2")];

fn spec() -> impl Strategy<Value = Spec> {
    let host_port = (0..HOSTS.len(), 1u16..).prop_map(|(h, port)| (HOSTS[h].0.to_string(), port));
    let token = prop_oneof![
        Just(TokenSpec::Simple),
        (
            prop::option::of("[a-z0-9/._-]{1,20}"),
            prop::option::of("[a-z0-9/._-]{1,20}"),
            prop::sample::select(&SignMethod::ALL[..]),
            prop::option::of(1u64..1_000_000),
        )
            .prop_filter("jwt needs a key", |(public, private, _, _)| public.is_some() || private.is_some())
            .prop_map(|(public_key, private_key, method, ttl_secs)| TokenSpec::Jwt {
                public_key,
                private_key,
                method,
                ttl_secs
            }),
    ];
    // edges as often as anything else
    let numbers = (
        prop_oneof![0u32..=2, Just(u32::MAX), any::<u32>()],
        prop_oneof![1u32..=2, Just(u32::MAX), 1u32..],
        prop_oneof![0u64..=2, Just(u64::MAX), any::<u64>()],
        prop_oneof![1u64..=2, Just(u64::MAX / 2), 1u64..=u64::MAX / 2],
        prop_oneof![Just(4u32), Just(31u32), 4u32..=31],
    );
    (
        ("[a-z][a-z0-9-]{0,15}", "[a-z0-9._][a-z0-9/._-]{0,30}", prop::collection::vec(host_port.clone(), 1..3)),
        (
            prop::collection::vec("http://[a-z0-9.-]{1,12}:[0-9]{1,4}", 0..3),
            prop::collection::vec(host_port, 1..3),
            any::<bool>(),
            "[a-z0-9][a-z0-9-]{0,19}",
        ),
        numbers,
        (token, prop::sample::select(&["debug", "info", "warn", "error", "dpanic", "panic", "fatal"][..])),
        prop::option::of(any::<bool>()),
    )
        .prop_map(
            |(
                (name, data_dir, listen),
                (advertise, peers, explicit_cluster, cluster_token),
                (max_request_bytes, max_txn_ops, snapshot_count, auth_token_ttl, bcrypt_cost),
                (auth_token, log_level),
                tls,
            )| Spec {
                name,
                data_dir,
                listen,
                advertise,
                peers,
                explicit_cluster,
                cluster_token,
                max_request_bytes,
                max_txn_ops,
                snapshot_count,
                auth_token,
                auth_token_ttl,
                bcrypt_cost,
                log_level,
                tls,
            },
        )
}

fn go_duration(secs: u64) -> String {
    match (secs / 3600, secs % 3600 / 60, secs % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, m, s) => format!("{h}h{m}m{s}s"),
    }
}

impl Spec {
    fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    fn listen_urls(&self) -> Vec<String> {
        self.listen.iter().map(|(host, port)| format!("{}://{host}:{port}", self.scheme())).collect()
    }

    fn peer_urls(&self) -> Vec<String> {
        self.peers.iter().map(|(host, port)| format!("http://{host}:{port}")).collect()
    }

    fn auth_token_text(&self) -> String {
        match &self.auth_token {
            TokenSpec::Simple => "simple".into(),
            TokenSpec::Jwt { public_key, private_key, method, ttl_secs } => {
                let mut text = format!("jwt,sign-method={}", method.as_str());
                if let Some(p) = public_key {
                    text.push_str(&format!(",pub-key={p}"));
                }
                if let Some(p) = private_key {
                    text.push_str(&format!(",priv-key={p}"));
                }
                if let Some(secs) = ttl_secs {
                    text.push_str(&format!(",ttl={}", go_duration(*secs)));
                }
                text
            }
        }
    }

    /// Every flag with its value (boolean flags with "true").
    fn flags(&self) -> Vec<(&'static str, String)> {
        let mut flags = vec![
            ("name", self.name.clone()),
            ("data-dir", self.data_dir.clone()),
            ("listen-client-urls", self.listen_urls().join(",")),
            ("initial-advertise-peer-urls", self.peer_urls().join(",")),
            ("initial-cluster-token", self.cluster_token.clone()),
            ("max-request-bytes", self.max_request_bytes.to_string()),
            ("max-txn-ops", self.max_txn_ops.to_string()),
            ("snapshot-count", self.snapshot_count.to_string()),
            ("auth-token", self.auth_token_text()),
            ("auth-token-ttl", self.auth_token_ttl.to_string()),
            ("bcrypt-cost", self.bcrypt_cost.to_string()),
            ("log-level", self.log_level.to_string()),
        ];
        if !self.advertise.is_empty() {
            flags.push(("advertise-client-urls", self.advertise.join(",")));
        }
        if self.explicit_cluster {
            let entries: Vec<String> = self.peer_urls().iter().map(|url| format!("{}={url}", self.name)).collect();
            flags.push(("initial-cluster", entries.join(",")));
        }
        if let Some(client_cert_auth) = self.tls {
            let f = files();
            flags.push(("cert-file", path_text(&f.cert)));
            flags.push(("key-file", path_text(&f.key)));
            if client_cert_auth {
                flags.push(("trusted-ca-file", path_text(&f.ca)));
                flags.push(("client-cert-auth", "true".into()));
            }
        }
        flags
    }
}

/// How one flag is written: as an argument in one of four forms, or as its `ETCD_*` variable, or
/// both (the variable holding a decoy value that the argument must override).
#[derive(Clone, Copy, Debug)]
enum Form {
    Separate,
    Equals,
    GoSeparate,
    GoEquals,
    Environment,
    ArgumentOverEnvironment,
}

fn env_name(flag: &str) -> String {
    format!("ETCD_{}", flag.to_uppercase().replace('-', "_"))
}

/// A value for `flag` that parses but differs from the one meant: what a stale environment holds.
fn decoy(flag: &str) -> String {
    match flag {
        "max-request-bytes" | "max-txn-ops" | "snapshot-count" | "auth-token-ttl" => "7".into(),
        "bcrypt-cost" => "5".into(),
        "log-level" => "warn".into(),
        "listen-client-urls" => "http://127.0.0.9:9".into(),
        _ => "decoy".into(),
    }
}

fn render(spec: &Spec, forms: &[Form]) -> (Vec<OsString>, Vec<(String, OsString)>) {
    let mut args: Vec<OsString> = vec!["serve".into()];
    let mut env = Vec::new();
    for (i, (flag, value)) in spec.flags().into_iter().enumerate() {
        let form = forms[i % forms.len()];
        let boolean = flag == "client-cert-auth";
        match form {
            Form::Environment => env.push((env_name(flag), value.into())),
            Form::Separate | Form::GoSeparate if boolean => {
                let dashes = if matches!(form, Form::Separate) { "--" } else { "-" };
                args.push(format!("{dashes}{flag}").into());
            }
            Form::Separate | Form::GoSeparate => {
                let dashes = if matches!(form, Form::Separate) { "--" } else { "-" };
                args.push(format!("{dashes}{flag}").into());
                args.push(value.into());
            }
            Form::Equals | Form::GoEquals => {
                let dashes = if matches!(form, Form::Equals) { "--" } else { "-" };
                args.push(format!("{dashes}{flag}={value}").into());
            }
            Form::ArgumentOverEnvironment => {
                if !boolean {
                    env.push((env_name(flag), decoy(flag).into()));
                }
                args.push(format!("--{flag}={value}").into());
            }
        }
    }
    (args, env)
}

fn form() -> impl Strategy<Value = Form> {
    prop::sample::select(vec![
        Form::Separate,
        Form::Equals,
        Form::GoSeparate,
        Form::GoEquals,
        Form::Environment,
        Form::ArgumentOverEnvironment,
    ])
}

/// The `Config` fields against the values meant; a message naming the first that differs.
fn compare(spec: &Spec, config: &Config) -> Result<(), TestCaseError> {
    prop_assert_eq!(&config.name, &spec.name);
    prop_assert_eq!(config.data_dir.as_path(), Path::new(&spec.data_dir));
    let listen: Vec<(String, SocketAddr, bool)> =
        config.listen_client.iter().map(|l| (l.url.clone(), l.addr, l.tls)).collect();
    let expected: Vec<(String, SocketAddr, bool)> = spec
        .listen
        .iter()
        .zip(spec.listen_urls())
        .map(|((host, port), url)| {
            let ip = HOSTS.iter().find(|(h, _)| h == host).map(|(_, ip)| ip).unwrap();
            (url, SocketAddr::new(ip.parse().unwrap(), *port), spec.tls.is_some())
        })
        .collect();
    prop_assert_eq!(listen, expected);
    let advertise =
        if spec.advertise.is_empty() { vec!["http://127.0.0.1:2379".to_string()] } else { spec.advertise.clone() };
    prop_assert_eq!(&config.advertise_client_urls, &advertise);
    // In the order given, as etcd keeps them (member ids sort them: `cluster/ids.rs`).
    prop_assert_eq!(&config.peer_urls, &spec.peer_urls());
    prop_assert_eq!(&config.cluster_token, &spec.cluster_token);
    prop_assert_eq!(config.max_request_bytes, spec.max_request_bytes as usize);
    prop_assert_eq!(config.max_txn_ops, spec.max_txn_ops as usize);
    prop_assert_eq!(config.snapshot_count, spec.snapshot_count.max(1));
    let token = match &spec.auth_token {
        TokenSpec::Simple => TokenConfig::Simple,
        TokenSpec::Jwt { public_key, private_key, method, ttl_secs } => TokenConfig::Jwt(JwtOptions {
            public_key: public_key.as_ref().map(PathBuf::from),
            private_key: private_key.as_ref().map(PathBuf::from),
            sign_method: *method,
            ttl: ttl_secs.map_or(keyward::DEFAULT_JWT_TTL, Duration::from_secs),
        }),
    };
    prop_assert_eq!(&config.auth_token, &token);
    prop_assert_eq!(config.auth_token_ttl, Duration::from_secs(spec.auth_token_ttl));
    prop_assert_eq!(config.bcrypt_cost, spec.bcrypt_cost);
    let filter = match spec.log_level {
        "dpanic" | "panic" | "fatal" => "error",
        level => level,
    };
    prop_assert_eq!(config.log_filter, filter);
    match (&config.client_tls, spec.tls) {
        (None, None) => {}
        (Some(tls), Some(client_cert_auth)) => {
            let f = files();
            prop_assert_eq!(&tls.cert_file, &f.cert);
            prop_assert_eq!(&tls.key_file, &f.key);
            prop_assert_eq!(tls.client_cert_auth, client_cert_auth);
            prop_assert_eq!(tls.trusted_ca_file.as_ref(), client_cert_auth.then_some(&f.ca));
        }
        (got, meant) => return Err(TestCaseError::fail(format!("client TLS {got:?}, meant {meant:?}"))),
    }
    prop_assert!(config.peer_tls.is_none());
    Ok(())
}

#[test]
fn valid_configs_round_trip() {
    if common::alone::elsewhere("fuzz_config::valid_configs_round_trip") {
        return;
    }
    let _env = environment();
    let strategy = (spec(), prop::collection::vec(form(), 1..8));
    fuzz("valid configs round-trip", 3_000, strategy, |(spec, forms)| {
        let (args, env) = render(&spec, &forms);
        match parse(&args, &env) {
            Parsed::Config(config) => compare(&spec, &config)?,
            Parsed::Usage(kind) => return Err(TestCaseError::fail(format!("usage error {kind} for {args:?} {env:?}"))),
            Parsed::Refused(message) => {
                return Err(TestCaseError::fail(format!("refused: {message} ({args:?} {env:?})")))
            }
        }
        let via_env = forms.iter().any(|f| matches!(f, Form::Environment | Form::ArgumentOverEnvironment));
        Ok(format!("{} via the environment too", if via_env { "some" } else { "none" }))
    });
}
