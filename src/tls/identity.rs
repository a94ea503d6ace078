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
    /// The verified certificate has several subject Common Names: which one is the user is a guess
    /// (etcd takes the last), so none is.
    SeveralCommonNames,
}

/// What the leaf certificate names: its CNs and its DNS and IP SANs (for the hostname allow-list).
pub struct CertNames {
    pub common_names: Vec<String>,
    pub san_hosts: Vec<String>,
}

/// Parses the names out of a (verified) leaf certificate; `None` if it does not parse.
pub fn cert_names(leaf: &CertificateDer<'_>) -> Option<CertNames> {
    let (_, cert) = X509Certificate::from_der(leaf.as_ref()).ok()?;
    let common_names =
        cert.subject().iter_common_name().filter_map(|cn| cn.as_str().ok()).map(str::to_string).collect();
    let san_hosts = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|name| match name {
                    GeneralName::DNSName(dns) => Some(dns.to_string()),
                    GeneralName::IPAddress(bytes) => ip_string(bytes),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    Some(CertNames { common_names, san_hosts })
}

fn ip_string(bytes: &[u8]) -> Option<String> {
    match bytes.len() {
        4 => Some(std::net::Ipv4Addr::from(<[u8; 4]>::try_from(bytes).ok()?).to_string()),
        16 => Some(std::net::Ipv6Addr::from(<[u8; 16]>::try_from(bytes).ok()?).to_string()),
        _ => None,
    }
}

impl PeerIdentity {
    pub fn from_names(names: &CertNames) -> PeerIdentity {
        match names.common_names.as_slice() {
            [cn] if !cn.is_empty() => PeerIdentity::Cert { common_name: cn.clone() },
            [] | [_] => PeerIdentity::None(NoIdentity::NoCommonName),
            _ => PeerIdentity::None(NoIdentity::SeveralCommonNames),
        }
    }

    pub fn common_name(&self) -> Option<&str> {
        match self {
            PeerIdentity::Cert { common_name } => Some(common_name),
            PeerIdentity::None(_) => None,
        }
    }
}
