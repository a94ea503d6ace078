//! The TLS listener: rustls via tokio-rustls on a client listener.
//!
//! - `settings.rs`: the TLS flags as a typed value, and building a rustls `ServerConfig` from the files.
//! - `listener.rs`: the accept loop — handshake deadline, allow-lists, certificate hot reload — which
//!   hands tonic connections that carry their `PeerIdentity` (`frontend/certificate.rs`).

pub mod listener;
pub mod settings;
