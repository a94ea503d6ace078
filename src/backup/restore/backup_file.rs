//! A backup file's integrity (what `etcdctl snapshot save` or `keyward snapshot save` wrote; not a
//! member's own snapshot, `raft/state_machine/snapshot/format.rs`), as etcd checks it: a file whose
//! length is a multiple of 512 plus 32 ends with the SHA-256 of everything before it (etcd's
//! `hasChecksum`); one without it is accepted only with `--skip-hash-check`, as etcdutl does.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use anyhow::{anyhow, bail, Context as _};
use sha2::{Digest, Sha256};

const DIGEST: u64 = 32;
const ALIGN: u64 = 512;

/// The database part of a snapshot file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BackupFile {
    /// Bytes before the digest (the whole file if it has none).
    pub db_len: u64,
    pub has_digest: bool,
}

impl BackupFile {
    /// Checks the trailing digest of `path` unless `skip_hash_check`.
    pub(crate) fn check(path: &Path, skip_hash_check: bool) -> anyhow::Result<BackupFile> {
        let mut file = File::open(path).with_context(|| format!("cannot open snapshot {}", path.display()))?;
        let len = file.metadata().with_context(|| format!("snapshot {}", path.display()))?.len();
        let has_digest = len >= ALIGN + DIGEST && len % ALIGN == DIGEST;
        let db_len = if has_digest { len - DIGEST } else { len };
        if skip_hash_check {
            return Ok(BackupFile { db_len, has_digest });
        }
        if !has_digest {
            bail!(
                "snapshot {} has no trailing sha256 ({len} bytes is not a multiple of 512 plus 32): the file is \
                 truncated, or has no hash (then use --skip-hash-check)",
                path.display()
            );
        }
        let mut hasher = Sha256::new();
        let copied = std::io::copy(&mut (&mut file).take(db_len), &mut hasher)
            .with_context(|| format!("cannot read snapshot {}", path.display()))?;
        if copied != db_len {
            bail!("snapshot {} changed while being read", path.display());
        }
        let mut expected = [0u8; DIGEST as usize];
        file.seek(SeekFrom::Start(db_len))
            .and_then(|_| file.read_exact(&mut expected))
            .with_context(|| format!("cannot read snapshot {}", path.display()))?;
        let got = hasher.finalize();
        if got[..] != expected[..] {
            return Err(anyhow!(
                "snapshot {}: expected sha256 {}, got {} (the file is corrupt)",
                path.display(),
                hex(&expected),
                hex(&got)
            ));
        }
        Ok(BackupFile { db_len, has_digest })
    }
}

/// LMDB's meta page: its magic, and where the page size, last page and txn id are (64-bit build).
const LMDB_MAGIC: u32 = 0xBEEF_C0DE;
const LMDB_PSIZE_AT: usize = 40;
const LMDB_LAST_PAGE_AT: usize = 136;
const LMDB_TXNID_AT: usize = 144;

impl BackupFile {
    /// For a backup in keyward's older format (an LMDB copy, before backups were in etcd's format):
    /// checks that the database part is a whole LMDB environment: a meta page with LMDB's magic, and
    /// every page its newest meta page counts inside the file. LMDB maps the file and trusts it: a
    /// truncated file would crash the process (SIGBUS) on the first read past its end, so this is
    /// checked before it is opened. (A page corrupted in place is caught by the digest only.)
    pub(crate) fn check_lmdb(&self, path: &Path) -> anyhow::Result<()> {
        let mut file = File::open(path).with_context(|| format!("cannot open snapshot {}", path.display()))?;
        let mut meta0 = [0u8; LMDB_TXNID_AT + 8];
        if self.db_len < meta0.len() as u64 || file.read_exact(&mut meta0).is_err() {
            bail!("snapshot {} is too short to be a backup", path.display());
        }
        let u32_at = |b: &[u8], at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let u64_at = |b: &[u8], at: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(x)
        };
        if u32_at(&meta0, 16) != LMDB_MAGIC {
            bail!(
                "snapshot {} is not a backup: neither etcd's format (bbolt) nor keyward's older one (LMDB)",
                path.display()
            );
        }
        let psize = u64::from(u32_at(&meta0, LMDB_PSIZE_AT));
        if !(512..=65536).contains(&psize) || !psize.is_power_of_two() {
            bail!("snapshot {} is corrupt: page size {psize}", path.display());
        }
        let mut meta1 = [0u8; LMDB_TXNID_AT + 8];
        if self.db_len < psize + meta1.len() as u64 {
            bail!("snapshot {} is truncated", path.display());
        }
        file.seek(SeekFrom::Start(psize))
            .and_then(|_| file.read_exact(&mut meta1))
            .with_context(|| format!("cannot read snapshot {}", path.display()))?;
        let newest =
            if u32_at(&meta1, 16) == LMDB_MAGIC && u64_at(&meta1, LMDB_TXNID_AT) > u64_at(&meta0, LMDB_TXNID_AT) {
                &meta1
            } else {
                &meta0
            };
        let pages = u64_at(newest, LMDB_LAST_PAGE_AT).checked_add(1);
        match pages.and_then(|p| p.checked_mul(psize)) {
            Some(needed) if needed <= self.db_len => Ok(()),
            _ => bail!(
                "snapshot {} is truncated: its database has {} pages of {psize} bytes, the file {} bytes",
                path.display(),
                u64_at(newest, LMDB_LAST_PAGE_AT).saturating_add(1),
                self.db_len
            ),
        }
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(bytes: &[u8]) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut file, bytes).unwrap();
        file
    }

    #[test]
    fn digest_is_checked_and_a_missing_one_needs_skip_hash_check() {
        let db = vec![7u8; 1024];
        let mut good = db.clone();
        good.extend_from_slice(&Sha256::digest(&db));
        let file = write(&good);
        assert_eq!(BackupFile::check(file.path(), false).unwrap(), BackupFile { db_len: 1024, has_digest: true });
        let mut bad = good.clone();
        bad[10] ^= 1;
        let err = BackupFile::check(write(&bad).path(), false).unwrap_err().to_string();
        assert!(err.contains("expected sha256"), "{err}");
        let truncated = write(&good[..1000]);
        let err = BackupFile::check(truncated.path(), false).unwrap_err().to_string();
        assert!(err.contains("--skip-hash-check"), "{err}");
        assert_eq!(BackupFile::check(truncated.path(), true).unwrap(), BackupFile { db_len: 1000, has_digest: false });
    }
}
