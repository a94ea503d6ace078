//! `--config-file`: etcd's YAML configuration file, turned into the flags it stands for.
//!
//! etcd reads the file instead of its flags and `ETCD_*` variables; so does keyward: each key becomes
//! `--KEY=VALUE` and the result is parsed by the same flag definitions (with the variables switched
//! off), so a setting means the same in the file as on the command line. Keys are etcd's
//! (`embed.Config`'s YAML names, with `client-transport-security` / `peer-transport-security`
//! mapped to the client and peer TLS flags) or any other long flag of `keyward serve`.
//!
//! etcd ignores keys it does not know; keyward does not, since a typo would silently leave a setting
//! at its default. An etcd setting keyward does not have is fine while it holds etcd's default (or is
//! empty): it changes nothing, and the member starts with one warning naming all of them. With any
//! other value the member refuses to start, with one message naming every such key and every unknown
//! key at once.

use std::path::Path;

use yaml_rust2::{Yaml, YamlLoader};

/// What `load` made of a file: the flags, and the warning to log once logging is up.
#[derive(Debug, Default)]
pub(crate) struct FileArgs {
    pub args: Vec<String>,
    pub warnings: Vec<String>,
}

/// The files read here are a few KiB; anything this large is not a configuration file.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// etcd settings keyward does not have, each with etcd 3.4's default (what leaves behaviour as
/// keyward's) and why it is absent. A key whose value is empty or this default is accepted.
const UNSUPPORTED: &[(&str, &str, &str)] = &[
    ("enable-v2", "false", "keyward serves only the v3 API"),
    ("wal-dir", "", "the raft log lives in the data dir"),
    ("max-snapshots", "5", "keyward keeps one snapshot"),
    ("max-wals", "5", "the raft log is an LMDB environment, purged behind snapshots"),
    ("initial-election-tick-advance", "true", "not applicable to openraft"),
    ("backend-batch-interval", "0", "each apply batch is one LMDB commit"),
    ("backend-batch-limit", "0", "each apply batch is one LMDB commit"),
    ("discovery", "", "no discovery service: use initial-cluster"),
    ("discovery-srv", "", "no DNS discovery: use initial-cluster"),
    ("discovery-srv-name", "", "no DNS discovery: use initial-cluster"),
    ("discovery-proxy", "", "no discovery service"),
    ("discovery-fallback", "proxy", "no discovery service"),
    ("strict-reconfig-check", "true", "membership changes that would lose quorum are always refused"),
    ("pre-vote", "false", "openraft 0.9 has no pre-vote"),
    ("force-new-cluster", "false", "use `keyward snapshot restore` to start a new cluster from data"),
    ("enable-pprof", "false", "no Go profiler; see benches/ for profiling"),
    ("metrics", "basic", "keyward exports one set of metrics"),
    ("enable-grpc-gateway", "true", "the HTTP/JSON gateway is always served"),
    ("log-package-levels", "", "use --log-level or KEYWARD_LOG"),
    ("log-output", "", "use log-outputs"),
    ("unsafe-no-fsync", "false", "keyward always syncs"),
    ("cors", "", "no CORS handling"),
    ("host-whitelist", "*", "no Host header checks"),
    ("auto-tls", "false", "no self-signed certificates: give cert-file and key-file"),
    ("peer-auto-tls", "false", "no self-signed certificates: give peer cert-file and key-file"),
    ("self-signed-cert-validity", "1", "no self-signed certificates"),
    ("proxy", "off", "use `keyward grpc-proxy start`"),
    ("proxy-failure-wait", "5000", "use `keyward grpc-proxy start`"),
    ("proxy-refresh-interval", "30000", "use `keyward grpc-proxy start`"),
    ("proxy-dial-timeout", "1000", "use `keyward grpc-proxy start`"),
    ("proxy-write-timeout", "5000", "use `keyward grpc-proxy start`"),
    ("proxy-read-timeout", "0", "use `keyward grpc-proxy start`"),
    ("experimental-initial-corrupt-check", "false", "experimental in etcd"),
    ("experimental-corrupt-check-time", "0s", "experimental in etcd"),
    ("experimental-enable-v2v3", "", "experimental in etcd"),
    ("experimental-backend-bbolt-freelist-type", "map", "experimental in etcd"),
    ("experimental-enable-lease-checkpoint", "false", "leases are always checkpointed"),
    ("experimental-compaction-batch-limit", "1000", "experimental in etcd"),
    ("experimental-warning-apply-duration", "100ms", "experimental in etcd"),
];

/// `debug: true` is etcd's deprecated spelling of `log-level: debug`.
const DEBUG_KEY: &str = "debug";

