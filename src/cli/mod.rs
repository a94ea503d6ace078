//! The command line: every clap definition keyward parses. `Cli` and its subcommands are here; each
//! subcommand's flags are in a file of their own (`member.rs`, `proxy.rs`, `backup.rs`), and
//! `go_style.rs` lets them be written Go's way (`-flag`). The checks that turn flags into settings are
//! elsewhere: `config/` for a member, `proxy/config.rs` for the proxy, `backup/` for the backups.

pub(crate) mod backup;
pub(crate) mod go_style;
pub(crate) mod member;
pub(crate) mod proxy;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "keyward", version, about = "An etcd-v3-compatible key-value store with authentication done right")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a cluster member.
    Serve(Box<member::ServeArgs>),
    /// gRPC proxy in front of the members (etcd's `grpc-proxy`), keeping each client's certificate
    /// identity; also the sidecar.
    #[command(subcommand)]
    GrpcProxy(GrpcProxyCommand),
    /// Backups: save a member's, restore one into a new data dir, show one's status (etcdctl's and
    /// etcdutl's `snapshot`).
    #[command(subcommand)]
    Snapshot(backup::SnapshotCommand),
    /// A new data dir from an etcd 3.4/3.5 snapshot: keys with their revisions, leases, users, roles.
    Migrate(Box<backup::MigrateArgs>),
}

#[derive(Subcommand, Debug)]
pub enum GrpcProxyCommand {
    /// Start the gRPC proxy.
    Start(Box<proxy::StartArgs>),
}
