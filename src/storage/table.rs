//! An LMDB table whose keys may be any length, iterated in the byte order of those keys.
//!
//! LMDB refuses keys longer than `mdb_env_get_maxkeysize` (511 bytes), but etcd keys, user names, role
//! names and lease attachments may be as long as a request (`--max-request-bytes`). A [`Table`] keeps the
//! common case free: a key of at most `chunk` bytes is stored as itself in the table's own database. A
//! longer key is split into chunks, like a trie with `chunk`-byte edges:
//!
//! - its first `chunk` bytes `p` name a *group*, stored in the table's database as the marker key
//!   `p ++ 0x00` whose value is the group's id (a number unique in the environment);
//! - the rest of the key is stored in the environment's shared `long_keys` database under
//!   `group id (8 bytes, big-endian) ++ rest`, splitting again, with a marker `group id ++ p' ++ 0x00`, if
//!   the rest is longer than `chunk`.
//!
//! Why the order is exactly the byte order of the full keys: within one level, an entry of at most
//! `chunk` bytes is a key (or key remainder) and an entry of exactly `chunk + 1` bytes is a marker. Every
//! key in group `p` is `p ++ x` with `x` non-empty, so it sorts after `p` itself and before every key
//! that differs from `p` within the first `chunk` bytes, which is precisely where LMDB puts the marker
//! `p ++ 0x00` among entries of at most `chunk` bytes. A walk that descends into a group when it meets its
//! marker therefore visits all keys in order. Group ids are allocated from a counter in the same write
//! transaction, so every member that applies the same entries writes byte-identical tables.
//!
//! A group is removed (its marker deleted) when its last key goes, so the structure holds nothing that
//! the keys don't need.

use std::borrow::Cow;
use std::ops::Bound;

use heed::types::Bytes;
use heed::{RoRange, RoTxn, RwTxn};

use super::{Db, LMDB_MAX_KEY};

const GROUP_ID_LEN: usize = 8;
/// The longest key (or key remainder) stored as itself: a marker in a group (`id ++ chunk ++ 0x00`) must
/// still fit LMDB's limit.
pub(crate) const CHUNK: usize = LMDB_MAX_KEY - GROUP_ID_LEN - 1;
/// Group 0 is never allocated; its key space holds the allocation counter.
const NEXT_GROUP: &[u8] = b"\0\0\0\0\0\0\0\0next_group";

/// The shared database of an environment that holds the remainders of long keys for all its tables.
#[derive(Clone, Copy)]
pub(crate) struct LongKeys {
    db: Db,
    chunk: usize,
}

impl LongKeys {
    pub(crate) const TABLE: &'static str = "long_keys";

    pub(crate) fn new(db: Db) -> Self {
        LongKeys { db, chunk: CHUNK }
    }

    /// A tiny chunk makes tests reach every level of the structure with short keys.
    #[cfg(test)]
    pub(crate) fn with_chunk(db: Db, chunk: usize) -> Self {
        assert!((1..=CHUNK).contains(&chunk));
        LongKeys { db, chunk }
    }

    pub(crate) fn db(&self) -> Db {
        self.db
    }

    /// The group a record of a table's own database opens, if the record is a marker (a key of
    /// exactly `chunk + 1` bytes; every key stored as itself is at most `chunk` bytes).
    pub(crate) fn marker_group(&self, raw: &[u8], value: &[u8]) -> heed::Result<Option<u64>> {
        if raw.len() == self.chunk + 1 {
            Ok(Some(group_id(value)?))
        } else {
            Ok(None)
        }
    }

    /// Removes group `id` and every group nested in it: the remainders of a table's long keys, once
    /// the table itself is gone.
    pub(crate) fn remove_group(&self, txn: &mut RwTxn, id: u64) -> heed::Result<()> {
        let mut pending = vec![id];
        while let Some(id) = pending.pop() {
            let from = id.to_be_bytes();
            let mut doomed = Vec::new();
            for entry in self.db.prefix_iter(txn, &from)? {
                let (raw, value) = entry?;
                if let Some(inner) = self.marker_group(&raw[GROUP_ID_LEN..], value)? {
                    pending.push(inner);
                }
                doomed.push(raw.to_vec());
            }
            for raw in doomed {
                self.db.delete(txn, &raw)?;
            }
        }
        Ok(())
    }
}

/// Where one level of the structure lives: the table's own database, or a group in `long_keys`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Level {
    Main,
    Group(u64),
}

/// A table with keys of any non-empty length. Cheap to copy: it holds two database handles.
#[derive(Clone, Copy)]
pub(crate) struct Table {
    main: Db,
    long: LongKeys,
}

impl Table {
    pub(crate) fn new(main: Db, long: LongKeys) -> Self {
        Table { main, long }
    }

