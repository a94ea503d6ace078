//! Who a Lock or Election call's steps run as: the credentials of the call itself, carried over to
//! each in-process KV, Lease and Watch call, so that `server::requester` decides each step from the
//! same metadata and the same connection as it decided the call.

use http::Extensions;
use tonic::metadata::MetadataMap;

use crate::identity::metadata::{AUTHORIZATION, FORWARDED_ADDR, FORWARDED_CERT, TOKEN};

/// The identity-bearing parts of a call: the metadata names that say who is calling (a token, and
/// what a trusted proxy forwarded) and the connection's extensions (its verified certificate and
/// address). Nothing else of the call reaches its steps.
#[derive(Clone)]
pub(crate) struct Caller {
    metadata: MetadataMap,
    extensions: Extensions,
}

/// Every metadata name that plays a part in deciding who is calling (`identity/metadata.rs`).
const IDENTITY_NAMES: [&str; 4] = [TOKEN, AUTHORIZATION, FORWARDED_CERT, FORWARDED_ADDR];

impl Caller {
    /// The caller of `request`.
    pub(crate) fn of<T>(request: &tonic::Request<T>) -> Caller {
        let mut metadata = MetadataMap::new();
        for name in IDENTITY_NAMES {
            // Every value: were a name sent twice, the step sees what the call saw.
            for value in request.metadata().get_all(name) {
                metadata.append(name, value.clone());
            }
        }
        Caller { metadata, extensions: request.extensions().clone() }
    }

    /// A request of one step, as this caller.
    pub(crate) fn request<M>(&self, message: M) -> tonic::Request<M> {
        tonic::Request::from_parts(self.metadata.clone(), self.extensions.clone(), message)
    }
}
