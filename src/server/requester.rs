//! The member's one call into `identity/`: who is behind a gRPC request, from its metadata and what
//! the connection's TLS proved (`frontend/connection.rs`).

use tonic::{Request, Status};

use crate::auth::throttle::Source;
use crate::frontend::connection::{client_addr, peer_identity};
use crate::identity::{Identity, Origin, Requester};
use crate::node::Node;

/// The requester behind a request to this member: its identity (decided in `identity/rules.rs`,
/// as every front end decides it) at the member's current auth revision.
pub(crate) fn requester<T>(node: &Node, request: &Request<T>) -> Result<Requester, Status> {
    Ok(identified(node, request)?.1)
}

/// The identity behind a request and the requester it runs as (`requester`), for a caller that must
/// know how the identity was established (a stream's credential: `stream_credential.rs`).
pub(crate) fn identified<T>(node: &Node, request: &Request<T>) -> Result<(Identity, Requester), Status> {
    let identity = node.identity.identify(request.metadata(), peer_identity(request.extensions()), &*node.tokens)?;
    let origin = Origin { client: client(node, request), credential: identity.credential() };
    let requester = identity.requester(node.auth_revision()).with_origin(origin);
    Ok((identity, requester))
}

/// The client's address as this member counts it (login throttling, the audit log): the connection's,
/// or the one a trusted proxy forwarded.
pub(crate) fn client<T>(node: &Node, request: &Request<T>) -> Option<std::net::SocketAddr> {
    let extensions = request.extensions();
    node.identity.client_addr(request.metadata(), peer_identity(extensions), client_addr(extensions))
}

/// Who a login attempt is counted under (`auth/throttle.rs`): the identity of a client certificate
/// the client proved (its own, or one a trusted proxy forwarded), else its address. A token sent
/// along plays no part, and a trusted proxy's own certificate stands for the clients behind it, so
/// their forwarded address counts.
pub(crate) fn login_source<T>(node: &Node, request: &Request<T>) -> Source {
    let peer = peer_identity(request.extensions());
    let mut metadata = request.metadata().clone();
    metadata.remove("token");
    metadata.remove("authorization");
    match node.identity.identify(&metadata, peer, &*node.tokens) {
        Ok(Identity::Forwarded { common_name, .. }) => Source::Certificate(common_name),
        Ok(Identity::Certificate { common_name }) if !node.identity.is_trusted_proxy(peer) => {
            Source::Certificate(common_name)
        }
        _ => Source::Address(client(node, request).map(|a| a.ip())),
    }
}
