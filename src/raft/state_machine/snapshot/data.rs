//! `SnapshotData`, the handle openraft carries a snapshot in: an open snapshot file, never its bytes.
//!
//! A leader's openraft reads the snapshot it sends by seek + read, `snapshot_max_chunk_size` bytes at a
//! time; a follower's writes each received chunk into what `begin_receiving_snapshot` returned — a
//! temp file in the snap dir, which becomes `current.snap` when the snapshot is installed and is
//! removed if the transfer is abandoned.

use std::io::{self, Seek, SeekFrom};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, AsyncWriteExt, ReadBuf};

use super::dir::TempFile;

#[derive(Debug)]
pub struct SnapshotData {
    /// `None` only once `finish` or `drop` took it.
    file: Option<tokio::fs::File>,
    /// The temp file of a snapshot being received (removed unless installed).
    receiving: Option<TempFile>,
}

/// The file is closed on a thread of its own (`storage/data_dir.rs`, `release_in_background`). A
/// snapshot sent or installed may be one that a newer build has since replaced, so its last close
/// frees its blocks and cached pages, about a second per gigabyte. openraft drops the handle on the
/// raft thread, where that close stopped the leader's heartbeats for 2.5 s after it sent a 1 GB
/// snapshot, and a follower campaigned (`docs/performance.md`, session 22).
impl Drop for SnapshotData {
    fn drop(&mut self) {
        if let Some(file) = self.file.take() {
            crate::storage::data_dir::release_in_background(file);
        }
    }
}

impl SnapshotData {
    /// A snapshot file to read (and send).
    pub fn reading(file: std::fs::File) -> Self {
        SnapshotData { file: Some(tokio::fs::File::from_std(file)), receiving: None }
    }

    /// The temp file `file` (at `temp`) that a snapshot being received is written into.
    pub fn receiving(temp: TempFile, file: std::fs::File) -> Self {
        SnapshotData { file: Some(tokio::fs::File::from_std(file)), receiving: Some(temp) }
    }

    /// Waits until every write has reached the file and, for a received snapshot, syncs it. Returns
    /// the file at its start, and the temp file it is if it was received.
    pub async fn finish(self) -> io::Result<(std::fs::File, Option<TempFile>)> {
        let mut this = self;
        let receiving = this.receiving.take();
        let mut file = this.file.take().ok_or_else(|| io::Error::other("the snapshot file is already closed"))?;
        // tokio's file completes a write in the background: flush waits for the last one.
        file.flush().await?;
        if receiving.is_some() {
            file.sync_all().await?;
        }
        let mut file = file.into_std().await;
        file.seek(SeekFrom::Start(0))?;
        Ok((file, receiving))
    }
}

impl SnapshotData {
    fn open(&mut self) -> &mut tokio::fs::File {
        self.file.as_mut().expect("the file is taken only by `finish` and `drop`, which consume the handle")
    }
}

impl AsyncRead for SnapshotData {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.get_mut().open()).poll_read(cx, buf)
    }
}

impl AsyncWrite for SnapshotData {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(self.get_mut().open()).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.get_mut().open()).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.get_mut().open()).poll_shutdown(cx)
    }
}

impl AsyncSeek for SnapshotData {
    fn start_seek(self: Pin<&mut Self>, position: SeekFrom) -> io::Result<()> {
        Pin::new(self.get_mut().open()).start_seek(position)
    }

    fn poll_complete(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        Pin::new(self.get_mut().open()).poll_complete(cx)
    }
}
