//! What a listener knows about the connection a request came on, read from the request's extensions
//! (tonic attaches its `Connected::ConnectInfo` to every request: `TcpConnectInfo` on a plain-text
//! listener, `TlsConnectInfo` on a TLS one; the HTTP gateway passes the extensions on unchanged).

use std::net::SocketAddr;

use http::Extensions;
use tonic::transport::server::TcpConnectInfo;

use super::tls::listener::TlsConnectInfo;
use crate::identity::certificate::PeerIdentity;

/// The identity the connection's client certificate established (`None`: not a TLS connection).
pub(crate) fn peer_identity(extensions: &Extensions) -> Option<&PeerIdentity> {
    extensions.get::<TlsConnectInfo>().map(|info| &info.identity)
}

/// The client's address, if the listener knows it.
pub(crate) fn client_addr(extensions: &Extensions) -> Option<SocketAddr> {
    match extensions.get::<TlsConnectInfo>() {
        Some(info) => info.remote_addr,
        None => extensions.get::<TcpConnectInfo>().and_then(TcpConnectInfo::remote_addr),
    }
}
