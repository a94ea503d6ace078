//! The kv file's dirty pages are written back while the member runs (`storage/paced_writeback.rs`),
//! not left for the kernel to write in one burst when they expire.

use super::snapshot_tests::put;
use super::*;
use crate::storage::paced_writeback::dirty_pages;

/// Applies several MiB of puts to a new state written as `writes` says, lets the write-back walk the
/// file twice, and returns the pages of `data.mdb` still dirty (`None`: the kernel cannot tell).
fn dirty_after_applies_and_two_walks(writes: Writes) -> Option<u64> {
    let dir = tempfile::tempdir().unwrap();
    let space = Arc::new(Space::without_ballast());
    let machine = StateMachine::open_writing(&dir.path().join("kv"), &dir.path().join("snap"), space, Some(writes))
        .expect("open");
    let state = machine.state();
    let value = vec![b'v'; 4 << 10];
    for index in 1..=16 {
        let requests = (0..64).map(|i| put(format!("k{index:02}/{i:03}").as_bytes(), &value, 0)).collect();
        assert!(state.apply_requests(index, requests).iter().all(Result::is_ok));
    }
    // Nothing commits from here on: a walk that starts after this point leaves the file clean.
    let walks = state.writeback.passes();
    state.writeback.wait_for_passes(walks + 2);
    dirty_pages(&std::fs::File::open(state.dir().join("data.mdb")).unwrap())
}

/// Without the write-back the 4 MiB applied stay dirty until the kernel's flusher finds them 30 s
/// old, and then go to the disk in one burst with everything else that expired.
#[test]
fn applied_pages_are_written_back_without_a_sync() {
    for writes in [Writes::Mapped, Writes::Copied] {
        match dirty_after_applies_and_two_walks(writes) {
            None => {
                eprintln!("skipping: this kernel has no cachestat");
                return;
            }
            Some(dirty) => assert_eq!(dirty, 0, "{writes:?}: {dirty} pages of data.mdb still dirty"),
        }
    }
}
