//! A snapshot file's integrity, as etcd checks it: a file whose length is a multiple of 512 plus 32
//! ends with the SHA-256 of everything before it (etcd's `hasChecksum`); one without it is accepted
//! only with `--skip-hash-check`, as etcdutl does.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use anyhow::{anyhow, bail, Context as _};
use sha2::{Digest, Sha256};

const DIGEST: u64 = 32;
const ALIGN: u64 = 512;

/// The database part of a snapshot file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotFile {
    /// Bytes before the digest (the whole file if it has none).
    pub db_len: u64,
    pub has_digest: bool,
}

impl SnapshotFile {
    /// Checks the trailing digest of `path` unless `skip_hash_check`.
    pub fn check(path: &Path, skip_hash_check: bool) -> anyhow::Result<SnapshotFile> {
        let mut file = File::open(path).with_context(|| format!("cannot open snapshot {}", path.display()))?;
        let len = file.metadata().with_context(|| format!("snapshot {}", path.display()))?.len();
        let has_digest = len >= ALIGN + DIGEST && len % ALIGN == DIGEST;
        let db_len = if has_digest { len - DIGEST } else { len };
        if skip_hash_check {
            return Ok(SnapshotFile { db_len, has_digest });
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
        Ok(SnapshotFile { db_len, has_digest })
    }
}

pub fn hex(bytes: &[u8]) -> String {
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
        assert_eq!(SnapshotFile::check(file.path(), false).unwrap(), SnapshotFile { db_len: 1024, has_digest: true });
        let mut bad = good.clone();
        bad[10] ^= 1;
        let err = SnapshotFile::check(write(&bad).path(), false).unwrap_err().to_string();
        assert!(err.contains("expected sha256"), "{err}");
        let truncated = write(&good[..1000]);
        let err = SnapshotFile::check(truncated.path(), false).unwrap_err().to_string();
        assert!(err.contains("--skip-hash-check"), "{err}");
        assert_eq!(
            SnapshotFile::check(truncated.path(), true).unwrap(),
            SnapshotFile { db_len: 1000, has_digest: false }
        );
    }
}
