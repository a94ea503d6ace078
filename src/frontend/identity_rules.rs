//! The identity rules a client listener's TLS flags set: `identity/rules.rs`'s `IdentityRules`, with
//! `--client-cert-auth`, `--trusted-proxy-cn`, `--client-cert-identity`, and the verifier a forwarded
//! certificate is checked with (`forwarded.rs`: `--trusted-ca-file`, `--client-crl-file`,
//! allow-lists). The member builds them once (`node/`); a proxy verifies at its own listener instead.

use super::forwarded::ForwardedVerifier;
use super::tls::settings::TlsSettings;
use crate::identity::{ForwardedCertificates, IdentityRules};

/// The rules for the client TLS settings (`None`: no TLS, so no certificate ever names a user).
pub(crate) fn identity_rules(tls: Option<&TlsSettings>) -> Result<IdentityRules, String> {
    let Some(tls) = tls else { return Ok(IdentityRules::plain_text()) };
    let forwarded = if tls.trusted_proxy_cns.is_empty() { None } else { ForwardedVerifier::new(tls)? };
    let forwarded = forwarded.map(|verifier| Box::new(verifier) as Box<dyn ForwardedCertificates>);
    Ok(IdentityRules::new(tls.client_cert_auth, tls.trusted_proxy_cns.clone(), tls.identity_source, forwarded))
}

#[cfg(test)]
mod tests {
    //! Every check on a forwarded certificate, each with the twin that passes it, and etcd's order of
    //! who is calling, through the rules a listener's flags set. The PKI is made with rcgen at run
    //! time.

    use std::path::Path;

    use base64::Engine as _;
    use rcgen::{
        BasicConstraints, CertificateParams, CertificateRevocationListParams, DistinguishedName, DnType,
        ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose, RevocationReason,
        RevokedCertParams, SerialNumber,
    };
    use std::net::SocketAddr;

    use tonic::metadata::{MetadataMap, MetadataValue};

    use super::*;
    use crate::error::EtcdError;
    use crate::identity::certificate::{IdentitySource, NoIdentity, PeerIdentity};
    use crate::identity::metadata::{FORWARDED_ADDR, FORWARDED_CERT};
    use crate::identity::rules::Anonymous;
    use crate::identity::{Identity, Requester, TokenResolver};

    struct Ca {
        issuer: Issuer<'static, KeyPair>,
        pem: String,
    }

    fn ca(name: &str) -> Ca {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        Ca { issuer: Issuer::new(params, key), pem }
    }

    fn client_params(cns: &[&str], serial: u8) -> CertificateParams {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        for (i, cn) in cns.iter().enumerate() {
            // rcgen keeps one value per DnType: a second CN goes in under the CN's OID as a custom type.
            let ty = if i == 0 { DnType::CommonName } else { DnType::CustomDnType(vec![2, 5, 4, 3]) };
            dn.push(ty, *cn);
        }
        params.distinguished_name = dn;
        params.serial_number = Some(SerialNumber::from_slice(&[0x10, serial]));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params
    }

    /// A certificate as a trusted proxy would forward it: DER, standard base64.
    fn forwarded(params: CertificateParams, by: &Ca) -> String {
        let cert = params.signed_by(&KeyPair::generate().unwrap(), &by.issuer).unwrap();
        base64::engine::general_purpose::STANDARD.encode(cert.der())
    }