/// Reads `path` and returns the flags it stands for. `known_flag` says whether `keyward serve` has a
/// long flag of that name. The error names the file.
pub(crate) fn load(path: &Path, known_flag: impl Fn(&str) -> bool) -> Result<FileArgs, String> {
    let shown = path.display();
    let size = std::fs::metadata(path).map_err(|e| format!("--config-file {shown}: {e}"))?.len();
    if size > MAX_FILE_BYTES {
        return Err(format!("--config-file {shown}: {size} bytes is too large for a configuration file"));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("--config-file {shown}: {e}"))?;
    parse(&text, known_flag).map_err(|e| format!("--config-file {shown}: {e}"))
}

/// `load` for the text of a file.
pub(crate) fn parse(text: &str, known_flag: impl Fn(&str) -> bool) -> Result<FileArgs, String> {
    let docs = YamlLoader::load_from_str(text).map_err(|e| format!("not valid YAML: {e}"))?;
    let root = match docs.as_slice() {
        [] => return Ok(FileArgs::default()),
        [root] => root,
        _ => return Err("holds several YAML documents; want one".into()),
    };
    let entries = match root {
        Yaml::Hash(entries) => entries,
        Yaml::Null => return Ok(FileArgs::default()),
        _ => return Err("is not a YAML mapping of etcd configuration keys".into()),
    };
    let mut out = Collected::default();
    for (key, value) in entries {
        let key = key_name(key)?;
        match key {
            "client-transport-security" | "peer-transport-security" => {
                let peer = key == "peer-transport-security";
                let Yaml::Hash(inner) = value else {
                    if matches!(value, Yaml::Null) {
                        continue;
                    }
                    return Err(format!("{key} must be a mapping (cert-file, key-file, ...)"));
                };
                for (inner_key, inner_value) in inner {
                    let inner_key = key_name(inner_key)?;
                    let flag = match (inner_key, peer) {
                        ("cert-file" | "key-file" | "client-cert-auth" | "trusted-ca-file", false) => {
                            inner_key.to_string()
                        }
                        ("cert-file" | "key-file" | "client-cert-auth" | "trusted-ca-file", true) => {
                            format!("peer-{inner_key}")
                        }
                        ("auto-tls", false) => "auto-tls".to_string(),
                        ("auto-tls", true) => "peer-auto-tls".to_string(),
                        _ => {
                            out.unknown.push(format!("{key}.{inner_key}"));
                            continue;
                        }
                    };
                    out.setting(&flag, &format!("{key}.{inner_key}"), inner_value, &known_flag)?;
                }
            }
            DEBUG_KEY => {
                if scalar(key, value)?.as_deref() == Some("true") {
                    out.args.push("--log-level=debug".into());
                }
            }
            "config-file" => return Err("config-file cannot be set inside the configuration file".into()),
            _ => out.setting(key, key, value, &known_flag)?,
        }
    }
    out.finish()
}

#[derive(Default)]
struct Collected {
    args: Vec<String>,
    /// Unsupported keys at etcd's default: a warning.
    ignored: Vec<String>,
    /// Unsupported keys with another value: refused.
    refused: Vec<String>,
    unknown: Vec<String>,
}

impl Collected {
    /// `flag` is the setting's flag name; `shown` its name in the file.
    fn setting(
        &mut self,
        flag: &str,
        shown: &str,
        value: &Yaml,
        known_flag: &impl Fn(&str) -> bool,
    ) -> Result<(), String> {
        if let Some((_, default, why)) = UNSUPPORTED.iter().find(|(name, ..)| *name == flag) {
            match scalar(shown, value)? {
                None => self.ignored.push(shown.to_string()),
                Some(v) if v.is_empty() || v == *default => self.ignored.push(shown.to_string()),
                Some(v) => self.refused.push(format!("{shown}: {v} ({why})")),
            }
            return Ok(());
        }
        if !known_flag(flag) {
            self.unknown.push(shown.to_string());
            return Ok(());
        }
        // A key left empty keeps the flag's default, as a Go zero value keeps etcd's.
        if let Some(v) = scalar(shown, value)? {
            self.args.push(format!("--{flag}={v}"));
        }
        Ok(())
    }

    fn finish(self) -> Result<FileArgs, String> {
        let mut problems = Vec::new();
        if !self.refused.is_empty() {
            problems.push(format!(
                "etcd settings keyward does not support, set to values other than etcd's defaults (remove them or \
                 leave them empty): {}",
                self.refused.join("; ")
            ));
        }
        if !self.unknown.is_empty() {
            problems.push(format!("unknown keys (neither etcd's nor keyward's): {}", self.unknown.join(", ")));
        }
        if !problems.is_empty() {
            return Err(problems.join("; and "));
        }
        let mut warnings = Vec::new();
        if !self.ignored.is_empty() {
            warnings.push(format!(
                "ignoring etcd settings keyward does not have, left empty or at etcd's defaults: {}",
                self.ignored.join(", ")
            ));
        }
        Ok(FileArgs { args: self.args, warnings })
    }
}

