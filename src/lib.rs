//! keyward: an etcd-v3-compatible replicated key-value store with authentication done right.
#![deny(unsafe_code)] // the one exception is opening LMDB, in storage/env.rs

pub mod proto;
