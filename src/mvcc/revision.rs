//! On-disk encodings of revisions and of the per-key history index.
//!
//! A revision is `(main, sub)`: `main` counts write transactions, `sub` orders the changes inside one.
//! Since layout 3 (`raft/state_machine/layout.rs`) each half is stored in as few bytes as it needs, so
//! that LMDB's byte order is still revision order: `main` as one byte `0x80 + n` then its `n` (0–8)
//! significant big-endian bytes, `sub` as one byte `n` then its `n` bytes. A revision of a store of
//! a million changes takes 5 bytes (`0x83 m m m 0x00`), not 16. A larger `n` always means a larger
//! value (`n` is minimal), so comparing bytes compares values. Layout 2 stored each half as a
//! big-endian u64 (16 bytes, [`Revision::legacy_bytes`]): those keys start with `0x00` (no main revision
//! reaches 2^56), these with `0x80` or more, which is how the migration tells them apart.
//!
//! The history index is keyed by `escape(key) ++ revision`. Escaping (`0x00` → `0x00 0xff`, then a
//! `0x00 0x00` terminator) keeps byte order equal to `(key, revision)` order, so all versions of one key
//! are adjacent and sorted, and no key's versions interleave with a longer key sharing its prefix.

use std::ops::Deref;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Revision {
    pub main: i64,
    pub sub: i64,
}

/// The bytes of layout 2's fixed-width revision.
pub(crate) const LEGACY_REVISION_LEN: usize = 16;
/// The first byte of an encoded revision is at least this (`0x80 + n` for `main`).
const MAIN_MARK: u8 = 0x80;
/// The most bytes an encoded revision takes.
const MAX_REVISION_LEN: usize = 18;

/// An encoded revision: a few bytes, on the stack.
#[derive(Clone, Copy)]
pub(crate) struct RevisionBytes {
    buf: [u8; MAX_REVISION_LEN],
    len: u8,
}

impl Deref for RevisionBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }
}

impl AsRef<[u8]> for RevisionBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl Revision {
    pub(crate) fn new(main: i64, sub: i64) -> Self {
        Revision { main, sub }
    }

    /// The stored form (see the module doc).
    pub(crate) fn to_bytes(self) -> RevisionBytes {
        let mut out = RevisionBytes { buf: [0; MAX_REVISION_LEN], len: 0 };
        let mut push = |mark: u8, value: u64| {
            let n = 8 - value.leading_zeros() as usize / 8;
            out.buf[usize::from(out.len)] = mark + n as u8;
            let at = usize::from(out.len) + 1;
            out.buf[at..at + n].copy_from_slice(&value.to_be_bytes()[8 - n..]);
            out.len += 1 + n as u8;
        };
        push(MAIN_MARK, self.main as u64);
        push(0, self.sub as u64);
        out
    }

    /// Reads exactly one stored revision from `bytes` (nothing before or after it).
    pub(crate) fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let (main, rest) = take(bytes, MAIN_MARK)?;
        let (sub, rest) = take(rest, 0)?;
        rest.is_empty().then_some(Revision { main: main as i64, sub: sub as i64 })
    }

    /// Layout 2's form: both halves as big-endian u64. `HashKV` and `Hash` hash this form, so that
    /// their values do not depend on the layout.
    pub(crate) fn legacy_bytes(self) -> [u8; LEGACY_REVISION_LEN] {
        let mut out = [0u8; LEGACY_REVISION_LEN];
        out[..8].copy_from_slice(&(self.main as u64).to_be_bytes());
        out[8..].copy_from_slice(&(self.sub as u64).to_be_bytes());
        out
    }

    /// Reads layout 2's form: `None` unless `bytes` is one (16 bytes, a main revision below 2^56).
    pub(crate) fn from_legacy_bytes(bytes: &[u8]) -> Option<Self> {
        let bytes: &[u8; LEGACY_REVISION_LEN] = bytes.try_into().ok()?;
        if bytes[0] >= MAIN_MARK {
            return None;
        }
        let main = u64::from_be_bytes(bytes[..8].try_into().ok()?);
        let sub = u64::from_be_bytes(bytes[8..].try_into().ok()?);
        Some(Revision { main: main as i64, sub: sub as i64 })
    }
}

