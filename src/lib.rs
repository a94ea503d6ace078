//! keyward: an etcd-v3-compatible replicated key-value store with authentication done right.
//!
//! The request path, top to bottom: `server` (gRPC front end, request validation) → `node` (proposes
//! writes through raft, serves reads) → `raft` (openraft log and state machine on LMDB) → `apply` (one
//! committed entry → effects) → `mvcc` (the revisioned store).
#![deny(unsafe_code)] // the one exception is opening LMDB, in storage.rs

pub mod apply;
pub mod error;
pub mod keyrange;
pub mod mvcc;
pub mod proto;
pub mod raft;
pub mod storage;
