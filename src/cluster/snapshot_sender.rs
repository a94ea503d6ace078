//! The leader's side of a snapshot transfer: keyward's `RaftNetwork::full_snapshot`, in place of
//! openraft's chunked sender, which a member that fell behind a multi-GB store never got past.
//!
//! openraft's sender gives every chunk `install_snapshot_timeout` (200 ms), the last one included,
//! though the follower answers the last one only once the snapshot is installed (26.7 s for 2.38 GB);
//! on any timeout the transfer starts over from byte 0, and openraft's leader, which learns that a
//! follower holds the snapshot only from that last answer, sends the whole snapshot again to a
//! follower that has installed it ("No need to install snapshot"), forever. Here:
//! - before the first byte, a probe (an empty AppendEntries whose previous entry is the snapshot's
//!   last) asks whether the follower already holds what the snapshot covers; if it does, nothing is
//!   sent. The same probe settles a last chunk whose answer did not come in time.
//! - each chunk's deadline covers its bytes at a floor rate; the last chunk's covers the install of
//!   the whole snapshot at a floor rate too. A dead peer is still found at once: its connection
//!   fails the call (a closed socket at once, a frozen host by HTTP/2 keep-alive, 15 s); the
//!   deadline only bounds a peer that is connected and slow.
//! - up to `CHUNKS_IN_FLIGHT` chunks are in flight: the next ones cross while the follower writes
//!   one (which takes them in order), each deadline covering the chunks ahead of it;
//! - a failed chunk is sent again at the same offset, with everything after it, and a follower
//!   that has more or less than the leader thinks (`snapshot_receiver.rs`) answers
//!   `SnapshotMismatch` with the offset it expects, where the transfer continues: an interrupted
//!   transfer resumes rather than restarting from byte 0, also across attempts (the connection
//!   remembers how far the last one got);
//! - a follower that cannot be reached (down) ends the attempt at once, so that the next one sends
//!   the leader's newest snapshot, not an older one whose log tail may be purged by the time the
//!   follower is back.
//!
//! Transfers are counted as etcd counts them (`etcd_network_snapshot_send_{success,failures}`), and
//! transfers a probe made needless in `keyward_network_snapshot_send_skipped_total`.

use std::io::SeekFrom;
use std::time::{Duration, Instant};

use futures::stream::FuturesOrdered;
use futures::{FutureExt, StreamExt};
use openraft::error::{
    Fatal, InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, ReplicationClosed, StreamingError,
    Unreachable,
};
use openraft::network::RPCOption;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, SnapshotResponse};
use openraft::{AnyError, ErrorSubject, ErrorVerb, OptionalSend, Snapshot, StorageError};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::network::{PeerConnection, Rpc};
use super::quorum_acks::{boot_clock, BootTime};
use crate::metrics;
use crate::raft::{NodeId, TypeConfig};

/// The slowest a chunk may cross the network before its call is given up and sent again.
const TRANSFER_RATE_FLOOR: u64 = 8 << 20;

/// The slowest a follower may install a received snapshot (fsync the file, load every table into
/// LMDB, sync) before the last chunk's call is given up: 2.38 GB installed in 26.7 s (89 MB/s) on
/// the run that found the bug, so the floor leaves a disk ten times slower, or busy, its time.
const INSTALL_RATE_FLOOR: u64 = 8 << 20;

/// Consecutive failed calls after which the attempt ends (openraft's replication tries again later,
/// from where this one got).
const MAX_CONSECUTIVE_FAILURES: u32 = 5;

/// Chunks sent before the first of them is answered: the follower writes one while the next ones
/// cross, where one call at a time left the link idle for each write and each answer (27 MB/s on
/// loopback for a 1 GB snapshot). The follower takes them in order (`snapshot_receiver.rs`).
pub(crate) const CHUNKS_IN_FLIGHT: usize = 4;

/// The chunk size when openraft names none (it always does).
const DEFAULT_CHUNK_SIZE: usize = 4 << 20;

type SnapshotData = <TypeConfig as openraft::RaftTypeConfig>::SnapshotData;
type SendError = StreamingError<TypeConfig, Fatal<NodeId>>;
type ChunkError = RPCError<NodeId, crate::raft::member::MemberNode, RaftError<NodeId, InstallSnapshotError>>;
/// A chunk's answer, or why none came in time.
type ChunkAnswer = Result<Result<openraft::raft::InstallSnapshotResponse<NodeId>, ChunkError>, String>;

