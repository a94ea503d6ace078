//! A user's key permissions, merged into sorted interval sets that answer "may this request touch this range?".
//!
//! This module owns the *decision* only: given the `Permission`s of all of a user's roles, it builds one
//! [`PermissionSet`] (a read set and a write set) and answers [`PermissionSet::allows`] for a [`KeyRange`].
//! Loading users and roles, the root-role bypass and the cache invalidation on every auth change live with the
//! auth store; this module holds no state beyond the sets it returns.
//!
//! # Representation and cost
//!
//! An [`IntervalSet`] is a sorted `Vec` of disjoint, *coalesced* half-open intervals `[start, end)` over byte
//! strings, where `end` may be unbounded (a from-key grant). Overlapping or touching grants are merged at build
//! time (`[a, b)` and `[b, c)` become `[a, c)`), so between two stored intervals there is always at least one
//! uncovered key (the first interval's `end` itself). Hence "the union of the grants covers the request" — the
//! rule etcd implements with `adt.IntervalTree.Contains` — is the same as "one stored interval contains the
//! request", which a single binary search on the start key decides.
//!
//! - build: O(n log n) for n grants (one sort, one merging pass);
//! - lookup: O(log n) comparisons of byte strings, no allocation.
//!
//! # Semantics (etcd 3.4's `isRangeOpPermitted`, with its gaps closed)
//!
//! - A grant or request with an empty `range_end` is the single key `k`, i.e. the interval `[k, k + "\0")`.
//! - `range_end == "\0"` means "from `key` to the end of the key space" (unbounded).
//! - Otherwise the range is `[key, range_end)`; a request is allowed when every key it could touch is granted.
//! - **From-key rule** (GHSA-xg4h-6gfc-h4m8): an open-ended request (`get --from-key`, a from-key watch, a
//!   prefix whose end does not exist such as `"\xff"`) is covered only by an *unbounded* stored interval starting
//!   at or before its key. A bounded grant such as `[a, "\xff\xff\xff")` never covers it, however large its end:
//!   keys above the end exist. (This is simply the union rule applied exactly; it is spelled out because it is
//!   the case etcd got wrong.)
//! - **Inverted or empty grants** (`range_end <= key`, not `"\0"`) grant nothing. In etcd such an interval
//!   intersects no point and cannot extend a covering union either, so this matches.
//! - **Inverted or empty requests** (`range_end <= key`, not `"\0"`): they touch no key, but etcd does not
//!   simply allow them. Its `Contains` on an interval with `begin > end` visits only the stored intervals that
//!   contain `begin`, and then passes its end check trivially, so etcd allows such a request iff its start key
//!   is granted — and sometimes not even then, because the tree's subtree pruning (`visit`, which compares
//!   against `[node.begin, node.max)`) can skip the containing interval depending on the tree's shape. Keyward
//!   takes the deterministic upper bound of that: an inverted request is allowed iff its start key is granted.
//!   That is conservative (a user learns nothing about keys outside their grants) and never more permissive
//!   than etcd's best case.
//! - **The empty key** is an ordinary byte string here: the smallest one. etcd's `BytesAffineComparable` sorts
//!   `""` *above* every key, so in etcd a grant whose key is `""` covers nothing (which is why etcdctl rewrites
//!   an empty key to `"\0"` before granting). Keyward gives such a grant its literal meaning (`"" .. "\0"` is
//!   the whole key space). Conversely a request starting at `""` (e.g. a raw from-key watch on `""`) needs a
//!   grant that starts at `""`; `From("\0")`, which is what etcdctl grants for "everything", does not include
//!   the key `""` and therefore does not cover it. Such requests only come from clients that bypass clientv3's
//!   own `"" -> "\0"` rewrite; denying them is the safe direction.
//! - Unknown `perm_type` values grant nothing.

use std::borrow::Borrow;

use crate::keyrange::KeyRange;
use crate::proto::authpb::{permission::Type as PermType, Permission};

/// The kind of access a request needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Access {
    /// Range, watch, and the read side of a txn's compares and gets.
    Read,
    /// Put, delete-range, and the write side of a txn.
    Write,
}

