//! Who a TLS connection says it is, decided once at the handshake.
//!
//! A connection carries a `PeerIdentity`: the subject Common Name of its verified client certificate,
//! or the reason there is none. Requests on the connection turn it into a `Requester` (see
//! `frontend/identity.rs`); nothing re-parses certificates later.

use rustls_pki_types::CertificateDer;
use x509_parser::asn1_rs::Tag;
use x509_parser::prelude::{AttributeTypeAndValue, FromDer, GeneralName, X509Certificate};

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
    /// The verified certificate's one Common Name is of a string type or encoding that cannot be
    /// read as text (Go, and so etcd, refuses such a certificate at the handshake).
    UnreadableCommonName,
}

/// What the leaf certificate names: its CNs and its DNS and IP SANs (for the hostname allow-list).
pub struct CertNames {
    /// Every subject Common Name in order; `None` for one that cannot be read as text, which still
    /// counts (two CNs are two CNs even when one is unreadable).
    pub common_names: Vec<Option<String>>,
    pub san_hosts: Vec<String>,
}

/// Parses the names out of a (verified) leaf certificate; `None` if it does not parse.
pub fn cert_names(leaf: &CertificateDer<'_>) -> Option<CertNames> {
    let (_, cert) = X509Certificate::from_der(leaf.as_ref()).ok()?;
    let common_names = cert.subject().iter_common_name().map(common_name_text).collect();
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

/// A Common Name as text, decoded as Go's `crypto/x509` decodes the directory string types etcd
/// sees: UTF8String, PrintableString, IA5String and NumericString as they are; BMPString as UTF-16
/// (big-endian, one trailing NUL dropped; an unpaired surrogate makes it unreadable rather than a
/// replacement character, so two different byte strings never read as the same name); TeletexString
/// as Latin-1. Anything else (UniversalString, a non-string) is unreadable.
fn common_name_text(attr: &AttributeTypeAndValue<'_>) -> Option<String> {
    let value = attr.attr_value();
    let bytes = value.data;
    match value.tag() {
        Tag::Utf8String | Tag::PrintableString | Tag::Ia5String | Tag::NumericString => {
            std::str::from_utf8(bytes).ok().map(str::to_string)
        }
        Tag::BmpString => {
            if bytes.len() % 2 != 0 {
                return None;
            }
            let bytes = bytes.strip_suffix(&[0, 0]).unwrap_or(bytes);
            let units = bytes.chunks_exact(2).map(|pair| u16::from_be_bytes([pair[0], pair[1]]));
            char::decode_utf16(units).collect::<Result<String, _>>().ok()
        }
        Tag::TeletexString => Some(bytes.iter().map(|&b| char::from(b)).collect()),
        _ => None,
    }
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
            [Some(cn)] if !cn.is_empty() => PeerIdentity::Cert { common_name: cn.clone() },
            [] | [Some(_)] => PeerIdentity::None(NoIdentity::NoCommonName),
            [None] => PeerIdentity::None(NoIdentity::UnreadableCommonName),
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

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::string::{BmpString, UniversalString};
    use rcgen::{CertificateParams, DistinguishedName, DnType, DnValue, KeyPair};

    /// A self-signed certificate whose subject is exactly `subject`, as DER.
    fn cert_with_subject(subject: Vec<(DnType, DnValue)>) -> Vec<u8> {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        for (ty, value) in subject {
            dn.push(ty, value);
        }
        params.distinguished_name = dn;
        let key = KeyPair::generate().expect("key pair");
        params.self_signed(&key).expect("self-sign").der().to_vec()
    }

    fn identity_of(der: &[u8]) -> PeerIdentity {
        let names = cert_names(&CertificateDer::from(der)).expect("rcgen's certificate parses");
        PeerIdentity::from_names(&names)
    }

    /// The Common Name attribute's OID as a custom type: rcgen keeps one value per `DnType`, and this
    /// is how a test gets a second CN into one subject.
    fn second_cn() -> DnType {
        DnType::CustomDnType(vec![2, 5, 4, 3])
    }

    #[test]
    fn a_bmp_string_common_name_is_the_identity() {
        let der =
            cert_with_subject(vec![(DnType::CommonName, DnValue::BmpString(BmpString::try_from("alice").unwrap()))]);
        assert_eq!(identity_of(&der), PeerIdentity::Cert { common_name: "alice".into() });
    }

    #[test]
    fn an_unreadable_common_name_still_counts_as_one() {
        // A CN that cannot be read next to one that can is still two CNs: no identity, rather than
        // the readable one silently becoming the user.
        let der = cert_with_subject(vec![
            (DnType::CommonName, DnValue::UniversalString(UniversalString::try_from("admin").unwrap())),
            (second_cn(), DnValue::Utf8String("bob".into())),
        ]);
        assert_eq!(identity_of(&der), PeerIdentity::None(NoIdentity::SeveralCommonNames));
    }

    #[test]
    fn a_lone_unreadable_common_name_gives_no_identity_and_says_why() {
        let der = cert_with_subject(vec![(
            DnType::CommonName,
            DnValue::UniversalString(UniversalString::try_from("admin").unwrap()),
        )]);
        assert_eq!(identity_of(&der), PeerIdentity::None(NoIdentity::UnreadableCommonName));
    }

    #[test]
    fn two_readable_common_names_give_no_identity() {
        let der = cert_with_subject(vec![
            (DnType::CommonName, DnValue::Utf8String("alice".into())),
            (second_cn(), DnValue::BmpString(BmpString::try_from("bob").unwrap())),
        ]);
        assert_eq!(identity_of(&der), PeerIdentity::None(NoIdentity::SeveralCommonNames));
    }
}