    /// The table's own database (for snapshots and whole-store hashes, together with `long_keys`).
    pub(crate) fn main_db(&self) -> Db {
        self.main
    }

    fn chunk(&self) -> usize {
        self.long.chunk
    }

    fn db(&self, level: Level) -> Db {
        match level {
            Level::Main => self.main,
            Level::Group(_) => self.long.db,
        }
    }

    /// The LMDB key of `rest` at `level`.
    fn slot<'k>(&self, level: Level, rest: &'k [u8]) -> Cow<'k, [u8]> {
        match level {
            Level::Main => Cow::Borrowed(rest),
            Level::Group(id) => {
                let mut out = Vec::with_capacity(GROUP_ID_LEN + rest.len());
                out.extend_from_slice(&id.to_be_bytes());
                out.extend_from_slice(rest);
                Cow::Owned(out)
            }
        }
    }

    /// The LMDB key of the marker for the group of keys starting with `head` (exactly `chunk` bytes).
    fn marker(&self, level: Level, head: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(GROUP_ID_LEN + head.len() + 1);
        if let Level::Group(id) = level {
            out.extend_from_slice(&id.to_be_bytes());
        }
        out.extend_from_slice(head);
        out.push(0);
        out
    }

    pub(crate) fn get<'t>(&self, txn: &'t RoTxn, key: &[u8]) -> heed::Result<Option<&'t [u8]>> {
        let mut level = Level::Main;
        let mut rest = key;
        // LMDB has no zero-length keys, so none is ever stored.
        if rest.is_empty() {
            return Ok(None);
        }
        while rest.len() > self.chunk() {
            let (head, tail) = rest.split_at(self.chunk());
            match self.db(level).get(txn, &self.marker(level, head))? {
                None => return Ok(None),
                Some(id) => level = Level::Group(group_id(id)?),
            }
            rest = tail;
        }
        self.db(level).get(txn, &self.slot(level, rest))
    }

    /// Stores `key → value`. An empty key is refused (LMDB cannot store one; callers never have one).
    pub(crate) fn put(&self, txn: &mut RwTxn, key: &[u8], value: &[u8]) -> heed::Result<()> {
        if key.is_empty() {
            return Err(heed::Error::Mdb(heed::MdbError::BadValSize));
        }
        let mut level = Level::Main;
        let mut rest = key;
        while rest.len() > self.chunk() {
            let (head, tail) = rest.split_at(self.chunk());
            let marker = self.marker(level, head);
            let id = match self.db(level).get(txn, &marker)? {
                Some(id) => group_id(id)?,
                None => {
                    let id = self.allocate_group(txn)?;
                    self.db(level).put(txn, &marker, &id.to_be_bytes())?;
                    id
                }
            };
            level = Level::Group(id);
            rest = tail;
        }
        self.db(level).put(txn, &self.slot(level, rest), value)
    }

    /// Stores each `key → value` of `entries` like `put`. Given in ascending key order, they are
    /// written through one cursor: LMDB looks for each key first on the leaf page of the one before
    /// (`mdb_cursor_set`), so a run of keys that land on one page costs one search from the root, not
    /// one each, and each page is touched once, in order. Any order is correct; only slower.
    pub(crate) fn put_in_order(&self, txn: &mut RwTxn, entries: &[(Vec<u8>, Vec<u8>)]) -> heed::Result<()> {
        let mut split = Vec::new();
        {
            let mut cursor = self.main.iter_mut(txn)?;
            for (key, value) in entries {
                if key.is_empty() || key.len() > self.chunk() {
                    split.push((key, value));
                    continue;
                }
                // SAFETY: `key` and `value` are the caller's own bytes, not borrowed from the
                // database, and nothing read through this cursor is held across the write. Without
                // MDB_CURRENT this is an ordinary put at `key` (insert or overwrite).
                #[allow(unsafe_code)]
                unsafe {
                    cursor.put_current_with_options::<Bytes>(heed::PutFlags::empty(), key, value)?
                };
            }
        }
        // Keys longer than a chunk (or empty, which `put` refuses) go through the groups.
        for (key, value) in split {
            self.put(txn, key, value)?;
        }
        Ok(())
    }

    /// Stores `key → value` like `put`, but appended (`MDB_APPEND`) when the key is stored whole and
    /// goes after every key of the table's database: LMDB then fills its last page instead of splitting
    /// it in the middle, so keys that arrive in order fill their pages.
    pub(crate) fn put_appending(&self, txn: &mut RwTxn, key: &[u8], value: &[u8]) -> heed::Result<()> {
        if !key.is_empty() && key.len() <= self.chunk() {
            // A marker (`head ++ 0x00`) below `key` has every key of its group below `key` too.
            let last = self.main.last(txn)?;
            if last.is_none_or(|(k, _)| k < key) {
                return self.main.put_with_flags(txn, heed::PutFlags::APPEND, key, value);
            }
        }
        self.put(txn, key, value)
    }

    /// The greatest key in `[prefix, bound)` (every key there starting with `prefix`), with its value:
    /// one seek when `bound` is stored whole and the key found is too, a walk of the range otherwise.
    pub(crate) fn last_below<'t>(
        &self,
        txn: &'t RoTxn,
        prefix: &[u8],
        bound: &[u8],
    ) -> heed::Result<Option<Entry<'t>>> {
        if bound.len() <= self.chunk() {
            match self.main.get_lower_than(txn, bound)? {
                None => return Ok(None),
                Some((raw, value)) if raw.len() <= self.chunk() => {
                    return Ok(raw.starts_with(prefix).then_some((Cow::Borrowed(raw), value)));
                }
                Some(_) => {} // a marker: the greatest key is in its group
            }
        }
        let mut last = None;
        for entry in self.range(txn, Bound::Included(prefix), Bound::Excluded(bound))? {
            last = Some(entry?);
        }
        Ok(last)
    }

    /// Removes `key`; true if it was there. Groups left empty are removed with it.
    pub(crate) fn delete(&self, txn: &mut RwTxn, key: &[u8]) -> heed::Result<bool> {
        if key.is_empty() {
            return Ok(false);
        }
        // The markers walked through, innermost last: (level holding the marker, marker key).
        let mut path: Vec<(Level, Vec<u8>)> = Vec::new();
        let mut level = Level::Main;
        let mut rest = key;
        while rest.len() > self.chunk() {
            let (head, tail) = rest.split_at(self.chunk());
            let marker = self.marker(level, head);
            let Some(id) = self.db(level).get(txn, &marker)? else {
                return Ok(false);
            };
            let id = group_id(id)?;
            path.push((level, marker));
            level = Level::Group(id);
            rest = tail;
        }
        if !self.db(level).delete(txn, &self.slot(level, rest))? {
            return Ok(false);
        }
        while let (Level::Group(id), Some((parent, marker))) = (level, path.pop()) {
            if !self.group_is_empty(txn, id)? {
                break;
            }
            self.db(parent).delete(txn, &marker)?;
            level = parent;
        }
        Ok(true)
    }

    /// Removes every key in `[start, end)`-style bounds; returns how many.
    pub(crate) fn delete_range(&self, txn: &mut RwTxn, start: Bound<&[u8]>, end: Bound<&[u8]>) -> heed::Result<usize> {
        let doomed: Vec<Vec<u8>> = self
            .range(txn, start, end)?
            .map(|entry| entry.map(|(key, _)| key.into_owned()))
            .collect::<Result<_, _>>()?;
        for key in &doomed {
            self.delete(txn, key)?;
        }
        Ok(doomed.len())
    }

    /// Every key that starts with `prefix`, in order.
    pub(crate) fn prefix<'t>(&self, txn: &'t RoTxn, prefix: &[u8]) -> heed::Result<Range<'t>> {
        let end = prefix_end(prefix);
        let end = end.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        self.range(txn, Bound::Included(prefix), end)
    }

    /// The greatest key that starts with `prefix`, with its value: one seek in the table's database
    /// (and one per level of groups it descends), however many keys share the prefix.
    #[cfg(test)]
    pub(crate) fn last_with_prefix<'t>(&self, txn: &'t RoTxn, prefix: &[u8]) -> heed::Result<Option<Entry<'t>>> {
        let chunk = self.chunk();
        if prefix.is_empty() || prefix.len() > chunk {
            // Within one group (or the whole table): walked, as rare as keys this long.
            let mut last = None;
            for entry in self.prefix(txn, prefix)? {
                last = Some(entry?);
            }
            return Ok(last);
        }
        let found = match prefix_end(prefix) {
            Some(upper) => self.main.get_lower_than(txn, &upper)?,
            None => self.main.last(txn)?,
        };
        let Some((raw, value)) = found.filter(|(raw, _)| raw.starts_with(prefix)) else {
            return Ok(None);
        };
        if raw.len() <= chunk {
            return Ok(Some((Cow::Borrowed(raw), value)));
        }
        // A marker (`head ++ 0x00`): every key of its group starts with `head`, so with `prefix`, and
        // sorts after every other key below the bound; the greatest is the group's last.
        let mut key = raw[..chunk].to_vec();
        let mut id = group_id(value)?;
        loop {
            let from = id.to_be_bytes();
            let found = match id.checked_add(1) {
                Some(next) => self.long.db.get_lower_than(txn, &next.to_be_bytes())?,
                None => self.long.db.last(txn)?,
            };
            let (raw, value) = found.filter(|(raw, _)| raw.starts_with(&from)).ok_or_else(|| corrupt("empty group"))?;
            let rest = &raw[GROUP_ID_LEN..];
            if rest.len() <= chunk {
                key.extend_from_slice(rest);
                return Ok(Some((Cow::Owned(key), value)));
            }
            key.extend_from_slice(&rest[..chunk]);
            id = group_id(value)?;
        }
    }

    /// Empties the table, the groups of its long keys in `long_keys` included: what a table no longer
    /// used leaves behind is nothing (`raft/state_machine/layout.rs`).
    pub(crate) fn clear(&self, txn: &mut RwTxn) -> heed::Result<()> {
        let mut groups = Vec::new();
        for entry in self.main.iter(txn)? {
            let (raw, value) = entry?;
            if let Some(id) = self.long.marker_group(raw, value)? {
                groups.push(id);
            }
        }
        for id in groups {
            self.long.remove_group(txn, id)?;
        }
        self.main.clear(txn)
    }

    /// Every key, in order.
    pub(crate) fn iter<'t>(&self, txn: &'t RoTxn) -> heed::Result<Range<'t>> {
        self.range(txn, Bound::Unbounded, Bound::Unbounded)
    }

    /// The keys within `start` and `end`, in byte order, each with its value.
    pub(crate) fn range<'t>(&self, txn: &'t RoTxn, start: Bound<&[u8]>, end: Bound<&[u8]>) -> heed::Result<Range<'t>> {
        let chunk = self.chunk();
        let main_end = match end {
            Bound::Unbounded => Bound::Unbounded,
            // Keys are never empty: nothing is below (or at) the empty key.
            Bound::Included([]) | Bound::Excluded([]) => {
                return Ok(Range::empty(*self, txn));
            }
            Bound::Included(e) | Bound::Excluded(e) if e.len() <= chunk => end.map(<[u8]>::to_vec),
            // The group `end` runs through is walked, and checked key by key.
            Bound::Included(e) | Bound::Excluded(e) => Bound::Included([&e[..chunk], &[0]].concat()),
        };
        let mut range = Range {
            table: *self,
            txn,
            stack: Vec::new(),
            key: Vec::new(),
            end: end.map(<[u8]>::to_vec),
            main_end,
            done: false,
        };
        range.seek(start)?;
        Ok(range)
    }

    fn group_is_empty(&self, txn: &RoTxn, id: u64) -> heed::Result<bool> {
        let from = id.to_be_bytes();
        Ok(match self.long.db.get_greater_than_or_equal_to(txn, &from)? {
            None => true,
            Some((key, _)) => !key.starts_with(&from),
        })
    }

    fn allocate_group(&self, txn: &mut RwTxn) -> heed::Result<u64> {
        let next = match self.long.db.get(txn, NEXT_GROUP)? {
            None => 1,
            Some(bytes) => group_id(bytes)?,
        };
        self.long.db.put(txn, NEXT_GROUP, &(next + 1).to_be_bytes())?;
        Ok(next)
    }

    /// The bounds of `level`'s entries from `lower` on.
    /// `main_end` bounds the main level (see `Range::main_end`); a group is bounded by its id.
    fn level_range<'t>(
        &self,
        txn: &'t RoTxn,
        level: Level,
        lower: Bound<&[u8]>,
        main_end: Bound<&[u8]>,
    ) -> heed::Result<LmdbRange<'t>> {
        let lower = match (level, lower) {
            // LMDB refuses a zero-length bound; every key of the main level is non-empty.
            (Level::Main, Bound::Included([]) | Bound::Excluded([])) => Bound::Unbounded,
            (_, Bound::Included(k)) => Bound::Included(self.slot(level, k)),
            (_, Bound::Excluded(k)) => Bound::Excluded(self.slot(level, k)),
            (Level::Main, Bound::Unbounded) => Bound::Unbounded,
            (Level::Group(id), Bound::Unbounded) => Bound::Included(Cow::Owned(id.to_be_bytes().to_vec())),
        };
        let next_group = match level {
            Level::Group(id) if id < u64::MAX => Some((id + 1).to_be_bytes()),
            _ => None,
        };
        let upper = match (level, &next_group) {
            (Level::Main, _) => main_end,
            (Level::Group(_), Some(next)) => Bound::Excluded(&next[..]),
            (Level::Group(_), None) => Bound::Unbounded,
        };
        self.db(level).range(txn, &(lower.as_ref().map(|k| k.as_ref()), upper))
    }
}