/// One half of a stored revision from the front of `bytes`: its value and what follows it.
fn take(bytes: &[u8], mark: u8) -> Option<(u64, &[u8])> {
    let (&first, rest) = bytes.split_first()?;
    let n = usize::from(first.checked_sub(mark)?);
    if n > 8 || rest.len() < n {
        return None;
    }
    let mut value = [0u8; 8];
    value[8 - n..].copy_from_slice(&rest[..n]);
    Some((u64::from_be_bytes(value), &rest[n..]))
}

/// `escape(key)` followed by the terminator: the prefix shared by every history entry of `key`.
pub(crate) fn history_prefix(key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 2 + MAX_REVISION_LEN);
    for &b in key {
        out.push(b);
        if b == 0 {
            out.push(0xff);
        }
    }
    out.extend_from_slice(&[0, 0]);
    out
}

pub(crate) fn history_key(key: &[u8], rev: Revision) -> Vec<u8> {
    let mut out = history_prefix(key);
    out.extend_from_slice(&rev.to_bytes());
    out
}

/// The length of the history prefix (`escape(key)` and its terminator) `raw` starts with.
pub(crate) fn prefix_len(raw: &[u8]) -> Option<usize> {
    let mut i = 0;
    loop {
        match (raw.get(i)?, raw.get(i + 1)) {
            (0, Some(0)) => return Some(i + 2),
            (0, Some(0xff)) => i += 2,
            (0, _) => return None,
            _ => i += 1,
        }
    }
}

/// Splits a history key into the user key and the revision.
pub(crate) fn split_history_key(raw: &[u8]) -> Option<(Vec<u8>, Revision)> {
    let split = prefix_len(raw)?;
    Some((unescape(&raw[..split - 2])?, Revision::from_bytes(&raw[split..])?))
}

/// Splits a history key of layout 2 (a 16-byte revision) into the user key and the revision.
pub(crate) fn split_legacy_history_key(raw: &[u8]) -> Option<(Vec<u8>, Revision)> {
    let split = prefix_len(raw)?;
    Some((unescape(&raw[..split - 2])?, Revision::from_legacy_bytes(&raw[split..])?))
}

/// The history key of layout 2 for `key` at `rev` (what `Hash` hashes, whatever the layout).
pub(crate) fn legacy_history_key(key: &[u8], rev: Revision) -> Vec<u8> {
    let mut out = history_prefix(key);
    out.extend_from_slice(&rev.legacy_bytes());
    out
}

fn unescape(escaped: &[u8]) -> Option<Vec<u8>> {
    let mut key = Vec::with_capacity(escaped.len());
    let mut bytes = escaped.iter();
    while let Some(&b) = bytes.next() {
        key.push(b);
        if b == 0 && bytes.next() != Some(&0xff) {
            return None;
        }
    }
    Some(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_revision() -> impl Strategy<Value = Revision> {
        let half = prop_oneof![0i64..300, 0i64..70_000, any::<i64>(), Just(i64::MAX), Just(0)];
        (half.clone(), half).prop_map(|(main, sub)| Revision::new(main, sub))
    }

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

        /// The short form sorts as the fixed one does (u64 order of each half), round-trips, and is
        /// never mistaken for the legacy form (nor the reverse).
        #[test]
        fn short_revisions_sort_like_the_legacy_ones(a in any_revision(), b in any_revision()) {
            prop_assert_eq!(Revision::from_bytes(&a.to_bytes()), Some(a));
            prop_assert_eq!(a.to_bytes().cmp(&b.to_bytes()), a.legacy_bytes().cmp(&b.legacy_bytes()));
            if (a.main as u64) < 1 << 56 {
                prop_assert_eq!(Revision::from_legacy_bytes(&a.legacy_bytes()), Some(a));
                prop_assert_eq!(Revision::from_bytes(&a.legacy_bytes()), None);
            }
            prop_assert_eq!(Revision::from_legacy_bytes(&a.to_bytes()), None);
        }
    }

    #[test]
    fn a_revision_of_a_million_changes_takes_five_bytes() {
        assert_eq!(&*Revision::new(1_000_000, 0).to_bytes(), &[0x83, 0x0f, 0x42, 0x40, 0x00]);
        assert_eq!(&*Revision::new(0, 0).to_bytes(), &[0x80, 0x00]);
        assert_eq!(Revision::new(-1, -1).to_bytes().len(), MAX_REVISION_LEN);
    }
}
