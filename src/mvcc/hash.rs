//! Consistency hashes of the store (etcd's Maintenance `Hash` and `HashKV`): CRC-32C (Castagnoli, as
//! etcd uses) from the `crc32c` crate, which uses the SSE 4.2 / ARM CRC instructions where the CPU has
//! them. (The snapshot stream's SHA-256 digest is `sha2`'s, in `server/maintenance.rs`.)
//!
//! The values are keyward's own: they are stable across keyward members that applied the same entries,
//! but they are not equal to what etcd computes for the same data (etcd hashes bbolt buckets holding its
//! own record encoding).

use std::ops::Bound;

use crc32c::crc32c_append;

use super::record::{decode_change, legacy_change};
use super::revision::{legacy_history_key, Revision};
use super::store::{corrupt, KvStore, ReadView};
use crate::error::EtcdError;

/// etcd's `HashKV` result: the hash, plus the compacted revision the hash started from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KvHash {
    pub hash: u32,
    pub compact_rev: i64,
}

impl ReadView<'_> {
    /// etcd's `Hash`: CRC-32C over every record of every kv table, table by table in key order (each
    /// table's name, then each key and value): `kv_revs`, `kv_index`, `kv_meta` (since layout 2,
    /// which stores each value once, `kv_live` is no longer a table, and no longer hashed). The state
    /// machine's own bookkeeping (applied log id, membership, layout) is not kv data and is left out,
    /// as etcd leaves out its consistent index. Revisions and records are hashed in layout 2's form
    /// (`revision.rs`, `record.rs`), so the value does not change with layout 3's shorter encodings.
    ///
    /// It hashes the tables as they are (`kv_meta`'s `compact_from`, the removal's cursor, as stored:
    /// since layout 4 it is an index entry, not a revision): while the removal of compacted versions is pending
    /// (`mvcc/compaction.rs`), members that removed more or less of them differ, as etcd's `Hash`
    /// (of the whole bbolt file) differs while its members compact; they agree again once each has
    /// finished. `HashKV` does not depend on removal's progress.
    pub(crate) fn hash_all(&self) -> Result<u32, EtcdError> {
        let [revs, index, meta] = KvStore::TABLES;
        // Keys are hashed whole, as the tables hold them logically, whatever their length (keys past
        // LMDB's limit are stored in chunks; see `storage/table.rs`).
        let mut crc = crc32c_append(0, revs.as_bytes());
        for entry in self.store.revs.iter(self.txn)? {
            let (k, v) = entry?;
            crc = hash_change(crc, k, v)?;
        }
        crc = crc32c_append(crc, index.as_bytes());
        // Since layout 4 the index keeps each key's newest change apart from its history
        // (`index.rs`): merged back into (key, revision) order, hashed as layout 2 held the entries.
        self.store.each_index_entry(self.txn, |key, at, tag| {
            crc = crc32c_append(crc32c_append(crc, &legacy_history_key(key, at)), &[tag]);
            Ok(())
        })?;
        crc = crc32c_append(crc, meta.as_bytes());
        for entry in self.store.meta.iter(self.txn)? {
            let (k, v) = entry?;
            crc = crc32c_append(crc32c_append(crc, k), v);
        }
        Ok(crc)
    }

    /// etcd's `HashKV` (`hashByRev`): CRC-32C over the key-value history up to `requested` (0 = the
    /// current revision): every change with a revision in `(compact_rev, rev]`, plus the versions
    /// compaction keeps at or below `compact_rev` — exactly the `kv_revs` records at or below `rev` that
    /// a finished removal leaves (`mvcc/compaction.rs`), whether or not removal has finished on this
    /// member, so members agree while each removes at its own pace. A hash at an old revision therefore
    /// does not change with later writes (only with a later compaction, as in etcd).
    ///
    /// Errors as etcd's: a revision at or below the compacted one is `Compacted` (note: at, unlike
    /// Range), one above the current revision is `FutureRev`.
    pub(crate) fn hash_kv(&self, requested: i64) -> Result<KvHash, EtcdError> {
        if requested > 0 && requested <= self.compact_rev {
            return Err(EtcdError::Compacted);
        }
        if requested > 0 && requested > self.rev {
            return Err(EtcdError::FutureRev);
        }
        let rev = if requested > 0 { requested } else { self.rev };
        let upper = Revision::new(rev.saturating_add(1), 0).to_bytes();
        // Once removal finished, every record at or below the compacted revision is one it keeps.
        let pending = self.removal_pending()?;
        let mut crc = crc32c_append(0, KvStore::REVS.as_bytes());
        for entry in self.store.revs.range(self.txn, &(Bound::Unbounded, Bound::Excluded(&upper[..])))? {
            let (k, v) = entry?;
            let at = Revision::from_bytes(k).ok_or(EtcdError::Internal)?;
            if pending && at.main <= self.compact_rev {
                let (tag, kv) = decode_change(at, v)?;
                if !self.kept_by_compaction(at, &kv.key, tag)? {
                    continue;
                }
            }
            crc = hash_change(crc, k, v)?;
        }
        Ok(KvHash { hash: crc, compact_rev: self.compact_rev })
    }
}

