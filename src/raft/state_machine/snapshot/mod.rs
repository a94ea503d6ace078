//! The state machine's snapshots: a dump of every kv table in one file, never held in memory.
//!
//! - `format.rs`: the member's snapshot file format (not a backup file: `backup/restore/backup_file.rs`);
//! - `dir.rs`: the snap dir (`<data-dir>/member/snap/`), where a snapshot becomes current atomically;
//! - `data.rs`: `SnapshotData`, the open file openraft sends, receives and installs;
//! - `receiving.rs`: the snapshot a follower is receiving, kept in the snap dir across restarts;
//! - `build.rs` and `install.rs`: a snapshot built from the applied state, and installed into a fresh
//!   environment that replaces it.

mod build;
pub(in crate::raft) mod data;
pub(super) mod dir;
pub(super) mod format;
mod install;
pub(crate) mod receiving;
