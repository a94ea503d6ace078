//! The front end every client-facing listener shares: the bytes, the TLS that proves who is calling,
//! and the connections.
//!
//! The member's gRPC services (`server/`) and the proxy (`proxy/`, which accepts through `tls/` and
//! forwards the certificate it verified) call it; the HTTP gateway (`gateway/`) reaches it through the
//! gRPC services it calls in process. Who is calling is decided in `identity/`, from what this front
//! end establishes.
//!
//! - `tls/`: the TLS flags (`settings.rs`), the accept loop (`listener.rs`) that hands tonic
//!   connections carrying their `PeerIdentity` and the client's address, the dialing side
//!   (`client.rs`), and the one reloader of certificate files (`reload.rs`) that every listener, the
//!   forwarded-certificate verifier and the proxy's dialer use.
//! - `forwarded.rs`: checking a client certificate forwarded by a trusted proxy
//!   (`keyward-forwarded-client-cert`) against the member's own CA, CRL and allow-lists;
//!   `identity_rules.rs`: the `identity::IdentityRules` a client listener's TLS flags set, with it.
//! - `connection.rs`: reading those back from a request (the identity; the client's address, which
//!   login throttling keys on).
//! - `request_trailers.rs`: request bodies without trailers, so that metadata is the request's
//!   headers only (`identity/metadata.rs`).
//! - `connection_limits.rs`: how many connections a listener holds (a newcomer takes the slot of
//!   the oldest connection that had no request answered) and how long one may stay silent;
//!   `answered.rs` reads from the server's writes whether a connection had a request answered.
//! - `coalesce.rs`: responses that complete together leave a connection in one write.
//! - `answers.rs`: answers on their way to their handlers, which `coalesce.rs` lets go first.
//!
//! It must not depend on the member (`node`, `raft`, `server`, `storage`): a proxy has none of them.

pub(crate) mod answered;
pub(crate) mod answers;
pub(crate) mod coalesce;
pub(crate) mod connection;
pub(crate) mod connection_limits;
pub(crate) mod forwarded;
pub(crate) mod identity_rules;
pub(crate) mod request_trailers;
pub(crate) mod tls;
