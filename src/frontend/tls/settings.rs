//! TLS flags (`--cert-file`, `--key-file`, `--trusted-ca-file`, `--client-cert-auth`,
//! `--client-crl-file`, allow-lists, `--trusted-proxy-cn`, `--client-cert-identity`) and the rustls
//! configuration built from them.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};

use super::policy::TlsPolicy;
use crate::identity::certificate::{CertNames, IdentitySource, PeerIdentity};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub trusted_ca_file: Option<PathBuf>,
    /// Require and verify a client certificate signed by `trusted_ca_file`.
    pub client_cert_auth: bool,
    pub crl_file: Option<PathBuf>,
    /// When non-empty, a client certificate's CN must be one of these.
    pub allowed_cns: Vec<String>,
    /// When non-empty, a client certificate must name one of these hosts (its SAN DNS names and IP
    /// addresses; the CN is not a host name, as in Go's check).
    pub allowed_hostnames: Vec<String>,
    /// `--trusted-proxy-cn`: client-certificate CNs of the proxies allowed to forward a client's
    /// certificate (`keyward-forwarded-client-cert`). A proxy is named the way a user is, by
    /// `identity_source`: its CN by default.
    pub trusted_proxy_cns: Vec<String>,
    /// `--client-cert-identity`: what part of a verified client certificate names the user.
    pub identity_source: IdentitySource,
    /// `--tls-min-version`, `--tls-max-version`, `--cipher-suites`.
    pub policy: TlsPolicy,
}

impl TlsSettings {
    /// Reads the files and builds the server configuration: the versions and cipher suites of
    /// `policy` (by default TLS 1.2 and 1.3, rustls' safe defaults), ALPN h2 (gRPC) and http/1.1
    /// (health and metrics).
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, String> {
        let provider = self.policy.provider();
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&self.cert_file)
            .and_then(|certs| certs.collect())
            .map_err(|e| format!("--cert-file {}: {e}", self.cert_file.display()))?;
        if certs.is_empty() {
            return Err(format!("--cert-file {}: no certificate found", self.cert_file.display()));
        }
        let key = PrivateKeyDer::from_pem_file(&self.key_file)
            .map_err(|e| format!("--key-file {}: {e}", self.key_file.display()))?;
        let builder = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&self.policy.versions())
            .map_err(|e| format!("TLS protocol versions and cipher suites: {e}"))?;
        // As in etcd, a trusted CA means client certificates are required and verified; without
        // `--client-cert-auth` their CN just does not name the user.
        let builder = match self.client_verifier()? {
            Some(verifier) => builder.with_client_cert_verifier(verifier),
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_single_cert(certs, key).map_err(|e| format!("--cert-file/--key-file: {e}"))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// The verifier of client certificates: chain to `--trusted-ca-file`, validity, client-auth
    /// usage, and `--client-crl-file`. The handshake uses it, and so does a certificate forwarded by
    /// a trusted proxy (`frontend/forwarded.rs`), so both are held to the same rules. `None` without a
    /// trusted CA.
    pub fn client_verifier(&self) -> Result<Option<Arc<dyn ClientCertVerifier>>, String> {
        let Some(ca) = &self.trusted_ca_file else {
            if self.client_cert_auth {
                return Err("--client-cert-auth needs --trusted-ca-file".into());
            }
            if self.crl_file.is_some()
                || !self.allowed_cns.is_empty()
                || !self.allowed_hostnames.is_empty()
                || !self.trusted_proxy_cns.is_empty()
            {
                return Err("--client-crl-file, --client-cert-allowed-cn, --client-cert-allowed-hostname and --trusted-proxy-cn need --trusted-ca-file (client certificates)".into());
            }
            return Ok(None);
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca).map_err(|e| format!("--trusted-ca-file {}: {e}", ca.display()))? {
            let cert = cert.map_err(|e| format!("--trusted-ca-file {}: {e}", ca.display()))?;
            roots.add(cert).map_err(|e| format!("--trusted-ca-file {}: {e}", ca.display()))?;
        }
        if roots.is_empty() {
            return Err(format!("--trusted-ca-file {}: no CA certificate found", ca.display()));
        }
        let mut verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
        if let Some(crl) = &self.crl_file {
            let crls: Vec<CertificateRevocationListDer<'static>> = CertificateRevocationListDer::pem_file_iter(crl)
                .and_then(|crls| crls.collect())
                .map_err(|e| format!("--client-crl-file {}: {e}", crl.display()))?;
            // An unreadable CRL must never mean "nothing is revoked".
            if crls.is_empty() {
                return Err(format!("--client-crl-file {}: no CRL found", crl.display()));
            }
            verifier = verifier.with_crls(crls);
        }
        let verifier = verifier.build().map_err(|e| format!("client certificate verifier: {e}"))?;
        Ok(Some(verifier))
    }

    /// The allow-lists (`--client-cert-allowed-cn`, `--client-cert-allowed-hostname`) applied to a
    /// verified certificate's names: at the handshake, and to a forwarded certificate.
    pub fn allows(&self, names: &CertNames) -> Result<(), NotAllowed> {
        let identity = PeerIdentity::from_names(names);
        if !self.allowed_cns.is_empty()
            && !identity.common_name().is_some_and(|cn| self.allowed_cns.iter().any(|a| a == cn))
        {
            return Err(NotAllowed::CommonName(identity.common_name().map(str::to_string)));
        }
        // Host names come from the SANs only, as Go's (and so etcd's) hostname check does.
        if !self.allowed_hostnames.is_empty()
            && !names
                .san_hosts
                .iter()
                .any(|host| self.allowed_hostnames.iter().any(|allowed| allowed.eq_ignore_ascii_case(host)))
        {
            return Err(NotAllowed::Hostname);
        }
        Ok(())
    }
}

/// Why a verified certificate is not allowed by the allow-lists.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotAllowed {
    #[error("client certificate common name {0:?} is not in --client-cert-allowed-cn")]
    CommonName(Option<String>),
    #[error("client certificate names no host in --client-cert-allowed-hostname")]
    Hostname,
}
