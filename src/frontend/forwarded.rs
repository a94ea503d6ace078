//! A client certificate forwarded by a trusted proxy (issue 12's interface): the gRPC metadata
//! `keyward-forwarded-client-cert` carries the client's leaf certificate, DER, standard base64.
//!
//! This module only checks the certificate, with the same rules as a certificate presented at the
//! handshake: chain to `--trusted-ca-file`, validity now, client-auth usage, `--client-crl-file`, then
//! the allow-lists. Whether the peer may forward at all is decided in `identity.rs`.
//!
//! A proxy forwards the same client's certificate with every request, and a chain check with its
//! signature verification costs more than serving a read (through a proxy, range throughput fell by
//! 40% when every request was verified). So a certificate that passed is remembered with the verifier
//! that passed it, until its notAfter: a changed CA or CRL file replaces the verifier and forgets
//! them all, so a revocation is never answered from memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use rustls::server::danger::ClientCertVerifier;
use rustls_pki_types::{CertificateDer, UnixTime};
use x509_parser::prelude::{FromDer, X509Certificate};

use super::certificate::{cert_names, CertNames};
use super::tls::settings::TlsSettings;

/// How often the CA and CRL files are checked for changes (as the listener checks its own).
const RELOAD_INTERVAL: Duration = Duration::from_secs(2);
/// Certificates remembered as passed; past this many the memory starts over (a trusted proxy
/// forwards its clients' certificates, so this is the number of clients active at once).
const PASSED_CAPACITY: usize = 4096;

/// Checks forwarded certificates against the member's current CA and CRL files.
pub(crate) struct ForwardedVerifier {
    settings: TlsSettings,
    current: Mutex<Loaded>,
}

struct Loaded {
    stamp: Vec<Option<SystemTime>>,
    checked_at: Instant,
    verifier: Arc<dyn ClientCertVerifier>,
    /// Bumped with every new verifier, so that a check that ran against the previous one is not
    /// remembered as passed by this one.
    generation: u64,
    /// Certificates `verifier` passed (every check, allow-lists included), by their metadata value.
    passed: HashMap<Vec<u8>, Passed>,
}

struct Passed {
    names: CertNames,
    /// The certificate's notAfter (Unix seconds): it is not remembered past it.
    not_after: u64,
}

impl ForwardedVerifier {
    /// `None` when the settings verify no client certificates (no `--trusted-ca-file`).
    pub(crate) fn new(settings: &TlsSettings) -> Result<Option<ForwardedVerifier>, String> {
        let Some(verifier) = settings.client_verifier()? else { return Ok(None) };
        let loaded = Loaded {
            stamp: stamp(settings),
            checked_at: Instant::now(),
            verifier,
            generation: 0,
            passed: HashMap::new(),
        };
        Ok(Some(ForwardedVerifier { settings: settings.clone(), current: Mutex::new(loaded) }))
    }

    /// Decodes and verifies a forwarded certificate; its names if every check passes, else why not.
    pub(crate) fn verify(&self, base64_der: &[u8]) -> Result<CertNames, String> {
        let now = UnixTime::now();
        let (verifier, generation) = {
            let current = self.current();
            if let Some(passed) = current.passed.get(base64_der).filter(|p| now.as_secs() < p.not_after) {
                return Ok(passed.names.clone());
            }
            (current.verifier.clone(), current.generation)
        };
        let der = base64::engine::general_purpose::STANDARD
            .decode(base64_der)
            .map_err(|e| format!("not standard base64: {e}"))?;
        let leaf = CertificateDer::from(der);
        // The proxy forwards the leaf only: a client whose chain needs an intermediate is refused
        // unless the intermediate is in --trusted-ca-file.
        verifier.verify_client_cert(&leaf, &[], now).map_err(|e| format!("certificate verification failed: {e}"))?;
        let names = cert_names(&leaf).ok_or("the verified certificate could not be parsed")?;
        self.settings.allows(&names).map_err(|e| e.to_string())?;
        if let Some(not_after) = not_after(&leaf) {
            let mut current = self.current();
            if current.generation == generation {
                if current.passed.len() >= PASSED_CAPACITY {
                    current.passed.clear();
                }
                current.passed.insert(base64_der.to_vec(), Passed { names: names.clone(), not_after });
            }
        }
        Ok(names)
    }

    /// The current verifier and what it passed, rebuilt (and forgotten) when the CA or CRL file
    /// changed. A file that changed but no longer loads keeps the previous verifier, as the listener
    /// keeps its previous configuration: a broken CRL never means "nothing is revoked".
    fn current(&self) -> std::sync::MutexGuard<'_, Loaded> {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if current.checked_at.elapsed() >= RELOAD_INTERVAL {
            current.checked_at = Instant::now();
            let now = stamp(&self.settings);
            if now != current.stamp {
                current.stamp = now;
                match self.settings.client_verifier() {
                    Ok(Some(verifier)) => {
                        current.verifier = verifier;
                        current.generation += 1;
                        current.passed.clear();
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::error!(error = %e, "CA or CRL file changed but could not be loaded; forwarded certificates are checked against the previous one")
                    }
                }
            }
        }
        current
    }
}

/// A verified certificate's notAfter as Unix seconds.
fn not_after(leaf: &CertificateDer<'_>) -> Option<u64> {
    let (_, cert) = X509Certificate::from_der(leaf.as_ref()).ok()?;
    u64::try_from(cert.validity().not_after.timestamp()).ok()
}

/// Modification times of the files a verifier is built from.
fn stamp(settings: &TlsSettings) -> Vec<Option<SystemTime>> {
    [settings.trusted_ca_file.as_ref(), settings.crl_file.as_ref()]
        .into_iter()
        .flatten()
        .map(|f| std::fs::metadata(f).and_then(|m| m.modified()).ok())
        .collect()
}
