//! What the proxy tells a member about the client behind one connection: the proxy's one auth
//! decision, taken once per connection and applied to every request on it.
//!
//! Every `keyward-` name a client sent is removed, whatever its case or suffix (`-bin`): only the
//! proxy speaks for a client, and only for one whose certificate its own listener verified. Tokens
//! (`token`, `authorization`) are left as they are: the member resolves them. The rules of every name,
//! and the removal of the `keyward-` ones: `identity/metadata.rs`. This rewrites headers only;
//! `forward.rs` drops the request's trailers, which the member would otherwise merge into the
//! metadata.

use base64::Engine as _;
use http::{HeaderMap, HeaderValue};
use rustls_pki_types::CertificateDer;

use super::config::Mode;
use super::error::ProxyError;
use crate::identity::metadata::{remove_keyward_names, FORWARDED_ADDR, FORWARDED_CERT};

/// One client connection: whose identity the proxy passes on, and the client's address (which the
/// member counts failed logins under and records in its audit log).
#[derive(Clone, Debug)]
pub(crate) struct ClientConnection {
    pub identity: ClientIdentity,
    addr: Option<HeaderValue>,
}

impl ClientConnection {
    pub(crate) fn new(identity: ClientIdentity, addr: Option<std::net::SocketAddr>) -> ClientConnection {
        let addr = addr.and_then(|a| HeaderValue::from_str(&a.to_string()).ok());
        ClientConnection { identity, addr }
    }

    /// Rewrites a request's metadata for the member: every `keyward-` name the client sent removed,
    /// then the identity (`ClientIdentity::apply`) and the client's real address set.
    pub(crate) fn apply(&self, headers: &mut HeaderMap) -> Result<(), ProxyError> {
        remove_keyward_names(headers);
        if let Some(addr) = &self.addr {
            headers.insert(FORWARDED_ADDR, addr.clone());
        }
        self.identity.apply(headers)
    }
}

/// The identity the proxy passes on for one client connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ClientIdentity {
    /// Forwarding proxy: the client's verified leaf certificate, DER, standard base64.
    Forward(HeaderValue),
    /// Forwarding proxy, but the connection has no verified certificate (the listener requires one,
    /// so this is a connection that should not exist): refused, never passed on as the proxy.
    Unverified,
    /// Sidecar: nothing is forwarded; the member sees the proxy's own certificate.
    Proxy,
}

impl ClientIdentity {
    /// The identity for a connection whose listener verified `certificate` (or none).
    pub(crate) fn of_connection(mode: Mode, certificate: Option<&CertificateDer<'_>>) -> ClientIdentity {
        match (mode, certificate) {
            (Mode::OwnIdentity, _) => ClientIdentity::Proxy,
            (Mode::ForwardClientCertificates, Some(leaf)) => {
                let encoded = base64::engine::general_purpose::STANDARD.encode(leaf.as_ref());
                match HeaderValue::from_str(&encoded) {
                    Ok(value) => ClientIdentity::Forward(value),
                    // Standard base64 is always a valid header value; fail closed all the same.
                    Err(_) => ClientIdentity::Unverified,
                }
            }
            (Mode::ForwardClientCertificates, None) => ClientIdentity::Unverified,
        }
    }

    /// Rewrites a request's metadata for the member: removes whatever forwarded certificate the
    /// client sent, then sets this connection's, if it forwards one.
    pub(crate) fn apply(&self, headers: &mut HeaderMap) -> Result<(), ProxyError> {
        headers.remove(FORWARDED_CERT);
        match self {
            ClientIdentity::Forward(certificate) => {
                headers.insert(FORWARDED_CERT, certificate.clone());
                Ok(())
            }
            ClientIdentity::Unverified => Err(ProxyError::NoClientCertificate),
            ClientIdentity::Proxy => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forged(headers: &mut HeaderMap) {
        headers.append(FORWARDED_CERT, HeaderValue::from_static("Zm9yZ2VkIGFsaWNl"));
        headers.append(FORWARDED_CERT, HeaderValue::from_static("c2Vjb25kIGZvcmdlcnk="));
        headers.insert("token", HeaderValue::from_static("tok-bob"));
    }

    #[test]
    fn a_forwarding_proxy_replaces_what_the_client_sent_with_its_verified_certificate() {
        let leaf = CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01, 0x07]);
        let client = ClientIdentity::of_connection(Mode::ForwardClientCertificates, Some(&leaf));
        let mut headers = HeaderMap::new();
        forged(&mut headers);
        client.apply(&mut headers).unwrap();
        let values: Vec<_> = headers.get_all(FORWARDED_CERT).iter().collect();
        assert_eq!(values, [&HeaderValue::from_static("MAMCAQc=")], "exactly the verified leaf, DER in base64");
        assert_eq!(headers.get("token").unwrap(), "tok-bob", "tokens pass through");
    }

    #[test]
    fn a_sidecar_forwards_nothing_and_drops_what_the_client_sent() {
        let leaf = CertificateDer::from(vec![0x30, 0x00]);
        for certificate in [None, Some(&leaf)] {
            let client = ClientIdentity::of_connection(Mode::OwnIdentity, certificate);
            assert_eq!(client, ClientIdentity::Proxy);
            let mut headers = HeaderMap::new();
            forged(&mut headers);
            client.apply(&mut headers).unwrap();
            assert!(headers.get(FORWARDED_CERT).is_none());
            assert_eq!(headers.get("token").unwrap(), "tok-bob");
        }
    }

    #[test]
    fn the_clients_address_replaces_any_the_client_sent() {
        let connection = ClientConnection::new(ClientIdentity::Proxy, Some("10.1.2.3:4567".parse().unwrap()));
        let mut headers = HeaderMap::new();
        headers.insert(FORWARDED_ADDR, HeaderValue::from_static("192.0.2.1:1"));
        connection.apply(&mut headers).unwrap();
        let values: Vec<_> = headers.get_all(FORWARDED_ADDR).iter().collect();
        assert_eq!(values, [&HeaderValue::from_static("10.1.2.3:4567")]);
        let unknown = ClientConnection::new(ClientIdentity::Proxy, None);
        headers.insert(FORWARDED_ADDR, HeaderValue::from_static("192.0.2.1:1"));
        unknown.apply(&mut headers).unwrap();
        assert!(headers.get(FORWARDED_ADDR).is_none(), "a Unix socket client has no address to pass on");
    }

    #[test]
    fn every_keyward_name_a_client_sent_is_removed() {
        let connection = ClientConnection::new(ClientIdentity::Proxy, None);
        let mut headers = HeaderMap::new();
        for name in ["keyward-forwarded-client-cert-bin", "keyward-cluster-id", "keyward-member-id", "keyward-anything"]
        {
            headers.append(name, HeaderValue::from_static("x"));
        }
        headers.append(
            http::HeaderName::from_bytes(b"Keyward-Forwarded-Client-Addr").unwrap(),
            HeaderValue::from_static("x"),
        );
        forged(&mut headers);
        connection.apply(&mut headers).unwrap();
        let left: Vec<&str> = headers.keys().map(|n| n.as_str()).collect();
        assert_eq!(left, ["token"]);
    }

    #[test]
    fn a_forwarding_proxy_without_a_verified_certificate_refuses_rather_than_act_as_itself() {
        let client = ClientIdentity::of_connection(Mode::ForwardClientCertificates, None);
        let mut headers = HeaderMap::new();
        forged(&mut headers);
        assert!(matches!(client.apply(&mut headers), Err(ProxyError::NoClientCertificate)));
    }
}