/// What the answer to one chunk means for the transfer.
enum Step {
    /// The follower has the bytes up to here; continue.
    Continue(u64),
    /// The follower did not take this chunk: it holds the bytes up to here and expects the next
    /// (`SnapshotMismatch`). Up to the end of the snapshot, when it has every byte and the last
    /// chunk went unanswered or a restart interrupted its install: the empty last chunk there
    /// installs it.
    Resume(u64),
    /// The transfer is over: the snapshot is installed.
    Done(SnapshotResponse<NodeId>),
    /// The follower has seen a higher vote: the transfer ends with it, and openraft steps down.
    HigherVote(openraft::Vote<NodeId>),
    /// The follower has none of it (it restarted, or installed it and the answer was lost).
    Restart,
    /// Nothing was learnt: the chunk goes again after a pause.
    Retry(String),
    /// The follower cannot be reached (its port is closed: it is down). The attempt ends at once,
    /// and openraft's next one, after its backoff, sends its newest snapshot: a transfer that kept
    /// retrying an older one while the leader built newer ones reached a restarted follower with a
    /// snapshot whose log tail the leader had purged meanwhile, and a second transfer followed. How
    /// far the follower got is kept (`resume`) for the next attempt at the same snapshot.
    Unreachable(Unreachable),
    /// The follower failed for good (openraft's `Fatal`): the attempt ends with it.
    Failed(Box<SendError>),
}

/// The follower's answer to the probe.
enum Holds {
    Yes,
    /// It does not, or cannot say.
    No,
    /// The follower has seen a higher vote: the transfer ends with it, and openraft steps down.
    HigherVote(openraft::Vote<NodeId>),
    /// The follower cannot be reached: nothing is sent (`Step::Unreachable`).
    Unreachable(Unreachable),
}

