//! The flags of keyward's one-shot backup commands — `keyward snapshot save|restore|status` (etcdctl's
//! and etcdutl's) and `keyward migrate` — as plain clap structs that import nothing of keyward; the
//! commands themselves (`backup/snapshot/`, `backup/migrate/`, `backup/restore/`) import them.

use std::path::PathBuf;

use clap::{Args, Subcommand};

#[derive(Subcommand, Debug)]
pub enum SnapshotCommand {
    /// Stores a member's backup in a file (as `etcdctl snapshot save`).
    Save(SaveArgs),
    /// Makes a new member's data dir from a backup (as `etcdutl snapshot restore`).
    Restore(RestoreArgs),
    /// Shows a backup's hash, revision, total keys and size (as `etcdctl snapshot status`).
    Status(StatusArgs),
}

#[derive(Args, Debug)]
pub struct SaveArgs {
    /// Where to store the backup.
    pub file: PathBuf,
    /// The member to back up (one endpoint, as etcdctl requires).
    #[arg(long, env = "ETCDCTL_ENDPOINTS", default_value = "127.0.0.1:2379", value_delimiter = ',')]
    pub endpoints: Vec<String>,
    /// Verify the server's certificate with this CA bundle.
    #[arg(long, env = "ETCDCTL_CACERT")]
    pub cacert: Option<PathBuf>,
    /// Client certificate (TLS).
    #[arg(long, env = "ETCDCTL_CERT")]
    pub cert: Option<PathBuf>,
    /// Client key (TLS).
    #[arg(long, env = "ETCDCTL_KEY")]
    pub key: Option<PathBuf>,
    /// username[:password] for authentication (prompting is not supported: give the password).
    #[arg(long, env = "ETCDCTL_USER")]
    pub user: Option<String>,
    /// Password for --user (when it holds no ':').
    #[arg(long, env = "ETCDCTL_PASSWORD")]
    pub password: Option<String>,
    /// Dial timeout, in seconds.
    #[arg(long, default_value_t = 2)]
    pub dial_timeout: u64,
}

#[derive(Args, Debug)]
pub struct RestoreArgs {
    /// The backup (`keyward snapshot save` or `etcdctl snapshot save` against keyward).
    pub file: PathBuf,
    /// Ignore the trailing SHA-256 (needed for a file without one).
    #[arg(long)]
    pub skip_hash_check: bool,
    #[command(flatten)]
    pub member: MemberFlags,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    pub file: PathBuf,
    /// Output format: simple, table, json or fields (etcdctl's -w).
    #[arg(short = 'w', long = "write-out", default_value = "simple")]
    pub write_out: String,
}

#[derive(Args, Debug)]
pub struct MigrateArgs {
    /// The etcd snapshot to migrate (`etcdctl snapshot save`'s file, or a member's `member/snap/db`).
    #[arg(long)]
    pub etcd_snapshot: PathBuf,
    /// Ignore the snapshot's trailing SHA-256 (needed for a file without one, e.g. a member's db).
    #[arg(long)]
    pub skip_hash_check: bool,
    #[command(flatten)]
    pub member: MemberFlags,
}

#[derive(Args, Debug, Clone)]
pub struct MemberFlags {
    /// Path to the data directory to create (default: NAME.keyward); it must not exist or be empty.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Human-readable name for this member.
    #[arg(long, default_value = "default")]
    pub name: String,
    /// Initial cluster configuration for the restored cluster (default: NAME=INITIAL-ADVERTISE-PEER-URLS).
    #[arg(long)]
    pub initial_cluster: Option<String>,
    /// Initial cluster token for the restored cluster.
    #[arg(long, default_value = "etcd-cluster")]
    pub initial_cluster_token: String,
    /// List of this member's peer URLs to advertise to the rest of the cluster.
    #[arg(long, default_value = "http://127.0.0.1:2380", value_delimiter = ',')]
    pub initial_advertise_peer_urls: Vec<String>,
}

impl MemberFlags {
    /// `--data-dir`, or `NAME.keyward` as `keyward serve`'s default is `default.keyward`.
    pub fn data_dir(&self) -> PathBuf {
        self.data_dir.clone().unwrap_or_else(|| PathBuf::from(format!("{}.keyward", self.name)))
    }
}
