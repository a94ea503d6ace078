//! The TLS front end: rustls via tokio-rustls on the client listener.
//!
//! - `settings.rs`: the TLS flags as a typed value, and building a rustls `ServerConfig` from the files.
//! - `identity.rs`: `PeerIdentity`, what a verified client certificate says about who is connecting;
//!   `identity_fuzz.rs` fuzzes it (bounded, in the test suite).
//! - `listener.rs`: the accept loop — handshake deadline, allow-lists, certificate hot reload — which
//!   hands tonic connections that carry their `PeerIdentity`.

pub mod identity;
#[cfg(test)]
mod identity_fuzz;
pub mod listener;
pub mod settings;