type LmdbRange<'t> = RoRange<'t, Bytes, Bytes>;

/// A key (whole, rebuilt from its chunks if it is long) and its value.
pub(crate) type Entry<'t> = (Cow<'t, [u8]>, &'t [u8]);

fn group_id(bytes: &[u8]) -> heed::Result<u64> {
    let bytes: [u8; GROUP_ID_LEN] = bytes.try_into().map_err(|_| corrupt("group id"))?;
    Ok(u64::from_be_bytes(bytes))
}

fn corrupt(what: &'static str) -> heed::Error {
    tracing::error!(what, "corrupt long-key record");
    heed::Error::Decoding(format!("corrupt long-key record: {what}").into())
}

/// The smallest key greater than every key starting with `prefix` (`None`: no such key).
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let last = prefix.iter().rposition(|&b| b < 0xff)?;
    let mut end = prefix[..=last].to_vec();
    end[last] += 1;
    Some(end)
}

/// One level being walked: its entries from the current position, how many key bytes are above it,
/// and where those bytes stand against the range's end.
struct Frame<'t> {
    level: Level,
    /// The length of the level's prefix: `Range::key[..depth]`.
    depth: usize,
    edge: EndEdge,
    entries: LmdbRange<'t>,
}

/// Where a level's prefix stands against the range's end: what lets a walk compare only the bytes a
/// level adds, not the whole prefix at every level (with a key of 1 MiB, some 2,000 levels deep, the
/// whole-prefix copies and compares made each seek cost gigabytes of memory traffic).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EndEdge {
    /// Every key under the prefix is below the end (or the range has none).
    Below,
    /// The prefix is a proper prefix of the end: each key under it must be compared.
    OnEdge,
}

