//! Which TLS versions and cipher suites a listener (or a member dialing its peers) accepts: etcd's
//! `--tls-min-version`, `--tls-max-version` (etcd 3.4.25+/3.5) and `--cipher-suites`, with etcd's value
//! spellings and its checks at start.
//!
//! - Versions are `TLS1.2` or `TLS1.3` (etcd's only values; rustls has no older ones); empty is the
//!   default, both. A minimum above the maximum is refused, and so are cipher suites with TLS 1.3
//!   only (Go cannot configure TLS 1.3 suites; etcd refuses the combination).
//! - Cipher suites are Go's names (`crypto/tls`), in order of preference, and apply to TLS 1.2, as in
//!   Go: TLS 1.3 names are accepted and change nothing, TLS 1.3 always offers all of its suites. A
//!   name Go does not know is refused as etcd refuses it (`unexpected TLS cipher suite "X"`); a suite
//!   Go has but rustls does not (CBC, RC4, 3DES, RSA key exchange, all refused by rustls as unsafe) is
//!   refused with the list keyward offers, never silently dropped.

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::{CipherSuite, SupportedCipherSuite, SupportedProtocolVersion};

/// The TLS versions and TLS 1.2 cipher suites allowed; the default allows everything rustls offers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsPolicy {
    min: Option<TlsVersion>,
    max: Option<TlsVersion>,
    /// TLS 1.2 suites in order of preference; empty: rustls' defaults.
    cipher_suites: Vec<CipherSuite>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum TlsVersion {
    Tls12,
    Tls13,
}

impl TlsPolicy {
    /// From the flags' values (`""`: not given), checked as etcd checks them.
    pub fn from_flags(min: &str, max: &str, cipher_suites: &[String]) -> Result<TlsPolicy, String> {
        let (min_version, max_version) = (version(min)?, version(max)?);
        if let (Some(low), Some(high)) = (min_version, max_version) {
            if low > high {
                return Err(format!("min version ({min}) is greater than max version ({max})"));
            }
        }
        let names: Vec<&str> = cipher_suites.iter().map(|s| s.trim()).filter(|s| !s.is_empty()).collect();
        if min_version == Some(TlsVersion::Tls13) && !names.is_empty() {
            return Err("cipher suites cannot be configured when only TLS1.3 is enabled".into());
        }
        let mut suites = Vec::new();
        for name in names {
            if let Some(suite) = tls12_suite(name)? {
                suites.push(suite);
            }
        }
        Ok(TlsPolicy { min: min_version, max: max_version, cipher_suites: suites })
    }

    /// rustls' ring provider with only the allowed TLS 1.2 suites, in the given order (TLS 1.3 suites
    /// are all kept).
    pub fn provider(&self) -> Arc<CryptoProvider> {
        let mut provider = rustls::crypto::ring::default_provider();
        if !self.cipher_suites.is_empty() {
            let offered = std::mem::take(&mut provider.cipher_suites);
            let tls13 = offered.iter().filter(|s| s.tls13().is_some()).copied();
            let tls12 =
                self.cipher_suites.iter().filter_map(|wanted| offered.iter().find(|s| s.suite() == *wanted).copied());
            provider.cipher_suites = tls13.chain(tls12).collect();
        }
        Arc::new(provider)
    }

    /// The protocol versions allowed, for rustls' builder.
    pub fn versions(&self) -> Vec<&'static SupportedProtocolVersion> {
        let allowed = |v: TlsVersion| self.min.is_none_or(|min| v >= min) && self.max.is_none_or(|max| v <= max);
        let mut versions = Vec::new();
        if allowed(TlsVersion::Tls13) {
            versions.push(&rustls::version::TLS13);
        }
        if allowed(TlsVersion::Tls12) {
            versions.push(&rustls::version::TLS12);
        }
        versions
    }
}

/// etcd's `tlsutil.GetTLSVersion`.
fn version(value: &str) -> Result<Option<TlsVersion>, String> {
    match value {
        "" => Ok(None),
        "TLS1.2" => Ok(Some(TlsVersion::Tls12)),
        "TLS1.3" => Ok(Some(TlsVersion::Tls13)),
        other => Err(format!("unexpected TLS version {other:?} (must be one of: TLS1.2, TLS1.3)")),
    }
}

