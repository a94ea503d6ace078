//! A new member's data dir made from a whole applied state: a keyward backup (`keyward snapshot
//! restore`) or an etcd one (`keyward migrate`). Both fill the kv tables their own way and share
//! the rest here:
//!
//! - `member_flags.rs`: etcdutl's member flags (`--name`, `--initial-cluster`, ...) and the new
//!   cluster's ids, derived as `keyward serve` bootstraps them (`cluster/bootstrap.rs`);
//! - `backup_file.rs`: a backup file's trailing SHA-256 (etcd's rule; keyward's and etcd's backups
//!   have the same trailer) and, for keyward's, the LMDB file's completeness;
//! - `new_data_dir.rs`: the data dir built in a temp dir next to the target and renamed into place
//!   only once complete, with a raft log that starts after the applied state.
//!
//! It must not import the member (`node`, `server`): nothing here runs a member.

pub(crate) mod backup_file;
pub(crate) mod member_flags;
pub(crate) mod new_data_dir;

pub(crate) use new_data_dir::NewDataDir;
