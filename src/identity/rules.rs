//! Who is calling: decided once per request, in this one place, for every front end (the member's
//! gRPC services, also when the HTTP gateway calls them in process; the proxy calls the same
//! `IdentityRules::identify`).
//!
//! The inputs are the request's metadata — its headers only: every listener drops request trailers
//! before tonic would merge them in (`frontend/request_trailers.rs`; the rules of each name:
//! `metadata.rs`) — (a token: `token` from etcd 3.4 clients, `authorization` from newer ones; a
//! certificate forwarded by a trusted proxy) and the connection's `PeerIdentity`, set at the TLS
//! handshake. The output is an `Identity`, which becomes the `Requester` that the raft entry header
//! and the read-path checks are built from. Nothing deeper in the stack looks at metadata or
//! certificates.
//!
//! The rules are plain: what resolves a token (`TokenResolver`: the member's token store) and what
//! verifies a forwarded certificate (`ForwardedCertificates`: the TLS front end's verifier,
//! `frontend/forwarded.rs`) are handed in, so this imports neither `auth` nor the TLS stack. The
//! rules a listener's TLS flags set are built in `frontend/identity_rules.rs`.

use std::net::SocketAddr;

use tonic::metadata::MetadataMap;

use super::certificate::{CertNames, IdentitySource, NoIdentity, PeerIdentity};
use super::metadata::{AUTHORIZATION, FORWARDED_ADDR, FORWARDED_CERT, TOKEN};
use super::requester::{Credential, Requester};
use crate::error::EtcdError;

/// Who a request comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Identity {
    /// A token from Authenticate (a password): the user, at the auth revision it was issued at.
    Token { username: String, revision: u64 },
    /// The connection's own verified client certificate (with `--client-cert-auth`).
    Certificate { common_name: String },
    /// A client certificate forwarded by the trusted proxy `proxy_cn` and verified here.
    Forwarded { proxy_cn: String, common_name: String },
    /// Nobody, and why.
    Anonymous(Anonymous),
}

/// Why a request has no identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Anonymous {
    /// `--client-cert-auth` is off: a certificate's CN names no user (as in etcd).
    CertAuthOff,
    /// The connection's certificate (or its absence) names no user.
    Connection(NoIdentity),
    /// The forwarded certificate is valid but names no user (no CN, several CNs, an unreadable one).
    Forwarded(NoIdentity),
}

impl Anonymous {
    /// A verified client certificate was presented (directly or forwarded) but names no user.
    pub(crate) fn is_nameless_certificate(&self) -> bool {
        match self {
            Anonymous::CertAuthOff => false,
            Anonymous::Connection(why) | Anonymous::Forwarded(why) => {
                !matches!(why, NoIdentity::PlainText | NoIdentity::NoClientCert)
            }
        }
    }
}

impl Identity {
    /// The requester this identity runs as. A certificate names a user at the current auth
    /// revision; a token, at the revision it was issued at (the checks void it if its user's
    /// credentials changed since). A verified certificate that names nobody is, as in etcd 3.4, the
    /// user "" at the current revision: refused with "permission denied" (etcd looks that user up
    /// and finds none), where a request with no credentials at all gets "user name is empty".
    pub(crate) fn requester(&self, current_auth_revision: u64) -> Requester {
        match self {
            Identity::Token { username, revision } => Requester::client(username.clone(), *revision),
            Identity::Certificate { common_name } | Identity::Forwarded { common_name, .. } => {
                Requester::client(common_name.clone(), current_auth_revision)
            }
            Identity::Anonymous(why) if why.is_nameless_certificate() => {
                Requester::client(String::new(), current_auth_revision)
            }
            Identity::Anonymous(_) => Requester::anonymous(),
        }
    }

    /// How the client identified itself, for the audit log.
    pub(crate) fn credential(&self) -> Credential {
        match self {
            Identity::Token { .. } => Credential::Token,
            Identity::Certificate { .. } => Credential::Certificate,
            Identity::Forwarded { .. } => Credential::ForwardedCertificate,
            Identity::Anonymous(_) => Credential::None,
        }
    }
}

/// What a token stands for: the user and the auth revision it was issued at. The member resolves
/// its own tokens (`auth/tokens.rs`); a front end without a token store would pass tokens through
/// instead.
pub(crate) trait TokenResolver {
    fn resolve(&self, token: &str) -> Result<(String, u64), EtcdError>;
}

/// Checks a client certificate forwarded by a trusted proxy with every rule a certificate presented
/// at the handshake is held to (`frontend/forwarded.rs`).
pub(crate) trait ForwardedCertificates: Send + Sync {
    /// Decodes and verifies a forwarded certificate (the `FORWARDED_CERT` value: the leaf, DER,
    /// standard base64); its names if every check passes, else why not.
    fn verify(&self, base64_der: &[u8]) -> Result<CertNames, String>;
}

/// The rules a listener's flags set: `--client-cert-auth`, `--trusted-proxy-cn` and the verifier a
/// forwarded certificate is checked with (`--trusted-ca-file`, `--client-crl-file`, allow-lists).
pub(crate) struct IdentityRules {
    client_cert_auth: bool,
    trusted_proxy_cns: Vec<String>,
    forwarded: Option<Box<dyn ForwardedCertificates>>,
    /// `--client-cert-identity`, applied to a forwarded certificate as the listener applies it to
    /// the connection's own.
    identity_source: IdentitySource,
}

