//! The HTTP/JSON gateway: etcd 3.4's grpc-gateway paths and JSON (`POST /v3/kv/range`, `/v3/watch`,
//! ...) on a client listener, beside gRPC on the same port.
//!
//! The gateway owns no state of the store and does not know the member: each HTTP request becomes one
//! call of the listener's own gRPC services, made in process through a tonic client over the
//! listener's `Routes`. So it mounts unchanged on any listener that serves those services (a member's;
//! the proxy's), and a gateway request is decided exactly as a gRPC request on that connection:
//! - the connection's extensions (the verified client certificate's `PeerIdentity` the TLS listener
//!   attached) travel with the call unchanged, so certificate identity works through the gateway
//!   (etcd's gateway dropped it: CVE-2018-16886);
//! - `Authorization: <token>` is sent as the call's token, as etcd's gateway does;
//! - `Authorization: Basic` is exchanged for a token by the gRPC Authenticate, cached by a keyed hash
//!   of the credentials (`logins.rs`), never weaker than Authenticate;
//! - no other header reaches the gRPC call: in particular no client can send
//!   `keyward-forwarded-client-cert` or any metadata through it.
//!
//! Files: `routes.rs` (the path table, `router`), `aliases.rs` (`/v3beta/` served as `/v3/`), `calls.rs` (an HTTP request's gRPC call: the
//! connection's extensions and the token), `unary.rs` and `streams.rs` (one call; the streaming
//! paths), `logins.rs` (verified Basic credentials; what the `Authorization` header presents is read
//! by `identity/credentials.rs`),
//! `request_body.rs` (JSON in), `reply.rs` (JSON out, etcd's error shapes), `unknown_path.rs` (what a
//! path no route takes, or a route with another method, is answered, as etcd's HTTP mux answers it).
//! It must not depend on the member (`node`, `raft`, `server`).

mod aliases;
mod calls;
pub(crate) mod logins;
mod reply;
mod request_body;
mod routes;
mod streams;
mod unary;
mod unknown_path;

pub(crate) use aliases::with_v3beta_paths;
pub(crate) use routes::router;
pub(crate) use unknown_path::{get_only, go_http_error, go_plain_text, unknown_path};
