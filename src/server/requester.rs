//! The member's one call into the shared front end: who is behind a gRPC request.

use tonic::{Request, Status};

use crate::auth::check::{Credential, Origin, Requester};
use crate::frontend::connection::client_addr;
use crate::frontend::connection::peer_identity;
use crate::frontend::identity::Identity;
use crate::node::Node;

/// The requester behind a request to this member: its identity (decided in `frontend/identity.rs`,
/// as every front end decides it) at the member's current auth revision.
pub(crate) fn requester<T>(node: &Node, request: &Request<T>) -> Result<Requester, Status> {
    let identity = node.identity.identify(request.metadata(), peer_identity(request.extensions()), &*node.tokens)?;
    let credential = match &identity {
        Identity::Token { .. } => Credential::Token,
        Identity::Certificate { .. } => Credential::Certificate,
        Identity::Forwarded { .. } => Credential::ForwardedCertificate,
        Identity::Anonymous(_) => Credential::None,
    };
    let origin = Origin { client: client_addr(request.extensions()), credential };
    Ok(identity.requester(node.auth_revision()).with_origin(origin))
}
