//! The follower's side of a snapshot transfer (the InstallSnapshot RPC), in place of openraft's
//! `Raft::install_snapshot`, whose receiver starts over at any gap and drops a snapshot half-installed
//! when the leader's deadline drops the call.
//!
//! The chunks of one snapshot (same metadata, so same bytes: a snapshot id names one build) go into
//! the member's one partial file (`raft/state_machine/snapshot/receiving.rs`), each written at its
//! offset after an explicit seek (a call dropped mid-write may have left the file anywhere). The file
//! is kept between calls and across restarts of this member, and the follower says where the transfer
//! stands: a chunk at any other offset than the end of what was received (one sent again after its
//! answer was lost, a new attempt starting over at 0, or the first chunk a restarted follower sees)
//! is answered `SnapshotMismatch` with that offset, where the leader continues
//! (`snapshot_sender.rs`) — a transfer interrupted mid-way resumes, across attempts, leader terms and
//! follower restarts. A chunk of another snapshot must start at 0, and replaces the one being
//! received. Each chunk also renews the leader's lease here (`heard_from_leader`).
//!
//! The peer port is a trust boundary: whatever a peer sends, a chunk is refused with an error and the
//! member goes on serving. Offsets are only ever the end of what was received; the last chunk's file
//! is checked whole (metadata, structure, checksum: `format::verify`) before openraft is asked to
//! install it, because a failed install stops this member's raft for good. A file that fails the
//! check is removed and answered as a transfer to begin again at 0.
//!
//! The last chunk installs the snapshot in a task of its own, which holds the receiver until it is
//! done: a leader that gave up on the call and sends the chunk again waits for the install instead of
//! finding nothing. A snapshot this member already covers (its committed log reaches the snapshot's
//! last entry: it installed it from an earlier transfer whose answer was lost) is not installed, and
//! its file is removed off the async threads.

use std::io::SeekFrom;
use std::sync::Arc;
use std::time::Instant;

use tokio::time::Instant as Deadline;

use openraft::error::{Fatal, InstallSnapshotError, RaftError, SnapshotMismatch};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, InstallSnapshotResponse};
use openraft::{ErrorSubject, ErrorVerb, Snapshot, SnapshotSegmentId, StorageError, Vote};
use tokio::io::{AsyncSeekExt, AsyncWriteExt};

use super::snapshot_sender::{ahead_patience, CHUNKS_IN_FLIGHT};
use crate::metrics;
use crate::raft::member::MemberNode;
use crate::raft::state_machine::SnapshotInbox;
use crate::raft::{NodeId, Raft, TypeConfig};

type SnapshotData = <TypeConfig as openraft::RaftTypeConfig>::SnapshotData;
type SnapshotMeta = openraft::SnapshotMeta<NodeId, MemberNode>;
type ReceiveError = RaftError<NodeId, InstallSnapshotError>;

/// The snapshot being received, if any, kept between InstallSnapshot calls.
pub(crate) struct SnapshotReceiver {
    receiving: Arc<tokio::sync::Mutex<Option<Receiving>>>,
    inbox: SnapshotInbox,
    /// How far past the end of what was received a chunk may start and wait for the ones before it:
    /// the chunks the leader has in flight ahead of one (`snapshot_sender::CHUNKS_IN_FLIGHT`).
    max_ahead: u64,
    /// Permits for chunks waiting for the ones before them.
    waiting: Arc<tokio::sync::Semaphore>,
    /// Told whenever what was received changes.
    progress: tokio::sync::Notify,
}

struct Receiving {
    meta: SnapshotMeta,
    data: Box<SnapshotData>,
    /// Every byte before this one is in `data`.
    received: u64,
    /// The leader sending it, in hex (the metrics' `From`).
    from: String,
    started: Instant,
    /// The size the leader announced (`identity::metadata::SNAPSHOT_SIZE`; a leader of the version
    /// before announces none): no chunk goes past it.
    size: Option<u64>,
}

