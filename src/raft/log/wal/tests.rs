//! The segment log: format, recovery, segment boundaries, migration.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use openraft::storage::RaftLogStorage;
use openraft::{CommittedLeaderId, EntryPayload, RaftLogReader, Vote};

use super::segment::{self, frame, read_frame, Frame, Record, RecordRef, State, SYNC_CHUNK};
use super::*;
use crate::proto::etcdserverpb::{InternalRaftBatch, InternalRaftRequest, PutRequest};
use crate::raft::RaftBatch;

/// Small segments, so that a few entries cross segment boundaries.
const SMALL: u64 = 4096;

fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

/// An entry with a put of `value_len` bytes, so its size is known.
fn entry(term: u64, index: u64, value_len: usize) -> Entry {
    let put = PutRequest { key: format!("k{index}").into(), value: vec![b'v'; value_len], ..Default::default() };
    let req = InternalRaftRequest { put: Some(Box::new(put)), ..Default::default() };
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(RaftBatch::new(InternalRaftBatch { requests: vec![req] })),
    }
}

fn open(dir: &Path) -> Wal {
    Wal::open_sized(dir, Arc::new(Space::without_ballast()), SMALL).unwrap()
}

async fn ids(log: &mut Wal) -> Vec<(u64, u64)> {
    let entries = log.try_get_log_entries(0..).await.unwrap();
    entries.iter().map(|e| (e.log_id.leader_id.term, e.log_id.index)).collect()
}

fn segment_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| segment::parse_name(n).is_some())
        .collect();
    names.sort();
    names
}

#[test]
fn frames_round_trip_and_damage_is_told_apart() {
    let e = entry(2, 7, 10);
    let state =
        State { vote: Some(Vote::new(3, 1)), committed: Some(log_id(2, 5)), last_purged: None, identity: Some((9, 8)) };
    let mut buf = Vec::new();
    frame(&RecordRef::Entry(&e), &mut buf).unwrap();
    let first_end = buf.len();
    frame(&RecordRef::Truncate { from: 4 }, &mut buf).unwrap();
    let second_end = buf.len();
    frame(&RecordRef::State(&state), &mut buf).unwrap();
    let mut offset = 0;
    let mut records = Vec::new();
    while let Frame::Valid { payload, next } = read_frame(&buf, offset) {
        records.push(segment::decode(payload).unwrap());
        offset = next;
    }
    assert_eq!(offset, buf.len());
    assert!(matches!(&records[0], Record::Entry(got) if *got == e));
    assert!(matches!(records[1], Record::Truncate { from: 4 }));
    assert!(matches!(&records[2], Record::State(got) if *got == state));
    assert_eq!(read_frame(&buf, buf.len()), Frame::End, "past the end");
    let mut zeros = buf.clone();
    zeros.extend_from_slice(&[0; 16]);
    assert_eq!(read_frame(&zeros, buf.len()), Frame::End, "a zero header ends the records");
    let mut flipped = buf.clone();
    flipped[first_end + 9] ^= 1;
    assert_eq!(read_frame(&flipped, first_end), Frame::BadCrc { next: second_end });
    assert_eq!(
        read_frame(&buf[..second_end - 1], first_end),
        Frame::Short { len: (second_end - first_end - 8) as u32 }
    );
    // A huge length from disk is only compared with the bytes there are: no allocation follows it.
    let mut huge = buf.clone();
    huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(read_frame(&huge, 0), Frame::Short { len: u32::MAX });
}

#[tokio::test]
async fn every_operation_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = open(dir.path());
        log.append_now(&(0..=20).map(|i| entry(1, i, 100)).collect::<Vec<_>>()).unwrap();
    }
    let mut log = open(dir.path());
    assert_eq!(ids(&mut log).await, (0..=20).map(|i| (1, i)).collect::<Vec<_>>());
    log.save_vote(&Vote::new(4, 2)).await.unwrap();
    drop(log);
    let mut log = open(dir.path());
    assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(4, 2)));
    log.truncate(log_id(1, 15)).await.unwrap();
    drop(log);
    let mut log = open(dir.path());
    assert_eq!(ids(&mut log).await.last(), Some(&(1, 14)));
    let (from, to) = (9, 3); // openraft may compute an inverted range
    assert!(log.try_get_log_entries(from..to).await.unwrap().is_empty(), "an inverted range is empty");
    assert!(log.try_get_log_entries(3..3).await.unwrap().is_empty());
    log.append_now(&[entry(4, 15, 100), entry(4, 16, 100)]).unwrap();
    log.purge(log_id(1, 5)).await.unwrap();
    drop(log);
    let mut log = open(dir.path());
    let mut expected: Vec<(u64, u64)> = (6..=14).map(|i| (1, i)).collect();
    expected.extend([(4, 15), (4, 16)]);
    assert_eq!(ids(&mut log).await, expected);
    let state = log.get_log_state().await.unwrap();
    assert_eq!((state.last_purged_log_id, state.last_log_id), (Some(log_id(1, 5)), Some(log_id(4, 16))));
    log.set_identity((11, 22)).unwrap();
    drop(log);
    let log = open(dir.path());
    assert_eq!(log.identity().unwrap(), Some((11, 22)));
    assert_eq!(log.state().vote, Some(Vote::new(4, 2)), "each state record carries the whole state");
}