/// An in-order walk over a [`Table`]'s keys (full keys, rebuilt from their chunks) and values.
pub(crate) struct Range<'t> {
    table: Table,
    txn: &'t RoTxn<'t>,
    /// The levels entered, innermost last.
    stack: Vec<Frame<'t>>,
    /// The key bytes above the innermost level entered; a frame's prefix is `key[..frame.depth]` (each
    /// level nests in the one below it, so one buffer serves them all).
    key: Vec<u8>,
    end: Bound<Vec<u8>>,
    /// The main level's upper bound for LMDB. It is exact for the keys stored there whole, so only keys
    /// rebuilt from groups are compared with `end`.
    main_end: Bound<Vec<u8>>,
    done: bool,
}

impl<'t> Range<'t> {
    fn empty(table: Table, txn: &'t RoTxn<'t>) -> Self {
        Range {
            table,
            txn,
            stack: Vec::new(),
            key: Vec::new(),
            end: Bound::Unbounded,
            main_end: Bound::Unbounded,
            done: true,
        }
    }

    /// Where the main level (the empty prefix) stands against the end.
    fn main_edge(&self) -> EndEdge {
        match self.end {
            Bound::Unbounded => EndEdge::Below,
            _ => EndEdge::OnEdge,
        }
    }

    /// Positions the walk at the first key within `start`: at each level, the entries after the marker
    /// the start key runs through are left for later, and the walk descends into that marker's group.
    fn seek(&mut self, start: Bound<&[u8]>) -> heed::Result<()> {
        let table = self.table;
        let main_edge = self.main_edge();
        let (mut rest, inclusive) = match start {
            Bound::Unbounded => {
                let entries = table.level_range(self.txn, Level::Main, Bound::Unbounded, self.main_end())?;
                self.stack.push(Frame { level: Level::Main, depth: 0, edge: main_edge, entries });
                return Ok(());
            }
            Bound::Included(key) => (key, true),
            Bound::Excluded(key) => (key, false),
        };
        let mut level = Level::Main;
        let mut edge = main_edge;
        loop {
            let depth = self.key.len();
            if rest.len() <= table.chunk() {
                let lower = if inclusive { Bound::Included(rest) } else { Bound::Excluded(rest) };
                let entries = table.level_range(self.txn, level, lower, self.main_end())?;
                self.stack.push(Frame { level, depth, edge, entries });
                return Ok(());
            }
            let (head, tail) = rest.split_at(table.chunk());
            let mut marker_rest = head.to_vec();
            marker_rest.push(0);
            // Entries before the marker hold keys below `start`, the marker's group holds the keys that
            // share `head`, and entries after it hold keys above `start`.
            let after = table.level_range(self.txn, level, Bound::Excluded(&marker_rest), self.main_end())?;
            let id = table.db(level).get(self.txn, &table.marker(level, head))?.map(group_id).transpose()?;
            self.stack.push(Frame { level, depth, edge, entries: after });
            let Some(id) = id else { return Ok(()) };
            let Some(inner) = self.descend(edge, depth, head) else {
                // The group, and every entry after it at each level above, is past the end.
                self.finish();
                return Ok(());
            };
            self.key.extend_from_slice(head);
            level = Level::Group(id);
            edge = inner;
            rest = tail;
        }
    }