impl IdentityRules {
    /// The rules of a listener without TLS: no certificate ever names a user.
    pub(crate) fn plain_text() -> IdentityRules {
        IdentityRules {
            client_cert_auth: false,
            trusted_proxy_cns: Vec::new(),
            forwarded: None,
            identity_source: IdentitySource::default(),
        }
    }

    /// The rules of a TLS listener (`frontend/identity_rules.rs` reads them from its flags):
    /// `--client-cert-auth`, `--trusted-proxy-cn`, `--client-cert-identity`, and the verifier of
    /// forwarded certificates (`None`: none is accepted).
    pub(crate) fn new(
        client_cert_auth: bool,
        trusted_proxy_cns: Vec<String>,
        identity_source: IdentitySource,
        forwarded: Option<Box<dyn ForwardedCertificates>>,
    ) -> IdentityRules {
        IdentityRules { client_cert_auth, trusted_proxy_cns, forwarded, identity_source }
    }

    /// Whether the connection's verified certificate is a `--trusted-proxy-cn` one.
    pub(crate) fn is_trusted_proxy(&self, peer: Option<&PeerIdentity>) -> bool {
        matches!(peer, Some(PeerIdentity::Cert { common_name }) if self.trusted_proxy_cns.contains(common_name))
    }

    /// The client's address: the connection's, or on a connection from a trusted proxy the address
    /// it forwarded for its client (`FORWARDED_ADDR`). From anyone else that metadata is ignored: a
    /// client must not choose the address its failed logins are counted under.
    pub(crate) fn client_addr(
        &self,
        metadata: &MetadataMap,
        peer: Option<&PeerIdentity>,
        connection: Option<SocketAddr>,
    ) -> Option<SocketAddr> {
        let forwarded = || metadata.get(FORWARDED_ADDR)?.to_str().ok()?.parse().ok();
        match self.is_trusted_proxy(peer) {
            true => forwarded().or(connection),
            false => connection,
        }
    }

    /// The identity behind a request, in etcd's order: a token wins; then a certificate forwarded by
    /// a trusted proxy; then, with `--client-cert-auth`, the connection's certificate; otherwise
    /// nobody. `peer` is `None` on a plain-text connection.
    ///
    /// Refused, never downgraded to anonymous: a token that does not resolve (etcd's "invalid auth
    /// token"); forwarded-certificate metadata from a peer that is not a trusted proxy, or a
    /// forwarded certificate that fails verification — even when a token is sent too.
    pub(crate) fn identify(
        &self,
        metadata: &MetadataMap,
        peer: Option<&PeerIdentity>,
        tokens: &impl TokenResolver,
    ) -> Result<Identity, EtcdError> {
        let forwarded = self.forwarded(metadata, peer)?;
        if let Some(token) = metadata.get(TOKEN).or_else(|| metadata.get(AUTHORIZATION)) {
            let token = token.to_str().map_err(|_| EtcdError::InvalidAuthToken)?;
            let (username, revision) = tokens.resolve(token)?;
            return Ok(Identity::Token { username, revision });
        }
        if let Some(forwarded) = forwarded {
            return Ok(forwarded);
        }
        if !self.client_cert_auth {
            return Ok(Identity::Anonymous(Anonymous::CertAuthOff));
        }
        Ok(match peer {
            Some(PeerIdentity::Cert { common_name }) => Identity::Certificate { common_name: common_name.clone() },
            Some(PeerIdentity::None(why)) => Identity::Anonymous(Anonymous::Connection(*why)),
            None => Identity::Anonymous(Anonymous::Connection(NoIdentity::PlainText)),
        })
    }

    /// The identity a forwarded certificate gives, if the request carries one: only from a peer
    /// whose own verified certificate's CN is in `--trusted-proxy-cn`, and only once the forwarded
    /// certificate passes every check a handshake certificate passes.
    fn forwarded(&self, metadata: &MetadataMap, peer: Option<&PeerIdentity>) -> Result<Option<Identity>, EtcdError> {
        let mut values = metadata.get_all(FORWARDED_CERT).iter();
        let Some(value) = values.next() else { return Ok(None) };
        let proxy_cn = match peer {
            Some(PeerIdentity::Cert { common_name }) if self.trusted_proxy_cns.contains(common_name) => common_name,
            _ => {
                tracing::debug!(peer = ?peer, "{FORWARDED_CERT} from a peer that is not a trusted proxy");
                return Err(EtcdError::NotTrustedProxy);
            }
        };
        // Configuration makes a trusted proxy imply a verifier (`--trusted-proxy-cn` needs
        // `--trusted-ca-file`); without one nothing could be verified, so nothing is accepted.
        let Some(verifier) = &self.forwarded else { return Err(EtcdError::NotTrustedProxy) };
        if values.next().is_some() {
            return Err(EtcdError::ForwardedCertRefused("more than one certificate".into()));
        }
        let names = verifier.verify(value.as_encoded_bytes()).map_err(|why| {
            tracing::debug!(proxy = %proxy_cn, reason = %why, "forwarded client certificate refused");
            EtcdError::ForwardedCertRefused(why)
        })?;
        Ok(Some(match self.identity_source.identify(&names) {
            PeerIdentity::Cert { common_name } => Identity::Forwarded { proxy_cn: proxy_cn.clone(), common_name },
            PeerIdentity::None(why) => Identity::Anonymous(Anonymous::Forwarded(why)),
        }))
    }
}