fn key_name(key: &Yaml) -> Result<&str, String> {
    match key {
        Yaml::String(name) => Ok(name),
        other => Err(format!("keys must be names, found {other:?}")),
    }
}

/// A value as the flag's text: scalars as written, a list joined by commas (etcd's list flags), and
/// `None` for an empty value.
fn scalar(key: &str, value: &Yaml) -> Result<Option<String>, String> {
    Ok(Some(match value {
        Yaml::Null => return Ok(None),
        Yaml::String(s) | Yaml::Real(s) => s.clone(),
        Yaml::Integer(i) => i.to_string(),
        Yaml::Boolean(b) => b.to_string(),
        Yaml::Array(items) => {
            let items: Vec<String> = items
                .iter()
                .map(|item| match scalar(key, item)? {
                    Some(s) if !matches!(item, Yaml::Array(_)) => Ok(s),
                    _ => Err(format!("{key}: list items must be plain values")),
                })
                .collect::<Result<_, _>>()?;
            items.join(",")
        }
        _ => return Err(format!("{key}: want a value or a list of values")),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(flag: &str) -> bool {
        matches!(
            flag,
            "name"
                | "data-dir"
                | "listen-client-urls"
                | "log-outputs"
                | "cert-file"
                | "peer-client-cert-auth"
                | "snapshot-count"
        )
    }

    #[test]
    fn keys_become_flags_and_tls_sections_become_their_flags() {
        let file = parse(
            "name: 'n1'\nsnapshot-count: 10000\nlog-outputs: [stderr, stdout]\ndata-dir:\n\
             client-transport-security:\n  cert-file: /c.pem\npeer-transport-security:\n  client-cert-auth: true\n",
            known,
        )
        .unwrap();
        assert_eq!(
            file.args,
            [
                "--name=n1",
                "--snapshot-count=10000",
                "--log-outputs=stderr,stdout",
                "--cert-file=/c.pem",
                "--peer-client-cert-auth=true"
            ]
        );
        assert!(file.warnings.is_empty());
    }

    #[test]
    fn unsupported_settings_at_etcds_defaults_are_one_warning() {
        let file = parse("name: n\nmax-wals: 5\nwal-dir:\nproxy: 'off'\ncors:\n", known).unwrap();
        assert_eq!(file.args, ["--name=n"]);
        assert_eq!(
            file.warnings,
            ["ignoring etcd settings keyward does not have, left empty or at etcd's defaults: max-wals, wal-dir, proxy, cors"]
        );
    }

    #[test]
    fn other_values_and_unknown_keys_are_refused_in_one_message() {
        let err = parse(
            "wal-dir: /wal\nname: n\ndiscovery-srv: [a, b]\nlisten-clients-urls: x\n\
             client-transport-security:\n  auto-tls: true\n  crl: x\n",
            known,
        )
        .unwrap_err();
        assert_eq!(
            err,
            "etcd settings keyward does not support, set to values other than etcd's defaults (remove them or leave them \
             empty): wal-dir: /wal (the raft log lives in the data dir); discovery-srv: a,b (no DNS discovery: use \
             initial-cluster); client-transport-security.auto-tls: true (no self-signed certificates: give cert-file \
             and key-file); and unknown keys (neither etcd's nor keyward's): listen-clients-urls, \
             client-transport-security.crl"
        );
    }

    #[test]
    fn a_file_at_the_size_limit_is_read_and_one_byte_more_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("etcd.conf.yml");
        let mut text = "name: n\n".to_string();
        text.push_str(&"#".repeat(MAX_FILE_BYTES as usize - text.len()));
        std::fs::write(&path, &text).unwrap();
        assert_eq!(load(&path, known).unwrap().args, ["--name=n"]);
        text.push('#');
        std::fs::write(&path, &text).unwrap();
        assert!(load(&path, known).unwrap_err().contains("too large for a configuration file"));
    }

    #[test]
    fn malformed_files_are_refused_not_guessed() {
        assert!(parse("name: [unclosed\n", known).unwrap_err().starts_with("not valid YAML"));
        assert!(parse("- a\n- b\n", known).unwrap_err().contains("not a YAML mapping"));
        assert!(parse("name: {a: 1}\n", known).unwrap_err().contains("want a value"));
        assert!(parse("a: 1\n---\nb: 2\n", known).unwrap_err().contains("several YAML documents"));
        assert!(parse("config-file: x\n", known).unwrap_err().contains("cannot be set inside"));
        assert_eq!(parse("", known).unwrap().args, Vec::<String>::new());
        assert_eq!(parse("debug: true\n", known).unwrap().args, ["--log-level=debug"]);
    }
}
