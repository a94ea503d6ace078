//! Which watchers a key touches: the index from watched key ranges to watchers that lets a commit
//! find the watchers of each of its keys in O(log n + found), not by asking every watcher.
//!
//! As etcd's `watcherGroup`: single-key watches in a map by key, ranges (`[start, end)` and from-key)
//! in an interval tree. The tree is a treap ordered by `(start, id)` whose nodes also know the largest
//! end in their subtree, so a stabbing query skips every subtree whose ranges all end at or before
//! the key, and every right subtree whose ranges all start after it.

use std::cmp::Ordering;
use std::collections::HashMap;

use crate::keyrange::KeyRange;

/// A watcher's id in the hub.
pub(crate) type WatcherId = u64;

#[derive(Default)]
pub(crate) struct WatchIndex {
    singles: HashMap<Vec<u8>, Vec<WatcherId>>,
    ranges: IntervalTree,
}

impl WatchIndex {
    pub(crate) fn insert(&mut self, id: WatcherId, range: &KeyRange) {
        match range {
            KeyRange::Single(key) => self.singles.entry(key.clone()).or_default().push(id),
            KeyRange::Span { start, end } => self.ranges.insert(start.clone(), Some(end.clone()), id),
            KeyRange::From(start) => self.ranges.insert(start.clone(), None, id),
        }
    }

    /// Removes what `insert` added for `id` and `range` (nothing when it is not there).
    pub(crate) fn remove(&mut self, id: WatcherId, range: &KeyRange) {
        match range {
            KeyRange::Single(key) => {
                if let Some(ids) = self.singles.get_mut(key) {
                    ids.retain(|&other| other != id);
                    if ids.is_empty() {
                        self.singles.remove(key);
                    }
                }
            }
            KeyRange::Span { start, .. } | KeyRange::From(start) => self.ranges.remove(start, id),
        }
    }

    /// Calls `found` with each watcher whose range contains `key`.
    pub(crate) fn touching(&self, key: &[u8], found: &mut impl FnMut(WatcherId)) {
        if let Some(ids) = self.singles.get(key) {
            ids.iter().copied().for_each(&mut *found);
        }
        self.ranges.stab(self.ranges.root, key, found);
    }

    pub(crate) fn clear(&mut self) {
        *self = WatchIndex::default();
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.singles.is_empty() && self.ranges.root.is_none()
    }
}

type Link = Option<usize>;

struct Node {
    start: Vec<u8>,
    /// Exclusive; `None` runs to the end of the key space.
    end: Option<Vec<u8>>,
    id: WatcherId,
    priority: u64,
    left: Link,
    right: Link,
    /// The node of this subtree whose end is the largest.
    max_end: usize,
}

/// A treap of ranges in an arena (`free` holds the slots of removed nodes).
#[derive(Default)]
struct IntervalTree {
    nodes: Vec<Node>,
    free: Vec<usize>,
    root: Link,
    /// Drives the priorities (splitmix64): independent of the keys, so no choice of keys unbalances it.
    seed: u64,
}

/// `a > b` for exclusive ends, `None` being past every key.
fn end_after(a: &Option<Vec<u8>>, b: &Option<Vec<u8>>) -> bool {
    match (a, b) {
        (None, None) => false,
        (None, Some(_)) => true,
        (Some(_), None) => false,
        (Some(a), Some(b)) => a > b,
    }
}