impl PeerConnection {
    /// Sends `snapshot` unless the follower already holds what it covers; see the module doc.
    pub(super) async fn send_snapshot(
        &mut self,
        vote: openraft::Vote<NodeId>,
        snapshot: Snapshot<TypeConfig>,
        cancel: impl std::future::Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<NodeId>, SendError> {
        // The chunks in flight borrow the connection: how far the transfer got is kept aside meanwhile.
        let mut progress = self.resume.take();
        let sent = self.transfer(vote, snapshot, cancel, option, &mut progress).await;
        self.resume = progress;
        sent
    }

    async fn transfer(
        &self,
        vote: openraft::Vote<NodeId>,
        snapshot: Snapshot<TypeConfig>,
        cancel: impl std::future::Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
        progress: &mut Option<(openraft::SnapshotId, u64)>,
    ) -> Result<SnapshotResponse<NodeId>, SendError> {
        let mut cancel = std::pin::pin!(cancel);
        let Snapshot { meta, snapshot: mut data } = snapshot;
        let to = format!("{:x}", self.target);
        let size = data.seek(SeekFrom::End(0)).await.map_err(|e| read_error(&meta, e))?;
        match self.holds(vote, &meta, &option).await {
            Holds::Yes => {
                tracing::info!(peer = to, snapshot = %meta.snapshot_id, "the follower already holds what the snapshot covers: not sent");
                metrics::SNAPSHOT_SEND_SKIPPED.with_label_values(&[&to]).inc();
                return Ok(SnapshotResponse::new(vote));
            }
            Holds::HigherVote(higher) => return Ok(SnapshotResponse::new(higher)),
            Holds::Unreachable(unreachable) => return Err(StreamingError::Unreachable(unreachable)),
            Holds::No => {}
        }
        let started = Instant::now();
        let resume = progress.take().filter(|(id, offset)| *id == meta.snapshot_id && *offset < size);
        // The next byte to send; what is in flight is before it.
        let mut next = resume.map_or(0, |(_, offset)| offset);
        tracing::info!(peer = to, snapshot = %meta.snapshot_id, size, offset = next, "sending a snapshot");
        let chunk_size = option.snapshot_chunk_size().unwrap_or(DEFAULT_CHUNK_SIZE);
        let mut in_flight = FuturesOrdered::new();
        let mut last_queued = false;
        let mut failures = 0;
        loop {
            // Keep the link busy: the next chunks cross while the follower writes this one.
            while in_flight.len() < CHUNKS_IN_FLIGHT && !last_queued {
                let chunk = read_chunk(&mut data, next, chunk_size).await.map_err(|e| read_error(&meta, e))?;
                let offset = next;
                next += chunk.len() as u64;
                last_queued = next == size;
                // Its deadline covers the chunks ahead of it, which the follower writes first.
                let ahead = in_flight.len() * chunk_size;
                let deadline = if last_queued {
                    last_chunk_deadline(&option, size) + at_rate(ahead as u64, TRANSFER_RATE_FLOOR)
                } else {
                    chunk_deadline(&option, ahead + chunk.len())
                };
                let request =
                    InstallSnapshotRequest { vote, meta: meta.clone(), offset, data: chunk, done: last_queued };
                if !in_flight.is_empty() {
                    metrics::SNAPSHOT_CHUNKS_SENT_AHEAD.with_label_values(&[&to]).inc();
                }
                in_flight.push_back(self.send_chunk(request, size, deadline));
            }
            let (request, sent, answer) = tokio::select! {
                closed = cancel.as_mut() => return Err(closed.into()),
                sent = in_flight.next() => match sent {
                    Some(sent) => sent,
                    // Not a storage error: openraft stops the leader's raft core on one of those,
                    // and no answer of a follower may do that. The attempt ends; openraft retries.
                    None => {
                        let error = format!("snapshot transfer at offset {next} of {size} has no chunk left to send");
                        return Err(NetworkError::new(&AnyError::error(error)).into());
                    }
                },
            };
            let expected = request.offset + request.data.len() as u64;
            let step = match answer {
                Ok(answer) => self.step(vote, &request, size, answer, sent),
                Err(reason) => Step::Retry(reason),
            };
            let reason = match step {
                Step::Continue(at) => {
                    *progress = Some((meta.snapshot_id.clone(), at));
                    failures = 0;
                    continue;
                }
                Step::Resume(at) => {
                    *progress = Some((meta.snapshot_id.clone(), at));
                    failures = 0;
                    if at != expected || request.done {
                        // The follower stands elsewhere, or has every byte but did not take the
                        // last chunk: what is in flight is of no use, and the transfer goes on at `at`.
                        in_flight.clear();
                        (next, last_queued) = (at, false);
                    }
                    continue;
                }
                Step::Done(response) => {
                    tracing::info!(peer = to, snapshot = %meta.snapshot_id, size, elapsed = ?started.elapsed(), "snapshot sent and installed");
                    metrics::SNAPSHOT_SEND_SUCCESS.with_label_values(&[&to]).inc();
                    return Ok(response);
                }
                Step::HigherVote(higher) => {
                    tracing::info!(peer = to, snapshot = %meta.snapshot_id, vote = %higher, "the follower has seen a higher vote: transfer ended");
                    return Ok(SnapshotResponse::new(higher));
                }
                Step::Restart => {
                    in_flight.clear();
                    match self.holds(vote, &meta, &option).await {
                        Holds::Yes => {
                            tracing::info!(peer = to, snapshot = %meta.snapshot_id, "the follower holds the snapshot already");
                            metrics::SNAPSHOT_SEND_SUCCESS.with_label_values(&[&to]).inc();
                            return Ok(SnapshotResponse::new(vote));
                        }
                        Holds::HigherVote(higher) => return Ok(SnapshotResponse::new(higher)),
                        Holds::Unreachable(unreachable) => return Err(StreamingError::Unreachable(unreachable)),
                        Holds::No => {
                            tracing::info!(peer = to, snapshot = %meta.snapshot_id, offset = request.offset, "the follower has none of the snapshot: sending it from the start");
                            (next, last_queued) = (0, false);
                            continue;
                        }
                    }
                }
                Step::Retry(reason) => reason,
                Step::Unreachable(unreachable) => return Err(StreamingError::Unreachable(unreachable)),
                Step::Failed(error) => return Err(*error),
            };
            // This chunk goes again, and everything after it.
            in_flight.clear();
            (next, last_queued) = (request.offset, false);
            // A last chunk unanswered may still have been installed: the probe says.
            if request.done {
                match self.holds(vote, &meta, &option).await {
                    Holds::Yes => {
                        tracing::info!(peer = to, snapshot = %meta.snapshot_id, "the last chunk was not answered, but the follower holds the snapshot");
                        metrics::SNAPSHOT_SEND_SUCCESS.with_label_values(&[&to]).inc();
                        return Ok(SnapshotResponse::new(vote));
                    }
                    Holds::HigherVote(higher) => return Ok(SnapshotResponse::new(higher)),
                    Holds::Unreachable(unreachable) => return Err(StreamingError::Unreachable(unreachable)),
                    Holds::No => {}
                }
            }
            failures += 1;
            let offset = request.offset;
            tracing::warn!(peer = to, snapshot = %meta.snapshot_id, offset, failures, reason, "snapshot chunk failed; sending it again");
            if failures >= MAX_CONSECUTIVE_FAILURES {
                metrics::SNAPSHOT_SEND_FAILURES.with_label_values(&[&to]).inc();
                let error = format!("snapshot chunk at offset {offset} failed {failures} times, last: {reason}");
                return Err(NetworkError::new(&AnyError::error(error)).into());
            }
            let pause = Duration::from_millis(50u64 << failures.min(4));
            tokio::select! {
                closed = cancel.as_mut() => return Err(closed.into()),
                () = tokio::time::sleep(pause) => {}
            }
            if let Some(closed) = cancel.as_mut().now_or_never() {
                return Err(closed.into());
            }
        }
    }

    /// One chunk's call (announcing the snapshot's `size`), given up after `deadline`: the request
    /// comes back with when it was sent and the answer (or why there is none).
    async fn send_chunk(
        &self,
        request: InstallSnapshotRequest<TypeConfig>,
        size: u64,
        deadline: Duration,
    ) -> (InstallSnapshotRequest<TypeConfig>, BootTime, ChunkAnswer) {
        let call_option = RPCOption::new(deadline);
        let sent = boot_clock();
        let wire = ChunkOnTheWire::of(&request);
        let call = self.call_announcing(Rpc::InstallSnapshot, &wire, &call_option, Some(size));
        let answer = match tokio::time::timeout(deadline, call).await {
            Ok(answer) => Ok(answer),
            Err(_) => Err(format!("no answer within {deadline:?}")),
        };
        (request, sent, answer)
    }

    /// What the follower's answer to `request` means for the transfer.
    fn step(
        &self,
        vote: openraft::Vote<NodeId>,
        request: &InstallSnapshotRequest<TypeConfig>,
        size: u64,
        answer: Result<openraft::raft::InstallSnapshotResponse<NodeId>, ChunkError>,
        sent: BootTime,
    ) -> Step {
        // A chunk accepted renews the follower's leader lease as an AppendEntries does: it counts
        // towards the leader's quorum (`quorum_acks.rs`), or a leader whose only live follower is
        // receiving a snapshot would step down for want of one.
        if answer.as_ref().is_ok_and(|response| response.vote <= vote) {
            self.acks.accepted(self.target, *vote.leader_id(), sent);
        }
        match answer {
            Ok(response) if response.vote > vote => Step::HigherVote(response.vote),
            Ok(response) if request.done => Step::Done(SnapshotResponse::new(response.vote)),
            Ok(_) => Step::Continue(request.offset + request.data.len() as u64),
            // The follower has another part than this one: continue where it is.
            Err(RPCError::RemoteError(RemoteError {
                source: RaftError::APIError(InstallSnapshotError::SnapshotMismatch(mismatch)),
                ..
            })) => {
                let at = mismatch.expect.offset;
                if at == 0 || mismatch.expect.id != request.meta.snapshot_id || at > size {
                    return Step::Restart;
                }
                tracing::info!(
                    peer = format!("{:x}", self.target),
                    offset = request.offset,
                    resume_at = at,
                    "the follower continues the snapshot elsewhere"
                );
                Step::Resume(at)
            }
            Err(RPCError::RemoteError(RemoteError { target, target_node, source: RaftError::Fatal(fatal) })) => {
                metrics::SNAPSHOT_SEND_FAILURES.with_label_values(&[&format!("{:x}", self.target)]).inc();
                Step::Failed(Box::new(RemoteError { target, target_node, source: fatal }.into()))
            }
            Err(RPCError::Unreachable(unreachable)) => Step::Unreachable(unreachable),
            Err(e) => Step::Retry(e.to_string()),
        }
    }

    /// Whether the follower holds the log up to the snapshot's last entry (in its log, or committed),
    /// asked with an AppendEntries that carries no entry.
    async fn holds(
        &self,
        vote: openraft::Vote<NodeId>,
        meta: &openraft::SnapshotMeta<NodeId, crate::raft::member::MemberNode>,
        option: &RPCOption,
    ) -> Holds {
        let Some(last) = meta.last_log_id else { return Holds::No };
        let probe =
            AppendEntriesRequest::<TypeConfig> { vote, prev_log_id: Some(last), entries: vec![], leader_commit: None };
        // Answered by the follower's raft core, not its disk: a second beyond openraft's timeout.
        let deadline = option.hard_ttl() + Duration::from_secs(1);
        let call_option = RPCOption::new(deadline);
        let call =
            self.call::<_, AppendEntriesResponse<NodeId>, RaftError<NodeId>>(Rpc::AppendEntries, &probe, &call_option);
        match tokio::time::timeout(deadline, call).await {
            Ok(Ok(AppendEntriesResponse::Success)) => Holds::Yes,
            Ok(Ok(AppendEntriesResponse::HigherVote(higher))) => Holds::HigherVote(higher),
            Ok(Err(RPCError::Unreachable(unreachable))) => Holds::Unreachable(unreachable),
            _ => Holds::No,
        }
    }
}

/// openraft's `InstallSnapshotRequest` as postcard encodes it, field for field, with its bytes
/// encoded whole: postcard writes a `Vec<u8>` and a byte string alike (a length, then the bytes), but
/// serde hands a `Vec<u8>` over one byte at a time. The follower decodes it as the request itself.
#[derive(serde::Serialize)]
pub(super) struct ChunkOnTheWire<'a> {
    vote: &'a openraft::Vote<NodeId>,
    meta: &'a openraft::SnapshotMeta<NodeId, crate::raft::member::MemberNode>,
    offset: u64,
    #[serde(with = "serde_bytes")]
    data: &'a [u8],
    done: bool,
}