#[tokio::test]
async fn the_committed_id_is_written_with_the_next_write_only() {
    let dir = tempfile::tempdir().unwrap();
    let committed = Some(log_id(1, 3));
    {
        let mut log = open(dir.path());
        log.save_committed(committed).await.unwrap();
        assert_eq!(log.read_committed().await.unwrap(), committed);
        assert_eq!(log.state().committed, None, "no write of its own");
        log.save_vote(&Vote::new(1, 1)).await.unwrap();
        assert_eq!(log.state().committed, committed);
        log.save_committed(Some(log_id(1, 2))).await.unwrap();
        assert_eq!(log.read_committed().await.unwrap(), committed, "never backwards");
    }
    let mut reopened = open(dir.path());
    assert_eq!(reopened.read_committed().await.unwrap(), committed, "read back after a restart");
}

/// Appends `entries` and returns the active segment's path and the offset where the next write goes.
fn tail(log: &Wal) -> (std::path::PathBuf, u64) {
    let writer = lock(&log.inner.writer);
    (writer.active.path.clone(), writer.end)
}

fn write_at(path: &Path, offset: u64, bytes: &[u8]) {
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.write_all_at(bytes, offset).unwrap();
}

#[tokio::test]
async fn a_torn_write_at_the_end_is_cut_and_the_log_goes_on() {
    // Three shapes of an interrupted write: half a frame, a frame with pages missing, and a frame
    // whose first page (its header) never reached the disk.
    for shape in ["half", "hole", "headless"] {
        let dir = tempfile::tempdir().unwrap();
        let (path, end) = {
            let log = open(dir.path());
            log.append_now(&[entry(1, 1, 50), entry(1, 2, 50)]).unwrap();
            tail(&log)
        };
        let mut torn = Vec::new();
        frame(&RecordRef::Entry(&entry(1, 3, 300)), &mut torn).unwrap();
        match shape {
            "half" => torn.truncate(torn.len() / 2),
            "hole" => torn[100..200].fill(0),
            _ => torn[..64].fill(0),
        }
        write_at(&path, end, &torn);
        let mut log = open(dir.path());
        assert_eq!(ids(&mut log).await, vec![(1, 1), (1, 2)], "{shape}");
        let (_, reopened_end) = tail(&log);
        assert_eq!(reopened_end, end, "{shape}: appends go where the torn write was");
        log.append_now(&[entry(1, 3, 10)]).unwrap();
        drop(log);
        let mut log = open(dir.path());
        assert_eq!(ids(&mut log).await, vec![(1, 1), (1, 2), (1, 3)], "{shape}: nothing of the torn write is left");
    }
}

#[tokio::test]
async fn corruption_before_the_end_is_an_error_naming_file_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = open(dir.path());
        for i in 1..=30 {
            log.append_now(&[entry(1, i, 400)]).unwrap();
        }
    }
    let files = segment_files(dir.path());
    assert!(files.len() >= 3, "{files:?}");
    let first = dir.path().join(&files[0]);
    let mut bytes = std::fs::read(&first).unwrap();
    bytes[20] ^= 0x40; // inside the first entry's payload
    std::fs::write(&first, &bytes).unwrap();
    let err =
        Wal::open_sized(dir.path(), Arc::new(Space::without_ballast()), SMALL).err().expect("corruption is an error");
    let message = err.to_string();
    assert!(message.contains(&files[0]) && message.contains("offset 0"), "{message}");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
}

