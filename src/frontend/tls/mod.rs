//! TLS with rustls via tokio-rustls, for listeners and dialers alike.
//!
//! - `settings.rs`: the TLS flags as a typed value, and building a rustls `ServerConfig` from the files.
//! - `listener.rs`: the accept loop — handshake deadline, allow-lists, certificate hot reload — which
//!   hands tonic connections that carry their `PeerIdentity` (`frontend/certificate.rs`).
//! - `client.rs`: the dialing side (a member to its peers): a rustls `ClientConfig` from the files and
//!   a tonic connector.

pub(crate) mod client;
pub(crate) mod listener;
pub(crate) mod settings;
