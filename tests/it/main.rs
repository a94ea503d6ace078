//! keyward's integration tests, as one test binary: every module below is what was once its own
//! binary (`tests/<name>.rs`), and [`common`] is the harness they share (servers, etcdctl, clusters,
//! the test PKI, the FUSE file system), compiled once and linked once with keyward.
//!
//! Run one group by its module path, e.g. `cargo test --test it watch::`, or one test by its name,
//! `cargo test --test it watch::watch_from_compacted_revision_is_canceled -- --exact`.
//! `tests/run-all.sh` runs them all (with `cargo test --all-targets`, four test threads).
//!
//! One process runs every test, so what belongs to a process is shared by all of them: the tests
//! that change or measure the whole process run in a child process of their own
//! ([`common::alone`]: `fuzz_config`, which sets `ETCD_*` variables, and `snapshot_memory`, which
//! counts the process's heap); a temporary umask is taken one test at a time
//! ([`common::under_umask`]). The CPU-heavy tests of `auth_client` and `login_throttle` take turns
//! among themselves, as they did in their own binaries; tests of different modules now run beside
//! each other.

mod common;

mod append_stream;
mod audit;
mod auth_client;
mod auth_enforcement;
mod auth_etcdctl;
mod cluster;
mod compaction;
mod connections;
mod defrag;
mod deploy;
mod details;
mod doc_paths;
mod durability;
mod etcd_backup;
mod etcd_config;
mod etcdctl_endpoints;
mod etcdctl_kv;
mod failover;
mod forged_identity;
mod fuzz_config;
mod gateway;
mod kubernetes_watch;
mod kv_client;
mod lease;
mod limits;
mod lock_election;
mod login_throttle;
mod long_key_memory;
mod maintenance;
mod metrics;
mod migrate;
mod module_cycles;
mod peer_port;
mod propose_stream;
mod proxy;
mod rejoin;
mod restore;
mod snapshot_memory;
mod snapshot_transfer;
mod space;
mod tls;
mod watch;
