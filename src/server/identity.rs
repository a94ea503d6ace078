//! Who is asking: resolved once per request at the edge, from the token an etcd client sends
//! (`token` metadata from etcd 3.4 clients, `authorization` from newer ones), into a typed `Requester`
//! that the raft entry header and the read-path checks are built from. Nothing deeper in the stack
//! looks at metadata.

use tonic::metadata::MetadataMap;
use tonic::Status;

use crate::auth::check::Requester;
use crate::error::EtcdError;
use crate::node::Node;

/// The requester behind a request's metadata. A token that does not resolve is an error (etcd's
/// "invalid auth token"), never a silent downgrade to anonymous.
pub fn requester(node: &Node, metadata: &MetadataMap) -> Result<Requester, Status> {
    let token = metadata.get("token").or_else(|| metadata.get("authorization"));
    let Some(token) = token else { return Ok(Requester::anonymous()) };
    let token = token.to_str().map_err(|_| EtcdError::InvalidAuthToken)?;
    let (username, revision) = node.tokens.resolve(token)?;
    Ok(Requester::Client { username, revision })
}
