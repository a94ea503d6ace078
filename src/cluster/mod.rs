//! A member among its peers: ids, both sides of the peer protocol, and membership.
//!
//! - `ids.rs`: member and cluster ids derived from the same flags on every member.
//! - `admission.rs`: who is a member on the peer port (the rule `peer_guard.rs` applies).
//! - `peers.rs`: dialing peers (one gRPC channel per peer, mTLS with the `--peer-*` flags).
//! - `network.rs`: openraft's transport over those channels; AppendEntries go on one stream per
//!   peer (`append_stream.rs`, both sides); snapshots go by `snapshot_sender.rs` on
//!   the leader and `snapshot_receiver.rs` on the follower.
//! - `peer_service.rs`: the serving side, on the peer listener that `server/mod.rs` binds; it calls
//!   the member through `LocalMember` (implemented in `node/for_peers.rs`).
//! - `quorum_acks.rs`: when each peer last accepted this member's AppendEntries (a leader's read
//!   lease, `node/read_lease.rs`, rests on it).
//! - `peer_guard.rs`: the gate every peer request passes first (members only, by `admission.rs`).
//! - `bootstrap.rs`: `--initial-cluster-state new` (every initial member initializes raft with the same
//!   membership) and `existing` (ask the running members who this member is).
//! - `membership.rs`: etcd's membership view and changes on top of openraft's membership.
//!
//! - `propose_stream.rs`: a follower's forwarded writes on one stream to the leader (both sides).
//!
//! A follower's forwarding of client requests to the leader is in `node/leader.rs`. This module must
//! not import the member (`node`, `server`): `node` imports it.

pub(crate) mod admission;
mod append_stream;
pub(crate) mod bootstrap;
pub(crate) mod ids;
pub(crate) mod membership;
pub(crate) mod network;
pub(crate) mod peer_guard;
pub(crate) mod peer_service;
pub(crate) mod peers;
pub(crate) mod propose_stream;
pub(crate) mod quorum_acks;
mod snapshot_receiver;
mod snapshot_sender;