impl Receiving {
    /// Whether the chunk `req` may be written: within the size announced for the snapshot (the same
    /// on every chunk; the last chunk ends there), and with room for it on the disk (for the whole
    /// snapshot when it begins). A member-certificate peer cannot make the partial file grow past
    /// the snapshot it announced, nor fill the disk.
    fn bound(
        &mut self,
        req: &InstallSnapshotRequest<TypeConfig>,
        announced: Option<u64>,
        inbox: &SnapshotInbox,
    ) -> std::io::Result<()> {
        let refuse = |what: String| Err(std::io::Error::other(format!("etcdserver: snapshot chunk refused: {what}")));
        match (self.size, announced) {
            (Some(size), Some(now)) if size != now => {
                return refuse(format!("announced {now} bytes, after {size} for the same snapshot"));
            }
            (None, Some(now)) => self.size = Some(now),
            _ => {}
        }
        let end = req.offset.saturating_add(req.data.len() as u64);
        if let Some(size) = self.size {
            if end > size {
                return refuse(format!("bytes {}..{end} past the {size} bytes announced", req.offset));
            }
            if req.done && end != size {
                return refuse(format!("the last chunk ends at {end}, not at the {size} bytes announced"));
            }
        }
        // The whole snapshot must fit when it begins; every chunk when it comes.
        let needed = match self.size {
            Some(size) if req.offset == 0 => size,
            _ => req.data.len() as u64,
        };
        match inbox.free_bytes() {
            Ok(free) if free < needed.saturating_add(DISK_MARGIN) => refuse(format!(
                "no space: {needed} bytes to write and {free} bytes free on the disk (database space exceeded)"
            )),
            _ => Ok(()),
        }
    }
}

/// Free space a snapshot transfer leaves on the disk: room for the log and the environment to go on.
const DISK_MARGIN: u64 = 64 << 20;

impl SnapshotReceiver {
    /// `chunk_size`: the largest chunk a leader sends (openraft's `snapshot_max_chunk_size`).
    pub(crate) fn new(inbox: SnapshotInbox, chunk_size: u64) -> Self {
        let ahead = CHUNKS_IN_FLIGHT - 1;
        SnapshotReceiver {
            receiving: Arc::default(),
            inbox,
            max_ahead: chunk_size.saturating_mul(ahead as u64),
            waiting: Arc::new(tokio::sync::Semaphore::new(ahead)),
            progress: tokio::sync::Notify::new(),
        }
    }

