//! Who a TLS connection says it is, decided once at the handshake.
//!
//! A connection carries a `PeerIdentity`: the name its verified client certificate gives under
//! `--client-cert-identity` (`IdentitySource`: the subject Common Name by default, as etcd; or the
//! one URI SAN, e.g. a SPIFFE ID; or the one DNS SAN), or the reason there is none. Requests on the
//! connection turn it into a `Requester` (see `rules.rs`); nothing re-parses
//! certificates later.

use rustls_pki_types::CertificateDer;
use x509_parser::asn1_rs::Tag;
use x509_parser::prelude::{AttributeTypeAndValue, FromDer, GeneralName, X509Certificate};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerIdentity {
    /// A client certificate verified against `--trusted-ca-file`, with the name it gives: its subject
    /// Common Name, or with `--client-cert-identity uri-san|dns-san` that SAN.
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
    /// `--client-cert-identity uri-san|dns-san`: the certificate has no (non-empty) SAN of that kind.
    NoSan,
    /// `--client-cert-identity uri-san|dns-san`: the certificate has several SANs of that kind, and
    /// which one is the user would be a guess.
    SeveralSans,
}

/// `--client-cert-identity`: which part of a verified client certificate names the user.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IdentitySource {
    /// The subject Common Name (etcd's rule).
    #[default]
    CommonName,
    /// The one URI SAN, e.g. a SPIFFE ID `spiffe://example.org/ns/app/sa/web`.
    UriSan,
    /// The one DNS SAN.
    DnsSan,
}

impl std::str::FromStr for IdentitySource {
    type Err = String;

    fn from_str(s: &str) -> Result<IdentitySource, String> {
        match s {
            "cn" => Ok(IdentitySource::CommonName),
            "uri-san" => Ok(IdentitySource::UriSan),
            "dns-san" => Ok(IdentitySource::DnsSan),
            other => Err(format!("unknown client certificate identity {other:?} (want cn, uri-san or dns-san)")),
        }
    }
}

impl IdentitySource {
    /// The identity a verified certificate's names give under this rule. A SAN rule needs exactly
    /// one non-empty SAN of its kind; the CN plays no part then (a mesh certificate's CN is often a
    /// host name or empty).
    pub fn identify(self, names: &CertNames) -> PeerIdentity {
        let sans = match self {
            IdentitySource::CommonName => return PeerIdentity::from_names(names),
            IdentitySource::UriSan => &names.uri_sans,
            IdentitySource::DnsSan => &names.dns_sans,
        };
        match sans.as_slice() {
            [one] if !one.is_empty() => PeerIdentity::Cert { common_name: one.clone() },
            [] | [_] => PeerIdentity::None(NoIdentity::NoSan),
            _ => PeerIdentity::None(NoIdentity::SeveralSans),
        }
    }
}

/// What the leaf certificate names: its CNs, its DNS and IP SANs (for the hostname allow-list and
/// the peer port's member check), its URI and DNS SANs (for `--client-cert-identity`), and whether it
/// is a server certificate (the peer port takes only those).
#[derive(Clone, Debug, Default)]
pub struct CertNames {
    /// Every subject Common Name in order; `None` for one that cannot be read as text, which still
    /// counts (two CNs are two CNs even when one is unreadable).
    pub common_names: Vec<Option<String>>,
    pub san_hosts: Vec<String>,
    pub uri_sans: Vec<String>,
    pub dns_sans: Vec<String>,
    pub ip_sans: Vec<std::net::IpAddr>,
    /// Its extended key usage lists serverAuth (a member's peer certificate also serves its peer port).
    pub server_auth: bool,
}

impl CertNames {
    /// Whether the certificate names `host` as Go's `VerifyHostname` (and so etcd's
    /// `--peer-cert-allowed-hostname`) decides: an IP address against the IP SANs; a host name,
    /// case-insensitively and without a trailing dot, against the DNS SANs, where a leftmost `*`
    /// label stands for exactly one label. The Common Name is never a host name.
    pub fn names_host(&self, host: &str) -> bool {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = host.parse::<std::net::IpAddr>() {
            return self.ip_sans.contains(&ip);
        }
        let host = host.trim_end_matches('.');
        !host.is_empty() && self.dns_sans.iter().any(|pattern| host_matches(pattern.trim_end_matches('.'), host))
    }
}