    fn main_end(&self) -> Bound<&[u8]> {
        self.main_end.as_ref().map(Vec::as_slice)
    }

    /// Where the prefix `key[..depth] ++ head` of a group stands against the end, given where
    /// `key[..depth]` stands (`parent`); `None` if every key of the group is past the end.
    fn descend(&self, parent: EndEdge, depth: usize, head: &[u8]) -> Option<EndEdge> {
        let end = match (&self.end, parent) {
            (Bound::Included(end) | Bound::Excluded(end), EndEdge::OnEdge) => &end[depth..],
            _ => return Some(EndEdge::Below),
        };
        let n = head.len().min(end.len());
        match head[..n].cmp(&end[..n]) {
            std::cmp::Ordering::Less => Some(EndEdge::Below),
            std::cmp::Ordering::Equal if head.len() < end.len() => Some(EndEdge::OnEdge),
            // The prefix is the end or extends it: every key of the group (a longer one) is past it.
            _ => None,
        }
    }

    /// Whether the key `key[..depth] ++ rest` of a level that stands at `edge` is past the end.
    fn beyond_end(&self, edge: EndEdge, depth: usize, rest: &[u8]) -> bool {
        if edge == EndEdge::Below {
            return false;
        }
        match &self.end {
            Bound::Unbounded => false,
            Bound::Included(end) => rest > &end[depth..],
            Bound::Excluded(end) => rest >= &end[depth..],
        }
    }