/// Extends `crc` with one `kv_revs` record, as layout 2 stored it.
fn hash_change(crc: u32, key: &[u8], record: &[u8]) -> Result<u32, EtcdError> {
    let at = Revision::from_bytes(key).ok_or_else(|| corrupt("revision key"))?;
    let (tag, kv) = decode_change(at, record)?;
    Ok(crc32c_append(crc32c_append(crc, &at.legacy_bytes()), &legacy_change(tag, &kv)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyrange::KeyRange;
    use crate::storage;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Go's `crc32.Castagnoli` on its own golden inputs (`hash/crc32/crc32_test.go`), whole and fed in
    /// pieces the way `hash_all` feeds records.
    #[test]
    fn crc32c_matches_gos_castagnoli() {
        let golden: [(u32, &str); 8] = [
            (0x0, ""),
            (0xc1d04330, "a"),
            (0x364b3fb7, "abc"),
            (0x0a9421b7, "abcdefgh"),
            (0xe6599437, "abcdefghij"),
            (0xb2cc01fe, "Discard medicine more than two years old."),
            (0x0e28207f, "He who has a shady past knows that nice guys finish last."),
            (0xdcded527, "How can you write a big system without C++?  -Paul Glick"),
        ];
        for (want, input) in golden {
            assert_eq!(crc32c::crc32c(input.as_bytes()), want, "{input:?}");
            let (a, b) = input.as_bytes().split_at(input.len() / 2);
            assert_eq!(crc32c_append(crc32c_append(0, a), b), want, "{input:?} in two pieces");
        }
        assert_eq!(crc32c_append(crc32c_append(0, b"1234"), b"56789"), 0xe306_9283, "the CRC-32C check value");
    }

    /// A megabyte of fixed pseudo-random bytes: the CRC-32C and SHA-256 that keyward's own
    /// implementations (before these crates) computed, whole and in pieces, so Hash, HashKV and snapshot
    /// digests stay bit-identical across the change.
    #[test]
    fn same_values_as_the_hand_written_implementations() {
        use sha2::{Digest, Sha256};
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let data: Vec<u8> = (0..1_000_003)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        assert_eq!(crc32c::crc32c(&data), 0x65b8_9468);
        assert_eq!(data.chunks(4093).fold(0, crc32c_append), 0x65b8_9468);
        let want = "6b61da8f1bdd0bf88df19279b2c144dc3c9e2372bf5f8d9b7313c76ce92293cf";
        assert_eq!(hex(&Sha256::digest(&data)), want);
        let mut h = Sha256::new();
        data.chunks(777).for_each(|c| h.update(c));
        assert_eq!(hex(&h.finalize()), want);
    }

    fn store() -> (tempfile::TempDir, storage::LmdbEnv, KvStore) {
        let dir = tempfile::tempdir().unwrap();
        let (env, kv) = KvStore::open_for_tests(dir.path(), crate::storage::table::CHUNK).unwrap();
        (dir, env, kv)
    }

    fn write(env: &storage::LmdbEnv, kv: &KvStore, f: impl FnOnce(&mut super::super::WriteTxn)) {
        let mut txn = env.write_txn().unwrap();
        {
            let mut w = kv.begin(&mut txn).unwrap();
            f(&mut w);
            w.finish().unwrap();
        }
        txn.commit().unwrap();
    }

    fn hashes(env: &storage::LmdbEnv, kv: &KvStore, rev: i64) -> Result<(u32, KvHash), EtcdError> {
        let txn = env.read_txn().unwrap();
        let view = kv.view(&txn).unwrap();
        Ok((view.hash_all()?, view.hash_kv(rev)?))
    }

    /// Hash and HashKV over 100,000 keys (100-byte values), and SHA-256 over 64 MiB, timed. Run it
    /// optimised: `cargo test --release --lib mvcc::hash::tests::hash_speed -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, not a check"]
    fn hash_speed() {
        use std::time::{Duration, Instant};
        fn best<T>(mut f: impl FnMut() -> T) -> (T, Duration) {
            let mut out = None;
            let mut best = Duration::MAX;
            for _ in 0..5 {
                let t = Instant::now();
                out = Some(f());
                best = best.min(t.elapsed());
            }
            (out.unwrap(), best)
        }
        let (_dir, env, kv) = store();
        for batch in 0..1_000 {
            write(&env, &kv, |w| {
                for i in 0..100 {
                    w.put(format!("key/{:08}", batch * 100 + i).as_bytes(), vec![b'v'; 100], 0).unwrap();
                }
            });
        }
        let txn = env.read_txn().unwrap();
        let view = kv.view(&txn).unwrap();
        let (all, t_all) = best(|| view.hash_all().unwrap());
        let (by_rev, t_kv) = best(|| view.hash_kv(0).unwrap());
        let data = vec![0x5au8; 64 << 20];
        let (digest, t_sha) = best(|| <sha2::Sha256 as sha2::Digest>::digest(&data));
        eprintln!(
            "100,000 keys: Hash {all:#010x} in {t_all:?}, HashKV {:#010x} in {t_kv:?}; SHA-256 of 64 MiB {} in {t_sha:?} \
             ({:.0} MiB/s)",
            by_rev.hash,
            hex(&digest[..4]),
            64.0 / t_sha.as_secs_f64()
        );
    }

    #[test]
    fn hash_kv_by_revision() {
        let (_dir, env, kv) = store();
        let (all0, kv0) = hashes(&env, &kv, 0).unwrap();
        assert_eq!(kv0.compact_rev, -1);
        assert_eq!(hashes(&env, &kv, 0).unwrap(), (all0, kv0), "stable");
        write(&env, &kv, |w| {
            w.put(b"a", b"1".to_vec(), 0).unwrap();
        }); // rev 2
        let (all2, kv2) = hashes(&env, &kv, 0).unwrap();
        assert_ne!(all2, all0);
        assert_ne!(kv2.hash, kv0.hash);
        assert_eq!(hashes(&env, &kv, 2).unwrap().1, kv2);
        write(&env, &kv, |w| {
            w.put(b"b", b"2".to_vec(), 0).unwrap();
        }); // rev 3
        write(&env, &kv, |w| {
            w.delete_range(&KeyRange::Single(b"a".to_vec()), false).unwrap();
        }); // rev 4
        assert_eq!(hashes(&env, &kv, 2).unwrap().1, kv2, "old revision stable");
        assert_eq!(hashes(&env, &kv, 1).unwrap().1.hash, kv0.hash);
        assert_eq!(hashes(&env, &kv, 5), Err(EtcdError::FutureRev));
        let (_, kv4) = hashes(&env, &kv, 0).unwrap();
        write(&env, &kv, |w| w.compact(3).unwrap());
        assert_eq!(hashes(&env, &kv, 3), Err(EtcdError::Compacted));
        assert_eq!(hashes(&env, &kv, 2), Err(EtcdError::Compacted));
        // Compacting at 3 removes nothing (a@2 and b@3 are each key's newest version at or below 3),
        // so the hash at 4 is unchanged; only the reported compacted revision moves.
        let (_, after) = hashes(&env, &kv, 4).unwrap();
        assert_eq!(after, KvHash { hash: kv4.hash, compact_rev: 3 });
        write(&env, &kv, |w| w.compact(4).unwrap()); // drops a@2 and the tombstone a@4
        let (_, after) = hashes(&env, &kv, 0).unwrap();
        assert_ne!(after.hash, kv4.hash);
        assert_eq!(after.compact_rev, 4);
    }
}