/// One DNS SAN `pattern` against `host`: label by label, case-insensitively; `*` only as a whole
/// leftmost label (stricter than Go: not directly above a top-level label, so `*.test` names nothing).
fn host_matches(pattern: &str, host: &str) -> bool {
    let (pattern_labels, host_labels): (Vec<&str>, Vec<&str>) =
        (pattern.split('.').collect(), host.split('.').collect());
    if pattern_labels.len() != host_labels.len() || pattern_labels.iter().any(|l| l.is_empty()) {
        return false;
    }
    pattern_labels.iter().zip(&host_labels).enumerate().all(|(i, (p, h))| {
        (i == 0 && *p == "*" && pattern_labels.len() > 2 && !h.is_empty()) || p.eq_ignore_ascii_case(h)
    })
}

/// Parses the names out of a (verified) leaf certificate; `None` if it does not parse.
pub(crate) fn cert_names(leaf: &CertificateDer<'_>) -> Option<CertNames> {
    let (_, cert) = X509Certificate::from_der(leaf.as_ref()).ok()?;
    let common_names = cert.subject().iter_common_name().map(common_name_text).collect();
    // An extended key usage extension that does not parse grants nothing.
    let server_auth = matches!(cert.extended_key_usage(), Ok(Some(eku)) if eku.value.server_auth);
    let mut names = CertNames { common_names, server_auth, ..CertNames::default() };
    // A SAN extension that does not parse names nothing (and so no SAN identity).
    let general_names = cert.subject_alternative_name().ok().flatten().map(|san| &san.value.general_names);
    for name in general_names.into_iter().flatten() {
        match name {
            GeneralName::DNSName(dns) => {
                names.san_hosts.push(dns.to_string());
                names.dns_sans.push(dns.to_string());
            }
            GeneralName::IPAddress(bytes) => {
                if let Some(ip) = ip_address(bytes) {
                    names.san_hosts.push(ip.to_string());
                    names.ip_sans.push(ip);
                }
            }
            GeneralName::URI(uri) => names.uri_sans.push(uri.to_string()),
            _ => {}
        }
    }
    Some(names)
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

fn ip_address(bytes: &[u8]) -> Option<std::net::IpAddr> {
    match bytes.len() {
        4 => Some(std::net::Ipv4Addr::from(<[u8; 4]>::try_from(bytes).ok()?).into()),
        16 => Some(std::net::Ipv6Addr::from(<[u8; 16]>::try_from(bytes).ok()?).into()),
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

    /// A certificate with CN `cn` and the given SANs.
    fn cert_with_sans(cn: &str, sans: Vec<rcgen::SanType>) -> Vec<u8> {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.subject_alt_names = sans;
        let key = KeyPair::generate().expect("key pair");
        params.self_signed(&key).expect("self-sign").der().to_vec()
    }

    fn identity_by(source: IdentitySource, der: &[u8]) -> PeerIdentity {
        source.identify(&cert_names(&CertificateDer::from(der)).expect("rcgen's certificate parses"))
    }

    fn uri(s: &str) -> rcgen::SanType {
        rcgen::SanType::URI(s.try_into().unwrap())
    }

    fn dns(s: &str) -> rcgen::SanType {
        rcgen::SanType::DnsName(s.try_into().unwrap())
    }

    const WEB: &str = "spiffe://example.org/ns/app/sa/web";

    #[test]
    fn uri_san_identity_is_the_one_uri_san_and_ignores_the_cn() {
        let der = cert_with_sans("web.app.svc", vec![dns("web.app.svc"), uri(WEB)]);
        assert_eq!(identity_by(IdentitySource::UriSan, &der), PeerIdentity::Cert { common_name: WEB.into() });
        // The same certificate under etcd's rule is its CN, and under dns-san its DNS SAN.
        assert_eq!(
            identity_by(IdentitySource::CommonName, &der),
            PeerIdentity::Cert { common_name: "web.app.svc".into() }
        );
        assert_eq!(identity_by(IdentitySource::DnsSan, &der), PeerIdentity::Cert { common_name: "web.app.svc".into() });
    }

    #[test]
    fn a_san_identity_needs_exactly_one_san_of_its_kind() {
        let two = cert_with_sans("alice", vec![uri(WEB), uri("spiffe://example.org/ns/app/sa/db")]);
        assert_eq!(identity_by(IdentitySource::UriSan, &two), PeerIdentity::None(NoIdentity::SeveralSans));
        // A CN is no fallback: without a URI SAN there is no identity, whatever the CN says.
        let none = cert_with_sans("alice", vec![dns("alice.example")]);
        assert_eq!(identity_by(IdentitySource::UriSan, &none), PeerIdentity::None(NoIdentity::NoSan));
        let two_dns = cert_with_sans("alice", vec![dns("a.example"), dns("b.example")]);
        assert_eq!(identity_by(IdentitySource::DnsSan, &two_dns), PeerIdentity::None(NoIdentity::SeveralSans));
        let only_uri = cert_with_sans("alice", vec![uri(WEB)]);
        assert_eq!(identity_by(IdentitySource::DnsSan, &only_uri), PeerIdentity::None(NoIdentity::NoSan));
    }

    #[test]
    fn identity_sources_parse_from_the_flag_values() {
        assert_eq!("cn".parse(), Ok(IdentitySource::CommonName));
        assert_eq!("uri-san".parse(), Ok(IdentitySource::UriSan));
        assert_eq!("dns-san".parse(), Ok(IdentitySource::DnsSan));
        assert!("CN".parse::<IdentitySource>().is_err());
        assert_eq!(IdentitySource::default(), IdentitySource::CommonName);
    }

    fn names_of(der: &[u8]) -> CertNames {
        cert_names(&CertificateDer::from(der)).expect("rcgen's certificate parses")
    }

    #[test]
    fn a_certificate_names_hosts_as_go_verify_hostname_does() {
        let ip = |s: &str| rcgen::SanType::IpAddress(s.parse().unwrap());
        let der = cert_with_sans(
            "peer.example",
            vec![dns("member1.Example.test"), dns("*.peers.example.test"), ip("10.0.0.1"), ip("::1")],
        );
        let names = names_of(&der);
        for named in ["member1.example.test", "MEMBER1.example.test.", "m2.peers.example.test", "10.0.0.1", "[::1]"] {
            assert!(names.names_host(named), "{named} is named");
        }
        for other in [
            "peer.example",           // the CN is no host name
            "example.test",           // the wildcard needs its label
            "a.b.peers.example.test", // and stands for one label only
            "peers.example.test",
            "member1.example.test.evil", // no suffix match
            "10.0.0.2",
            "::2",
            "",
        ] {
            assert!(!names.names_host(other), "{other:?} is not named");
        }
        // A DNS SAN that spells an address does not name the address, nor a wildcard a top-level one.
        assert!(!names_of(&cert_with_sans("x", vec![dns("10.0.0.3")])).names_host("10.0.0.3"));
        assert!(!names_of(&cert_with_sans("x", vec![dns("*.test")])).names_host("example.test"));
    }

    #[test]
    fn server_auth_comes_from_the_extended_key_usage() {
        let with = |ekus: Vec<rcgen::ExtendedKeyUsagePurpose>| {
            let mut params = CertificateParams::default();
            params.extended_key_usages = ekus;
            let key = KeyPair::generate().expect("key pair");
            names_of(params.self_signed(&key).expect("self-sign").der()).server_auth
        };
        use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
        assert!(with(vec![ServerAuth, ClientAuth]));
        assert!(with(vec![ServerAuth]));
        assert!(!with(vec![ClientAuth]));
        assert!(!with(vec![]), "no extended key usage at all is no server certificate here");
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