impl<'a> ChunkOnTheWire<'a> {
    pub(super) fn of(request: &'a InstallSnapshotRequest<TypeConfig>) -> Self {
        let InstallSnapshotRequest { vote, meta, offset, data, done } = request;
        ChunkOnTheWire { vote, meta, offset: *offset, data, done: *done }
    }
}

/// A chunk's deadline: openraft's per-RPC timeout and a second (a member just restarted answers its
/// first chunk only once its state machine opens the file to receive into), plus its bytes at the
/// floor rate.
fn chunk_deadline(option: &RPCOption, len: usize) -> Duration {
    option.hard_ttl() + Duration::from_secs(1) + at_rate(len as u64, TRANSFER_RATE_FLOOR)
}

/// The last chunk's deadline also covers the install of the whole snapshot of `size` bytes.
fn last_chunk_deadline(option: &RPCOption, size: u64) -> Duration {
    option.hard_ttl() + at_rate(size, INSTALL_RATE_FLOOR)
}

/// How long a follower that accepted a chunk waits for the next before it may campaign
/// (`raft/election_timer.rs`): the longest a chunk of `chunk` bytes may take to cross here, beyond
/// openraft's per-RPC timeout (its `install_snapshot_timeout`, 200 ms), covered by an election timeout.
pub(crate) fn next_chunk_patience(chunk: usize, election_timeout: Duration) -> Duration {
    election_timeout + Duration::from_secs(1) + at_rate(chunk as u64, TRANSFER_RATE_FLOOR)
}

