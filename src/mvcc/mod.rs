//! Multi-version concurrency control: revisions, the store on LMDB, and etcd's KV request semantics
//! (range, put, delete, txn, compact) on top of it.

pub mod counts;
pub mod encoded_events;
pub mod hash;
pub mod import;
pub mod kv;
pub mod revision;
pub mod store;
pub mod txn;

#[cfg(test)]
mod model_tests;

pub use store::{KvStore, RangeResult, ReadView, WriteTxn};
