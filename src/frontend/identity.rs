//! Who is asking: resolved once per request at the edge, from the token an etcd client sends
//! (`token` metadata from etcd 3.4 clients, `authorization` from newer ones) or the connection's
//! verified certificate (`PeerIdentity`, set at the TLS handshake), into a typed `Requester`
//! that the raft entry header and the read-path checks are built from. Nothing deeper in the stack
//! looks at metadata.

use tonic::metadata::MetadataMap;
use tonic::{Request, Status};

use crate::auth::check::Requester;
use crate::error::EtcdError;
use crate::node::Node;
use crate::frontend::certificate::PeerIdentity;

/// The requester behind a request, in etcd's order: a token (from Authenticate with a password) wins;
/// otherwise, with `--client-cert-auth`, the connection's certificate Common Name at the current auth
/// revision; otherwise nobody. A token that does not resolve is an error (etcd's "invalid auth
/// token"), never a silent downgrade.
pub fn requester<T>(node: &Node, request: &Request<T>) -> Result<Requester, Status> {
    if let Some(requester) = from_token(node, request.metadata())? {
        return Ok(requester);
    }
    if node.client_cert_auth {
        if let Some(PeerIdentity::Cert { common_name }) = request.extensions().get::<PeerIdentity>() {
            return Ok(Requester::Client { username: common_name.clone(), revision: node.auth_revision() });
        }
    }
    Ok(Requester::anonymous())
}

fn from_token(node: &Node, metadata: &MetadataMap) -> Result<Option<Requester>, Status> {
    let token = metadata.get("token").or_else(|| metadata.get("authorization"));
    let Some(token) = token else { return Ok(None) };
    let token = token.to_str().map_err(|_| EtcdError::InvalidAuthToken)?;
    let (username, revision) = node.tokens.resolve(token)?;
    Ok(Some(Requester::Client { username, revision }))
}