    /// Takes one chunk of a snapshot from the leader; the last one installs it.
    pub(crate) async fn receive(
        &self,
        raft: &Raft,
        req: InstallSnapshotRequest<TypeConfig>,
        announced: Option<u64>,
    ) -> Result<InstallSnapshotResponse<NodeId>, ReceiveError> {
        let (my_vote, committed) =
            raft.with_raft_state(|state| (*state.vote_ref(), state.committed)).await.map_err(RaftError::Fatal)?;
        // A stale leader's chunk is not written (openraft's own receiver checks the same).
        if matches!(req.vote.partial_cmp(&my_vote), None | Some(std::cmp::Ordering::Less)) {
            return Ok(InstallSnapshotResponse { vote: my_vote });
        }
        heard_from_leader(raft, req.vote, committed).await?;
        let from = req.vote.leader_id().voted_for().map_or_else(String::new, |id| format!("{id:x}"));
        // Set while this chunk waits for the ones before it.
        let mut waiting: Option<WaitingTurn> = None;
        let mut receiving = loop {
            let mut receiving = self.receiving.clone().lock_owned().await;
            // Where this snapshot stands: 0 when the chunk that begins it has not come yet.
            let received = match self.prepare(&mut receiving, &req, &from).await? {
                Prepared::Receiving => match receiving.as_ref() {
                    Some(current) if req.offset == current.received => break receiving,
                    Some(current) => current.received,
                    None => return Err(mismatch(&req, 0)),
                },
                Prepared::NotBegun => 0,
            };
            // The follower says where the transfer stands: a chunk sent again whose first answer was
            // lost, a new attempt (a new leader term) starting over at 0, or a transfer this member
            // resumes after a restart, continues from there. A chunk a little ahead (the leader keeps
            // several in flight, and calls may overtake one another) waits for the ones before it.
            let ahead = req.offset.checked_sub(received).filter(|&ahead| ahead <= self.max_ahead);
            let (Some(ahead), false) = (ahead, waiting.as_ref().is_some_and(|turn| turn.until <= Deadline::now()))
            else {
                return Err(mismatch(&req, received));
            };
            if waiting.is_none() {
                // At most the chunks one window holds wait, whatever a peer sends: their bytes are in memory.
                let Ok(permit) = self.waiting.clone().try_acquire_owned() else {
                    return Err(mismatch(&req, received));
                };
                metrics::SNAPSHOT_CHUNKS_WAITING.inc();
                waiting = Some(WaitingTurn { _permit: permit, until: Deadline::now() + ahead_patience(ahead) });
            }
            let until = waiting.as_ref().map_or_else(Deadline::now, |turn| turn.until);
            // Registered before the lock is let go: a write that ends meanwhile is not missed.
            let progressed = self.progress.notified();
            let mut progressed = std::pin::pin!(progressed);
            progressed.as_mut().enable();
            drop(receiving);
            let _ = tokio::time::timeout_at(until, progressed).await;
        };
        drop(waiting);
        let Some(current) = receiving.as_mut() else {
            return Err(mismatch(&req, 0));
        };
        if let Err(refused) = current.bound(&req, announced, &self.inbox) {
            tracing::warn!(snapshot = %req.meta.snapshot_id, from = current.from, offset = req.offset, len = req.data.len(), error = %refused, "a snapshot chunk refused");
            metrics::SNAPSHOT_RECEIVE_FAILURES.with_label_values(&[&current.from]).inc();
            return Err(RaftError::Fatal(Fatal::StorageError(storage_error(&req.meta, ErrorVerb::Write, refused))));
        }
        if let Err(e) = write_at(&mut current.data, req.offset, &req.data).await {
            metrics::SNAPSHOT_RECEIVE_FAILURES.with_label_values(&[&current.from]).inc();
            if let Some(failed) = receiving.take() {
                self.discard(failed.data);
            }
            self.progress.notify_waiters();
            return Err(RaftError::Fatal(Fatal::StorageError(storage_error(&req.meta, ErrorVerb::Write, e))));
        }
        metrics::SNAPSHOT_RECEIVED_BYTES.with_label_values(&[&current.from]).inc_by(req.data.len() as u64);
        current.received = req.offset + req.data.len() as u64;
        self.progress.notify_waiters();
        if !req.done {
            return Ok(InstallSnapshotResponse { vote: my_vote });
        }
        let Some(received) = receiving.take() else {
            return Err(mismatch(&req, 0));
        };
        let (raft, vote, inbox) = (raft.clone(), req.vote, self.inbox.clone());
        // Holds `receiving` until installed, even if the leader's deadline drops this call.
        let install = tokio::spawn(async move {
            let installed = install(&raft, vote, received, inbox).await;
            drop(receiving);
            installed
        });
        match install.await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(Refused::Corrupt)) => Err(mismatch(&req, 0)),
            Ok(Err(Refused::Raft(e))) => Err(*e),
            Err(e) => Err(RaftError::Fatal(Fatal::StorageError(install_panicked(&req.meta, e)))),
        }
    }

    /// Makes `receiving` the snapshot `req` is a chunk of: the one being received, the part an
    /// earlier run of this member kept, or (a chunk at 0) a new one replacing whatever was received.
    /// Otherwise (a chunk past 0 of a snapshot not begun) leaves it.
    async fn prepare(
        &self,
        receiving: &mut Option<Receiving>,
        req: &InstallSnapshotRequest<TypeConfig>,
        from: &str,
    ) -> Result<Prepared, ReceiveError> {
        if receiving.as_ref().is_some_and(|r| r.meta == req.meta) {
            return Ok(Prepared::Receiving);
        }
        // What an earlier run of this member received of it, if anything, is where it goes on.
        let inbox = self.inbox.clone();
        let meta = req.meta.clone();
        let kept = tokio::task::spawn_blocking(move || inbox.resume(&meta))
            .await
            .map_err(|e| storage_error(&req.meta, ErrorVerb::Read, std::io::Error::other(e.to_string())))?
            .map_err(|e| storage_error(&req.meta, ErrorVerb::Read, e))?;
        let from = from.to_string();
        if let Some((data, received)) = kept {
            if let Some(abandoned) = receiving.take() {
                abandon(abandoned);
            }
            tracing::info!(snapshot = %req.meta.snapshot_id, from, received, "resuming a snapshot received in part");
            let meta = req.meta.clone();
            *receiving = Some(Receiving { meta, data, received, from, started: Instant::now(), size: None });
        } else if req.offset != 0 {
            return Ok(Prepared::NotBegun);
        } else {
            if let Some(abandoned) = receiving.take() {
                abandon(abandoned);
            }
            let (inbox, meta) = (self.inbox.clone(), req.meta.clone());
            let data = tokio::task::spawn_blocking(move || inbox.begin(&meta))
                .await
                .map_err(|e| storage_error(&req.meta, ErrorVerb::Write, std::io::Error::other(e.to_string())))?
                .map_err(|e| storage_error(&req.meta, ErrorVerb::Write, e))?;
            tracing::info!(snapshot = %req.meta.snapshot_id, from, "receiving a snapshot");
            let meta = req.meta.clone();
            *receiving = Some(Receiving { meta, data, received: 0, from, started: Instant::now(), size: None });
        }
        Ok(Prepared::Receiving)
    }

    /// Removes the partial file (with `data`, its open handle) on a blocking thread: removing a
    /// multi-GB file takes a while.
    fn discard(&self, data: Box<SnapshotData>) {
        discard(data, self.inbox.clone());
    }
}

