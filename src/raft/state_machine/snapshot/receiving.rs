//! The snapshot a follower is receiving, kept in its snap dir so that a restart of the follower
//! mid-transfer does not lose what it received: the leader resumes at the follower's offset
//! (`cluster/snapshot_receiver.rs`) instead of sending a multi-GB file from byte 0 again.
//!
//! At most one snapshot is received at a time, so at most one partial file exists: `receiving.part`,
//! the bytes received so far, and `receiving.meta`, the snapshot they belong to (openraft's
//! `SnapshotMeta`, postcard). A snapshot id names one build, so the same id means the same bytes: a
//! transfer resumes only for the metadata the partial file was begun with, at its length. Beginning
//! another snapshot truncates the data first and then replaces the metadata (under a temp name,
//! renamed), so whatever a crash leaves, the data is a prefix of the snapshot the metadata names (an
//! empty one at worst). The data is not synced while it arrives: bytes an operating-system crash
//! tore are caught by `verify` (the checksum) before anything is installed, and the transfer starts
//! over. The partial file becomes `current.snap` when installed (renamed, no copy), and is removed
//! when the snapshot is already covered, cannot be written, or fails its check.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::data::SnapshotData;
use super::dir::TempFile;
use super::format::{self, Meta};
use crate::storage::data_dir::FILE_MODE;

const DATA: &str = "receiving.part";
const META: &str = "receiving.meta";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Where a member receives snapshots: its snap dir, and the number of tables a snapshot it can
/// install has (checked before an install).
#[derive(Clone, Debug)]
pub(crate) struct Inbox {
    dir: PathBuf,
    tables: usize,
}

impl Inbox {
    pub(crate) fn new(dir: &Path, tables: usize) -> Inbox {
        Inbox { dir: dir.to_path_buf(), tables }
    }

    /// The part of the snapshot `meta` kept from an earlier transfer, if the partial file holds that
    /// snapshot: its file, open for writing, and how many bytes it has.
    pub(crate) fn resume(&self, meta: &Meta) -> io::Result<Option<(Box<SnapshotData>, u64)>> {
        let kept = match std::fs::read(self.dir.join(META)) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        // Unreadable metadata (a torn write) is no snapshot to resume.
        if postcard::from_bytes::<Meta>(&kept).ok().as_ref() != Some(meta) {
            return Ok(None);
        }
        let path = self.dir.join(DATA);
        let file = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let received = file.metadata()?.len();
        Ok(Some((Box::new(SnapshotData::receiving(TempFile::kept(path), file)), received)))
    }

    /// An empty partial file for the snapshot `meta`, replacing whatever was received before.
    pub(crate) fn begin(&self, meta: &Meta) -> io::Result<Box<SnapshotData>> {
        let path = self.dir.join(DATA);
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).mode(FILE_MODE).open(&path)?;
        // The data is empty before the metadata names another snapshot (see the module doc).
        let encoded = postcard::to_allocvec(meta).map_err(io::Error::other)?;
        let temp = self.dir.join(format!("{META}.tmp"));
        let mut out = OpenOptions::new().write(true).create(true).truncate(true).mode(FILE_MODE).open(&temp)?;
        out.write_all(&encoded)?;
        out.sync_all()?;
        std::fs::rename(&temp, self.dir.join(META))?;
        Ok(Box::new(SnapshotData::receiving(TempFile::kept(path), file)))
    }

    /// Checks the whole received snapshot `meta` (`format::verify`): what passes can be installed.
    pub(crate) fn verify(&self, meta: &Meta) -> Result<(), BoxError> {
        format::verify(File::open(self.dir.join(DATA))?, meta, self.tables)
    }

    /// Bytes free on the file system of the snap dir.
    pub(crate) fn free_bytes(&self) -> io::Result<u64> {
        crate::space::ballast::free_bytes(&self.dir)
    }

    /// Removes the partial file and its metadata (either may be gone: an installed snapshot's data
    /// became `current.snap`).
    pub(crate) fn remove(&self) -> io::Result<()> {
        for name in [DATA, META] {
            match std::fs::remove_file(self.dir.join(name)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    fn meta(id: &str) -> Meta {
        Meta { last_log_id: None, last_membership: Default::default(), snapshot_id: id.to_string() }
    }

    #[tokio::test]
    async fn a_partial_file_resumes_only_for_its_own_snapshot_and_is_replaced_by_another() {
        let dir = tempfile::tempdir().unwrap();
        let inbox = Inbox::new(dir.path(), 3);
        assert!(inbox.resume(&meta("a")).unwrap().is_none(), "nothing received yet");
        let mut data = inbox.begin(&meta("a")).unwrap();
        data.write_all(b"first bytes").await.unwrap();
        data.flush().await.unwrap();
        // Dropped as a restart drops it: the bytes stay.
        drop(data);
        let (_, received) = inbox.resume(&meta("a")).unwrap().expect("the partial file of a");
        assert_eq!(received, 11);
        assert!(inbox.resume(&meta("b")).unwrap().is_none(), "another snapshot's bytes are not resumed");
        drop(inbox.begin(&meta("b")).unwrap());
        assert!(inbox.resume(&meta("a")).unwrap().is_none(), "b replaced a");
        let (_, received) = inbox.resume(&meta("b")).unwrap().expect("the partial file of b");
        assert_eq!(received, 0);
        inbox.remove().unwrap();
        assert!(inbox.resume(&meta("b")).unwrap().is_none());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing left behind");
    }
}
