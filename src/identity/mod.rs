//! Who is calling, in one place: the plain types and the rules, for the member and the proxy alike.
//!
//! - `rules.rs`: `IdentityRules::identify`, etcd's order of who a request comes from (a token; a
//!   certificate forwarded by a trusted proxy; with `--client-cert-auth` the connection's own
//!   certificate; otherwise nobody), giving an `Identity`; and the client's address.
//! - `requester.rs`: `Requester`, who a request runs as (an `Identity` at an auth revision, and where
//!   it came from), as the raft entry header carries it and `auth/check.rs` judges it.
//! - `certificate.rs`: what a verified certificate names (`PeerIdentity`: its one CN, or under
//!   `--client-cert-identity` its one URI or DNS SAN, or why none); `certificate_fuzz.rs` fuzzes it
//!   (bounded, in the test suite).
//! - `metadata.rs`: every metadata name keyward reads and who may set it.
//! - `credentials.rs`: what an HTTP `Authorization` header presents (a token, or Basic credentials).
//!
//! The rules are plain: what resolves a token and what verifies a forwarded certificate are handed
//! in. This imports neither `auth` (stores, checks) nor `storage`, nor the TLS front end: `frontend/`
//! (the TLS that proves a certificate, and the verifier of forwarded ones), `auth`, `server`,
//! `gateway` and `proxy` import it, never the reverse.

pub(crate) mod certificate;
#[cfg(test)]
mod certificate_fuzz;
pub(crate) mod credentials;
pub(crate) mod metadata;
pub(crate) mod requester;
pub(crate) mod rules;

pub(crate) use requester::{Credential, Origin, Requester};
pub(crate) use rules::{ForwardedCertificates, Identity, IdentityRules, TokenResolver};
