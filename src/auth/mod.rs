//! Authentication and role-based access control, as etcd v3 designs it (see `docs/architecture.md`).
//!
//! - `store.rs`: users, roles, the enabled flag and the auth revision, in LMDB (replicated state).
//! - `permissions.rs`: a user's roles merged into sorted, coalesced key-interval sets, binary-searched.
//! - `cache.rs`: merged permissions per user, valid at one auth revision.
//! - `check.rs`: the decisions — may this requester touch these keys — for apply and reads.
//! - `password.rs`: bcrypt, always off the async threads and never inside apply.
//! - `throttle.rs`: failed logins slow down the next attempts from the same client address.
//! - `verified.rs`: passwords bcrypt accepted, as keyed hashes, so logging in again is cheap.
//! - `simple.rs`, `jwt.rs`, `tokens.rs`, `token_config.rs`: `--auth-token` and the token providers.

pub(crate) mod audit;
pub(crate) mod cache;
pub(crate) mod check;
pub(crate) mod jwt;
pub(crate) mod password;
pub(crate) mod permissions;
pub(crate) mod simple;
pub(crate) mod store;
pub(crate) mod throttle;
pub(crate) mod token_config;
pub(crate) mod tokens;
pub(crate) mod verified;
