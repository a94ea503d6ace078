//! The space the kv tables take per key (issue 30): loads shaped like `benches/store-scale.sh`'s
//! (16-byte keys written in order by many clients, so arriving slightly out of order; 100-byte values)
//! into a fresh store, and the pages each table then holds, against a bound derived from etcd's figure;
//! and the same for a candidate index of kv layout 4 (`candidate_layout_4_index`), under the order a
//! real load's keys arrived in.

use super::store::KvStore;
use crate::keyrange::KeyRange;
use crate::storage::LmdbEnv;

/// The pages of one table (and of the environment's `long_keys`, which holds nothing for short keys).
#[derive(Debug, Clone, Copy)]
struct Pages {
    leaf: usize,
    branch: usize,
    overflow: usize,
    entries: usize,
}

impl Pages {
    fn bytes(&self) -> usize {
        (self.leaf + self.branch + self.overflow) * 4096
    }
}

fn pages(env: &LmdbEnv, db: crate::storage::Db) -> Pages {
    let txn = env.read_txn().unwrap();
    let stat = db.stat(&txn).unwrap();
    Pages { leaf: stat.leaf_pages, branch: stat.branch_pages, overflow: stat.overflow_pages, entries: stat.entries }
}

/// The key `benches/store-scale.sh` gives the `i`-th put: `keyward-bench`'s `--prefix` then the
/// zero-padded index, 16 bytes in all.
fn bench_key(prefix: &str, i: usize) -> Vec<u8> {
    format!("{prefix}{i:0width$}", width = 16 - prefix.len()).into_bytes()
}

/// Writes keys `0..n` once, in windows of `clients` keys applied as one group-committed batch each
/// and shuffled within it (many clients sending the next keys at once), one revision per key.
fn load(env: &LmdbEnv, store: &KvStore, prefix: &str, n: usize, clients: usize, seed: u64) {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let value = vec![b'v'; 100];
    let mut order: Vec<usize> = Vec::with_capacity(clients);
    for start in (0..n).step_by(clients) {
        order.clear();
        order.extend(start..(start + clients).min(n));
        order.shuffle(&mut rng);
        let mut txn = env.write_txn().unwrap();
        for &i in &order {
            let mut w = store.begin(&mut txn).unwrap();
            w.put(&bench_key(prefix, i), value.clone(), 0).unwrap();
            w.finish().unwrap();
        }
        txn.commit().unwrap();
    }
}