#[test]
fn a_bad_frame_followed_by_more_than_one_sync_of_data_is_corruption() {
    let mut bytes = Vec::new();
    frame(&RecordRef::Entry(&entry(1, 1, 10)), &mut bytes).unwrap();
    let bad = bytes.len();
    frame(&RecordRef::Entry(&entry(1, 2, 10)), &mut bytes).unwrap();
    bytes[bad + 10] ^= 1;
    bytes.resize(bad + SYNC_CHUNK + 100, 0);
    let stop = read_frame(&bytes, bad);
    assert!(matches!(stop, Frame::BadCrc { .. }));
    // Only zeros after it: a torn write.
    assert!(recover_torn(&bytes, bad, &stop).is_ok());
    // Data more than one sync's bytes further on was acknowledged: never dropped silently.
    let far = bytes.len() - 1;
    bytes[far] = 1;
    let stop = read_frame(&bytes, bad);
    let err = recover_torn(&bytes, bad, &stop).unwrap_err();
    assert!(err.to_string().contains(&format!("offset {bad}")), "{err}");
}

fn recover_torn(bytes: &[u8], offset: usize, stop: &Frame<'_>) -> std::io::Result<Option<usize>> {
    super::recover::torn_tail(Path::new("seg"), bytes, offset, stop)
}

#[tokio::test]
async fn truncate_and_purge_across_segment_boundaries() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut log = open(dir.path());
        for i in 0..40 {
            log.append_now(&[entry(1, i, 300)]).unwrap();
        }
        let before = segment_files(dir.path()).len();
        assert!(before >= 4, "{before}");
        // A new leader's conflicting entries from index 5 on: back into the first segments.
        log.truncate(log_id(1, 5)).await.unwrap();
        log.append_now(&(5..12).map(|i| entry(2, i, 300)).collect::<Vec<_>>()).unwrap();
    }
    let mut log = open(dir.path());
    let mut expected: Vec<(u64, u64)> = (0..5).map(|i| (1, i)).collect();
    expected.extend((5..12).map(|i| (2, i)));
    assert_eq!(ids(&mut log).await, expected, "the truncated entries stay gone after a reopen");
    let before = segment_files(dir.path());
    log.purge(log_id(2, 9)).await.unwrap();
    let after = segment_files(dir.path());
    assert!(after.len() < before.len(), "whole purged segments are deleted: {before:?} → {after:?}");
    assert_eq!(ids(&mut log).await, vec![(2, 10), (2, 11)]);
    drop(log);
    let mut log = open(dir.path());
    assert_eq!(ids(&mut log).await, vec![(2, 10), (2, 11)]);
    let state = log.get_log_state().await.unwrap();
    assert_eq!((state.last_purged_log_id, state.last_log_id), (Some(log_id(2, 9)), Some(log_id(2, 11))));
    // Purged past the end (a snapshot install): the log is empty and goes on after it.
    log.purge(log_id(3, 50)).await.unwrap();
    log.append_now(&[entry(3, 51, 10)]).unwrap();
    drop(log);
    let mut log = open(dir.path());
    assert_eq!(ids(&mut log).await, vec![(3, 51)]);
    assert_eq!(log.get_log_state().await.unwrap().last_purged_log_id, Some(log_id(3, 50)));
}

#[tokio::test]
async fn a_purged_segment_back_after_a_crash_is_purged_again_but_a_lost_one_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let saved = tempfile::tempdir().unwrap();
    {
        let mut log = open(dir.path());
        for i in 0..40 {
            log.append_now(&[entry(1, i, 300)]).unwrap();
        }
        for name in segment_files(dir.path()) {
            std::fs::copy(dir.path().join(&name), saved.path().join(&name)).unwrap();
        }
        log.purge(log_id(1, 30)).await.unwrap();
    }
    let kept = segment_files(dir.path());
    let all = segment_files(saved.path());
    let gone: Vec<&String> = all.iter().filter(|n| !kept.contains(n)).collect();
    assert!(gone.len() >= 2, "{gone:?}");
    // The unlinks were not synced: the oldest comes back, the next one does not (a gap).
    std::fs::copy(saved.path().join(gone[0]), dir.path().join(gone[0])).unwrap();
    let mut log = open(dir.path());
    assert_eq!(ids(&mut log).await, (31..40).map(|i| (1, i)).collect::<Vec<_>>());
    assert!(!dir.path().join(gone[0]).exists(), "purged again at open");
    drop(log);
    // A segment with live entries lost between others: never silently skipped.
    let dir = tempfile::tempdir().unwrap();
    {
        let log = open(dir.path());
        for i in 0..40 {
            log.append_now(&[entry(1, i, 300)]).unwrap();
        }
    }
    let files = segment_files(dir.path());
    std::fs::remove_file(dir.path().join(&files[1])).unwrap();
    let err = Wal::open_sized(dir.path(), Arc::new(Space::without_ballast()), SMALL).err().expect("a missing segment");
    assert!(err.to_string().contains("missing"), "{err}");
}