impl IntervalTree {
    fn insert(&mut self, start: Vec<u8>, end: Option<Vec<u8>>, id: WatcherId) {
        self.seed = self.seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        let priority = z ^ (z >> 31);
        let node = Node { start, end, id, priority, left: None, right: None, max_end: 0 };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.nodes[slot] = node;
                slot
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        };
        self.nodes[slot].max_end = slot;
        self.root = Some(self.insert_at(self.root, slot));
    }

    fn remove(&mut self, start: &[u8], id: WatcherId) {
        self.root = self.remove_at(self.root, start, id);
    }

    fn order(&self, a: usize, start: &[u8], id: WatcherId) -> Ordering {
        (start, id).cmp(&(self.nodes[a].start.as_slice(), self.nodes[a].id))
    }

    fn insert_at(&mut self, at: Link, new: usize) -> usize {
        let Some(i) = at else { return new };
        let (start, id) = (std::mem::take(&mut self.nodes[new].start), self.nodes[new].id);
        let less = self.order(i, &start, id) == Ordering::Less;
        self.nodes[new].start = start;
        let top = if less {
            let left = self.insert_at(self.nodes[i].left, new);
            self.nodes[i].left = Some(left);
            if self.nodes[left].priority > self.nodes[i].priority {
                self.rotate_right(i)
            } else {
                i
            }
        } else {
            let right = self.insert_at(self.nodes[i].right, new);
            self.nodes[i].right = Some(right);
            if self.nodes[right].priority > self.nodes[i].priority {
                self.rotate_left(i)
            } else {
                i
            }
        };
        self.update(top);
        top
    }

    fn remove_at(&mut self, at: Link, start: &[u8], id: WatcherId) -> Link {
        let i = at?;
        match self.order(i, start, id) {
            Ordering::Less => self.nodes[i].left = self.remove_at(self.nodes[i].left, start, id),
            Ordering::Greater => self.nodes[i].right = self.remove_at(self.nodes[i].right, start, id),
            Ordering::Equal => {
                let merged = self.merge(self.nodes[i].left, self.nodes[i].right);
                self.nodes[i].start = Vec::new();
                self.nodes[i].end = None;
                self.free.push(i);
                return merged;
            }
        }
        self.update(i);
        Some(i)
    }

    /// Joins two treaps whose every key of `a` is below every key of `b`.
    fn merge(&mut self, a: Link, b: Link) -> Link {
        let (Some(a), Some(b)) = (a, b) else { return a.or(b) };
        let top = if self.nodes[a].priority > self.nodes[b].priority {
            self.nodes[a].right = self.merge(self.nodes[a].right, Some(b));
            a
        } else {
            self.nodes[b].left = self.merge(Some(a), self.nodes[b].left);
            b
        };
        self.update(top);
        Some(top)
    }

    fn rotate_right(&mut self, i: usize) -> usize {
        let Some(l) = self.nodes[i].left else { return i };
        self.nodes[i].left = self.nodes[l].right;
        self.nodes[l].right = Some(i);
        self.update(i);
        self.update(l);
        l
    }

    fn rotate_left(&mut self, i: usize) -> usize {
        let Some(r) = self.nodes[i].right else { return i };
        self.nodes[i].right = self.nodes[r].left;
        self.nodes[r].left = Some(i);
        self.update(i);
        self.update(r);
        r
    }

    fn update(&mut self, i: usize) {
        let mut max = i;
        for child in [self.nodes[i].left, self.nodes[i].right].into_iter().flatten() {
            let candidate = self.nodes[child].max_end;
            if end_after(&self.nodes[candidate].end, &self.nodes[max].end) {
                max = candidate;
            }
        }
        self.nodes[i].max_end = max;
    }

    fn stab(&self, at: Link, key: &[u8], found: &mut impl FnMut(WatcherId)) {
        let Some(i) = at else { return };
        let node = &self.nodes[i];
        // Every range below ends at or before `key`: none contains it.
        if matches!(&self.nodes[node.max_end].end, Some(end) if end.as_slice() <= key) {
            return;
        }
        self.stab(node.left, key, found);
        if node.start.as_slice() > key {
            return; // this range and every one to its right start after `key`
        }
        if node.end.as_ref().is_none_or(|end| key < end.as_slice()) {
            found(node.id);
        }
        self.stab(node.right, key, found);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touching(index: &WatchIndex, key: &[u8]) -> Vec<WatcherId> {
        let mut found = Vec::new();
        index.touching(key, &mut |id| found.push(id));
        found.sort_unstable();
        found
    }

    /// Against a plain scan of every range, over inserts and removals of all three shapes.
    #[test]
    fn finds_exactly_the_ranges_that_contain_a_key() {
        let mut index = WatchIndex::default();
        let mut live: Vec<(WatcherId, KeyRange)> = Vec::new();
        let mut state = 7u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let key = |n: u64| format!("k{:02}", n % 40).into_bytes();
        for id in 0..600u64 {
            let r = next();
            let range = match r % 3 {
                0 => KeyRange::new(&key(r >> 8), b""),
                1 => KeyRange::new(&key(r >> 8), &key(r >> 20)),
                _ => KeyRange::new(&key(r >> 8), b"\0"),
            };
            index.insert(id, &range);
            live.push((id, range));
            if next() % 3 == 0 {
                let (gone, range) = live.swap_remove((next() % live.len() as u64) as usize);
                index.remove(gone, &range);
            }
            if id % 50 == 0 {
                for k in 0..42 {
                    let probe = format!("k{k:02}").into_bytes();
                    let mut want: Vec<_> = live.iter().filter(|(_, r)| r.contains(&probe)).map(|(id, _)| *id).collect();
                    want.sort_unstable();
                    assert_eq!(touching(&index, &probe), want, "key {}", String::from_utf8_lossy(&probe));
                }
            }
        }
        for (id, range) in live.drain(..) {
            index.remove(id, &range);
        }
        assert!(index.is_empty());
    }

    #[test]
    fn the_three_shapes() {
        let mut index = WatchIndex::default();
        index.insert(1, &KeyRange::new(b"a", b""));
        index.insert(2, &KeyRange::new(b"a", b"c"));
        index.insert(3, &KeyRange::new(b"b", b"\0"));
        index.insert(4, &KeyRange::new(b"a", b""));
        assert_eq!(touching(&index, b"a"), [1, 2, 4]);
        assert_eq!(touching(&index, b"b"), [2, 3]);
        assert_eq!(touching(&index, b"c"), [3]);
        assert_eq!(touching(&index, b"0"), Vec::<WatcherId>::new());
        index.remove(1, &KeyRange::new(b"a", b""));
        index.remove(3, &KeyRange::new(b"b", b"\0"));
        assert_eq!(touching(&index, b"a"), [2, 4]);
        assert_eq!(touching(&index, b"zz"), Vec::<WatcherId>::new());
    }
}
