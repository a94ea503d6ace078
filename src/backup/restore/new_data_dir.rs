//! A new member's data dir, built in a temp dir and renamed into place only once complete: an error
//! or a crash at any step leaves no data dir behind (a stale temp dir of a crashed run is named
//! `.NAME.restoring-PID` next to the target, and removed by the next run with the same PID only —
//! remove it by hand).
//!
//! The applied state is whatever the caller put into `member/kv`; `finish` then makes it the state of
//! a new cluster: the applied log id becomes `(term 0, index)` (as openraft's `initialize` starts a
//! log at `(term 0, index 0)`), the membership the one of `--initial-cluster`, and the raft log is
//! empty with everything up to that index purged and committed (one state record of `raft/log/wal`). So the
//! member never claims an entry it does not have; the first election starts term 1, and openraft
//! builds a raft snapshot from the applied state at start for any peer that needs one.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, Context as _};
use openraft::CommittedLeaderId;

use super::member_flags;
use crate::cli::backup::MemberFlags;
use crate::cluster::bootstrap::NewCluster;
use crate::raft::log::wal::{segment, Wal};
use crate::raft::state_machine::{State, StateMachine};
use crate::raft::{LogId, Membership, StoredMembership};

pub(crate) struct NewDataDir {
    target: PathBuf,
    temp: PathBuf,
    cluster: NewCluster,
    state: Option<Arc<State>>,
    done: bool,
}

/// What `finish` made.
#[derive(Debug)]
pub(crate) struct Restored {
    pub data_dir: PathBuf,
    pub member_id: u64,
    pub cluster_id: u64,
    pub applied_index: u64,
}

impl NewDataDir {
    /// Checks the flags and that the data dir does not exist (or is empty), and creates the temp dir.
    pub(crate) fn create(flags: &MemberFlags) -> anyhow::Result<NewDataDir> {
        let cluster = member_flags::new_cluster(flags).map_err(|e| anyhow!(e))?;
        let target = flags.data_dir();
        if let Ok(mut entries) = std::fs::read_dir(&target) {
            if entries.next().is_some() {
                return Err(anyhow!("data dir {} already exists", target.display()));
            }
        } else if target.exists() {
            return Err(anyhow!("data dir {} already exists", target.display()));
        }
        let parent = match target.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = target.file_name().ok_or_else(|| anyhow!("--data-dir {} names no directory", target.display()))?;
        let temp = parent.join(format!(".{}.restoring-{}", name.to_string_lossy(), std::process::id()));
        if temp.exists() {
            std::fs::remove_dir_all(&temp).with_context(|| format!("cannot remove stale {}", temp.display()))?;
        }
        crate::storage::data_dir::create_private_dir(&temp.join("member"))
            .with_context(|| format!("cannot create {}", temp.display()))?;
        Ok(NewDataDir { target, temp, cluster, state: None, done: false })
    }

    /// Where the kv environment goes (`member/kv`): its `data.mdb` may be put there before `state`.
    pub(crate) fn kv_dir(&self) -> PathBuf {
        self.temp.join("member").join("kv")
    }

    /// The applied state's tables, opened once (after a `data.mdb` was put in `kv_dir`, if any).
    pub(crate) fn state(&mut self) -> anyhow::Result<Arc<State>> {
        if let Some(state) = &self.state {
            return Ok(state.clone());
        }
        let (kv, snap) = (self.kv_dir(), self.temp.join("member").join("snap"));
        let state = StateMachine::open_offline(&kv, &snap)
            .map_err(|e| anyhow!("cannot open the restored database: {e}"))?
            .state();
        self.state = Some(state.clone());
        Ok(state)
    }

    /// Makes the applied state that of the new cluster at raft index `index`, writes the raft log and
    /// this member's ids, and renames the data dir into place.
    pub(crate) fn finish(mut self, index: u64) -> anyhow::Result<Restored> {
        let index = index.max(1);
        let applied = LogId::new(CommittedLeaderId::new(0, 0), index);
        let voters: BTreeSet<u64> = self.cluster.members.keys().copied().collect();
        let membership = Membership::new(vec![voters], self.cluster.members.clone());
        let state = self.state()?;
        state
            .restart_at(applied, StoredMembership::new(Some(applied), membership))
            .map_err(|e| anyhow!("cannot write the applied state: {e}"))?;
        // The environment closes when its last handle goes: before the rename.
        drop(state);
        self.state = None;
        let log =
            Wal::open(&self.temp.join("member").join("wal")).map_err(|e| anyhow!("cannot create the raft log: {e}"))?;
        log.restore(segment::State {
            vote: None,
            committed: Some(applied),
            last_purged: Some(applied),
            identity: Some((self.cluster.member_id, self.cluster.cluster_id)),
        })
        .map_err(|e| anyhow!("cannot write the raft log: {e}"))?;
        drop(log);
        // Every file's directory entry is durable before the data dir appears under its name.
        let member = self.temp.join("member");
        for dir in ["kv", "wal", "snap"].map(|d| member.join(d)).iter().chain([&member, &self.temp]) {
            crate::storage::data_dir::sync_dir(dir).with_context(|| format!("cannot sync {}", dir.display()))?;
        }
        std::fs::rename(&self.temp, &self.target)
            .with_context(|| format!("cannot rename {} to {}", self.temp.display(), self.target.display()))?;
        self.done = true;
        if let Some(parent) = self.target.parent().filter(|p| !p.as_os_str().is_empty()) {
            crate::storage::data_dir::sync_dir(parent)?;
        }
        Ok(Restored {
            data_dir: self.target.clone(),
            member_id: self.cluster.member_id,
            cluster_id: self.cluster.cluster_id,
            applied_index: index,
        })
    }
}

impl Drop for NewDataDir {
    fn drop(&mut self) {
        if !self.done {
            self.state = None;
            let _ = std::fs::remove_dir_all(&self.temp);
        }
    }
}
