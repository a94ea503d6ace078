//! Every metadata name keyward reads, and the trust rule of each: who may set it, where it is read,
//! and what the forwarding proxy does with a copy a client sent. Code that reads or sets one of these
//! names takes it from here.
//!
//! Two rules hold for all of them:
//!
//! - **Headers only.** Metadata is the request's headers. Request trailers never count: tonic would
//!   merge a unary call's request trailers into its metadata, replacing the header values, so every
//!   listener drops them before tonic sees the request (`frontend/request_trailers.rs`, applied to every
//!   listener of a member in `server/mod.rs`, and by the proxy to every call it forwards). gRPC
//!   clients send no request trailers; nothing legitimate is lost.
//! - **A client sends no `keyward-` name.** Those are spoken between keyward processes only. The
//!   proxy removes every header whose name starts with [`KEYWARD_PREFIX`] (any case, `-bin` too)
//!   before it sets its own (`proxy/client_identity.rs`).
//!
//! | name | who may set it | read by | a client's copy, through the proxy |
//! | --- | --- | --- | --- |
//! | [`FORWARDED_CERT`] | the proxy, for the client whose certificate its listener verified | a member's client listener (`rules.rs`), only from a connection whose certificate CN is in `--trusted-proxy-cn`; from anyone else the request is refused ("peer is not a trusted proxy") | removed, replaced by the verified one |
//! | [`FORWARDED_ADDR`] | the proxy: its client's address | a member's client listener (`rules.rs`, login throttling and the audit log), only from a trusted proxy; from anyone else ignored (the connection's address counts) | removed, replaced by the real one (none for a Unix socket client) |
//! | [`TOKEN`] | the client: a token from Authenticate (etcd 3.4 clients) | a member (`rules.rs`); it wins over a certificate, as in etcd. The gateway sets it for a request's `Authorization` | passed on: the member resolves it |
//! | [`AUTHORIZATION`] | the client: a token (newer etcd clients); on the gateway also `Basic` credentials | a member (`rules.rs`), when there is no `token`; the gateway reads (`credentials.rs`) the HTTP header and passes only the resulting `token` on | passed on |
//! | [`CLUSTER_ID`] | a member dialing a peer (`cluster/peers.rs`) | the peer listener (`cluster/peer_service.rs`): a request of another cluster is refused. Not an identity: who may call the peer port is the peer TLS's decision | removed (the proxy never reaches a peer port) |
//! | [`MEMBER_ID`] | a member dialing a peer | the peer listener, to name the sender in logs and answers | removed |
//! | [`SNAPSHOT_SIZE`] | a leader sending a snapshot chunk (`cluster/snapshot_sender.rs`) | the peer listener: the partial file is bounded by it (`cluster/snapshot_receiver.rs`). A member's word, as the chunk is | removed |
//!
//! Other names read, none of which says who a caller is: `grpc-timeout` (the deadline; the proxy and
//! tonic), `client-api-version` (a metrics label, `server/grpc_metrics.rs`), `content-type`.

/// The client certificate a trusted proxy forwards: the leaf, DER, standard base64.
pub(crate) const FORWARDED_CERT: &str = "keyward-forwarded-client-cert";

/// The address (`ip:port`) of the client a trusted proxy forwards for.
pub(crate) const FORWARDED_ADDR: &str = "keyward-forwarded-client-addr";

/// A token from Authenticate, as etcd 3.4 clients send it.
pub(crate) const TOKEN: &str = "token";

/// A token from Authenticate, as newer etcd clients send it.
pub(crate) const AUTHORIZATION: &str = "authorization";

/// The sending member's cluster id (hex), on every peer request.
pub(crate) const CLUSTER_ID: &str = "keyward-cluster-id";

/// The sending member's id (hex), on every peer request.
pub(crate) const MEMBER_ID: &str = "keyward-member-id";

/// The size in bytes of the snapshot a chunk belongs to, on every InstallSnapshot call.
pub(crate) const SNAPSHOT_SIZE: &str = "keyward-snapshot-size";

/// The prefix of every name only keyward processes set.
pub(crate) const KEYWARD_PREFIX: &str = "keyward-";

/// Whether a (lowercase, as HTTP carries it) header name is one only keyward processes set.
fn is_keyward_name(name: &str) -> bool {
    name.starts_with(KEYWARD_PREFIX)
}

/// Removes every header only keyward processes may set, as the proxy does before it sets its own
/// (HTTP names are lowercase, so this covers any case a client wrote them in).
pub(crate) fn remove_keyward_names(headers: &mut http::HeaderMap) {
    let sent: Vec<http::HeaderName> = headers.keys().filter(|name| is_keyward_name(name.as_str())).cloned().collect();
    for name in sent {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_keyward_name_is_recognised_and_the_client_names_are_not() {
        for name in
            [FORWARDED_CERT, FORWARDED_ADDR, CLUSTER_ID, MEMBER_ID, SNAPSHOT_SIZE, "keyward-forwarded-client-cert-bin"]
        {
            assert!(is_keyward_name(name), "{name}");
        }
        for name in [TOKEN, AUTHORIZATION, "grpc-timeout", "x-keyward-forwarded-client-cert"] {
            assert!(!is_keyward_name(name), "{name}");
        }
    }
}
