//! LMDB environments: the one place keyward opens an environment (and so the one `unsafe` it needs).
//!
//! A member has two environments under `<data-dir>/member/`: `raft/` (log and vote, fsynced on every
//! append batch) and `kv/` (the state machine: MVCC data, applied log id, membership). Keeping them apart
//! lets openraft append new entries while earlier ones are being applied.

use std::path::Path;

use heed::types::Bytes;
use heed::{CommitOrAbort, Database, Env, EnvFlags, EnvOpenOptions, WithoutTls};

/// Every keyward database maps raw bytes to raw bytes; encodings live with the code that owns each table.
pub type Db = Database<'static, Bytes, Bytes>;
pub type LmdbEnv = Env<WithoutTls>;

/// Address space reserved for an environment. LMDB grows the file only as data is written, so this is a
/// ceiling, not an allocation. The kv environment reserves more when the space quota asks for it
/// (`space::map_size`).
pub const MAP_SIZE: usize = 64 << 30;

/// How much a commit waits for the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Every commit is on disk when it returns (the raft log and vote: an acknowledged write must
    /// survive power loss).
    Full,
    /// Data pages are synced on commit but the meta page is not: a power loss can undo the last
    /// commit, never corrupt or half-apply one (LMDB's `MDB_NOMETASYNC`). Right for the state
    /// machine, whose applied log id is in the same commit: raft replays an undone batch from the log.
    LastCommitMayUndo,
}

/// Opens (creating if needed) the environment at `dir` and the named databases in it.
pub fn open<const N: usize>(dir: &Path, names: [&str; N], durability: Durability) -> heed::Result<(LmdbEnv, [Db; N])> {
    open_with_map_size(dir, names, durability, MAP_SIZE)
}

/// `open` with `map_size` bytes of address space reserved instead of `MAP_SIZE`.
pub fn open_with_map_size<const N: usize>(
    dir: &Path,
    names: [&str; N],
    durability: Durability,
    map_size: usize,
) -> heed::Result<(LmdbEnv, [Db; N])> {
    crate::data_dir::create_private_dir(dir)?;
    let mut options = EnvOpenOptions::new().read_txn_without_tls();
    options.map_size(map_size).max_dbs(N as u32).max_readers(1024);
    if durability == Durability::LastCommitMayUndo {
        // SAFETY: MDB_NOMETASYNC only relaxes when the meta page reaches the disk; LMDB documents that
        // it keeps atomicity, consistency and isolation (see `Durability`).
        #[allow(unsafe_code)]
        unsafe {
            options.flags(EnvFlags::NO_META_SYNC);
        }
    }
    // SAFETY: LMDB requires that an environment is opened at most once per process and that the file is
    // not modified by other means while open. keyward opens each member directory exactly once
    // (`Node::start`), and the data dir belongs to one process at a time (`data_dir::lock`, taken
    // before any environment is opened).
    #[allow(unsafe_code)]
    let env = unsafe { options.open(dir)? };
    let wtxn = env.write_txn()?;
    let dbs = env
        .create_databases_and_commit(wtxn, |opener, wtxn| {
            let mut out = Vec::with_capacity(N);
            for name in names {
                out.push(opener.database_options().types::<Bytes, Bytes>().name(name).create(wtxn)?);
            }
            let dbs: [_; N] = out.try_into().unwrap_or_else(|_| unreachable!("exactly N databases were created"));
            Ok::<_, heed::Error>(CommitOrAbort::<_, ()>::Commit(dbs))
        })?
        .unwrap_commit();
    Ok((env, dbs))
}
