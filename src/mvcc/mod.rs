//! Multi-version concurrency control: revisions, the store on LMDB, and etcd's KV request semantics
//! (range, put, delete, txn, compact) on top of it.

pub(crate) mod compaction;
pub(crate) mod counts;
pub(crate) mod encoded_events;
pub(crate) mod export;
pub(crate) mod hash;
pub(crate) mod import;
mod index;
pub(crate) mod kv;
pub(crate) mod record;
pub(crate) mod revision;
pub(crate) mod store;
pub(crate) mod txn;
pub(crate) mod upgrade;

#[cfg(test)]
mod footprint_tests;
#[cfg(test)]
mod model_tests;

pub(crate) use store::{KvStore, ReadView, WriteTxn};