#[tokio::test]
async fn a_failed_write_leaves_no_half_record() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path());
    log.append_now(&[entry(1, 1, 50)]).unwrap();
    let (path, end) = tail(&log);
    // What a write cut short by a full disk leaves behind, undone the way a failed write undoes it.
    write_at(&path, end, &[0xAB; 300]);
    lock(&log.inner.writer).active.zero_from(end).unwrap();
    log.append_now(&[entry(1, 2, 10)]).unwrap();
    drop(log);
    let mut log = open(dir.path());
    assert_eq!(ids(&mut log).await, vec![(1, 1), (1, 2)]);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), SMALL, "the segment keeps its size");
}

#[tokio::test]
async fn a_record_larger_than_a_segment_gets_a_segment_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = open(dir.path());
        log.append_now(&[entry(1, 1, 10), entry(1, 2, 3 * SMALL as usize), entry(1, 3, 10)]).unwrap();
    }
    let mut log = open(dir.path());
    assert_eq!(ids(&mut log).await, vec![(1, 1), (1, 2), (1, 3)]);
}

#[tokio::test]
async fn an_lmdb_log_is_migrated_once_and_set_aside() {
    use crate::raft::log::legacy::LegacyLog;
    let member = tempfile::tempdir().unwrap();
    let legacy = member.path().join(migrate::LEGACY_DIR);
    let entries: Vec<Entry> = (0..=2000).map(|i| entry(1 + i / 1000, i, 20)).collect();
    {
        // Entries as `LegacyLog` keeps them (big-endian index → postcard entry; `LegacyLog` has no append
        // without openraft's callback, which only openraft can make); the rest through `LegacyLog`,
        // which also reads them all back below.
        let (env, [log, _meta]) =
            crate::storage::open(&legacy, ["log", "meta"], crate::storage::Durability::Full).unwrap();
        let mut txn = env.write_txn().unwrap();
        for e in &entries {
            log.put(&mut txn, &e.log_id.index.to_be_bytes(), &postcard::to_allocvec(e).unwrap()).unwrap();
        }
        txn.commit().unwrap();
    }
    {
        let mut old = LegacyLog::open(&legacy).unwrap();
        assert_eq!(old.try_get_log_entries(0..).await.unwrap(), entries, "the fixture reads back through LegacyLog");
        old.save_vote(&Vote::new(7, 3)).await.unwrap();
        old.set_identity((3, 99)).unwrap();
        old.purge(log_id(1, 10)).await.unwrap();
        old.save_committed(Some(log_id(2, 1500))).await.unwrap();
        old.truncate(log_id(2, 1900)).await.unwrap(); // also writes the committed id
    }
    // A migration a crash interrupted leaves a half-written temp directory: it is redone.
    std::fs::create_dir_all(member.path().join("wal.migrating")).unwrap();
    std::fs::write(member.path().join("wal.migrating").join(segment::file_name(0)), b"junk").unwrap();
    let space = || Arc::new(Space::without_ballast());
    let mut log = migrate::open_member(member.path(), space()).await.unwrap();
    let check = |state: State| {
        assert_eq!(state.vote, Some(Vote::new(7, 3)));
        assert_eq!(state.identity, Some((3, 99)));
        assert_eq!(state.committed, Some(log_id(2, 1500)));
        assert_eq!(state.last_purged, Some(log_id(1, 10)));
    };
    check(log.state());
    let got = log.try_get_log_entries(0..).await.unwrap();
    assert_eq!(got, entries[11..1900].to_vec());
    assert!(!legacy.exists(), "the LMDB log is set aside");
    assert!(member.path().join(migrate::MIGRATED_DIR).join("data.mdb").exists());
    assert!(!member.path().join("wal.migrating").exists());
    drop(log);
    // Opened again: the migrated log, nothing migrated twice.
    let mut log = migrate::open_member(member.path(), space()).await.unwrap();
    check(log.state());
    assert_eq!(log.try_get_log_entries(0..).await.unwrap().len(), 1889);
    drop(log);
    // A crash between the two renames: the LMDB log is only set aside.
    std::fs::rename(member.path().join(migrate::MIGRATED_DIR), &legacy).unwrap();
    let log = migrate::open_member(member.path(), space()).await.unwrap();
    check(log.state());
    assert!(!legacy.exists());
}