/// The TLS 1.2 suite Go names `name`; `None` for a TLS 1.3 suite (nothing to configure).
fn tls12_suite(name: &str) -> Result<Option<CipherSuite>, String> {
    // Go's two names without the hash (etcd's `tlsutil.GetCipherSuite` accepts them).
    let name = match name {
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305" => "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305" => "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        name => name,
    };
    if GO_TLS13_SUITES.contains(&name) {
        return Ok(None);
    }
    let offered = rustls::crypto::ring::DEFAULT_CIPHER_SUITES;
    if let Some(suite) = offered.iter().filter(|s| s.tls13().is_none()).find(|s| s.suite().as_str() == Some(name)) {
        return Ok(Some(suite.suite()));
    }
    if GO_TLS12_SUITES.contains(&name) {
        return Err(format!(
            "TLS cipher suite {name:?} is not supported by keyward (rustls refuses it as unsafe); it offers {}",
            offered_tls12(offered).join(", ")
        ));
    }
    Err(format!("unexpected TLS cipher suite {name:?}"))
}

fn offered_tls12(offered: &[SupportedCipherSuite]) -> Vec<&'static str> {
    offered.iter().filter(|s| s.tls13().is_none()).filter_map(|s| s.suite().as_str()).collect()
}

/// Go's TLS 1.3 suites (`tls.CipherSuites()`): accepted, nothing to configure.
const GO_TLS13_SUITES: &[&str] = &["TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"];

/// Go's other suite names (`tls.CipherSuites()` and `tls.InsecureCipherSuites()`): a name here that
/// rustls lacks is a real suite keyward cannot offer, not a typo.
const GO_TLS12_SUITES: &[&str] = &[
    "TLS_RSA_WITH_RC4_128_SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn suites(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn versions_are_etcds_spellings_and_bad_ones_are_refused_as_etcd_does() {
        assert_eq!(TlsPolicy::from_flags("", "", &[]).unwrap().versions().len(), 2);
        let only13 = TlsPolicy::from_flags("TLS1.3", "", &[]).unwrap();
        assert_eq!(only13.versions(), [&rustls::version::TLS13]);
        let only12 = TlsPolicy::from_flags("", "TLS1.2", &[]).unwrap();
        assert_eq!(only12.versions(), [&rustls::version::TLS12]);
        assert_eq!(
            TlsPolicy::from_flags("TLS1.1", "", &[]).unwrap_err(),
            r#"unexpected TLS version "TLS1.1" (must be one of: TLS1.2, TLS1.3)"#
        );
        assert_eq!(
            TlsPolicy::from_flags("", "tls1.3", &[]).unwrap_err(),
            r#"unexpected TLS version "tls1.3" (must be one of: TLS1.2, TLS1.3)"#
        );
        assert_eq!(
            TlsPolicy::from_flags("TLS1.3", "TLS1.2", &[]).unwrap_err(),
            "min version (TLS1.3) is greater than max version (TLS1.2)"
        );
        assert_eq!(
            TlsPolicy::from_flags("TLS1.3", "", &suites(&["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"])).unwrap_err(),
            "cipher suites cannot be configured when only TLS1.3 is enabled"
        );
    }

    #[test]
    fn cipher_suites_keep_their_order_and_every_tls13_suite() {
        let policy = TlsPolicy::from_flags(
            "",
            "",
            &suites(&[
                "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
                "TLS_AES_128_GCM_SHA256",
                "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
            ]),
        )
        .unwrap();
        let provider = policy.provider();
        let names: Vec<&str> = provider.cipher_suites.iter().filter_map(|s| s.suite().as_str()).collect();
        assert_eq!(
            names,
            [
                "TLS13_AES_256_GCM_SHA384",
                "TLS13_AES_128_GCM_SHA256",
                "TLS13_CHACHA20_POLY1305_SHA256",
                "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
                "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
            ]
        );
    }

    #[test]
    fn unknown_and_unsupported_suites_are_refused() {
        assert_eq!(
            TlsPolicy::from_flags("", "", &suites(&["FOO"])).unwrap_err(),
            r#"unexpected TLS cipher suite "FOO""#
        );
        let cbc = TlsPolicy::from_flags("", "", &suites(&["TLS_RSA_WITH_AES_128_CBC_SHA"])).unwrap_err();
        assert!(
            cbc.starts_with(r#"TLS cipher suite "TLS_RSA_WITH_AES_128_CBC_SHA" is not supported by keyward"#),
            "{cbc}"
        );
    }
}
