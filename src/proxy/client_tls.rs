//! The proxy's own TLS towards the members (`--cert`, `--key`, `--cacert`), reloaded when the files
//! change.
//!
//! A sidecar's workload certificate rotates (mesh certificates live hours), and the member knows the
//! workload by the certificate presented at the handshake. So the files are re-read every
//! `RELOAD_INTERVAL` (`frontend/tls/reload.rs`, as every listener's are); when their contents change
//! and still load, a new rustls configuration (with an empty session cache: a resumed session would
//! carry the old identity) replaces the old one and the generation counter moves, which tells
//! `upstream.rs` to open new connections for the requests that follow. Streams already open on an
//! old connection keep it, and its identity, until they end.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::ClientConfig;

use crate::frontend::tls::client::client_config;
use crate::frontend::tls::policy::TlsPolicy;
use crate::frontend::tls::reload::{Reload, Reloading};

/// `--cert`, `--key`, `--cacert`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientTlsFiles {
    /// The proxy's (or the workload's) certificate and key, presented to the members.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// The CA bundle that signs the members' server certificates.
    pub cacert: PathBuf,
}

impl ClientTlsFiles {
    fn paths(&self) -> Vec<PathBuf> {
        let mut paths = vec![self.cacert.clone()];
        if let Some((cert, key)) = &self.identity {
            paths.extend([cert.clone(), key.clone()]);
        }
        paths
    }

    /// Builds the client configuration: TLS 1.2 and 1.3, the members verified against `--cacert`,
    /// the certificate presented if given, ALPN h2.
    pub fn config(&self) -> Result<Arc<ClientConfig>, String> {
        let identity = self.identity.as_ref().map(|(cert, key)| (cert.as_path(), key.as_path()));
        client_config(&self.cacert, identity, ("--cacert", "--cert", "--key"), &TlsPolicy::default())
    }
}

/// The current client configuration and its generation.
pub(crate) struct ClientTls {
    config: Arc<Reloading<Arc<ClientConfig>>>,
}

impl ClientTls {
    /// Loads the files now (a missing or broken file fails startup).
    pub(crate) fn load(files: ClientTlsFiles) -> Result<Arc<ClientTls>, String> {
        let config = Reloading::load(files.paths(), move || files.config())?;
        Ok(Arc::new(ClientTls { config: Arc::new(config) }))
    }

    /// The configuration new connections use, and its generation.
    pub(crate) fn current(&self) -> (Arc<ClientConfig>, u64) {
        self.config.current()
    }

    /// The generation new connections would get.
    pub(crate) fn generation(&self) -> u64 {
        self.config.generation()
    }

    /// Re-reads the files; a change that loads becomes the next generation. A change that does not
    /// load (a half-written rotation) keeps the current one until the files change again.
    #[cfg(test)]
    fn reload_if_changed(&self) {
        report_reload(self.config.reload_if_changed());
    }

    /// Checks the files every `RELOAD_INTERVAL` while the proxy runs.
    pub(crate) fn spawn_reloader(&self) {
        self.config.spawn_checks(report_reload);
    }
}

fn report_reload(reload: Reload) {
    match reload {
        Reload::Unchanged => {}
        Reload::Reloaded { generation } => {
            tracing::info!(generation, "--cert/--key/--cacert changed; new member connections use the new certificate")
        }
        Reload::Failed(e) => {
            tracing::warn!(error = %e, "--cert/--key/--cacert changed but do not load; keeping the previous ones")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, KeyPair};

    fn write_cert(dir: &std::path::Path, name: &str, cn: &str) -> (PathBuf, PathBuf) {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let (cert_path, key_path) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}-key.pem")));
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }

    #[test]
    fn a_changed_certificate_is_a_new_generation_and_a_broken_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, _) = write_cert(dir.path(), "ca", "ca");
        let identity = write_cert(dir.path(), "web", "web");
        let tls = ClientTls::load(ClientTlsFiles { identity: Some(identity.clone()), cacert: ca }).unwrap();
        assert_eq!(tls.generation(), 0);
        tls.reload_if_changed();
        assert_eq!(tls.generation(), 0, "unchanged files are no new generation");
        write_cert(dir.path(), "web", "web-rotated");
        tls.reload_if_changed();
        assert_eq!(tls.generation(), 1);
        // Half a rotation (the new certificate, the old key) does not load either.
        let other = tempfile::tempdir().unwrap();
        let (next_cert, _) = write_cert(other.path(), "web", "web-next");
        std::fs::copy(next_cert, &identity.0).unwrap();
        tls.reload_if_changed();
        assert_eq!(tls.generation(), 1, "a certificate without its key keeps the previous configuration");
        std::fs::write(&identity.1, "not a key").unwrap();
        tls.reload_if_changed();
        assert_eq!(tls.generation(), 1, "a key that does not load keeps the previous configuration");
    }

    #[test]
    fn missing_files_fail_at_load() {
        let dir = tempfile::tempdir().unwrap();
        let files = ClientTlsFiles { identity: None, cacert: dir.path().join("none.pem") };
        assert!(ClientTls::load(files).err().unwrap().contains("--cacert"));
    }
}
