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
    let writeback = state.writeback.as_ref().expect("a member's environment is written back");
    let walks = writeback.passes();
    writeback.wait_for_passes(walks + 2);
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

/// Whether the map of `data.mdb` under `dir` is advised for random access (`rr` in its `VmFlags`,
/// `/proc/self/smaps`): no readahead into it, so no large folio of pages faulted in order.
fn map_reads_at_random(dir: &std::path::Path) -> bool {
    let file = dir.join("data.mdb");
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut lines = smaps.lines().skip_while(|line| !line.ends_with(file.to_str().unwrap()));
    lines.find(|line| line.starts_with("VmFlags:")).is_some_and(|flags| flags.split_whitespace().any(|f| f == "rr"))
}

/// The kv map is read without readahead (`storage::open_with`: LMDB's `MDB_NORDAHEAD`, advice
/// `MADV_RANDOM`), before and after a remap. With readahead, ext4 (Linux 6.16 and later) reads pages
/// faulted in order into folios of up to 2 MiB, and one page changed through the map marks its whole
/// folio dirty, all of it written back (measured on this kernel: 3 one-byte writes through a map,
/// 3.2-6.3 MB written; with `pwrite`, 12 KB). This test's own load did not build large folios, so it
/// checks the advice, which fails on any Linux if the flag is dropped.
#[test]
fn the_kv_map_is_read_without_readahead_so_a_changed_page_dirties_no_whole_folio() {
    let dir = tempfile::tempdir().unwrap();
    let space = Arc::new(Space::without_ballast());
    let machine =
        StateMachine::open_writing(&dir.path().join("kv"), &dir.path().join("snap"), space, Some(Writes::Mapped))
            .expect("open");
    let state = machine.state();
    if state.writes() != Writes::Mapped {
        eprintln!("skipping: this file system gets copied writes");
        return;
    }
    assert!(map_reads_at_random(state.dir()), "the kv map is read ahead: changed pages dirty whole folios");
    // Enough to grow the map (a remap maps the file anew: LMDB advises the new map too).
    let reserved = state.mapping.reserved();
    let value = vec![b'v'; 4 << 10];
    for index in 1..=32 {
        let requests = (0..64).map(|i| put(format!("k{index:02}/{i:03}").as_bytes(), &value, 0)).collect();
        assert!(state.apply_requests(index, requests).iter().all(Result::is_ok));
    }
    assert_ne!(state.mapping.reserved(), reserved, "the map did not grow");
    assert!(map_reads_at_random(state.dir()), "after a remap, the kv map is read ahead");
}
