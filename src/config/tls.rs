//! The TLS flags: the client listeners' (`--cert-file`, `--client-cert-auth`, `--trusted-proxy-cn`,
//! ...), the peer port's (`--peer-*`), and the versions and cipher suites both allow
//! (`--tls-min-version`, `--tls-max-version`, `--cipher-suites`). Each pair of files goes together, every other TLS flag needs
//! them, and the files are read once here, so that a missing or malformed file stops the start rather
//! than the first connection.

use super::error::{invalid, ConfigError};
use super::listeners::Listener;
use crate::cli::member::ServeArgs;
use crate::frontend::tls::policy::TlsPolicy;
use crate::frontend::tls::settings::TlsSettings;
use crate::identity::certificate::IdentitySource;

/// `--tls-min-version`, `--tls-max-version` and `--cipher-suites`: as in etcd, one policy for the
/// client listeners, the peer listeners and the member's dialing of its peers. Checked even without
/// TLS, as etcd checks them.
pub(super) fn tls_policy(args: &ServeArgs) -> Result<TlsPolicy, ConfigError> {
    TlsPolicy::from_flags(&args.tls_min_version, &args.tls_max_version, &args.cipher_suites).map_err(invalid)
}

/// TLS for the `https://` client listeners (`None`: no `--cert-file`/`--key-file`).
pub(super) fn client_tls(args: &ServeArgs, listen_client: &[Listener]) -> Result<Option<TlsSettings>, ConfigError> {
    let client_tls = match (&args.cert_file, &args.key_file) {
        (Some(cert), Some(key)) => Some(TlsSettings {
            cert_file: cert.clone(),
            key_file: key.clone(),
            trusted_ca_file: args.trusted_ca_file.clone(),
            client_cert_auth: args.client_cert_auth,
            crl_file: args.client_crl_file.clone(),
            allowed_cns: args.client_cert_allowed_cn.clone(),
            allowed_hostnames: args.client_cert_allowed_hostname.clone(),
            trusted_proxy_cns: args.trusted_proxy_cn.clone(),
            identity_source: args.client_cert_identity,
            policy: tls_policy(args)?,
        }),
        (None, None) => None,
        _ => return Err(invalid("--cert-file and --key-file go together")),
    };
    if listen_client.iter().any(|l| l.tls) && client_tls.is_none() {
        return Err(invalid("an https:// client URL needs --cert-file and --key-file"));
    }
    if args.client_cert_auth && args.trusted_ca_file.is_none() {
        return Err(invalid("--client-cert-auth needs --trusted-ca-file"));
    }
    if client_tls.is_none()
        && (args.client_crl_file.is_some()
            || !args.client_cert_allowed_cn.is_empty()
            || !args.client_cert_allowed_hostname.is_empty()
            || !args.trusted_proxy_cn.is_empty())
    {
        return Err(invalid(
            "--client-crl-file, --client-cert-allowed-cn, --client-cert-allowed-hostname and --trusted-proxy-cn need client TLS (--cert-file, --key-file, --trusted-ca-file)",
        ));
    }
    if args.client_cert_identity != IdentitySource::CommonName && !args.client_cert_auth {
        return Err(invalid("--client-cert-identity names users by certificate: it needs --client-cert-auth"));
    }
    if !args.trusted_proxy_cn.is_empty() {
        // A proxy is trusted by its verified certificate, and what it forwards names a user only
        // where certificates do.
        if !args.client_cert_auth {
            return Err(invalid("--trusted-proxy-cn needs --client-cert-auth (and --trusted-ca-file)"));
        }
        if args.trusted_proxy_cn.iter().any(String::is_empty) {
            return Err(invalid("--trusted-proxy-cn: a Common Name must not be empty"));
        }
    }
    if let Some(tls) = &client_tls {
        // Fail at startup, not at the first connection, when a file is missing or malformed.
        tls.server_config().map_err(invalid)?;
    }
    Ok(client_tls)
}

/// Peer TLS: the peer listener's settings, and the certificate this member presents to its peers
/// (`None`: no `--peer-cert-file`/`--peer-key-file`).
pub(super) fn peer_tls(args: &ServeArgs) -> Result<Option<TlsSettings>, ConfigError> {
    if !args.peer_cert_allowed_cn.is_empty() && !args.peer_cert_allowed_hostname.is_empty() {
        return Err(invalid(format!(
            "--peer-cert-allowed-cn and --peer-cert-allowed-hostname are mutually exclusive (cn={:?}, hostname={:?})",
            args.peer_cert_allowed_cn.join(","),
            args.peer_cert_allowed_hostname.join(",")
        )));
    }
    match (&args.peer_cert_file, &args.peer_key_file) {
        (Some(cert), Some(key)) => {
            let tls = TlsSettings {
                cert_file: cert.clone(),
                key_file: key.clone(),
                trusted_ca_file: args.peer_trusted_ca_file.clone(),
                client_cert_auth: args.peer_client_cert_auth,
                crl_file: args.peer_crl_file.clone(),
                // The peer allow-lists are part of the member rule every peer request is held
                // to (`cluster/admission.rs`), not of the handshake.
                allowed_cns: Vec::new(),
                allowed_hostnames: Vec::new(),
                trusted_proxy_cns: Vec::new(),
                identity_source: IdentitySource::CommonName,
                policy: tls_policy(args)?,
            };
            tls.server_config().map_err(|e| invalid(format!("peer TLS: {e}")))?;
            Ok(Some(tls))
        }
        (None, None)
            if args.peer_client_cert_auth
                || args.peer_trusted_ca_file.is_some()
                || args.peer_crl_file.is_some()
                || !args.peer_cert_allowed_cn.is_empty()
                || !args.peer_cert_allowed_hostname.is_empty() =>
        {
            Err(invalid("peer TLS flags need --peer-cert-file and --peer-key-file"))
        }
        (None, None) => Ok(None),
        _ => Err(invalid("--peer-cert-file and --peer-key-file go together")),
    }
}
