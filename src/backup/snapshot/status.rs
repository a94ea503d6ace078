//! `keyward snapshot status FILE`: for a backup in etcd's format (etcd's, and keyward's since it
//! writes that format), exactly what `etcdctl snapshot status` prints (`migrate::etcd::status`); for
//! a backup in keyward's older format (an LMDB copy), its hash (keyward's `Hash`: CRC-32C over every table, as
//! `etcdctl endpoint hash` shows it for the member), revision, total keys (records in every table,
//! as etcd counts every bucket's keys) and size (the database, digest excluded), printed as etcdctl
//! prints them (`-w simple|table|json|fields`). The backup is read from a private copy: its LMDB
//! file is never opened in place. A trailing digest, when present, is checked first.

use std::fs::File;
use std::io::Read;
use std::path::PathBuf;

use anyhow::{anyhow, bail, Context as _};

use crate::backup::restore::backup_file::BackupFile;
use crate::cli::backup::StatusArgs;
use crate::raft::state_machine::StateMachine;

#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Status {
    pub hash: u32,
    pub revision: i64,
    pub total_keys: u64,
    pub total_size: u64,
}

pub(crate) fn run(args: StatusArgs) -> anyhow::Result<()> {
    if !["simple", "table", "json", "fields"].contains(&args.write_out.as_str()) {
        bail!("--write-out {:?}: must be simple, table, json or fields", args.write_out);
    }
    let status = status(&args.file)?;
    print!("{}", render(&status, &args.write_out));
    Ok(())
}

pub(crate) fn status(path: &std::path::Path) -> anyhow::Result<Status> {
    let checked = BackupFile::check(path, true)?;
    if checked.has_digest {
        BackupFile::check(path, false)?;
    }
    if crate::backup::migrate::bolt::has_magic(path) {
        // etcd's format (etcd's backups and keyward's): etcdctl's numbers for it.
        let bolt = crate::backup::migrate::bolt::Bolt::open(path, checked.db_len)
            .map_err(|e| anyhow!("snapshot {}: {e}", path.display()))?;
        let (hash, revision, total_keys, total_size) =
            crate::backup::migrate::etcd::status(&bolt).map_err(|e| anyhow!("{}: {e}", path.display()))?;
        return Ok(Status { hash, revision, total_keys, total_size });
    }
    checked.check_lmdb(path)?;
    let temp = tempdir_near()?;
    let kv = temp.join("kv");
    crate::storage::data_dir::create_private_dir(&kv)?;
    let result = (|| {
        let mut out = crate::storage::data_dir::create_private_file(&kv.join("data.mdb"))?;
        let mut source = File::open(path).with_context(|| format!("cannot open snapshot {}", path.display()))?;
        std::io::copy(&mut (&mut source).take(checked.db_len), &mut out)?;
        drop(out);
        let state = StateMachine::open_offline(&kv, &temp.join("snap"))
            .map_err(|e| anyhow!("snapshot {} is not a keyward backup: {e}", path.display()))?
            .state();
        let txn = state.read_txn()?;
        let read = |e: crate::error::EtcdError| anyhow!("snapshot {}: {e}", path.display());
        let hash = state.hash_all(&txn).map_err(read)?;
        let revision = state.kv.view(&txn).map_err(read)?.rev;
        let mut total_keys = 0u64;
        for db in state.tables() {
            total_keys += db.len(&txn)?;
        }
        Ok(Status { hash, revision, total_keys, total_size: checked.db_len })
    })();
    let _ = std::fs::remove_dir_all(&temp);
    result
}

/// A private temp dir for the copy (under $TMPDIR).
fn tempdir_near() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "keyward-snapshot-status-{}-{}",
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
    ));
    crate::storage::data_dir::create_private_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

pub(crate) fn render(s: &Status, format: &str) -> String {
    let size = humanize_bytes(s.total_size);
    match format {
        "json" => format!(
            "{{\"hash\":{},\"revision\":{},\"totalKey\":{},\"totalSize\":{}}}\n",
            s.hash, s.revision, s.total_keys, s.total_size
        ),
        "fields" => format!(
            "\"Hash\" : {}\n\"Revision\" : {}\n\"Keys\" : {}\n\"Size\" : {}\n",
            s.hash, s.revision, s.total_keys, s.total_size
        ),
        "table" => {
            let cells = [format!("{:x}", s.hash), s.revision.to_string(), s.total_keys.to_string(), size];
            let header = ["HASH", "REVISION", "TOTAL KEYS", "TOTAL SIZE"];
            let widths: Vec<usize> = header.iter().zip(&cells).map(|(h, c)| h.len().max(c.len())).collect();
            let line = format!("+{}+\n", widths.iter().map(|w| "-".repeat(w + 2)).collect::<Vec<_>>().join("+"));
            // etcdctl's tablewriter centres the header and right-aligns the cells.
            let head = header
                .iter()
                .zip(&widths)
                .map(|(h, w)| {
                    let pad = w - h.len();
                    format!(" {}{}{} ", " ".repeat(pad / 2), h, " ".repeat(pad - pad / 2))
                })
                .collect::<Vec<_>>()
                .join("|");
            let row = cells.iter().zip(&widths).map(|(c, w)| format!(" {c:>w$} ")).collect::<Vec<_>>().join("|");
            format!("{line}|{head}|\n{line}|{row}|\n{line}")
        }
        _ => format!("{:x}, {}, {}, {}\n", s.hash, s.revision, s.total_keys, size),
    }
}

/// go-humanize's `Bytes`: SI units, one decimal below 10 ("25 kB", "1.5 MB").
fn humanize_bytes(n: u64) -> String {
    if n < 10 {
        return format!("{n} B");
    }
    let units = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    let e = ((n as f64).ln() / 1000f64.ln()).floor() as usize;
    let value = n as f64 / 1000f64.powi(e as i32);
    let rounded = (value * 10.0 + 0.5).floor() / 10.0;
    if rounded < 10.0 {
        format!("{rounded:.1} {}", units[e])
    } else {
        format!("{rounded:.0} {}", units[e])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printed_as_etcdctl_prints_a_snapshot_status() {
        let s = Status { hash: 0x671a8baa, revision: 11, total_keys: 20, total_size: 24576 };
        assert_eq!(render(&s, "simple"), "671a8baa, 11, 20, 25 kB\n");
        assert_eq!(render(&s, "json"), "{\"hash\":1729792938,\"revision\":11,\"totalKey\":20,\"totalSize\":24576}\n");
        assert_eq!(
            render(&s, "table"),
            "+----------+----------+------------+------------+\n\
             |   HASH   | REVISION | TOTAL KEYS | TOTAL SIZE |\n\
             +----------+----------+------------+------------+\n\
             | 671a8baa |       11 |         20 |      25 kB |\n\
             +----------+----------+------------+------------+\n"
        );
        let odd = Status { hash: 0x944a02b, ..s };
        assert!(render(&odd, "table").contains("\n|  HASH   | REVISION |"), "{}", render(&odd, "table"));
        assert_eq!(humanize_bytes(1_500_000), "1.5 MB");
        assert_eq!(humanize_bytes(4_096), "4.1 kB");
    }
}
