//! The raft log: openraft's `RaftLogStorage` (entries, vote, committed id, last purged id) and the
//! member identity.
//!
//! - `wal/`: the live log, append-only segment files in `<data-dir>/member/wal`; every member runs on
//!   it, and `wal/migrate.rs` opens it at start.
//! - `legacy.rs`: the LMDB log (`<data-dir>/member/raft`) of versions before the WAL. Never the live
//!   log: only read, once, by `wal/migrate.rs` to move an old data dir's log into `member/wal`.
//! - `cache.rs`: the newest entries in memory, which both serve openraft's read-back from.

mod cache;
pub(super) mod legacy;
pub(crate) mod wal;