    fn finish(&mut self) {
        self.done = true;
        self.stack.clear();
    }
}

impl<'t> Iterator for Range<'t> {
    type Item = heed::Result<(Cow<'t, [u8]>, &'t [u8])>;

    fn next(&mut self) -> Option<Self::Item> {
        let chunk = self.table.chunk();
        while !self.done {
            let Some(frame) = self.stack.last_mut() else {
                self.finish();
                break;
            };
            let (level, depth, edge) = (frame.level, frame.depth, frame.edge);
            let (raw, value) = match frame.entries.next() {
                None => {
                    self.stack.pop();
                    continue;
                }
                Some(Err(e)) => return Some(Err(e)),
                Some(Ok(entry)) => entry,
            };
            let rest = match level {
                Level::Main => raw,
                Level::Group(_) => &raw[GROUP_ID_LEN.min(raw.len())..],
            };
            // The innermost level's prefix: deeper levels walked before are done.
            self.key.truncate(depth);
            if rest.len() <= chunk {
                if level == Level::Main {
                    // LMDB's own bound (`main_end`) already stopped at the end.
                    return Some(Ok((Cow::Borrowed(rest), value)));
                }
                if self.beyond_end(edge, depth, rest) {
                    self.finish();
                    break;
                }
                return Some(Ok((Cow::Owned([self.key.as_slice(), rest].concat()), value)));
            }
            if rest.len() != chunk + 1 || rest[chunk] != 0 {
                return Some(Err(corrupt("marker key")));
            }
            let id = match group_id(value) {
                Ok(id) => id,
                Err(e) => return Some(Err(e)),
            };
            let head = &rest[..chunk];
            // Every key of the group extends its prefix: if the prefix is already past the end, so are they.
            let Some(inner) = self.descend(edge, depth, head) else {
                self.finish();
                break;
            };
            match self.table.level_range(self.txn, Level::Group(id), Bound::Unbounded, Bound::Unbounded) {
                Ok(entries) => {
                    self.key.extend_from_slice(head);
                    self.stack.push(Frame { level: Level::Group(id), depth: self.key.len(), edge: inner, entries });
                }
                Err(e) => return Some(Err(e)),
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::storage::{self, Durability, LmdbEnv};

    fn open(chunk: usize) -> (tempfile::TempDir, LmdbEnv, Table) {
        let dir = tempfile::tempdir().unwrap();
        let (env, [main, long]) = storage::open(dir.path(), ["t", LongKeys::TABLE], Durability::Full).unwrap();
        (dir, env, Table::new(main, LongKeys::with_chunk(long, chunk)))
    }

    #[derive(Clone, Debug)]
    enum Op {
        Put(Vec<u8>, u8),
        Delete(Vec<u8>),
        DeleteRange(Bound<Vec<u8>>, Bound<Vec<u8>>),
        /// `put_in_order` of these, sorted by key when `true` (any order must give the same table).
        PutInOrder(Vec<(Vec<u8>, u8)>, bool),
    }

    fn key() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(prop::sample::select(vec![0x00u8, 0x01, b'a', 0xfe, 0xff]), 1..9)
    }

    fn bound() -> impl Strategy<Value = Bound<Vec<u8>>> {
        prop_oneof![
            1 => Just(Bound::Unbounded),
            3 => key().prop_map(Bound::Included),
            3 => key().prop_map(Bound::Excluded),
            1 => Just(Bound::Included(Vec::new())),
        ]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (key(), any::<u8>()).prop_map(|(k, v)| Op::Put(k, v)),
            3 => key().prop_map(Op::Delete),
            1 => (bound(), bound()).prop_map(|(s, e)| Op::DeleteRange(s, e)),
            2 => (prop::collection::vec((key(), any::<u8>()), 0..12), any::<bool>()).prop_map(|(kvs, sorted)| Op::PutInOrder(kvs, sorted)),
        ]
    }

    fn as_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
        b.as_ref().map(Vec::as_slice)
    }

