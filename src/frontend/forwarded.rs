//! A client certificate forwarded by a trusted proxy (issue 12's interface): the gRPC metadata
//! `keyward-forwarded-client-cert` carries the client's leaf certificate, DER, standard base64.
//!
//! This module only checks the certificate, with the same rules as a certificate presented at the
//! handshake: chain to `--trusted-ca-file`, validity now, client-auth usage, `--client-crl-file`, then
//! the allow-lists. Whether the peer may forward at all is decided in `identity/rules.rs`.
//!
//! A proxy forwards the same client's certificate with every request, and a chain check with its
//! signature verification costs more than serving a read (through a proxy, range throughput fell by
//! 40% when every request was verified). So a certificate that passed is remembered with the verifier
//! that passed it, until its notAfter: a changed CA or CRL file replaces the verifier (`tls/reload.rs`)
//! and forgets them all, so a revocation is never answered from memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use rustls::server::danger::ClientCertVerifier;
use rustls_pki_types::{CertificateDer, UnixTime};
use x509_parser::prelude::{FromDer, X509Certificate};

use super::tls::reload::{Reload, Reloading};
use super::tls::settings::TlsSettings;
use crate::identity::certificate::{cert_names, CertNames};
use crate::identity::ForwardedCertificates;

/// Certificates remembered as passed; past this many the memory starts over (a trusted proxy
/// forwards its clients' certificates, so this is the number of clients active at once).
const PASSED_CAPACITY: usize = 4096;

/// Checks forwarded certificates against the member's current CA and CRL files.
pub(crate) struct ForwardedVerifier {
    settings: TlsSettings,
    /// The verifier of the current CA and CRL files (`tls/reload.rs`, checked on use); a new one is
    /// a new generation.
    verifier: Reloading<Arc<dyn ClientCertVerifier>>,
    remembered: Mutex<Remembered>,
}

/// Certificates one verifier generation passed (every check, allow-lists included), by their
/// metadata value. A check that ran against an earlier generation is not remembered by a later one.
struct Remembered {
    generation: u64,
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
        if settings.client_verifier()?.is_none() {
            return Ok(None);
        }
        let files = [settings.trusted_ca_file.as_ref(), settings.crl_file.as_ref()].into_iter().flatten().cloned();
        let from = settings.clone();
        let verifier = Reloading::load(files.collect(), move || {
            from.client_verifier()?.ok_or_else(|| "--trusted-ca-file is not set".to_string())
        })?;
        let remembered = Mutex::new(Remembered { generation: 0, passed: HashMap::new() });
        Ok(Some(ForwardedVerifier { settings: settings.clone(), verifier, remembered }))
    }

    /// The current verifier and its generation, rebuilt (and what it passed forgotten) when the CA
    /// or CRL file changed. A file that changed but no longer loads keeps the previous verifier, as
    /// the listener keeps its previous configuration: a broken CRL never means "nothing is revoked".
    fn current(&self) -> (Arc<dyn ClientCertVerifier>, u64) {
        if let Reload::Failed(e) = self.verifier.reload_if_due() {
            tracing::error!(error = %e, "CA or CRL file changed but could not be loaded; forwarded certificates are checked against the previous one")
        }
        self.verifier.current()
    }

    fn remembered(&self) -> std::sync::MutexGuard<'_, Remembered> {
        self.remembered.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl ForwardedCertificates for ForwardedVerifier {
    /// Decodes and verifies a forwarded certificate; its names if every check passes, else why not.
    fn verify(&self, base64_der: &[u8]) -> Result<CertNames, String> {
        let now = UnixTime::now();
        let (verifier, generation) = self.current();
        {
            let mut remembered = self.remembered();
            if remembered.generation != generation {
                // A newer verifier (the older one's verdicts are never used again) or, for a check
                // that started before a reload, an older one (nothing to look up).
                if remembered.generation < generation {
                    *remembered = Remembered { generation, passed: HashMap::new() };
                }
            } else if let Some(passed) = remembered.passed.get(base64_der).filter(|p| now.as_secs() < p.not_after) {
                return Ok(passed.names.clone());
            }
        }
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
            let mut remembered = self.remembered();
            if remembered.generation == generation {
                if remembered.passed.len() >= PASSED_CAPACITY {
                    remembered.passed.clear();
                }
                remembered.passed.insert(base64_der.to_vec(), Passed { names: names.clone(), not_after });
            }
        }
        Ok(names)
    }
}

/// A verified certificate's notAfter as Unix seconds.
fn not_after(leaf: &CertificateDer<'_>) -> Option<u64> {
    let (_, cert) = X509Certificate::from_der(leaf.as_ref()).ok()?;
    u64::try_from(cert.validity().not_after.timestamp()).ok()
}
