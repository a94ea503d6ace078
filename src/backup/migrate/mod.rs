//! `keyward migrate`: an etcd 3.4/3.5 snapshot (`etcdctl snapshot save`'s file, a bbolt database with
//! or without its trailing SHA-256) into a new keyward data dir. keyward's own backups are in the
//! same format (`backup/export/`), and `keyward snapshot restore` reads them with `into_new_data_dir`.
//!
//! - `bolt.rs`: reading bbolt files (why not a crate: see there);
//! - `etcd.rs`: etcd's buckets → keyward's tables;
//! - the new data dir and the member flags are `restore`'s, shared with `keyward snapshot restore`.

pub(crate) mod bolt;
pub(crate) mod etcd;

use anyhow::anyhow;

use crate::backup::restore::backup_file::BackupFile;
use crate::backup::restore::new_data_dir::Restored;
use crate::backup::restore::NewDataDir;
use crate::cli::backup::{MemberFlags, MigrateArgs};

/// Runs `keyward migrate`; the error names the file or flag.
pub fn run(args: MigrateArgs) -> anyhow::Result<()> {
    let file = BackupFile::check(&args.etcd_snapshot, args.skip_hash_check)?;
    let bolt = bolt::Bolt::open(&args.etcd_snapshot, file.db_len).map_err(|e| {
        // LMDB's magic where a keyward backup has it.
        let mut head = [0u8; 20];
        let keyward_backup = std::fs::File::open(&args.etcd_snapshot)
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
            .is_ok_and(|()| head[16..] == 0xBEEF_C0DEu32.to_le_bytes());
        if keyward_backup {
            anyhow!(
                "{} is a backup in keyward's older format (LMDB), not an etcd one: use keyward snapshot restore",
                args.etcd_snapshot.display()
            )
        } else {
            anyhow!("{}: {e}", args.etcd_snapshot.display())
        }
    })?;
    let (imported, restored) = into_new_data_dir(&bolt, &args.etcd_snapshot, &args.member)?;
    println!(
        "migrated {} into {}: revision {} (compacted {}), {} changes, {} leases, {} users, {} roles, auth {} \
         (revision {}), {} alarms; member {:x}, cluster {:x}",
        args.etcd_snapshot.display(),
        restored.data_dir.display(),
        imported.revision,
        imported.compacted.unwrap_or(0),
        imported.changes,
        imported.leases,
        imported.users,
        imported.roles,
        if imported.auth_enabled { "enabled" } else { "disabled" },
        imported.auth_revision,
        imported.alarms,
        restored.member_id,
        restored.cluster_id,
    );
    Ok(())
}

/// A new data dir (`member`'s flags) holding the etcd backend `bolt` read from `path`: what `keyward
/// migrate` and `keyward snapshot restore` of an etcd-format backup (etcd's or keyward's) both do.
pub(crate) fn into_new_data_dir(
    bolt: &bolt::Bolt,
    path: &std::path::Path,
    member: &MemberFlags,
) -> anyhow::Result<(etcd::Imported, Restored)> {
    let mut dir = NewDataDir::create(member)?;
    let state = dir.state()?;
    let imported = etcd::import(bolt, &state).map_err(|e| anyhow!("{}: {e:#}", path.display()))?;
    drop(state);
    let restored = dir.finish(imported.consistent_index)?;
    Ok((imported, restored))
}
