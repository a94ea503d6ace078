//! A member among its peers: ids, the peer transport, and membership.
//!
//! - `ids.rs`: member and cluster ids derived from the same flags on every member.
//! - `admission.rs`: who is a member on the peer port (the rule `server/peer_guard.rs` applies).
//! - `peers.rs`: dialing peers (one gRPC channel per peer, mTLS with the `--peer-*` flags).
//! - `network.rs`: openraft's transport over those channels.
//! - `bootstrap.rs`: `--initial-cluster-state new` (every initial member initializes raft with the same
//!   membership) and `existing` (ask the running members who this member is).
//! - `membership.rs`: etcd's membership view and changes on top of openraft's membership.
//!
//! The peer protocol's serving side is `server/peer.rs`; a follower's forwarding of client requests
//! to the leader is in `node/mod.rs`. This module must not import the member (`node`, `server`).

pub(crate) mod admission;
pub(crate) mod bootstrap;
pub(crate) mod ids;
pub(crate) mod membership;
pub(crate) mod network;
pub(crate) mod peers;
