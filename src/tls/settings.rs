//! TLS flags (`--cert-file`, `--key-file`, `--trusted-ca-file`, `--client-cert-auth`,
//! `--client-crl-file`, allow-lists) and the rustls server configuration built from them.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};

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
    /// When non-empty, a client certificate must name one of these hosts among its DNS or IP SANs (the CN
    /// is not consulted, as in Go's and so etcd's hostname check).
    pub allowed_hostnames: Vec<String>,
}

impl TlsSettings {
    /// Reads the files and builds the server configuration: TLS 1.2 and 1.3, rustls' safe defaults,
    /// ALPN h2 (gRPC) and http/1.1 (health and metrics).
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&self.cert_file)
            .and_then(|certs| certs.collect())
            .map_err(|e| format!("--cert-file {}: {e}", self.cert_file.display()))?;
        if certs.is_empty() {
            return Err(format!("--cert-file {}: no certificate found", self.cert_file.display()));
        }
        let key = PrivateKeyDer::from_pem_file(&self.key_file)
            .map_err(|e| format!("--key-file {}: {e}", self.key_file.display()))?;
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS protocol versions: {e}"))?;
        // As in etcd, a trusted CA means client certificates are required and verified; without
        // `--client-cert-auth` their CN just does not name the user.
        let builder = match &self.trusted_ca_file {
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for cert in CertificateDer::pem_file_iter(ca).map_err(|e| format!("--trusted-ca-file {}: {e}", ca.display()))? {
                    let cert = cert.map_err(|e| format!("--trusted-ca-file {}: {e}", ca.display()))?;
                    roots.add(cert).map_err(|e| format!("--trusted-ca-file {}: {e}", ca.display()))?;
                }
                if roots.is_empty() {
                    return Err(format!("--trusted-ca-file {}: no CA certificate found", ca.display()));
                }
                let mut verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
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
                builder.with_client_cert_verifier(verifier.build().map_err(|e| format!("client certificate verifier: {e}"))?)
            }
            None if self.client_cert_auth => return Err("--client-cert-auth needs --trusted-ca-file".into()),
            None if self.crl_file.is_some() || !self.allowed_cns.is_empty() || !self.allowed_hostnames.is_empty() => {
                return Err("--client-crl-file, --client-cert-allowed-cn and --client-cert-allowed-hostname need --trusted-ca-file (client certificates)".into())
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_single_cert(certs, key).map_err(|e| format!("--cert-file/--key-file: {e}"))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}
