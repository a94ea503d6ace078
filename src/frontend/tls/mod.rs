//! TLS with rustls via tokio-rustls, for listeners and dialers alike.
//!
//! - `settings.rs`: the TLS flags as a typed value, and building a rustls `ServerConfig` from the files.
//! - `policy.rs`: the TLS versions and cipher suites allowed (`--tls-min-version`, `--tls-max-version`,
//!   `--cipher-suites`), for listeners and dialers.
//! - `listener.rs`: the accept loop — handshake deadline, allow-lists, certificate hot reload — which
//!   hands tonic connections that carry their `PeerIdentity` (`identity/certificate.rs`).
//! - `client.rs`: the dialing side (a member to its peers): a rustls `ClientConfig` from the files and
//!   a tonic connector.
//! - `reload.rs`: certificate files reloaded when their contents change, every `RELOAD_INTERVAL`: the
//!   one reloader of the listeners, the forwarded-certificate verifier and the proxy's dialer.

pub(crate) mod client;
pub(crate) mod listener;
pub(crate) mod policy;
pub(crate) mod reload;
pub(crate) mod settings;
