//! keyward: an etcd-v3-compatible replicated key-value store with authentication done right.
//!
//! The request path, top to bottom: `server` (the member's gRPC services, request validation; who is
//! calling is decided in `identity`, from what `frontend`'s TLS proved, shared with the proxy and the
//! gateway) → `node` (proposes writes through raft, serves reads) → `raft` (openraft log and state
//! machine on LMDB) → `apply` (one committed entry → effects) → `mvcc` (the revisioned store). `proxy`
//! is `keyward grpc-proxy`: it shares `frontend` and `identity` and has no store.
//!
//! Every folder in a paragraph, and the imports no layer may make: `docs/architecture.md` ("The tree",
//! "Layers", checked by `tests/it/module_cycles.rs`). The lints: `Cargo.toml`'s `[lints]`.

mod apply;
mod auth;
mod backup;
mod cli;
mod cluster;
mod config;
mod error;
mod frontend;
mod gateway;
mod identity;
mod keyrange;
mod lease;
mod logging;
mod metrics;
mod mvcc;
mod node;
mod proxy;
mod raft;
mod server;
mod signals;
mod space;
mod storage;
mod watch_hub;

// The public surface: what keyward's binaries and integration tests use; every module is private.
// The wire types, generated from `proto/`.
pub mod proto;

// `src/main.rs`: the command line and the commands it runs.
pub use backup::migrate::run as migrate;
pub use backup::snapshot::run as snapshot;
pub use cli::go_style::etcd_style_args;
pub use cli::{Cli, Command, GrpcProxyCommand};
pub use config::Config;
pub use logging::{init as init_logging, LogSettings};
pub use proxy::run as grpc_proxy;
pub use server::run::serve;

// `keyward-bench`: the TLS connector, the client-port admission its ceiling server measures, and
// the duration syntax of etcd's flags.
pub use config::duration::parse_go_duration;
pub use frontend::connection_limits::{admitted_tcp, Admission};
pub use frontend::tls::client::TlsConnector;

// Integration tests that reach below the wire: the token settings the flag fuzzer compares
// (`tests/it/fuzz_config.rs`), the peer client (`tests/it/peer_port.rs`), the state machine whose
// snapshot memory is measured through openraft's traits (`tests/it/snapshot_memory.rs`; only `open`
// is its own), and the raft log's last purged index after a power loss (`tests/it/durability.rs`,
// `raft_log_last_purged_index` below).
pub use auth::token_config::{JwtOptions, SignMethod, TokenConfig, DEFAULT_JWT_TTL};
pub use frontend::tls::client::{client_config, lazy_channel};
pub use frontend::tls::policy::TlsPolicy;
pub use raft::state_machine::StateMachine;
pub use raft::{Entry, LogId, RaftBatch};

/// The last log index the raft log in `wal_dir` has purged (compacted into a snapshot), 0 for none;
/// opening the log may cut a torn tail. For `tests/it/durability.rs`, which reads it after a power
/// loss: the log itself stays private.
pub fn raft_log_last_purged_index(wal_dir: &std::path::Path) -> std::io::Result<u64> {
    Ok(raft::log::wal::Wal::open(wal_dir)?.state().last_purged.map_or(0, |id| id.index))
}