/// How long a chunk `ahead` bytes past the end of what the follower received waits there for the
/// chunks before it: longer than the leader gives them to cross (its call ends first when they do
/// not, and with it the wait), so that a chunk is not refused while the one before it is written on
/// a busy disk.
pub(crate) fn ahead_patience(ahead: u64) -> Duration {
    Duration::from_secs(5) + at_rate(ahead, TRANSFER_RATE_FLOOR)
}

fn at_rate(bytes: u64, per_second: u64) -> Duration {
    Duration::from_secs_f64(bytes as f64 / per_second as f64)
}

/// Up to `len` bytes of the snapshot from `offset`.
async fn read_chunk(data: &mut SnapshotData, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
    data.seek(SeekFrom::Start(offset)).await?;
    let mut chunk = Vec::with_capacity(len);
    while chunk.len() < len {
        if data.read_buf(&mut chunk).await? == 0 {
            break;
        }
    }
    Ok(chunk)
}

fn read_error(meta: &openraft::SnapshotMeta<NodeId, crate::raft::member::MemberNode>, e: std::io::Error) -> SendError {
    StorageError::from_io_error(ErrorSubject::Snapshot(Some(meta.signature())), ErrorVerb::Read, e).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_chunk_waits_for_the_install_of_the_whole_snapshot() {
        let option = RPCOption::new(Duration::from_millis(200));
        assert_eq!(chunk_deadline(&option, 4 << 20), Duration::from_millis(1_700));
        // 2.38 GB: the install measured 26.7 s, the deadline leaves ten times that.
        let deadline = last_chunk_deadline(&option, 2_380_000_000);
        assert!(deadline > Duration::from_secs(267), "{deadline:?}");
        assert_eq!(last_chunk_deadline(&option, 0), Duration::from_millis(200));
    }
}
