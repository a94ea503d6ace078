//! Leases: time-to-live grants that keys attach to; when a lease ends, its keys are deleted.
//!
//! - `store.rs`: what is replicated — each lease's TTL (and last checkpointed remaining TTL) and which
//!   keys are attached, in LMDB, changed only by applied raft entries.
//! - `holders.rs`: who may use a lease once granted (its holder, users of its keys, root).
//! - `lessor.rs`: the clock — when each lease expires. Only the leader acts on it, by proposing a
//!   revoke through raft, so expiry is ordered in the log like any other write.

pub(crate) mod holders;
pub(crate) mod lessor;
pub(crate) mod store;

/// The largest TTL etcd accepts, in seconds.
pub(crate) const MAX_LEASE_TTL: i64 = 9_000_000_000;
/// The smallest TTL a lease gets (etcd: 1.5 election timeouts, rounded up to whole seconds).
pub(crate) const MIN_LEASE_TTL: i64 = 2;