fn report(env: &LmdbEnv, store: &KvStore, keys: usize, what: &str) -> Vec<(&'static str, Pages)> {
    let tables: Vec<(&'static str, Pages)> =
        KvStore::TABLES.iter().zip(store.tables()).map(|(name, db)| (*name, pages(env, db))).collect();
    for (name, p) in &tables {
        eprintln!(
            "{what}: {name:9} {:>7} leaf {:>5} branch {:>5} overflow {:>8} entries  {:6.1} B/key  {:6.1} B/entry",
            p.leaf,
            p.branch,
            p.overflow,
            p.entries,
            p.bytes() as f64 / keys as f64,
            p.bytes() as f64 / p.entries.max(1) as f64
        );
    }
    let total: usize = tables.iter().map(|(_, p)| p.bytes()).sum();
    eprintln!("{what}: total {:.1} B/key", total as f64 / keys as f64);
    tables
}

/// etcd 3.4.23's `dbSizeInUse` per key for the same load (100-byte values, 16-byte keys): 37.6 MB for
/// 200k keys and 188 MB for 1M in `benches/store-scale.sh` runs (docs/performance.md, issue 30).
const ETCD_BYTES_PER_KEY: f64 = 188.0;

/// 20,000 keys loaded as the bench loads them: `kv_revs` within 0.75× etcd's bytes per key (layout 2:
/// 164 bytes, 0.87×) and the kv tables together within etcd's figure, fresh and after the keys were
/// written twice more and every older revision compacted (layout 3: about 1.1× fresh, its index of
/// one entry per key and version filling its pages half; layout 4 keeps each key's newest version
/// apart, in pages filled in key order). Fails with layout 3's index or with layout 2's encodings.
#[test]
fn a_bench_load_takes_at_most_etcds_space_per_key() {
    let keys = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let (env, store) = KvStore::open_for_tests(dir.path(), crate::storage::table::CHUNK).unwrap();
    load(&env, &store, "kv/", keys, 100, 1);
    let per_key = |p: &Pages| p.bytes() as f64 / keys as f64;
    let tables = report(&env, &store, keys, "fresh");
    let revs = per_key(&tables[0].1);
    let total: f64 = tables.iter().map(|(_, p)| per_key(p)).sum();
    assert!(revs <= 0.75 * ETCD_BYTES_PER_KEY, "kv_revs takes {revs:.1} bytes per key");
    assert!(total <= ETCD_BYTES_PER_KEY, "the kv tables take {total:.1} bytes per key");
    load(&env, &store, "kv/", keys, 100, 2);
    load(&env, &store, "kv/", keys, 100, 3);
    compact_all(&env, &store);
    let tables = report(&env, &store, keys, "compacted");
    let total: f64 = tables.iter().map(|(_, p)| per_key(p)).sum();
    assert!(total <= ETCD_BYTES_PER_KEY, "compacted, the kv tables take {total:.1} bytes per key");
}

/// Compacts every older revision and runs the removal to its end, a step per write transaction.
fn compact_all(env: &LmdbEnv, store: &KvStore) {
    let mut txn = env.write_txn().unwrap();
    let rev = store.view(&txn).unwrap().rev;
    let mut w = store.begin(&mut txn).unwrap();
    w.compact(rev).unwrap();
    w.finish().unwrap();
    txn.commit().unwrap();
    loop {
        let mut txn = env.write_txn().unwrap();
        let step = store.compaction_step(&mut txn, super::compaction::STEP_LIMIT).unwrap();
        txn.commit().unwrap();
        if step.pending.is_none() {
            break;
        }
    }
}

/// The footprint of a bench-shaped load, then of the same keys written twice more and compacted:
/// `cargo test --release --lib footprint_of_a_bench_load -- --ignored --nocapture` (KEYS to size it).
#[test]
#[ignore = "measurement: prints each table's pages"]
fn footprint_of_a_bench_load() {
    let keys: usize = std::env::var("KEYS").ok().and_then(|k| k.parse().ok()).unwrap_or(200_000);
    let dir = tempfile::tempdir().unwrap();
    let (env, store) = KvStore::open_for_tests(dir.path(), crate::storage::table::CHUNK).unwrap();
    load(&env, &store, "kv/", keys, 100, 1);
    report(&env, &store, keys, "fresh");
    load(&env, &store, "kv/", keys, 100, 2);
    load(&env, &store, "kv/", keys, 100, 3);
    report(&env, &store, keys, "3 passes");
    compact_all(&env, &store);
    report(&env, &store, keys, "compacted");
    let txn = env.read_txn().unwrap();
    let count = store.view(&txn).unwrap().range(&KeyRange::new(b"kv/", b"kv0"), 0, 0, true).unwrap().count;
    assert_eq!(count, keys);
}

/// How a candidate index receives each batch's new entries.
#[derive(Debug, Clone, Copy)]
enum Inserts {
    /// One put per change, in the order the changes are applied (what `kv_index` does today).
    Arrival,
    /// A batch's entries put in key order at its end, appended (`MDB_APPEND`) when larger than every
    /// key in the table: a write transaction that holds its index writes until it commits.
    SortedPerBatch,
    /// A new key's first entry put into a small staging table, and the smallest half of that table
    /// moved into `newest` in key order (appended when larger than every key) whenever it holds more
    /// than this many: reads would look in both. Overwrites and history go straight to their tables.
    Staged(usize),
}

/// The arrival order of a real load: the key indices of a `keyward-bench put --sequential-keys` run
/// in revision order, one a line, from `ARRIVALS` (see the test below for how to make the file).
fn recorded_arrivals(keys: usize) -> Option<Vec<usize>> {
    let path = std::env::var("ARRIVALS").ok()?;
    let order: Vec<usize> = std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .filter(|&i| i < keys)
        .collect();
    assert_eq!(order.len(), keys, "ARRIVALS must hold each key below KEYS once");
    Some(order)
}

/// A candidate kv layout 4 index, in an environment of its own: `newest` (key → tag and revision:
/// each key's newest version, overwritten in place once the key exists) and `history` (escaped key
/// ++ revision → tag: the versions a newer one superseded, which compaction empties). Loads `passes`
/// passes of `keys` keys arriving as `arrivals` says, applied `batch` changes per write transaction,
/// then removes every history entry (a compaction of every older revision) and reports the pages per
/// key after the first pass, after all passes and after the removal.
fn newest_and_history(
    keys: usize,
    passes: usize,
    batch: usize,
    inserts: Inserts,
    arrivals: &dyn Fn(u64) -> Vec<usize>,
) {
    use super::revision::{history_key, Revision};
    use heed::PutFlags;
    let dir = tempfile::tempdir().unwrap();
    let (env, [newest, history]) =
        crate::storage::open(dir.path(), ["newest", "history"], crate::storage::Durability::Deferred).unwrap();
    let mut revision = 1i64;
    let mut current: Vec<Option<Revision>> = vec![None; keys];
    let mut staged: std::collections::BTreeMap<Vec<u8>, Vec<u8>> = Default::default();
    let staged_now = std::cell::Cell::new(0usize);
    let show = |what: &str| {
        let (n, h) = (pages(&env, newest), pages(&env, history));
        eprintln!(
            "{inserts:?} batch {batch}: {what:11} newest {:6.1} B/key ({} entries, {} staged)  history {:6.1} B/key ({} entries)",
            n.bytes() as f64 / keys as f64,
            n.entries,
            staged_now.get(),
            h.bytes() as f64 / keys as f64,
            h.entries
        );
    };
    for pass in 0..passes {
        let order = arrivals(pass as u64 + 1);
        for chunk in order.chunks(batch) {
            let mut txn = env.write_txn().unwrap();
            let mut pending: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
            let mut superseded: Vec<Vec<u8>> = Vec::new();
            for &i in chunk {
                revision += 1;
                let at = Revision::new(revision, 0);
                let key = bench_key("kv/", i);
                let value = [&[1u8][..], &at.to_bytes()].concat();
                match current[i].replace(at) {
                    Some(old) => superseded.push(history_key(&key, old)),
                    None if matches!(inserts, Inserts::Staged(_)) => {
                        staged.insert(key, value);
                        continue;
                    }
                    None => {}
                }
                match staged.get_mut(&key) {
                    Some(in_staging) => *in_staging = value,
                    None => pending.push((key, value)),
                }
            }
            match inserts {
                Inserts::Arrival => {}
                Inserts::SortedPerBatch => {
                    pending.sort();
                    superseded.sort();
                }
                Inserts::Staged(limit) => {
                    if staged.len() > limit {
                        let mut moved = Vec::new();
                        while staged.len() > limit / 2 {
                            moved.extend(staged.pop_first());
                        }
                        let mut last = newest.last(&txn).unwrap().map(|(k, _)| k.to_vec());
                        for (k, v) in moved {
                            if last.as_ref().is_none_or(|l| &k > l) {
                                newest.put_with_flags(&mut txn, PutFlags::APPEND, &k, &v).unwrap();
                                last = Some(k);
                            } else {
                                newest.put(&mut txn, &k, &v).unwrap();
                            }
                        }
                    }
                }
            }
            let last_of = |txn: &heed::RwTxn, db: crate::storage::Db| db.last(txn).unwrap().map(|(k, _)| k.to_vec());
            for (db, entries) in
                [(newest, pending), (history, superseded.into_iter().map(|k| (k, vec![1u8])).collect::<Vec<_>>())]
            {
                let mut last = last_of(&txn, db);
                for (k, v) in entries {
                    let append = matches!(inserts, Inserts::SortedPerBatch) && last.as_ref().is_none_or(|l| &k > l);
                    if append {
                        db.put_with_flags(&mut txn, PutFlags::APPEND, &k, &v).unwrap();
                        last = Some(k);
                    } else {
                        db.put(&mut txn, &k, &v).unwrap();
                    }
                }
            }
            txn.commit().unwrap();
        }
        staged_now.set(staged.len());
        if pass == 0 {
            show("fresh");
        }
    }
    show(&format!("{passes} passes"));
    // Compaction of every older revision: every history entry goes, in key order, 1,000 a step.
    loop {
        let mut txn = env.write_txn().unwrap();
        let doomed: Vec<Vec<u8>> = history.iter(&txn).unwrap().take(1000).map(|e| e.unwrap().0.to_vec()).collect();
        for k in &doomed {
            history.delete(&mut txn, k).unwrap();
        }
        txn.commit().unwrap();
        if doomed.is_empty() {
            break;
        }
    }
    show("compacted");
}

/// The candidate layout 4 index under each insertion strategy, for the bench load's model (shuffled
/// windows of 100, one per batch) and, with `ARRIVALS`, for a real load's order replayed in batches of
/// `BATCH` (default 34: 200,000 puts at 100 clients took 5,958 apply batches on the machine that
/// recorded it). To record one: load a single keyward as `benches/store-scale.sh` does, then
/// `etcdctl get kv/ --prefix --keys-only -w json` and list the keys' indices by `mod_revision`.
/// `cargo test --release --lib candidate_layout_4_index -- --ignored --nocapture` (KEYS to size it).
#[test]
#[ignore = "measurement: prints each candidate's pages"]
fn candidate_layout_4_index() {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let keys: usize = std::env::var("KEYS").ok().and_then(|k| k.parse().ok()).unwrap_or(200_000);
    let batch: usize = std::env::var("BATCH").ok().and_then(|k| k.parse().ok()).unwrap_or(34);
    let windows = |seed: u64| {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut order: Vec<usize> = (0..keys).collect();
        for window in order.chunks_mut(100) {
            window.shuffle(&mut rng);
        }
        order
    };
    let recorded = recorded_arrivals(keys);
    for inserts in [Inserts::Arrival, Inserts::SortedPerBatch, Inserts::Staged(512), Inserts::Staged(2048)] {
        eprintln!("-- windows of 100 shuffled, one window per batch");
        newest_and_history(keys, 3, 100, inserts, &windows);
        if let Some(order) = &recorded {
            eprintln!("-- a recorded load's order, every pass");
            newest_and_history(keys, 3, batch, inserts, &|_| order.clone());
        }
    }
}

/// How full the candidate's pages are after a migration from layout 3 (the question the design in
/// docs/performance.md leaves open): a layout 3 `kv_index` of three passes of `ARRIVALS`' order (or the
/// bench model's) converted in place, in steps of 10,000 entries in key order, into one table of two
/// regions, history (`00 01 ++` the layout 3 entry) and newest (`00 03 ++ key` → tag and revision);
/// then the history region removed, as a compaction of every older revision would.
/// `cargo test --release --lib candidate_layout_4_migration -- --ignored --nocapture`.
#[test]
#[ignore = "measurement: prints the migrated table's pages"]
fn candidate_layout_4_migration() {
    use super::revision::{history_key, prefix_len, Revision};
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    use std::ops::Bound;
    let keys: usize = std::env::var("KEYS").ok().and_then(|k| k.parse().ok()).unwrap_or(200_000);
    let batch: usize = std::env::var("BATCH").ok().and_then(|k| k.parse().ok()).unwrap_or(34);
    let order = recorded_arrivals(keys).unwrap_or_else(|| {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let mut order: Vec<usize> = (0..keys).collect();
        for window in order.chunks_mut(100) {
            window.shuffle(&mut rng);
        }
        order
    });
    let dir = tempfile::tempdir().unwrap();
    let (env, [index]) = crate::storage::open(dir.path(), ["kv_index"], crate::storage::Durability::Deferred).unwrap();
    let show = |what: &str| {
        let p = pages(&env, index);
        eprintln!("migration: {what:26} {:6.1} B/key ({} entries)", p.bytes() as f64 / keys as f64, p.entries);
    };
    let mut revision = 1i64;
    for _pass in 0..3 {
        for chunk in order.chunks(batch) {
            let mut txn = env.write_txn().unwrap();
            for &i in chunk {
                revision += 1;
                index.put(&mut txn, &history_key(&bench_key("kv/", i), Revision::new(revision, 0)), &[1]).unwrap();
            }
            txn.commit().unwrap();
        }
    }
    show("layout 3, 3 passes");
    const HISTORY: [u8; 2] = [0, 1];
    const NEWEST: [u8; 2] = [0, 3];
    const LAYOUT_3_FROM: [u8; 2] = [0, 4];
    loop {
        let mut txn = env.write_txn().unwrap();
        // The next entries of layout 3, whole keys only: the last key's entries wait for the next step
        // unless the walk reached the end (its last entry is the key's newest).
        let mut old: Vec<(Vec<u8>, u8)> = Vec::new();
        let mut reached_end = true;
        for entry in index.range(&txn, &(Bound::Included(&LAYOUT_3_FROM[..]), Bound::Unbounded)).unwrap() {
            let (k, v) = entry.unwrap();
            if old.len() == 10_000 {
                reached_end = false;
                break;
            }
            old.push((k.to_vec(), v[0]));
        }
        if old.is_empty() {
            break;
        }
        let split = |raw: &[u8]| prefix_len(raw).unwrap();
        if !reached_end {
            let last = old.last().unwrap().0.clone();
            old.retain(|(k, _)| k[..split(k)] != last[..split(&last)]);
            assert!(!old.is_empty(), "a key with more entries than a step");
        }
        for (k, _) in &old {
            index.delete(&mut txn, k).unwrap();
        }
        let mut newest = Vec::new();
        for (n, (k, tag)) in old.iter().enumerate() {
            let at = split(k);
            let is_newest = old.get(n + 1).is_none_or(|(next, _)| next[..split(next)] != k[..at]);
            if is_newest {
                // The key unescaped is the bench's (no zero bytes): drop the terminator.
                newest.push(([&NEWEST[..], &k[..at - 2]].concat(), [&[*tag][..], &k[at..]].concat()));
            } else {
                index.put(&mut txn, &[&HISTORY[..], k].concat(), &[*tag]).unwrap();
            }
        }
        for (k, v) in newest {
            index.put(&mut txn, &k, &v).unwrap();
        }
        txn.commit().unwrap();
    }
    show("migrated");
    loop {
        let mut txn = env.write_txn().unwrap();
        let range = (Bound::Included(&HISTORY[..]), Bound::Excluded(&[0u8, 2][..]));
        let doomed: Vec<Vec<u8>> =
            index.range(&txn, &range).unwrap().take(1000).map(|e| e.unwrap().0.to_vec()).collect();
        for k in &doomed {
            index.delete(&mut txn, k).unwrap();
        }
        txn.commit().unwrap();
        if doomed.is_empty() {
            break;
        }
    }
    show("migrated, history removed");
}