    /// A CRL of `by` revoking the serials given.
    fn crl(by: &Ca, serials: &[u8], path: &Path) {
        let params = CertificateRevocationListParams {
            this_update: rcgen::date_time_ymd(2024, 1, 1),
            next_update: rcgen::date_time_ymd(2099, 1, 1),
            crl_number: SerialNumber::from_slice(&[1]),
            issuing_distribution_point: None,
            revoked_certs: serials
                .iter()
                .map(|s| RevokedCertParams {
                    serial_number: SerialNumber::from_slice(&[0x10, *s]),
                    revocation_time: rcgen::date_time_ymd(2024, 1, 1),
                    reason_code: Some(RevocationReason::KeyCompromise),
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        };
        std::fs::write(path, params.signed_by(&by.issuer).unwrap().pem().unwrap()).unwrap();
    }

    struct Setup {
        dir: tempfile::TempDir,
        ca: Ca,
        settings: TlsSettings,
    }

    /// A member's client TLS settings: its CA, `--client-cert-auth`, `--trusted-proxy-cn proxy`.
    fn setup() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let ca = ca("member CA");
        std::fs::write(dir.path().join("ca.pem"), &ca.pem).unwrap();
        let settings = TlsSettings {
            cert_file: dir.path().join("unused.pem"),
            key_file: dir.path().join("unused-key.pem"),
            trusted_ca_file: Some(dir.path().join("ca.pem")),
            client_cert_auth: true,
            crl_file: None,
            allowed_cns: Vec::new(),
            allowed_hostnames: Vec::new(),
            trusted_proxy_cns: vec!["proxy".into()],
            identity_source: IdentitySource::CommonName,
            policy: Default::default(),
        };
        Setup { dir, ca, settings }
    }

    /// Tokens "tok-bob" (bob at revision 7); anything else is invalid.
    struct OneToken;

    impl TokenResolver for OneToken {
        fn resolve(&self, token: &str) -> Result<(String, u64), EtcdError> {
            match token {
                "tok-bob" => Ok(("bob".into(), 7)),
                _ => Err(EtcdError::InvalidAuthToken),
            }
        }
    }

    fn proxy() -> PeerIdentity {
        PeerIdentity::Cert { common_name: "proxy".into() }
    }

    fn identify(
        settings: &TlsSettings,
        peer: Option<&PeerIdentity>,
        metadata: &[(&'static str, &str)],
    ) -> Result<Identity, EtcdError> {
        let rules = identity_rules(Some(settings)).unwrap();
        let mut map = MetadataMap::new();
        for (key, value) in metadata {
            map.append(*key, MetadataValue::try_from(*value).unwrap());
        }
        rules.identify(&map, peer, &OneToken)
    }

    fn alice_by(ca: &Ca) -> String {
        forwarded(client_params(&["alice"], 1), ca)
    }

    fn as_alice() -> Identity {
        Identity::Forwarded { proxy_cn: "proxy".into(), common_name: "alice".into() }
    }

    #[test]
    fn a_trusted_proxy_forwarding_a_valid_certificate_acts_as_its_cn() {
        let s = setup();
        let identity = identify(&s.settings, Some(&proxy()), &[(FORWARDED_CERT, &alice_by(&s.ca))]).unwrap();
        assert_eq!(identity, as_alice());
        assert_eq!(identity.requester(42), Requester::client("alice".into(), 42));
    }

    #[test]
    fn forwarded_certificates_from_peers_that_are_not_trusted_proxies_are_refused() {
        let s = setup();
        let alice = alice_by(&s.ca);
        let peers = [
            None,
            Some(PeerIdentity::None(NoIdentity::NoClientCert)),
            Some(PeerIdentity::None(NoIdentity::SeveralCommonNames)),
            Some(PeerIdentity::Cert { common_name: "mallory".into() }),
            Some(PeerIdentity::Cert { common_name: "Proxy".into() }),
        ];
        for peer in &peers {
            let refused = identify(&s.settings, peer.as_ref(), &[(FORWARDED_CERT, &alice)]);
            assert_eq!(refused, Err(EtcdError::NotTrustedProxy), "peer {peer:?}");
            // Even with a valid token: the metadata is refused, not ignored.
            let refused = identify(&s.settings, peer.as_ref(), &[(FORWARDED_CERT, &alice), ("token", "tok-bob")]);
            assert_eq!(refused, Err(EtcdError::NotTrustedProxy), "peer {peer:?} with a token");
        }
        let status = tonic::Status::from(EtcdError::NotTrustedProxy);
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        assert!(status.message().contains("peer is not a trusted proxy"), "{}", status.message());
    }

    #[test]
    fn without_trusted_proxies_no_peer_may_forward() {
        let mut s = setup();
        s.settings.trusted_proxy_cns.clear();
        let refused = identify(&s.settings, Some(&proxy()), &[(FORWARDED_CERT, &alice_by(&s.ca))]);
        assert_eq!(refused, Err(EtcdError::NotTrustedProxy));
    }

    #[track_caller]
    fn assert_refused(result: Result<Identity, EtcdError>, why: &str) {
        match result {
            Err(EtcdError::ForwardedCertRefused(reason)) => assert!(reason.contains(why), "{reason:?} lacks {why:?}"),
            other => panic!("expected a refusal ({why}), got {other:?}"),
        }
    }

    #[test]
    fn a_forwarded_certificate_from_another_ca_is_refused() {
        let s = setup();
        let other = ca("other CA");
        assert_refused(
            identify(&s.settings, Some(&proxy()), &[(FORWARDED_CERT, &alice_by(&other))]),
            "verification failed",
        );
    }

    #[test]
    fn an_expired_forwarded_certificate_is_refused() {
        let s = setup();
        let mut params = client_params(&["alice"], 1);
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        let expired = forwarded(params, &s.ca);
        assert_refused(identify(&s.settings, Some(&proxy()), &[(FORWARDED_CERT, &expired)]), "verification failed");
    }

    #[test]
    fn a_forwarded_certificate_without_client_auth_usage_is_refused() {
        let s = setup();
        let mut params = client_params(&["alice"], 1);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_only = forwarded(params, &s.ca);
        assert_refused(identify(&s.settings, Some(&proxy()), &[(FORWARDED_CERT, &server_only)]), "verification failed");
    }

    #[test]
    fn a_revoked_forwarded_certificate_is_refused_and_others_pass() {
        let mut s = setup();
        let crl_path = s.dir.path().join("crl.pem");
        crl(&s.ca, &[1], &crl_path);
        s.settings.crl_file = Some(crl_path);
        let revoked = alice_by(&s.ca); // serial 1
        assert_refused(identify(&s.settings, Some(&proxy()), &[(FORWARDED_CERT, &revoked)]), "verification failed");
        let bob = forwarded(client_params(&["bob"], 2), &s.ca);
        assert_eq!(
            identify(&s.settings, Some(&proxy()), &[(FORWARDED_CERT, &bob)]),
            Ok(Identity::Forwarded { proxy_cn: "proxy".into(), common_name: "bob".into() })
        );
    }

    #[test]
    fn with_uri_san_identity_a_forwarded_certificate_is_its_one_uri_san() {
        let mut s = setup();
        s.settings.identity_source = IdentitySource::UriSan;
        // The proxy, too, is named by its URI SAN under this rule.
        let proxy_id = "spiffe://example.org/ns/infra/sa/proxy";
        s.settings.trusted_proxy_cns = vec![proxy_id.into()];
        let proxy = PeerIdentity::Cert { common_name: proxy_id.into() };
        let web = "spiffe://example.org/ns/app/sa/web";
        let mut params = client_params(&["alice"], 1);
        params.subject_alt_names = vec![rcgen::SanType::URI(web.try_into().unwrap())];
        assert_eq!(
            identify(&s.settings, Some(&proxy), &[(FORWARDED_CERT, &forwarded(params, &s.ca))]),
            Ok(Identity::Forwarded { proxy_cn: proxy_id.into(), common_name: web.into() })
        );
        // CN alice but no URI SAN: nobody, not alice.
        assert_eq!(
            identify(&s.settings, Some(&proxy), &[(FORWARDED_CERT, &alice_by(&s.ca))]),
            Ok(Identity::Anonymous(Anonymous::Forwarded(NoIdentity::NoSan)))
        );
    }

    /// One set of rules for several requests, as a member keeps them: what a verifier remembers as
    /// passed is used again.
    fn identify_with(rules: &IdentityRules, certificate: &str) -> Result<Identity, EtcdError> {
        let mut map = MetadataMap::new();
        map.append(FORWARDED_CERT, MetadataValue::try_from(certificate).unwrap());
        rules.identify(&map, Some(&proxy()), &OneToken)
    }

    #[test]
    fn a_remembered_certificate_is_forgotten_when_the_crl_changes() {
        let mut s = setup();
        let crl_path = s.dir.path().join("crl.pem");
        crl(&s.ca, &[], &crl_path);
        s.settings.crl_file = Some(crl_path.clone());
        let rules = identity_rules(Some(&s.settings)).unwrap();
        let alice = alice_by(&s.ca); // serial 1
        assert_eq!(identify_with(&rules, &alice), Ok(as_alice()));
        assert_eq!(identify_with(&rules, &alice), Ok(as_alice()), "remembered");
        crl(&s.ca, &[1], &crl_path);
        // The CA and CRL files are looked at every RELOAD_INTERVAL.
        std::thread::sleep(std::time::Duration::from_millis(2200));
        assert_refused(identify_with(&rules, &alice), "verification failed");
    }

    #[test]
    fn a_remembered_certificate_is_not_used_past_its_not_after() {
        let s = setup();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
        let mut params = client_params(&["alice"], 1);
        params.not_before = rcgen::date_time_ymd(2024, 1, 1);
        params.not_after = rcgen::date_time_ymd(1970, 1, 1) + (now + std::time::Duration::from_secs(2));
        let short_lived = forwarded(params, &s.ca);
        let rules = identity_rules(Some(&s.settings)).unwrap();
        assert_eq!(identify_with(&rules, &short_lived), Ok(as_alice()));
        std::thread::sleep(std::time::Duration::from_secs(3));
        assert_refused(identify_with(&rules, &short_lived), "verification failed");
    }

    #[test]
    fn a_forwarded_client_address_counts_only_from_a_trusted_proxy() {
        let s = setup();
        let rules = identity_rules(Some(&s.settings)).unwrap();
        let connection: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let mut map = MetadataMap::new();
        map.insert(FORWARDED_ADDR, MetadataValue::from_static("10.1.2.3:4567"));
        let alice = PeerIdentity::Cert { common_name: "alice".into() };
        assert_eq!(rules.client_addr(&map, Some(&proxy()), Some(connection)), Some("10.1.2.3:4567".parse().unwrap()));
        assert_eq!(rules.client_addr(&map, Some(&alice), Some(connection)), Some(connection), "not a trusted proxy");
        assert_eq!(rules.client_addr(&map, None, Some(connection)), Some(connection), "plain text");
        map.insert(FORWARDED_ADDR, MetadataValue::from_static("not an address"));
        assert_eq!(rules.client_addr(&map, Some(&proxy()), Some(connection)), Some(connection), "malformed");
        assert_eq!(rules.client_addr(&MetadataMap::new(), Some(&proxy()), None), None);
    }

    #[test]
    fn a_forwarded_certificate_with_two_cns_gives_no_identity() {
        let s = setup();
        let two = forwarded(client_params(&["alice", "root"], 1), &s.ca);
        assert_eq!(
            identify(&s.settings, Some(&proxy()), &[(FORWARDED_CERT, &two)]),
            Ok(Identity::Anonymous(Anonymous::Forwarded(NoIdentity::SeveralCommonNames)))
        );
    }

    #[test]
    fn the_allowed_cn_list_applies_to_forwarded_certificates() {
        let mut s = setup();
        s.settings.allowed_cns = vec!["proxy".into(), "bob".into()];
        let alice = alice_by(&s.ca);
        assert_refused(identify(&s.settings, Some(&proxy()), &[(FORWARDED_CERT, &alice)]), "--client-cert-allowed-cn");
        let bob = forwarded(client_params(&["bob"], 2), &s.ca);
        assert!(matches!(
            identify(&s.settings, Some(&proxy()), &[(FORWARDED_CERT, &bob)]),
            Ok(Identity::Forwarded { .. })
        ));
    }

    #[test]
    fn the_allowed_hostname_list_applies_to_forwarded_certificates() {
        let mut s = setup();
        s.settings.allowed_hostnames = vec!["app.example".into()];
        assert_refused(
            identify(&s.settings, Some(&proxy()), &[(FORWARDED_CERT, &alice_by(&s.ca))]),
            "--client-cert-allowed-hostname",
        );
        let mut params = client_params(&["alice"], 1);
        params.subject_alt_names = vec![rcgen::SanType::DnsName("app.example".try_into().unwrap())];
        let named = forwarded(params, &s.ca);
        assert_eq!(identify(&s.settings, Some(&proxy()), &[(FORWARDED_CERT, &named)]), Ok(as_alice()));
    }

    #[test]
    fn malformed_or_repeated_forwarded_metadata_is_refused() {
        let s = setup();
        let alice = alice_by(&s.ca);
        assert_refused(identify(&s.settings, Some(&proxy()), &[(FORWARDED_CERT, "not base64!")]), "base64");
        assert_refused(identify(&s.settings, Some(&proxy()), &[(FORWARDED_CERT, "AAAA")]), "verification failed");
        let bob = forwarded(client_params(&["bob"], 2), &s.ca);
        assert_refused(
            identify(&s.settings, Some(&proxy()), &[(FORWARDED_CERT, &alice), (FORWARDED_CERT, &bob)]),
            "more than one",
        );
    }

    #[test]
    fn a_token_wins_over_a_forwarded_certificate_but_a_bad_one_is_still_refused() {
        let s = setup();
        let token = identify(&s.settings, Some(&proxy()), &[(FORWARDED_CERT, &alice_by(&s.ca)), ("token", "tok-bob")]);
        assert_eq!(token, Ok(Identity::Token { username: "bob".into(), revision: 7 }));
        let other = alice_by(&ca("other CA"));
        assert_refused(
            identify(&s.settings, Some(&proxy()), &[(FORWARDED_CERT, &other), ("token", "tok-bob")]),
            "verification failed",
        );
    }

    #[test]
    fn a_trusted_proxy_forwarding_nothing_acts_as_itself() {
        let s = setup();
        assert_eq!(
            identify(&s.settings, Some(&proxy()), &[]),
            Ok(Identity::Certificate { common_name: "proxy".into() })
        );
    }

    #[test]
    fn etcds_rules_without_forwarding() {
        let mut s = setup();
        let alice = PeerIdentity::Cert { common_name: "alice".into() };
        assert_eq!(
            identify(&s.settings, Some(&alice), &[("token", "tok-bob")]),
            Ok(Identity::Token { username: "bob".into(), revision: 7 })
        );
        assert_eq!(identify(&s.settings, Some(&alice), &[("authorization", "nope")]), Err(EtcdError::InvalidAuthToken));
        assert_eq!(
            identify(&s.settings, None, &[]),
            Ok(Identity::Anonymous(Anonymous::Connection(NoIdentity::PlainText)))
        );
        s.settings.client_cert_auth = false;
        s.settings.trusted_proxy_cns.clear();
        assert_eq!(identify(&s.settings, Some(&alice), &[]), Ok(Identity::Anonymous(Anonymous::CertAuthOff)));
    }
}
