//! Who is a member on the peer port: the rule every peer request is held to (`peer_guard.rs`
//! applies it to each request, before any Peer RPC runs).
//!
//! A caller on a TLS connection is a member when its verified certificate (chained to
//! `--peer-trusted-ca-file` at the handshake) is a server certificate (extended key usage serverAuth:
//! a member's peer certificate also serves its own peer port, so a user's client certificate never
//! passes, even when one CA signs both) and names a member:
//! - with `--peer-cert-allowed-cn`: its Common Name is listed (etcd's rule, exact match);
//! - with `--peer-cert-allowed-hostname`: it names a listed host (Go's `VerifyHostname`);
//! - otherwise: it names the host of another member's peer URL, from the current membership (or
//!   from `--initial-cluster` while this member does not know the membership yet: a joining member).
//!
//! A plain-text connection proves nothing; it is admitted only where the operator allowed plain text
//! (loopback, or `--peer-allow-plaintext`) and only while there is another member to be: a single
//! member's peer port serves no one.

/// The peer flags the rule reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PeerAdmission {
    /// `--peer-cert-allowed-cn`.
    pub allowed_cns: Vec<String>,
    /// `--peer-cert-allowed-hostname`.
    pub allowed_hostnames: Vec<String>,
    /// The peer URLs of the other members named in `--initial-cluster`.
    pub initial_peers: Vec<String>,
}

/// How a peer request arrived.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Caller<'a> {
    PlainText,
    /// A TLS connection, with the names of the client certificate it verified (if any).
    Tls(Option<&'a crate::identity::certificate::CertNames>),
}

/// Why a peer request was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    #[error("no client certificate")]
    NoCertificate,
    #[error("the certificate is not a server certificate (no serverAuth extended key usage): a client certificate is no member's")]
    NotServerCertificate,
    #[error("the certificate's common name is not in --peer-cert-allowed-cn")]
    CommonNameNotAllowed,
    #[error("the certificate names no host in --peer-cert-allowed-hostname")]
    HostnameNotAllowed,
    #[error("the certificate names no other member's peer URL host")]
    NamesNoMember,
    #[error("plain-text peer request, and this member has no other member to hear from")]
    NoOtherMember,
}

impl Refusal {
    /// A short label for metrics and rate-limited logs.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Refusal::NoCertificate => "no_certificate",
            Refusal::NotServerCertificate => "not_server_certificate",
            Refusal::CommonNameNotAllowed => "cn_not_allowed",
            Refusal::HostnameNotAllowed => "hostname_not_allowed",
            Refusal::NamesNoMember => "names_no_member",
            Refusal::NoOtherMember => "no_other_member",
        }
    }
}

impl PeerAdmission {
    /// The rule the member's flags set.
    pub(crate) fn of(config: &crate::config::Config) -> PeerAdmission {
        PeerAdmission::new(
            config.peer_cert_allowed_cn.clone(),
            config.peer_cert_allowed_hostname.clone(),
            &config.name,
            &config.initial_cluster,
        )
    }

    /// The rule for member `name` of `initial_cluster` (name, peer URLs): its own URLs name no
    /// *other* member.
    pub(crate) fn new(
        allowed_cns: Vec<String>,
        allowed_hostnames: Vec<String>,
        name: &str,
        initial_cluster: &[(String, Vec<String>)],
    ) -> PeerAdmission {
        let initial_peers =
            initial_cluster.iter().filter(|(member, _)| member != name).flat_map(|(_, urls)| urls.clone()).collect();
        PeerAdmission { allowed_cns, allowed_hostnames, initial_peers }
    }

    /// Admits `caller` or says why not. `other_members` answers whether any peer URL of a member
    /// other than this one (or of `initial_peers` before the membership is known, which the caller
    /// of this function decides) satisfies its predicate.
    pub(crate) fn admit(
        &self,
        caller: Caller<'_>,
        other_members: impl FnOnce(&mut dyn FnMut(&str) -> bool) -> bool,
    ) -> Result<(), Refusal> {
        let names = match caller {
            Caller::PlainText => {
                return match other_members(&mut |_| true) {
                    true => Ok(()),
                    false => Err(Refusal::NoOtherMember),
                }
            }
            Caller::Tls(None) => return Err(Refusal::NoCertificate),
            Caller::Tls(Some(names)) => names,
        };
        if !names.server_auth {
            return Err(Refusal::NotServerCertificate);
        }
        if !self.allowed_cns.is_empty() {
            let identity = crate::identity::certificate::PeerIdentity::from_names(names);
            return match identity.common_name().is_some_and(|cn| self.allowed_cns.iter().any(|a| a == cn)) {
                true => Ok(()),
                false => Err(Refusal::CommonNameNotAllowed),
            };
        }
        if !self.allowed_hostnames.is_empty() {
            return match self.allowed_hostnames.iter().any(|host| names.names_host(host)) {
                true => Ok(()),
                false => Err(Refusal::HostnameNotAllowed),
            };
        }
        match other_members(&mut |url| url_host(url).is_some_and(|host| names.names_host(host))) {
            true => Ok(()),
            false => Err(Refusal::NamesNoMember),
        }
    }
}

