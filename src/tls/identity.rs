//! Who a TLS connection says it is, decided once at the handshake.
//!
//! A connection carries a `PeerIdentity`: the subject Common Name of its verified client certificate,
//! or the reason there is none. Requests on the connection turn it into a `Requester` (see
//! `server/identity.rs`); nothing re-parses certificates later.

use rustls_pki_types::CertificateDer;
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerIdentity {
    /// A client certificate verified against `--trusted-ca-file`, with its subject Common Name.
    Cert { common_name: String },
    /// No identity, and why.
    None(NoIdentity),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoIdentity {
    /// A plain-text connection.
    PlainText,
    /// TLS without a client certificate (client certificates not required).
    NoClientCert,
    /// The verified certificate has no subject Common Name.
    NoCommonName,
}

/// What the leaf certificate names: its CN (if any) and its DNS names (for the hostname allow-list).
pub struct CertNames {
    pub common_name: Option<String>,
    pub dns_names: Vec<String>,
}

/// Parses the names out of a (verified) leaf certificate; `None` if it does not parse.
pub fn cert_names(leaf: &CertificateDer<'_>) -> Option<CertNames> {
    let (_, cert) = X509Certificate::from_der(leaf.as_ref()).ok()?;
    let common_name = cert.subject().iter_common_name().next().and_then(|cn| cn.as_str().ok()).map(str::to_string);
    let dns_names = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|name| match name {
                    GeneralName::DNSName(dns) => Some(dns.to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    Some(CertNames { common_name, dns_names })
}

impl PeerIdentity {
    pub fn from_names(names: &CertNames) -> PeerIdentity {
        match &names.common_name {
            Some(cn) if !cn.is_empty() => PeerIdentity::Cert { common_name: cn.clone() },
            _ => PeerIdentity::None(NoIdentity::NoCommonName),
        }
    }

    pub fn common_name(&self) -> Option<&str> {
        match self {
            PeerIdentity::Cert { common_name } => Some(common_name),
            PeerIdentity::None(_) => None,
        }
    }
}
