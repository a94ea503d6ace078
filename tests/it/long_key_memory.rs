//! A key as long as a request may be (1 MiB and more) costs memory in proportion to its length, not
//! to its length squared.
//!
//! A key longer than LMDB's 511 bytes is stored in chunks, one level of groups per chunk
//! (`src/storage/table.rs`): a 1 MiB key is some 2,000 levels deep. A walk that held its own copy of
//! the prefix above each level held about a gigabyte to seek to such a key, and copied as much: a
//! `del` of a 1 MiB key took over 7 s to apply and its client got `request timed out` (found by
//! `limits::long_keys_through_etcdctl` on a busy machine). The apply's peak heap is measured here with
//! the counting allocator (`common/heap.rs`), in a process of its own.

use keyward::proto::etcdserverpb::request_op::Request;
use keyward::proto::etcdserverpb::{
    DeleteRangeRequest, InternalRaftBatch, InternalRaftRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use keyward::{Entry, LogId, RaftBatch, StateMachine};
use openraft::storage::RaftStateMachine;
use openraft::{CommittedLeaderId, EntryPayload};

use crate::common;
use crate::common::heap::peak_growth;

const MIB: usize = 1 << 20;

/// Applies `request` as raft entry `index`; it must succeed.
async fn apply(sm: &mut StateMachine, index: u64, request: InternalRaftRequest) {
    let entry = Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(RaftBatch::new(InternalRaftBatch { requests: vec![request] })),
    };
    let results = sm.apply([entry]).await.expect("apply");
    assert!(results[0].iter().all(Result::is_ok), "entry {index}: {:?}", results[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_and_deleting_a_mebibyte_key_holds_a_few_copies_of_it() {
    if common::alone::elsewhere("long_key_memory::reading_and_deleting_a_mebibyte_key_holds_a_few_copies_of_it") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut sm = StateMachine::open(&dir.path().join("kv"), &dir.path().join("snap")).expect("open");
    let key: Vec<u8> = b"k/".iter().copied().chain((0..MIB - 2).map(|i| b'a' + (i % 26) as u8)).collect();
    let put = |value: &[u8]| InternalRaftRequest {
        put: Some(Box::new(PutRequest { key: key.clone(), value: value.to_vec(), ..Default::default() })),
        ..Default::default()
    };
    // Two versions: the delete moves the second into the history, which is sought by the key.
    apply(&mut sm, 1, put(b"v1")).await;
    apply(&mut sm, 2, put(b"v2")).await;

    // A prefix range whose start is the whole key: the walk descends every level of it.
    let mut range_end = key.clone();
    *range_end.last_mut().unwrap() += 1;
    let read = InternalRaftRequest {
        txn: Some(Box::new(TxnRequest {
            success: vec![RequestOp {
                request: Some(Request::RequestRange(RangeRequest {
                    key: key.clone(),
                    range_end,
                    ..Default::default()
                })),
            }],
            ..Default::default()
        })),
        ..Default::default()
    };
    let ((), read_peak) = peak_growth(apply(&mut sm, 3, read)).await;
    let delete = InternalRaftRequest {
        delete_range: Some(Box::new(DeleteRangeRequest { key: key.clone(), prev_kv: true, ..Default::default() })),
        ..Default::default()
    };
    let ((), delete_peak) = peak_growth(apply(&mut sm, 4, delete)).await;

    println!("a {MIB}-byte key: heap peak of a prefix range +{read_peak}, of its delete +{delete_peak}");
    // The request, the result, an event and the key rebuilt from its chunks: a few copies at most.
    let bound = 16 * MIB;
    assert!(read_peak < bound, "a range over a {MIB}-byte key held {read_peak} bytes");
    assert!(delete_peak < bound, "deleting a {MIB}-byte key held {delete_peak} bytes");
}