#[tokio::test]
async fn no_write_follows_a_failed_write_that_could_not_be_undone() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path());
    log.append_now(&[entry(1, 1, 10)]).unwrap();
    {
        // A file the writer can neither write nor cut: the write fails and so does its undoing.
        let mut writer = lock(&log.inner.writer);
        writer.active.file = Arc::new(std::fs::File::open(&writer.active.path).unwrap());
    }
    assert!(log.append_now(&[entry(1, 2, 10)]).is_err());
    let err = log.append_now(&[entry(1, 2, 10)]).unwrap_err();
    assert!(err.to_string().contains("could not be undone"), "{err}");
    drop(log);
    let mut log = open(dir.path());
    assert_eq!(ids(&mut log).await, vec![(1, 1)]);
}

// --- the leader's own appends: submitted, written behind the caller's back, in order -------------

/// Holds the log's writer thread until the returned sender is dropped or sent to.
fn hold_writer(log: &Wal) -> std::sync::mpsc::Sender<()> {
    let (release, hold) = std::sync::mpsc::channel::<()>();
    log.inner
        .queue
        .submit(move || {
            let _ = hold.recv();
        })
        .unwrap();
    release
}

/// Waits (yielding to the runtime) until the log serves `index`, durable or not.
async fn until_readable(log: &mut Wal, index: u64) {
    while log.try_get_log_entries(index..=index).await.unwrap().is_empty() {
        tokio::task::yield_now().await;
    }
}

fn last_durable(log: &Wal) -> Option<u64> {
    let index = lock(&log.inner.index);
    index.entries.keys().next_back().copied()
}

#[tokio::test]
async fn a_leaders_entries_are_served_before_they_are_durable_and_become_durable_after() {
    use openraft::storage::RaftLogStorageExt;
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path());
    log.set_identity((1, 99)).unwrap(); // the entries' leader (node 1) is this member
    log.append_now(&[entry(1, 1, 10), entry(1, 2, 10), entry(1, 3, 10)]).unwrap();

    let release = hold_writer(&log);
    let mut appending = log.clone();
    let appended = tokio::spawn(async move { appending.blocking_append([entry(1, 4, 10), entry(1, 5, 10)]).await });
    until_readable(&mut log, 5).await;
    assert_eq!(last_durable(&log), Some(3), "4 and 5 wait behind the held writer");
    // Replication reads from where a follower is: the files hold 1..=3, the cache the rest.
    let served: Vec<u64> = log.try_get_log_entries(1..6).await.unwrap().iter().map(|e| e.log_id.index).collect();
    assert_eq!(served, vec![1, 2, 3, 4, 5], "entries not yet durable are served after the durable ones");

    release.send(()).unwrap();
    appended.await.unwrap().unwrap();
    assert_eq!(last_durable(&log), Some(5));
    drop(log);
    assert_eq!(ids(&mut open(dir.path())).await, vec![(1, 1), (1, 2), (1, 3), (1, 4), (1, 5)]);
}

#[tokio::test]
async fn writes_reach_the_disk_in_the_order_they_were_made() {
    use openraft::storage::RaftLogStorageExt;
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path());
    log.set_identity((1, 99)).unwrap();
    log.append_now(&[entry(1, 1, 10), entry(1, 2, 10)]).unwrap();

    // The leader's append is still queued when a new leader's truncation (a later term) arrives: the
    // truncation must not overtake it, or the append would bring back what it removed.
    let release = hold_writer(&log);
    let mut appending = log.clone();
    let appended = tokio::spawn(async move { appending.blocking_append([entry(1, 3, 10), entry(1, 4, 10)]).await });
    until_readable(&mut log, 4).await;
    let mut truncating = log.clone();
    let truncated = tokio::spawn(async move { truncating.truncate(log_id(1, 4)).await });
    while log.inner.queue.pending() < 3 {
        tokio::task::yield_now().await; // the hold, the append and the truncation are all queued
    }
    release.send(()).unwrap();
    appended.await.unwrap().unwrap();
    truncated.await.unwrap().unwrap();
    assert_eq!(last_durable(&log), Some(3));
    drop(log);
    assert_eq!(ids(&mut open(dir.path())).await, vec![(1, 1), (1, 2), (1, 3)]);
}
