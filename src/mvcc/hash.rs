//! Consistency hashes of the store (etcd's Maintenance `Hash` and `HashKV`), and the two hash functions
//! they and the snapshot stream need: CRC-32C (Castagnoli, as etcd uses) and SHA-256 (the digest etcd
//! appends to a snapshot stream). Both are written here so keyward needs no extra dependency for them.
//!
//! The values are keyward's own: they are stable across keyward members that applied the same entries,
//! but they are not equal to what etcd computes for the same data (etcd hashes bbolt buckets holding its
//! own record encoding).

use std::ops::Bound;

use super::revision::Revision;
use super::store::{KvStore, ReadView};
use crate::error::EtcdError;

/// etcd's `HashKV` result: the hash, plus the compacted revision the hash started from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvHash {
    pub hash: u32,
    pub compact_rev: i64,
}

impl ReadView<'_> {
    /// etcd's `Hash`: CRC-32C over every record of every kv table, table by table in key order (each
    /// table's name, then each key and value). The state machine's own bookkeeping (applied log id,
    /// membership) is not kv data and is left out, as etcd leaves out its consistent index.
    pub fn hash_all(&self) -> Result<u32, EtcdError> {
        let mut h = Crc32c::new();
        let [live, revs, index, meta] = KvStore::TABLES;
        // Keys are hashed whole, as the tables hold them logically, whatever their length (keys past
        // LMDB's limit are stored in chunks; see `storage/table.rs`).
        hash_records(&mut h, live, self.store.live.iter(self.txn)?)?;
        hash_records(&mut h, revs, self.store.revs.iter(self.txn)?)?;
        hash_records(&mut h, index, self.store.index.iter(self.txn)?)?;
        hash_records(&mut h, meta, self.store.meta.iter(self.txn)?)?;
        Ok(h.finish())
    }

    /// etcd's `HashKV` (`hashByRev`): CRC-32C over the key-value history up to `requested` (0 = the
    /// current revision): every change with a revision in `(compact_rev, rev]`, plus the versions
    /// compaction kept at or below `compact_rev`. keyward compacts synchronously, so `kv_revs` holds
    /// exactly those, and the hash is every `kv_revs` record at or below `rev`. A hash at an old revision
    /// therefore does not change with later writes (only with a later compaction, as in etcd).
    ///
    /// Errors as etcd's: a revision at or below the compacted one is `Compacted` (note: at, unlike
    /// Range), one above the current revision is `FutureRev`.
    pub fn hash_kv(&self, requested: i64) -> Result<KvHash, EtcdError> {
        if requested > 0 && requested <= self.compact_rev {
            return Err(EtcdError::Compacted);
        }
        if requested > 0 && requested > self.rev {
            return Err(EtcdError::FutureRev);
        }
        let rev = if requested > 0 { requested } else { self.rev };
        let upper = Revision::new(rev.saturating_add(1), 0).to_bytes();
        let mut h = Crc32c::new();
        h.update(KvStore::TABLES[1].as_bytes());
        for entry in self.store.revs.range(self.txn, &(Bound::Unbounded, Bound::Excluded(&upper[..])))? {
            let (k, v) = entry?;
            h.update(k);
            h.update(v);
        }
        Ok(KvHash { hash: h.finish(), compact_rev: self.compact_rev })
    }
}

/// Feeds a table's name, then each of its keys and values, to `h`.
fn hash_records<'t, K: AsRef<[u8]>>(
    h: &mut Crc32c,
    name: &str,
    records: impl Iterator<Item = heed::Result<(K, &'t [u8])>>,
) -> Result<(), EtcdError> {
    h.update(name.as_bytes());
    for entry in records {
        let (k, v) = entry?;
        h.update(k.as_ref());
        h.update(v);
    }
    Ok(())
}

/// The reflected Castagnoli polynomial (CRC-32C, iSCSI), the one Go's `crc32.Castagnoli` names.
const CASTAGNOLI: u32 = 0x82f6_3b78;

static CRC32C_TABLE: [u32; 256] = crc32c_table();

const fn crc32c_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ CASTAGNOLI } else { crc >> 1 };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
}

/// Incremental CRC-32C; `finish` gives what Go's `crc32.New(crc32.MakeTable(crc32.Castagnoli)).Sum32()`
/// gives for the same bytes.
#[derive(Clone, Debug)]
pub struct Crc32c(u32);

impl Default for Crc32c {
    fn default() -> Self {
        Self::new()
    }
}

impl Crc32c {
    pub fn new() -> Self {
        Crc32c(!0)
    }

    pub fn update(&mut self, data: &[u8]) {
        let mut crc = self.0;
        for &b in data {
            crc = CRC32C_TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
        }
        self.0 = crc;
    }

    pub fn finish(&self) -> u32 {
        !self.0
    }
}

/// SHA-256 (FIPS 180-4), incremental. Used for the digest etcd appends to a snapshot stream.
#[derive(Clone, Debug)]
pub struct Sha256 {
    state: [u32; 8],
    block: [u8; 64],
    filled: usize,
    total: u64,
}

const SHA256_K: [u32; 64] = [
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
    0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
    0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
    0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2,
];

impl Default for Sha256 {
    fn default() -> Self {
        Self::new()
    }
}

impl Sha256 {
    pub fn new() -> Self {
        Sha256 {
            state: [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19],
            block: [0; 64],
            filled: 0,
            total: 0,
        }
    }

    pub fn update(&mut self, mut data: &[u8]) {
        self.total = self.total.wrapping_add(data.len() as u64);
        while !data.is_empty() {
            let take = (64 - self.filled).min(data.len());
            self.block[self.filled..self.filled + take].copy_from_slice(&data[..take]);
            self.filled += take;
            data = &data[take..];
            if self.filled == 64 {
                let block = self.block;
                self.compress(&block);
                self.filled = 0;
            }
        }
    }

    pub fn finish(mut self) -> [u8; 32] {
        let bits = self.total.wrapping_mul(8);
        self.update(&[0x80]);
        while self.filled != 56 {
            self.update(&[0]);
        }
        self.update(&bits.to_be_bytes());
        let mut out = [0u8; 32];
        for (chunk, word) in out.chunks_exact_mut(4).zip(self.state) {
            chunk.copy_from_slice(&word.to_be_bytes());
        }
        out
    }

    fn compress(&mut self, block: &[u8; 64]) {
        let mut w = [0u32; 64];
        for (i, word) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16].wrapping_add(s0).wrapping_add(w[i - 7]).wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut h] = self.state;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = h.wrapping_add(s1).wrapping_add(ch).wrapping_add(SHA256_K[i]).wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            h = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (s, v) in self.state.iter_mut().zip([a, b, c, d, e, f, g, h]) {
            *s = s.wrapping_add(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyrange::KeyRange;
    use crate::storage;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn crc32c_check_value() {
        let mut h = Crc32c::new();
        h.update(b"1234");
        h.update(b"56789");
        assert_eq!(h.finish(), 0xe306_9283);
        assert_eq!(Crc32c::new().finish(), 0);
    }

    #[test]
    fn sha256_known_answers() {
        let digest = |data: &[u8]| {
            let mut h = Sha256::new();
            h.update(data);
            hex(&h.finish())
        };
        assert_eq!(digest(b""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(digest(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(
            digest(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
        let mut h = Sha256::new();
        for _ in 0..1000 {
            h.update(&[b'a'; 1000]);
        }
        assert_eq!(hex(&h.finish()), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
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
            w.delete_range(&KeyRange::Single(b"a".to_vec())).unwrap();
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