/// openraft's `InstallSnapshotRequest` as it comes (`snapshot_sender.rs` writes it): its bytes
/// decoded whole, where serde would push them into a `Vec<u8>` one at a time.
#[derive(serde::Deserialize)]
pub(crate) struct ChunkReceived {
    vote: Vote<NodeId>,
    meta: SnapshotMeta,
    offset: u64,
    #[serde(with = "serde_bytes")]
    data: Vec<u8>,
    done: bool,
}

impl From<ChunkReceived> for InstallSnapshotRequest<TypeConfig> {
    fn from(chunk: ChunkReceived) -> Self {
        let ChunkReceived { vote, meta, offset, data, done } = chunk;
        InstallSnapshotRequest { vote, meta, offset, data, done }
    }
}

/// What `prepare` found for a chunk's snapshot.
enum Prepared {
    /// It is the one being received.
    Receiving,
    /// Not received, and the chunk is not its first: the chunks before it may still come (several
    /// are in flight), the first of them beginning it.
    NotBegun,
}

/// A chunk waiting for the ones before it: one of the few permits, until when it waits.
struct WaitingTurn {
    _permit: tokio::sync::OwnedSemaphorePermit,
    until: Deadline,
}

impl Drop for WaitingTurn {
    fn drop(&mut self) {
        metrics::SNAPSHOT_CHUNKS_WAITING.dec();
    }
}

/// Why a received snapshot was not installed.
enum Refused {
    /// It failed its check (a torn or forged file): removed, to be sent again from byte 0.
    Corrupt,
    Raft(Box<ReceiveError>),
}

/// A snapshot half-received is left for another; its bytes are overwritten by the next one's.
fn abandon(abandoned: Receiving) {
    tracing::warn!(snapshot = %abandoned.meta.snapshot_id, received = abandoned.received, "a snapshot half-received is abandoned for another");
    metrics::SNAPSHOT_RECEIVE_FAILURES.with_label_values(&[&abandoned.from]).inc();
}

/// A chunk from the leader is word from the leader, as etcd's MsgSnap is: told to the raft core as an
/// AppendEntries of nothing after this member's committed entry (in every leader's log), which
/// renews the leader's lease here. Without it a member busy receiving a snapshot, whose heartbeats
/// were late, campaigned, and each election ended the transfer.
async fn heard_from_leader(
    raft: &Raft,
    vote: Vote<NodeId>,
    committed: Option<openraft::LogId<NodeId>>,
) -> Result<(), ReceiveError> {
    let heartbeat = AppendEntriesRequest { vote, prev_log_id: committed, entries: vec![], leader_commit: None };
    match raft.append_entries(heartbeat).await {
        Ok(_) => Ok(()),
        Err(RaftError::Fatal(fatal)) => Err(RaftError::Fatal(fatal)),
        Err(RaftError::APIError(never)) => match never {},
    }
}