/// The exclusive upper bound of a stored interval. The derived order puts every key below `Unbounded`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum End {
    Key(Vec<u8>),
    Unbounded,
}

impl End {
    /// `key < self`: the interval with this end (and a start at or below `key`) contains `key`.
    fn is_above(&self, key: &[u8]) -> bool {
        match self {
            End::Key(end) => key < end.as_slice(),
            End::Unbounded => true,
        }
    }

    /// `key <= self`: an interval with this end reaches at least up to the (exclusive) bound `key`.
    fn reaches(&self, key: &[u8]) -> bool {
        match self {
            End::Key(end) => key <= end.as_slice(),
            End::Unbounded => true,
        }
    }
}

/// A non-empty half-open interval `[start, end)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Interval {
    start: Vec<u8>,
    end: End,
}

impl Interval {
    /// The keys of `range` as an interval, or `None` when it holds no key (an inverted or empty span).
    fn of(range: &KeyRange) -> Option<Self> {
        match range {
            KeyRange::Single(key) => {
                let mut end = Vec::with_capacity(key.len() + 1);
                end.extend_from_slice(key);
                end.push(0);
                Some(Interval { start: key.clone(), end: End::Key(end) })
            }
            KeyRange::Span { start, end } if start < end => {
                Some(Interval { start: start.clone(), end: End::Key(end.clone()) })
            }
            KeyRange::Span { .. } => None,
            KeyRange::From(start) => Some(Interval { start: start.clone(), end: End::Unbounded }),
        }
    }
}

/// Sorted, disjoint, coalesced half-open intervals of byte-string keys; see the module documentation.
///
/// Invariant: every interval is non-empty and `intervals[i].end < intervals[i + 1].start`, so the key
/// `intervals[i].end` is never covered and union coverage equals containment in one interval.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct IntervalSet {
    intervals: Vec<Interval>,
}

impl IntervalSet {
    /// Merges any number of key ranges (in any order, overlapping or not) into a set. O(n log n).
    pub(crate) fn from_ranges<R: Borrow<KeyRange>>(ranges: impl IntoIterator<Item = R>) -> Self {
        let mut pieces: Vec<Interval> = ranges.into_iter().filter_map(|range| Interval::of(range.borrow())).collect();
        pieces.sort_unstable_by(|a, b| a.start.cmp(&b.start));

        let mut intervals: Vec<Interval> = Vec::with_capacity(pieces.len());
        for piece in pieces {
            match intervals.last_mut() {
                // Overlapping or touching (`piece.start <= last.end`): extend the last interval.
                Some(last) if last.end.reaches(&piece.start) => {
                    if piece.end > last.end {
                        last.end = piece.end;
                    }
                }
                _ => intervals.push(piece),
            }
        }
        intervals.shrink_to_fit();
        IntervalSet { intervals }
    }

    /// Whether every key `range` could touch lies inside the set. O(log n).
    ///
    /// An inverted or empty span (`end <= start`) is covered iff its start key is (see the module docs); a
    /// from-key range only by an unbounded interval starting at or before its key.
    pub(crate) fn covers(&self, range: &KeyRange) -> bool {
        match range {
            KeyRange::Single(key) => self.containing(key).is_some(),
            KeyRange::Span { start, end } if end <= start => self.containing(start).is_some(),
            KeyRange::Span { start, end } => self.containing(start).is_some_and(|iv| iv.end.reaches(end)),
            KeyRange::From(start) => self.containing(start).is_some_and(|iv| iv.end == End::Unbounded),
        }
    }

    #[cfg(test)]
    /// Whether the set grants no key at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.intervals.is_empty()
    }

    #[cfg(test)]
    /// The number of merged intervals.
    pub(crate) fn len(&self) -> usize {
        self.intervals.len()
    }

    #[cfg(test)]
    /// The merged intervals in key order, as `(start, end)`; `end` is `None` when unbounded.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> + '_ {
        self.intervals.iter().map(|iv| {
            let end = match &iv.end {
                End::Key(end) => Some(end.as_slice()),
                End::Unbounded => None,
            };
            (iv.start.as_slice(), end)
        })
    }

    /// The stored interval containing `key`, if any: the last one starting at or before it, if it reaches past it.
    fn containing(&self, key: &[u8]) -> Option<&Interval> {
        let after = self.intervals.partition_point(|iv| iv.start.as_slice() <= key);
        let candidate = self.intervals[..after].last()?;
        candidate.end.is_above(key).then_some(candidate)
    }
}

