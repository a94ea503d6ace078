//! The recipes the Lock and Election services (`server/lock.rs`, `server/election.rs`) are made of,
//! as etcd builds them in `clientv3/concurrency` on top of KV, Lease and Watch: a key under the
//! name with the caller's lease, and a wait for the keys created before it to be deleted.
//!
//! Every step is one in-process call of the listener's own KV, Lease or Watch service, carrying the
//! caller's credentials (`caller.rs`), so each is decided exactly as that call from the caller would
//! be: a token voided between two steps, or a permission revoked, stops the next one, and callers
//! sharing a connection never act as each other (etcd #17502). Waiting is a watch: no thread, no raft
//! slot.
//!
//! Files: `caller.rs` (whose credentials a step carries), `steps.rs` (the KV and Lease calls),
//! `waits.rs` (waiting for deletions, over Watch), `keys.rs` (the keys under a name),
//! `cleanup.rs` (what a call abandoned by its client still does).

pub(super) mod caller;
pub(super) mod cleanup;
pub(super) mod keys;
pub(super) mod steps;
pub(super) mod waits;