/// The host of a `scheme://host:port[/...]` peer URL (an IPv6 host keeps its brackets).
pub(crate) fn url_host(url: &str) -> Option<&str> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or(rest);
    let host = match authority.rsplit_once(':') {
        Some((host, port)) if !port.contains(']') => host,
        _ => authority,
    };
    (!host.is_empty()).then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::certificate::CertNames;

    fn names(cn: &str, dns: &[&str], ips: &[&str], server_auth: bool) -> CertNames {
        CertNames {
            common_names: vec![Some(cn.to_string())],
            dns_sans: dns.iter().map(|s| s.to_string()).collect(),
            ip_sans: ips.iter().map(|s| s.parse().unwrap()).collect(),
            server_auth,
            ..CertNames::default()
        }
    }

    /// The other members' peer URLs, as the guard hands them over.
    fn others<'a>(urls: &'a [&'a str]) -> impl FnOnce(&mut dyn FnMut(&str) -> bool) -> bool + 'a {
        move |f| urls.iter().any(|u| f(u))
    }

    const MEMBERS: &[&str] = &["https://10.0.0.2:2380", "https://member3.example.test:2380"];

    #[test]
    fn a_server_certificate_naming_another_members_host_is_a_member() {
        let rule = PeerAdmission::default();
        let by_ip = names("member2", &[], &["10.0.0.2"], true);
        let by_name = names("member3", &["*.example.test"], &[], true);
        assert_eq!(rule.admit(Caller::Tls(Some(&by_ip)), others(MEMBERS)), Ok(()));
        assert_eq!(rule.admit(Caller::Tls(Some(&by_name)), others(MEMBERS)), Ok(()));
    }

    #[test]
    fn client_certificates_and_strangers_are_no_members() {
        let rule = PeerAdmission::default();
        let alice = names("alice", &[], &[], false);
        let alice_at_a_member = names("alice", &[], &["10.0.0.2"], false);
        let proxy = names("keyward-proxy", &["keyward-proxy"], &["127.0.0.1"], true);
        assert_eq!(rule.admit(Caller::Tls(Some(&alice)), others(MEMBERS)), Err(Refusal::NotServerCertificate));
        assert_eq!(
            rule.admit(Caller::Tls(Some(&alice_at_a_member)), others(MEMBERS)),
            Err(Refusal::NotServerCertificate)
        );
        assert_eq!(rule.admit(Caller::Tls(Some(&proxy)), others(MEMBERS)), Err(Refusal::NamesNoMember));
        assert_eq!(rule.admit(Caller::Tls(None), others(MEMBERS)), Err(Refusal::NoCertificate));
        // A member's certificate names no one when this member is alone.
        let member = names("member2", &[], &["10.0.0.2"], true);
        assert_eq!(rule.admit(Caller::Tls(Some(&member)), others(&[])), Err(Refusal::NamesNoMember));
    }

    #[test]
    fn allow_lists_replace_the_membership_rule_and_still_want_a_server_certificate() {
        let by_cn = PeerAdmission { allowed_cns: vec!["ops".into()], ..Default::default() };
        let ops = names("ops", &[], &[], true);
        let member = names("member2", &[], &["10.0.0.2"], true);
        assert_eq!(by_cn.admit(Caller::Tls(Some(&ops)), others(&[])), Ok(()));
        assert_eq!(by_cn.admit(Caller::Tls(Some(&member)), others(MEMBERS)), Err(Refusal::CommonNameNotAllowed));
        let ops_client = names("ops", &[], &[], false);
        assert_eq!(by_cn.admit(Caller::Tls(Some(&ops_client)), others(MEMBERS)), Err(Refusal::NotServerCertificate));

        let by_host = PeerAdmission { allowed_hostnames: vec!["peer.example.test".into()], ..Default::default() };
        let named = names("x", &["*.example.test"], &[], true);
        assert_eq!(by_host.admit(Caller::Tls(Some(&named)), others(&[])), Ok(()));
        assert_eq!(by_host.admit(Caller::Tls(Some(&member)), others(MEMBERS)), Err(Refusal::HostnameNotAllowed));
    }

    #[test]
    fn plain_text_is_admitted_only_when_there_is_another_member() {
        let rule = PeerAdmission::default();
        assert_eq!(rule.admit(Caller::PlainText, others(MEMBERS)), Ok(()));
        assert_eq!(rule.admit(Caller::PlainText, others(&[])), Err(Refusal::NoOtherMember));
    }

    #[test]
    fn the_initial_peers_are_the_other_members_urls() {
        let cluster = [
            ("a".to_string(), vec!["http://127.0.0.1:1".to_string()]),
            ("b".to_string(), vec!["http://127.0.0.1:2".to_string(), "http://127.0.0.1:3".to_string()]),
        ];
        let rule = PeerAdmission::new(Vec::new(), Vec::new(), "b", &cluster);
        assert_eq!(rule.initial_peers, ["http://127.0.0.1:1"]);
    }

    #[test]
    fn url_hosts() {
        assert_eq!(url_host("https://10.0.0.1:2380"), Some("10.0.0.1"));
        assert_eq!(url_host("https://[::1]:2380"), Some("[::1]"));
        assert_eq!(url_host("http://member1:2380/"), Some("member1"));
        assert_eq!(url_host("https://member1"), Some("member1"));
        assert_eq!(url_host("https://:2380"), None);
    }
}