impl<R: Borrow<KeyRange>> FromIterator<R> for IntervalSet {
    fn from_iter<I: IntoIterator<Item = R>>(ranges: I) -> Self {
        IntervalSet::from_ranges(ranges)
    }
}

/// Everything one user may read and write: the permissions of all of their roles, merged.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct PermissionSet {
    pub read: IntervalSet,
    pub write: IntervalSet,
}

impl PermissionSet {
    /// READ grants go to the read set, WRITE to the write set, READWRITE to both; unknown types are ignored.
    pub(crate) fn from_permissions<'a>(perms: impl IntoIterator<Item = &'a Permission>) -> Self {
        let (mut read, mut write) = (Vec::new(), Vec::new());
        for perm in perms {
            let Ok(perm_type) = PermType::try_from(perm.perm_type) else {
                continue;
            };
            let range = KeyRange::new(&perm.key, &perm.range_end);
            match perm_type {
                PermType::Read => read.push(range),
                PermType::Write => write.push(range),
                PermType::Readwrite => {
                    read.push(range.clone());
                    write.push(range);
                }
            }
        }
        PermissionSet { read: IntervalSet::from_ranges(read), write: IntervalSet::from_ranges(write) }
    }

    /// Whether `access` to every key of `range` is granted. O(log n).
    pub(crate) fn allows(&self, access: Access, range: &KeyRange) -> bool {
        match access {
            Access::Read => self.read.covers(range),
            Access::Write => self.write.covers(range),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn perm(perm_type: PermType, key: &[u8], range_end: &[u8]) -> Permission {
        Permission { perm_type: perm_type as i32, key: key.to_vec(), range_end: range_end.to_vec() }
    }

    fn set(ranges: &[(&[u8], &[u8])]) -> IntervalSet {
        ranges.iter().map(|(key, end)| KeyRange::new(key, end)).collect()
    }

    fn r(key: &[u8], range_end: &[u8]) -> KeyRange {
        KeyRange::new(key, range_end)
    }

    /// What `etcdctl --prefix` sends as `range_end` (clientv3's `GetPrefixRangeEnd`): the prefix with its last
    /// byte below 0xff incremented and the rest cut off; `"\0"` (from-key) when there is no such byte.
    fn prefix_end(prefix: &[u8]) -> Vec<u8> {
        match prefix.iter().rposition(|&b| b < 0xff) {
            Some(i) => {
                let mut end = prefix[..=i].to_vec();
                end[i] += 1;
                end
            }
            None => vec![0],
        }
    }

    fn collected(set: &IntervalSet) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        set.iter().map(|(s, e)| (s.to_vec(), e.map(<[u8]>::to_vec))).collect()
    }

    #[test]
    fn single_key_grant() {
        let s = set(&[(b"foo", b"")]);
        assert!(s.covers(&r(b"foo", b"")));
        assert!(s.covers(&r(b"foo", b"foo\0")), "[foo, foo\\0) is exactly the key foo");
        assert!(!s.covers(&r(b"foo", b"foo\0\0")), "also touches foo\\0");
        assert!(!s.covers(&r(b"fo", b"")));
        assert!(!s.covers(&r(b"foo\0", b"")));
        assert!(!s.covers(&r(b"foo", b"fop")));
        assert!(!s.covers(&r(b"foo", b"\0")));
    }

    #[test]
    fn prefix_grant_as_etcdctl_sends_it() {
        assert_eq!(prefix_end(b"foo"), b"fop");
        let s = set(&[(b"foo", &prefix_end(b"foo"))]);
        for key in [&b"foo"[..], b"foo/bar", b"foo\0", b"foo\xff\xff\xff", b"foo/zz"] {
            assert!(s.covers(&r(key, b"")), "{key:?}");
        }
        for key in [&b"fop"[..], b"fo", b"fon\xff", b"", b"fop\0"] {
            assert!(!s.covers(&r(key, b"")), "{key:?}");
        }
        assert!(s.covers(&r(b"foo", b"fop")), "the prefix request itself");
        assert!(s.covers(&r(b"foo/a", b"foo/z")));
        assert!(!s.covers(&r(b"foo", b"fop\0")));
        assert!(!s.covers(&r(b"fo", b"foo\0")));
        assert!(!s.covers(&r(b"foo", b"\0")), "from-key needs a from-key grant");
    }

    #[test]
    fn span_grant() {
        let s = set(&[(b"b", b"d")]);
        assert!(s.covers(&r(b"b", b"")) && s.covers(&r(b"c\xff\xff", b"")));
        assert!(!s.covers(&r(b"d", b"")) && !s.covers(&r(b"a\xff", b"")));
        assert!(s.covers(&r(b"b", b"d")) && s.covers(&r(b"c", b"d")) && s.covers(&r(b"b", b"c")));
        assert!(!s.covers(&r(b"a", b"c")) && !s.covers(&r(b"c", b"e")) && !s.covers(&r(b"b", b"d\0")));
    }

    #[test]
    fn from_key_grant() {
        let s = set(&[(b"b", b"\0")]);
        assert_eq!(collected(&s), vec![(b"b".to_vec(), None)]);
        assert!(s.covers(&r(b"b", b"")) && s.covers(&r(b"zzz", b"")) && s.covers(&r(b"\xff\xff", b"")));
        assert!(s.covers(&r(b"b", b"\0")) && s.covers(&r(b"c", b"\0")));
        assert!(s.covers(&r(b"b", b"\xff\xff\xff")));
        assert!(!s.covers(&r(b"a", b"")) && !s.covers(&r(b"a", b"\0")) && !s.covers(&r(b"a", b"c")));
    }

    #[test]
    fn from_key_request_against_bounded_grant_is_denied() {
        // GHSA-xg4h-6gfc-h4m8: a huge bounded grant is still bounded.
        let s = set(&[(b"a", b"\xff\xff\xff\xff")]);
        assert!(s.covers(&r(b"a", b"\xff\xff\xff\xff")));
        assert!(s.covers(&r(b"a", b"")) && s.covers(&r(b"\xff\xff\xff", b"")));
        assert!(!s.covers(&r(b"a", b"\0")));
        assert!(!s.covers(&r(b"b", b"\0")));
        assert!(!s.covers(&r(b"\xff\xff\xff\xff", b"\0")));
        // A bounded grant that touches an unbounded one merges with it into an unbounded interval.
        let s = set(&[(b"a", b"m"), (b"m", b"\0")]);
        assert_eq!(collected(&s), vec![(b"a".to_vec(), None)]);
        assert!(s.covers(&r(b"a", b"\0")));
    }

    #[test]
    fn adjacent_and_overlapping_grants_coalesce() {
        let s = set(&[(b"b", b"c"), (b"a", b"b"), (b"c", b"")]);
        assert_eq!(collected(&s), vec![(b"a".to_vec(), Some(b"c\0".to_vec()))]);

        let s = set(&[(b"a", b"c"), (b"b", b"d"), (b"x", b"z"), (b"y", b"y\0")]);
        assert_eq!(collected(&s), vec![(b"a".to_vec(), Some(b"d".to_vec())), (b"x".to_vec(), Some(b"z".to_vec()))]);

        // Consecutive single keys: "a" is [a, a\0), "a\0" is [a\0, a\0\0).
        let s = set(&[(b"a\0", b""), (b"a", b"")]);
        assert_eq!(collected(&s), vec![(b"a".to_vec(), Some(b"a\0\0".to_vec()))]);
        assert!(s.covers(&r(b"a", b"a\0\0")));

        // Nested and duplicate grants.
        let s = set(&[(b"a", b"z"), (b"c", b"d"), (b"a", b"z"), (b"q", b"")]);
        assert_eq!(s.len(), 1);

        // Empty and inverted grants grant nothing.
        let s = set(&[(b"c", b"a"), (b"b", b"b")]);
        assert!(s.is_empty());
        assert!(!s.covers(&r(b"b", b"")) && !s.covers(&r(b"a", b"")));
    }

    #[test]
    fn request_spanning_adjacent_grants_is_allowed_and_spanning_a_gap_is_denied() {
        let perms = [perm(PermType::Read, b"a", b"c"), perm(PermType::Readwrite, b"c", b"e")];
        let p = PermissionSet::from_permissions(&perms);
        assert!(p.allows(Access::Read, &r(b"b", b"d")));
        assert!(p.allows(Access::Read, &r(b"a", b"e")));
        assert!(!p.allows(Access::Write, &r(b"b", b"d")), "[b, c) is read-only");
        assert!(p.allows(Access::Write, &r(b"c", b"d")));

        // The gap is exactly the key "c".
        let perms = [perm(PermType::Read, b"a", b"c"), perm(PermType::Read, b"c\0", b"e")];
        let p = PermissionSet::from_permissions(&perms);
        assert!(!p.allows(Access::Read, &r(b"b", b"d")));
        assert!(!p.allows(Access::Read, &r(b"c", b"")));
        assert!(p.allows(Access::Read, &r(b"b", b"c")) && p.allows(Access::Read, &r(b"c\0", b"d")));

        // Two single keys do not grant what lies between them.
        let s = set(&[(b"a", b""), (b"c", b"")]);
        assert!(!s.covers(&r(b"a", b"c\0")));
    }

    #[test]
    fn keys_with_zero_and_ff_bytes() {
        // etcdctl's prefix of "\xff" has no end: it becomes from-key.
        assert_eq!(prefix_end(b"\xff"), b"\0");
        let s = set(&[(b"\xff", &prefix_end(b"\xff"))]);
        assert!(s.covers(&r(b"\xff", b"\0")) && s.covers(&r(b"\xff\xff\xff", b"")));
        assert!(!s.covers(&r(b"\xfe\xff", b"")));

        // The prefix "a\xff" ends at "b".
        assert_eq!(prefix_end(b"a\xff"), b"b");
        let s = set(&[(b"a\xff", &prefix_end(b"a\xff"))]);
        assert!(s.covers(&r(b"a\xff\0", b"")) && s.covers(&r(b"a\xff\xff", b"")));
        assert!(!s.covers(&r(b"a\xfe", b"")) && !s.covers(&r(b"b", b"")));

        let s = set(&[(b"\0", b"")]);
        assert!(s.covers(&r(b"\0", b"")));
        assert!(!s.covers(&r(b"", b"")) && !s.covers(&r(b"\0\0", b"")) && !s.covers(&r(b"\0", b"\0")));

        // etcdctl's "everything" grant (`"" --prefix` is sent as key "\0", range_end "\0").
        let s = set(&[(b"\0", b"\0")]);
        assert!(s.covers(&r(b"\0", b"\0")) && s.covers(&r(b"\0\0", b"")) && s.covers(&r(b"\xff", b"\0")));
        assert!(!s.covers(&r(b"", b"")));
        assert!(!s.covers(&r(b"", b"\0")), "the key \"\" is outside [\\0, ..)");
    }

    #[test]
    fn empty_key_grant() {
        let s = set(&[(b"", b"\0")]);
        assert!(s.covers(&r(b"", b"\0")) && s.covers(&r(b"", b"")) && s.covers(&r(b"\0", b"\0")));
        assert!(s.covers(&r(b"\xff\xff", b"")));

        let s = set(&[(b"", b"")]);
        assert!(s.covers(&r(b"", b"")) && !s.covers(&r(b"", b"\0\0")));
        assert!(!s.covers(&r(b"\0", b"")));

        let s = set(&[(b"", b"b")]);
        assert!(s.covers(&r(b"", b"b")) && s.covers(&r(b"a\xff", b"")) && s.covers(&r(b"\0", b"a")));
        assert!(!s.covers(&r(b"b", b"")) && !s.covers(&r(b"", b"\0")));

        assert!(IntervalSet::default().is_empty());
        assert!(!IntervalSet::default().covers(&r(b"", b"")));
    }

    #[test]
    fn empty_and_inverted_requests_need_their_start_key() {
        let s = set(&[(b"a", b"c")]);
        assert!(s.covers(&r(b"b", b"a")));
        assert!(s.covers(&r(b"b", b"b")));
        assert!(!s.covers(&r(b"d", b"a")));
        assert!(!s.covers(&r(b"c", b"c")));
        assert!(!IntervalSet::default().covers(&r(b"b", b"a")));
    }

    #[test]
    fn permission_types() {
        let perms = [
            perm(PermType::Read, b"r", b""),
            perm(PermType::Write, b"w", b""),
            perm(PermType::Readwrite, b"rw", b""),
            Permission { perm_type: 7, key: b"x".to_vec(), range_end: b"\0".to_vec() },
            Permission { perm_type: -1, key: b"y".to_vec(), range_end: b"\0".to_vec() },
        ];
        let p = PermissionSet::from_permissions(&perms);
        let check = |key: &[u8]| (p.allows(Access::Read, &r(key, b"")), p.allows(Access::Write, &r(key, b"")));
        assert_eq!(check(b"r"), (true, false));
        assert_eq!(check(b"w"), (false, true));
        assert_eq!(check(b"rw"), (true, true));
        assert_eq!(check(b"x"), (false, false));
        assert_eq!(check(b"y"), (false, false));
        assert_eq!(PermissionSet::from_permissions(&[]), PermissionSet::default());
    }

    // ---- property test against a brute-force oracle ----------------------------------------------------------
    //
    // Why enumerating a finite key universe is exact. Let the query be `[s, e)` (e possibly +inf) and the grants
    // `[a_j, b_j)` (b_j possibly +inf), all in the total order of byte strings.
    //
    // Lemma: if some key p in `[s, e)` is not granted, then one of the *critical points* — `s`, or a finite grant
    // end `b_j` with `s <= b_j < e` — is an ungranted key of the query. Proof: let x be the largest element of
    // the finite set `{s} ∪ {b_j : b_j <= p}`; then `s <= x <= p < e`. If some grant `[a_k, b_k)` contained x,
    // then `b_k > x` and, by the maximality of x, `b_k > p`; with `a_k <= x <= p` it would contain p. So x is not
    // granted. (Only the total order is used; no density or finiteness of the key space is needed, so unbounded
    // ends and infinitely long keys between bounds are handled.)
    //
    // So "every key of the universe U that lies in the query is granted" is equivalent to "every key of the query
    // is granted" as soon as U contains every critical point. Generated keys and explicit range ends are strings
    // of length <= MAX_LEN over ALPHABET; prefix ends are such strings with one byte incremented (0x00 -> 0x01,
    // 0x01 -> 0x02, 0x61 -> 0x62); single-key ends are `k + "\0"`, of length <= MAX_LEN + 1. U is therefore all
    // strings of length <= MAX_LEN + 1 over ALPHABET ∪ {0x02, 0x62}; `oracle_covers` asserts that U really holds
    // every critical point, so a change of the generators cannot silently make the oracle inexact. Restricting
    // to short keys without this argument would be wrong: `[a, a\0)` holds only `a`, but `[a\0, a\0\0)` is a
    // separate key that a length-1 universe would never see.
    //
    // Inverted or empty query spans touch no key; keyward's rule for them (allowed iff the start key is granted)
    // is checked directly.

    const ALPHABET: [u8; 4] = [0x00, 0x01, 0x61, 0xff];
    const UNIVERSE_BYTES: [u8; 6] = [0x00, 0x01, 0x02, 0x61, 0x62, 0xff];
    const MAX_LEN: usize = 3;

    fn universe() -> Vec<Vec<u8>> {
        let mut all = vec![Vec::new()];
        let mut layer = vec![Vec::new()];
        for _ in 0..=MAX_LEN {
            layer = layer
                .iter()
                .flat_map(|prefix: &Vec<u8>| {
                    UNIVERSE_BYTES.iter().map(move |&b| {
                        let mut key = prefix.clone();
                        key.push(b);
                        key
                    })
                })
                .collect();
            all.extend(layer.iter().cloned());
        }
        all.sort();
        all
    }

    /// Membership written independently of the code under test.
    fn naive_contains(range: &KeyRange, key: &[u8]) -> bool {
        match range {
            KeyRange::Single(k) => k.as_slice() == key,
            KeyRange::Span { start, end } => start.as_slice() <= key && key < end.as_slice(),
            KeyRange::From(start) => start.as_slice() <= key,
        }
    }

    fn oracle_covers(grants: &[KeyRange], query: &KeyRange, universe: &[Vec<u8>]) -> bool {
        let granted = |key: &[u8]| grants.iter().any(|g| naive_contains(g, key));
        if let KeyRange::Span { start, end } = query {
            if end <= start {
                return granted(start);
            }
        }
        // The exactness precondition: every critical point is in the universe.
        let in_universe = |key: &[u8]| universe.binary_search_by(|k| k.as_slice().cmp(key)).is_ok();
        assert!(in_universe(query.start()), "query start {:?} outside the universe", query.start());
        for grant in grants {
            if let Some(end) = grant.end() {
                assert!(in_universe(&end), "grant end {end:?} outside the universe");
            }
        }
        universe.iter().filter(|key| naive_contains(query, key)).all(|key| granted(key))
    }

    fn key() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(prop::sample::select(ALPHABET.to_vec()), 0..=MAX_LEN)
    }

    /// A `(key, range_end)` pair: single key, from-key, an etcdctl prefix, or an arbitrary (maybe inverted) end.
    fn key_and_end() -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
        (key(), 0..5u8, key()).prop_map(|(key, kind, other)| match kind {
            0 => (key, Vec::new()),
            1 => (key, vec![0]),
            2 => {
                let end = prefix_end(&key);
                (key, end)
            }
            _ => (key, other),
        })
    }

    fn check_invariants(set: &IntervalSet) {
        let ivs = &set.intervals;
        for iv in ivs {
            if let End::Key(end) = &iv.end {
                assert!(iv.start < *end, "empty interval {iv:?}");
            }
        }
        for pair in ivs.windows(2) {
            match &pair[0].end {
                End::Key(end) => assert!(*end < pair[1].start, "not coalesced: {pair:?}"),
                End::Unbounded => panic!("unbounded interval before another: {pair:?}"),
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        #[test]
        fn covers_matches_oracle(
            grants in prop::collection::vec(key_and_end(), 0..8),
            queries in prop::collection::vec(key_and_end(), 1..6),
        ) {
            let universe = universe();
            let grants: Vec<KeyRange> = grants.iter().map(|(k, e)| KeyRange::new(k, e)).collect();
            let set = IntervalSet::from_ranges(&grants);
            check_invariants(&set);
            for (k, e) in &queries {
                let query = KeyRange::new(k, e);
                prop_assert_eq!(set.covers(&query), oracle_covers(&grants, &query, &universe), "{:?}", query);
            }
            // Every non-empty grant covers itself (an inverted one grants nothing, not even its start key).
            for grant in grants.iter().filter(|g| !g.is_empty()) {
                prop_assert!(set.covers(grant), "{:?}", grant);
            }
        }

        #[test]
        fn allows_matches_oracle(
            perms in prop::collection::vec((-1..4i32, key_and_end()), 0..10),
            queries in prop::collection::vec(key_and_end(), 1..6),
        ) {
            let universe = universe();
            let perms: Vec<Permission> = perms
                .into_iter()
                .map(|(perm_type, (key, range_end))| Permission { perm_type, key, range_end })
                .collect();
            let set = PermissionSet::from_permissions(&perms);
            check_invariants(&set.read);
            check_invariants(&set.write);
            let grants = |types: &[i32]| -> Vec<KeyRange> {
                perms
                    .iter()
                    .filter(|p| types.contains(&p.perm_type))
                    .map(|p| KeyRange::new(&p.key, &p.range_end))
                    .collect()
            };
            let read = grants(&[PermType::Read as i32, PermType::Readwrite as i32]);
            let write = grants(&[PermType::Write as i32, PermType::Readwrite as i32]);
            for (k, e) in &queries {
                let query = KeyRange::new(k, e);
                prop_assert_eq!(set.allows(Access::Read, &query), oracle_covers(&read, &query, &universe));
                prop_assert_eq!(set.allows(Access::Write, &query), oracle_covers(&write, &query, &universe));
            }
        }
    }
}
