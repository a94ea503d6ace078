//! On-disk encodings of revisions and of the per-key history index.
//!
//! A revision is `(main, sub)`: `main` counts write transactions, `sub` orders the changes inside one.
//! Both are stored as big-endian u64 so LMDB's byte order is revision order.
//!
//! The history index is keyed by `escape(key) ++ revision`. Escaping (`0x00` → `0x00 0xff`, then a
//! `0x00 0x00` terminator) keeps byte order equal to `(key, revision)` order, so all versions of one key
//! are adjacent and sorted, and no key's versions interleave with a longer key sharing its prefix.

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Revision {
    pub main: i64,
    pub sub: i64,
}

pub(crate) const REVISION_LEN: usize = 16;

impl Revision {
    pub(crate) fn new(main: i64, sub: i64) -> Self {
        Revision { main, sub }
    }

    pub(crate) fn to_bytes(self) -> [u8; REVISION_LEN] {
        let mut out = [0u8; REVISION_LEN];
        out[..8].copy_from_slice(&(self.main as u64).to_be_bytes());
        out[8..].copy_from_slice(&(self.sub as u64).to_be_bytes());
        out
    }

    pub(crate) fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let bytes: &[u8; REVISION_LEN] = bytes.try_into().ok()?;
        let main = u64::from_be_bytes(bytes[..8].try_into().ok()?);
        let sub = u64::from_be_bytes(bytes[8..].try_into().ok()?);
        Some(Revision { main: main as i64, sub: sub as i64 })
    }
}

/// `escape(key)` followed by the terminator: the prefix shared by every history entry of `key`.
pub(crate) fn history_prefix(key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 2 + REVISION_LEN);
    for &b in key {
        out.push(b);
        if b == 0 {
            out.push(0xff);
        }
    }
    out.extend_from_slice(&[0, 0]);
    out
}

/// The escaped form of a range bound: sorts exactly where `key`'s first history entry would.
pub(crate) fn history_bound(key: &[u8]) -> Vec<u8> {
    history_prefix(key)
}

pub(crate) fn history_key(key: &[u8], rev: Revision) -> Vec<u8> {
    let mut out = history_prefix(key);
    out.extend_from_slice(&rev.to_bytes());
    out
}

/// Splits a history key into the user key and the revision.
pub(crate) fn split_history_key(raw: &[u8]) -> Option<(Vec<u8>, Revision)> {
    let (escaped, rev) = raw.split_at(raw.len().checked_sub(REVISION_LEN)?);
    let rev = Revision::from_bytes(rev)?;
    let escaped = escaped.strip_suffix(&[0, 0])?;
    let mut key = Vec::with_capacity(escaped.len());
    let mut bytes = escaped.iter();
    while let Some(&b) = bytes.next() {
        key.push(b);
        if b == 0 && bytes.next() != Some(&0xff) {
            return None;
        }
    }
    Some((key, rev))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn history_keys_round_trip_and_sort_like_key_then_revision(
            a in proptest::collection::vec(0u8..4, 0..6), ra in 0i64..1000,
            b in proptest::collection::vec(0u8..4, 0..6), rb in 0i64..1000,
        ) {
            let ka = history_key(&a, Revision::new(ra, 0));
            let kb = history_key(&b, Revision::new(rb, 0));
            prop_assert_eq!(split_history_key(&ka), Some((a.clone(), Revision::new(ra, 0))));
            prop_assert_eq!(ka.cmp(&kb), (a, ra).cmp(&(b, rb)));
        }
    }
}