    /// The model's entries within the bounds (BTreeMap::range would panic on an inverted range).
    fn within(model: &BTreeMap<Vec<u8>, Vec<u8>>, s: &Bound<Vec<u8>>, e: &Bound<Vec<u8>>) -> Vec<(Vec<u8>, Vec<u8>)> {
        let bounds = (as_ref(s), as_ref(e));
        model
            .iter()
            .filter(|(k, _)| std::ops::RangeBounds::<[u8]>::contains(&bounds, k.as_slice()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    fn walk(table: &Table, txn: &RoTxn, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Vec<(Vec<u8>, Vec<u8>)> {
        table
            .range(txn, start, end)
            .unwrap()
            .map(|e| e.map(|(k, v)| (k.into_owned(), v.to_vec())))
            .collect::<Result<_, _>>()
            .unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// With 1–3-byte chunks, 8-byte keys run through up to seven levels of groups: every lookup and
        /// every range must still equal a sorted map's, and nothing may be left behind once keys go.
        #[test]
        fn behaves_as_a_sorted_map(chunk in 1usize..4, ops in prop::collection::vec(op(), 1..60),
                                   reads in prop::collection::vec((bound(), bound()), 1..8)) {
            let (_dir, env, table) = open(chunk);
            let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
            let mut wtxn = env.write_txn().unwrap();
            for op in &ops {
                match op {
                    Op::Put(k, v) => {
                        table.put(&mut wtxn, k, &[*v]).unwrap();
                        model.insert(k.clone(), vec![*v]);
                    }
                    Op::Delete(k) => {
                        prop_assert_eq!(table.delete(&mut wtxn, k).unwrap(), model.remove(k).is_some());
                    }
                    Op::DeleteRange(s, e) => {
                        let n = table.delete_range(&mut wtxn, as_ref(s), as_ref(e)).unwrap();
                        let doomed: Vec<_> = within(&model, s, e).into_iter().map(|(k, _)| k).collect();
                        prop_assert_eq!(n, doomed.len());
                        for k in doomed { model.remove(&k); }
                    }
                    Op::PutInOrder(kvs, sorted) => {
                        let mut entries: Vec<(Vec<u8>, Vec<u8>)> = kvs.iter().map(|(k, v)| (k.clone(), vec![*v])).collect();
                        // Distinct keys, as its callers give it.
                        let mut seen = std::collections::BTreeSet::new();
                        entries.retain(|(k, _)| seen.insert(k.clone()));
                        if *sorted {
                            entries.sort_by(|a, b| a.0.cmp(&b.0));
                        }
                        table.put_in_order(&mut wtxn, &entries).unwrap();
                        model.extend(entries);
                    }
                }
            }
            for k in ops.iter().filter_map(|op| match op { Op::Put(k, _) | Op::Delete(k) => Some(k), _ => None }).chain(model.keys()) {
                prop_assert_eq!(table.get(&wtxn, k).unwrap().map(<[u8]>::to_vec), model.get(k).cloned());
            }
            for (s, e) in &reads {
                prop_assert_eq!(walk(&table, &wtxn, as_ref(s), as_ref(e)), within(&model, s, e));
            }
            let prefix = vec![b'a'];
            let want: Vec<_> = model.iter().filter(|(k, _)| k.starts_with(&prefix)).map(|(k, v)| (k.clone(), v.clone())).collect();
            let got: Vec<_> = table.prefix(&wtxn, &prefix).unwrap().map(|e| e.map(|(k, v)| (k.into_owned(), v.to_vec()))).collect::<Result<_, _>>().unwrap();
            prop_assert_eq!(got, want);
            // The last key under each prefix of every key (and of none), found by seeking.
            let mut prefixes: Vec<Vec<u8>> = vec![vec![0xff; chunk + 2], vec![b'a'; chunk + 1]];
            for k in model.keys().chain(ops.iter().filter_map(|op| match op { Op::Delete(k) => Some(k), _ => None })) {
                prefixes.extend((1..=k.len()).map(|n| k[..n].to_vec()));
            }
            for prefix in &prefixes {
                let want = model.iter().rev().find(|(k, _)| k.starts_with(prefix)).map(|(k, v)| (k.clone(), v.clone()));
                let got = table.last_with_prefix(&wtxn, prefix).unwrap().map(|(k, v)| (k.into_owned(), v.to_vec()));
                prop_assert_eq!(got, want, "last_with_prefix({:?})", prefix);
            }
            if chunk == 2 {
                // Clearing the table leaves nothing of it in either database (but the group counter).
                table.clear(&mut wtxn).unwrap();
                prop_assert_eq!(table.main.len(&wtxn).unwrap(), 0);
                prop_assert!(table.long.db.len(&wtxn).unwrap() <= 1);
                return Ok(());
            }
            // Removing every key leaves both databases as they started (only the group counter remains).
            let all: Vec<Vec<u8>> = model.keys().cloned().collect();
            for k in &all {
                prop_assert!(table.delete(&mut wtxn, k).unwrap());
            }
            prop_assert_eq!(table.main.len(&wtxn).unwrap(), 0);
            prop_assert!(table.long.db.len(&wtxn).unwrap() <= 1);
        }
    }

    #[test]
    fn keys_far_beyond_lmdbs_limit_round_trip_in_order() {
        let (_dir, env, table) = open(CHUNK);
        let mut wtxn = env.write_txn().unwrap();
        let long = |fill: u8, len: usize, last: u8| {
            let mut k = vec![fill; len];
            k.push(last);
            k
        };
        let keys = [
            long(b'a', 493, b'z'),
            long(b'a', 600, 0),
            long(b'a', 600, 0xff),
            long(0, 4096, 1),
            long(b'a', 1 << 20, b'b'),
            b"a".to_vec(),
            b"b".to_vec(),
        ];
        for (i, k) in keys.iter().enumerate() {
            table.put(&mut wtxn, k, &[i as u8]).unwrap();
        }
        let mut sorted = keys.to_vec();
        sorted.sort();
        let got: Vec<Vec<u8>> =
            walk(&table, &wtxn, Bound::Unbounded, Bound::Unbounded).into_iter().map(|(k, _)| k).collect();
        assert_eq!(got, sorted);
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(table.get(&wtxn, k).unwrap(), Some(&[i as u8][..]));
        }
    }
    /// The layer's cost for keys within a chunk (every key of an ordinary workload): puts, point reads
    /// and a full scan, through a `Table` and through the raw database, alternated and repeated (best
    /// of 5) so a busy machine weighs on both alike.
    #[test]
    #[ignore = "benchmark: cargo test --release --lib table_overhead -- --ignored --nocapture"]
    fn table_overhead_on_short_keys() {
        use std::time::Instant;
        const N: u32 = 100_000;
        let keys: Vec<Vec<u8>> =
            (0..N).map(|i| format!("bench/{:010}", (i as u64 * 7919) % N as u64).into_bytes()).collect();
        let value = vec![7u8; 256];
        let (_dir, env, table) = open(CHUNK);
        let raw = table.main;
        let mut best = [[f64::MAX; 3]; 2];
        for round in 0..10 {
            let through_table = round % 2 == 0;
            let mut w = env.write_txn().unwrap();
            raw.clear(&mut w).unwrap();
            let t0 = Instant::now();
            for k in &keys {
                if through_table {
                    table.put(&mut w, k, &value).unwrap()
                } else {
                    raw.put(&mut w, k, &value).unwrap()
                }
            }
            let put = t0.elapsed();
            let t0 = Instant::now();
            let mut found = 0;
            for k in &keys {
                let v = if through_table { table.get(&w, k).unwrap() } else { raw.get(&w, k).unwrap() };
                found += v.map_or(0, |v| v.len());
            }
            let get = t0.elapsed();
            let t0 = Instant::now();
            // A prefix range, as etcd's `get --prefix bench/` asks for it.
            let (from, to) = (&b"bench/"[..], &b"bench0"[..]);
            let scanned = if through_table {
                table
                    .range(&w, Bound::Included(from), Bound::Excluded(to))
                    .unwrap()
                    .map(|e| e.unwrap().1.len())
                    .sum::<usize>()
            } else {
                let bounds = (Bound::Included(from), Bound::Excluded(to));
                raw.range(&w, &bounds).unwrap().map(|e| e.unwrap().1.len()).sum::<usize>()
            };
            let scan = t0.elapsed();
            assert_eq!((found, scanned), (256 * N as usize, 256 * N as usize));
            w.abort();
            let per = |d: std::time::Duration| d.as_nanos() as f64 / N as f64;
            let b = &mut best[usize::from(through_table)];
            for (slot, ns) in b.iter_mut().zip([per(put), per(get), per(scan)]) {
                *slot = slot.min(ns);
            }
        }
        for (name, i) in [("put", 0), ("get", 1), ("scan", 2)] {
            let (raw, table) = (best[0][i], best[1][i]);
            eprintln!("{name:5} raw {raw:7.1} ns/key  table {table:7.1} ns/key  ratio {:.3}", table / raw);
        }
    }
}
