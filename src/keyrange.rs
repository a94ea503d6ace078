//! The key ranges of etcd's API: a single key, `[start, end)`, or everything from a key on.
//!
//! etcd encodes all three in a `(key, range_end)` pair; this type decides which one once, at the edge.

#[cfg(test)]
use std::cmp::Ordering;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum KeyRange {
    /// Exactly one key (`range_end` empty).
    Single(Vec<u8>),
    /// `[start, end)`; empty when `end <= start`.
    Span { start: Vec<u8>, end: Vec<u8> },
    /// Every key `>= start` (`range_end` is `"\0"`).
    From(Vec<u8>),
}

impl KeyRange {
    pub(crate) fn new(key: &[u8], range_end: &[u8]) -> Self {
        match range_end {
            [] => KeyRange::Single(key.to_vec()),
            [0] => KeyRange::From(key.to_vec()),
            end => KeyRange::Span { start: key.to_vec(), end: end.to_vec() },
        }
    }

    pub(crate) fn start(&self) -> &[u8] {
        match self {
            KeyRange::Single(k) | KeyRange::From(k) => k,
            KeyRange::Span { start, .. } => start,
        }
    }

    /// The exclusive upper bound, or `None` when the range runs to the end of the key space.
    pub(crate) fn end(&self) -> Option<std::borrow::Cow<'_, [u8]>> {
        match self {
            KeyRange::Single(k) => {
                let mut next = k.clone();
                next.push(0);
                Some(next.into())
            }
            KeyRange::Span { end, .. } => Some(end.as_slice().into()),
            KeyRange::From(_) => None,
        }
    }

    pub(crate) fn contains(&self, key: &[u8]) -> bool {
        match self {
            KeyRange::Single(k) => k == key,
            KeyRange::Span { start, end } => start.as_slice() <= key && key < end.as_slice(),
            KeyRange::From(start) => start.as_slice() <= key,
        }
    }

    #[cfg(test)]
    /// Whether two ranges share at least one key.
    pub(crate) fn intersects(&self, other: &KeyRange) -> bool {
        let (a_start, a_end) = (self.start(), self.end());
        let (b_start, b_end) = (other.start(), other.end());
        let below = |start: &[u8], end: &Option<std::borrow::Cow<'_, [u8]>>| match end {
            Some(end) => start.cmp(end) == Ordering::Less,
            None => true,
        };
        below(a_start, &b_end) && below(b_start, &a_end) && !self.is_empty() && !other.is_empty()
    }

    pub(crate) fn is_empty(&self) -> bool {
        matches!(self, KeyRange::Span { start, end } if end <= start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_the_three_shapes() {
        assert_eq!(KeyRange::new(b"a", b""), KeyRange::Single(b"a".to_vec()));
        assert_eq!(KeyRange::new(b"a", b"\0"), KeyRange::From(b"a".to_vec()));
        assert_eq!(KeyRange::new(b"a", b"c"), KeyRange::Span { start: b"a".to_vec(), end: b"c".to_vec() });
    }

    #[test]
    fn membership_and_intersection() {
        let span = KeyRange::new(b"b", b"d");
        assert!(span.contains(b"b") && span.contains(b"c\xff") && !span.contains(b"d"));
        assert!(KeyRange::new(b"a", b"\0").contains(b"zzz"));
        assert!(span.intersects(&KeyRange::new(b"c", b"")));
        assert!(!span.intersects(&KeyRange::new(b"d", b"")));
        assert!(span.intersects(&KeyRange::new(b"a", b"\0")));
        assert!(!KeyRange::new(b"d", b"b").intersects(&KeyRange::new(b"a", b"\0")));
        assert!(KeyRange::new(b"a", b"").intersects(&KeyRange::new(b"a", b"")));
    }
}
