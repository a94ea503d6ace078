//! `keyward snapshot restore FILE`: a new member's data dir from a backup, with etcdutl's flags.
//!
//! A backup in etcd's format (what keyward's Snapshot RPC streams, `backup/export/`, and what etcd's
//! does) is read as `keyward migrate` reads it (`backup/migrate/`): keys and their history, leases,
//! users, roles, the auth flag and revision, and the alarms (etcd's restore keeps its alarm bucket
//! too; a NOSPACE alarm is cleared with `etcdctl alarm disarm`).
//!
//! A backup in keyward's older format (an LMDB copy, streamed before keyward wrote etcd's format) is
//! still restored, as it was: its database, after its digest is checked, becomes `member/kv/data.mdb`
//! of the new data dir (`restore::NewDataDir`), every table with it. It costs this one branch.
//!
//! Either way the source cluster's applied log id and membership are replaced by the new cluster's.

use std::fs::File;
use std::io::Read;

use anyhow::{anyhow, bail, Context as _};

use crate::backup::restore::backup_file::BackupFile;
use crate::backup::restore::new_data_dir::Restored;
use crate::backup::restore::NewDataDir;
use crate::cli::backup::RestoreArgs;

pub(crate) fn run(args: RestoreArgs) -> anyhow::Result<()> {
    let checked = BackupFile::check(&args.file, args.skip_hash_check)?;
    if crate::backup::migrate::bolt::has_magic(&args.file) {
        return restore_etcd_format(&args, checked.db_len);
    }
    checked.check_lmdb(&args.file)?;
    let mut dir = NewDataDir::create(&args.member)?;
    let kv = dir.kv_dir();
    crate::storage::data_dir::create_private_dir(&kv).with_context(|| format!("cannot create {}", kv.display()))?;
    let target = kv.join("data.mdb");
    let mut out = crate::storage::data_dir::create_private_file(&target)
        .with_context(|| format!("cannot create {}", target.display()))?;
    let mut source = File::open(&args.file).with_context(|| format!("cannot open snapshot {}", args.file.display()))?;
    let copied = std::io::copy(&mut (&mut source).take(checked.db_len), &mut out)
        .with_context(|| format!("cannot copy snapshot {} to {}", args.file.display(), target.display()))?;
    if copied != checked.db_len {
        bail!("snapshot {} changed while being read", args.file.display());
    }
    out.sync_all().with_context(|| format!("cannot sync {}", target.display()))?;
    drop(out);
    let state = dir.state().map_err(|e| anyhow!("snapshot {} is not a keyward backup: {e:#}", args.file.display()))?;
    // Read every table once: a backup that opens but does not read back is refused here, not by the
    // member that would serve it.
    let (revision, index) = {
        let txn = state.read_txn()?;
        let revision = state.kv.view(&txn).map_err(|e| anyhow!("snapshot {}: {e}", args.file.display()))?.rev;
        state.hash_all(&txn).map_err(|e| anyhow!("snapshot {}: cannot read it back: {e}", args.file.display()))?;
        let applied = state.applied_log_id().map_err(|e| anyhow!("snapshot {}: {e}", args.file.display()))?;
        (revision, applied.map_or(1, |id| id.index))
    };
    drop(state);
    report(&args, revision, &dir.finish(index)?);
    Ok(())
}

/// A backup in etcd's format (keyward's since it writes them so, or etcd's own): read as `keyward
/// migrate` reads it.
fn restore_etcd_format(args: &RestoreArgs, db_len: u64) -> anyhow::Result<()> {
    let bolt = crate::backup::migrate::bolt::Bolt::open(&args.file, db_len)
        .map_err(|e| anyhow!("snapshot {}: {e}", args.file.display()))?;
    let (imported, restored) = crate::backup::migrate::into_new_data_dir(&bolt, &args.file, &args.member)?;
    report(args, imported.revision, &restored);
    Ok(())
}

/// The line a restore ends with, whichever format the backup was in.
fn report(args: &RestoreArgs, revision: i64, restored: &Restored) {
    println!(
        "restored snapshot {} into {} (revision {revision}, raft index {}; member {:x}, cluster {:x})",
        args.file.display(),
        restored.data_dir.display(),
        restored.applied_index,
        restored.member_id,
        restored.cluster_id
    );
}