/// Installs a snapshot received whole, unless this member already covers it or it fails its check.
async fn install(
    raft: &Raft,
    vote: Vote<NodeId>,
    received: Receiving,
    inbox: SnapshotInbox,
) -> Result<InstallSnapshotResponse<NodeId>, Refused> {
    let Receiving { meta, mut data, received: size, from, started, .. } = received;
    let (my_vote, committed) = raft
        .with_raft_state(|state| (*state.vote_ref(), state.committed))
        .await
        .map_err(|e| Refused::Raft(Box::new(RaftError::Fatal(e))))?;
    if meta.last_log_id <= committed {
        metrics::SNAPSHOT_RECEIVE_SUCCESS.with_label_values(&[&from]).inc();
        tracing::info!(snapshot = %meta.snapshot_id, committed = ?committed, "a snapshot received is already covered: not installed");
        discard(data, inbox);
        return Ok(InstallSnapshotResponse { vote: my_vote });
    }
    let received_in = started.elapsed();
    // tokio's file completes a write in the background: the check reads what the last one wrote.
    let checking = Instant::now();
    let checked = match data.flush().await {
        Ok(()) => {
            let (inbox, meta) = (inbox.clone(), meta.clone());
            tokio::task::spawn_blocking(move || inbox.verify(&meta).map_err(|e| e.to_string()))
                .await
                .unwrap_or_else(|e| Err(e.to_string()))
        }
        Err(e) => Err(e.to_string()),
    };
    if let Err(error) = checked {
        tracing::warn!(snapshot = %meta.snapshot_id, from, size, error, "a snapshot received fails its check: removed, not installed");
        metrics::SNAPSHOT_RECEIVE_FAILURES.with_label_values(&[&from]).inc();
        discard(data, inbox);
        return Err(Refused::Corrupt);
    }
    metrics::SNAPSHOT_RECEIVE_SUCCESS.with_label_values(&[&from]).inc();
    tracing::info!(snapshot = %meta.snapshot_id, size, ?received_in, checked_in = ?checking.elapsed(), "installing a snapshot received");
    let installing = Instant::now();
    let answer = raft.install_full_snapshot(vote, Snapshot { meta: meta.clone(), snapshot: data }).await;
    // The data became `current.snap`; what is left is the partial file's metadata.
    let _ = tokio::task::spawn_blocking(move || inbox.remove()).await;
    match answer {
        Ok(response) => {
            tracing::info!(snapshot = %meta.snapshot_id, installed_in = ?installing.elapsed(), "snapshot installed");
            Ok(response.into())
        }
        Err(fatal) => {
            metrics::SNAPSHOT_RECEIVE_FAILURES.with_label_values(&[&from]).inc();
            Err(Refused::Raft(Box::new(RaftError::Fatal(fatal))))
        }
    }
}

/// Writes `bytes` at `offset`, seeking first whatever the file's position: a call dropped mid-write
/// may have left it anywhere.
async fn write_at(data: &mut SnapshotData, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
    data.seek(SeekFrom::Start(offset)).await?;
    data.write_all(bytes).await?;
    data.flush().await
}

/// Closes a snapshot file and removes the partial file, on a blocking thread (removing a multi-GB
/// file takes a while).
fn discard(data: Box<SnapshotData>, inbox: SnapshotInbox) {
    tokio::task::spawn_blocking(move || {
        drop(data);
        if let Err(e) = inbox.remove() {
            tracing::warn!(error = %e, "cannot remove the snapshot received in part");
        }
    });
}

fn storage_error(meta: &SnapshotMeta, verb: ErrorVerb, e: std::io::Error) -> StorageError<NodeId> {
    StorageError::from_io_error(ErrorSubject::Snapshot(Some(meta.signature())), verb, e)
}

/// The answer to a chunk at the wrong offset: where this member expects the next one.
fn mismatch(req: &InstallSnapshotRequest<TypeConfig>, expect: u64) -> ReceiveError {
    let segment = |offset| SnapshotSegmentId { id: req.meta.snapshot_id.clone(), offset };
    RaftError::APIError(InstallSnapshotError::SnapshotMismatch(SnapshotMismatch {
        expect: segment(expect),
        got: segment(req.offset),
    }))
}

fn install_panicked(meta: &SnapshotMeta, e: tokio::task::JoinError) -> StorageError<NodeId> {
    let subject = ErrorSubject::Snapshot(Some(meta.signature()));
    StorageError::from_io_error(subject, ErrorVerb::Write, std::io::Error::other(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chunk's bytes encoded whole are the bytes a member of the version before (openraft's own
    /// encoding) sends and takes.
    #[test]
    fn a_chunk_on_the_wire_is_openrafts_request_byte_for_byte() {
        let meta = openraft::SnapshotMeta {
            last_log_id: Some(openraft::LogId::new(openraft::CommittedLeaderId::new(3, 1), 71_535)),
            last_membership: Default::default(),
            snapshot_id: "3-1-71535-7".to_string(),
        };
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let request = InstallSnapshotRequest::<TypeConfig> {
            vote: openraft::Vote::new_committed(3, 1),
            meta,
            offset: 8 << 20,
            data,
            done: true,
        };
        let wire = postcard::to_allocvec(&super::super::snapshot_sender::ChunkOnTheWire::of(&request)).unwrap();
        assert_eq!(wire, postcard::to_allocvec(&request).unwrap());
        let received: ChunkReceived = postcard::from_bytes(&wire).unwrap();
        assert_eq!(InstallSnapshotRequest::from(received), request);
    }
}
