//! The front end every client-facing listener shares: who is calling, and the TLS that proves it.
//!
//! The member's gRPC services (`server/`) and the proxy (`proxy/`, which accepts through `tls/` and
//! forwards the certificate it verified) call it; the HTTP gateway (`gateway/`) reaches it through the
//! gRPC services it calls in process, so "who is calling" is decided in one place.
//!
//! - `identity.rs`: `Identity`, resolved once per request from a token, the connection's verified
//!   certificate, or a certificate forwarded by a trusted proxy, into the `Requester` that the raft
//!   header is built from.
//! - `forwarded.rs`: checking a client certificate forwarded by a trusted proxy
//!   (`keyward-forwarded-client-cert`) against the member's own CA, CRL and allow-lists.
//! - `certificate.rs`: what a verified certificate names (`PeerIdentity`: its one CN, or under
//!   `--client-cert-identity` its one URI or DNS SAN, or why none);
//!   `certificate_fuzz.rs` fuzzes it (bounded, in the test suite).
//! - `tls/`: the TLS flags (`settings.rs`) and the accept loop (`listener.rs`) that hands tonic
//!   connections carrying their `PeerIdentity` and the client's address.
//! - `connection.rs`: reading those back from a request (the identity; the client's address, which
//!   login throttling keys on).
//! - `metadata.rs`: every metadata name keyward reads and who may set it; `request_trailers.rs`:
//!   request bodies without trailers, so that metadata is the request's headers only.
//! - `connection_limits.rs`: how many connections a listener holds (a newcomer takes the slot of
//!   the oldest connection that had no request answered) and how long one may stay silent;
//!   `answered.rs` reads from the server's writes whether a connection had a request answered.
//! - `coalesce.rs`: responses that complete together leave a connection in one write.
//!
//! It must not depend on the member (`node`, `raft`, `server`): a proxy has none of them.

pub(crate) mod answered;
pub(crate) mod answers;
pub(crate) mod certificate;
#[cfg(test)]
mod certificate_fuzz;
pub(crate) mod coalesce;
pub(crate) mod connection;
pub(crate) mod connection_limits;
pub(crate) mod forwarded;
pub(crate) mod identity;
pub(crate) mod metadata;
pub(crate) mod request_trailers;
pub(crate) mod tls;
