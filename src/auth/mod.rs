//! Authentication and role-based access control, as etcd v3 designs it (see `docs/architecture.md`).
//!
//! - `permissions.rs`: a user's roles merged into sorted, coalesced key-interval sets, binary-searched.
//! - `jwt.rs`, `token_config.rs`: `--auth-token` parsing and the JWT token provider.

pub mod jwt;
pub mod permissions;
pub mod token_config;
