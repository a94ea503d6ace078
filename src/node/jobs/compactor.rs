//! Auto compaction (`--auto-compaction-mode`, `--auto-compaction-retention`), as etcd 3.4's
//! `v3compactor`: the leader proposes a compaction through raft, as a member-internal request (no
//! user's permissions apply), so every member compacts at the same point of the log.
//!
//! - **periodic**: keep at least `retention` of history. The revision is sampled every tenth of the
//!   retention (at most every 6 minutes); each sample older than the retention is a revision every
//!   key may be compacted to, and the newest such one is proposed.
//! - **revision**: every 5 minutes, compact to `current revision - retention`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

pub(crate) use crate::config::auto_compaction::AutoCompaction;
use crate::error::EtcdError;
use crate::identity::Requester;
use crate::node::Node;
use crate::proto::etcdserverpb::{CompactionRequest, InternalRaftRequest};

/// Runs the compactor for the life of the member.
pub(crate) async fn run(node: Arc<Node>, policy: AutoCompaction) {
    tracing::info!(?policy, "auto compaction enabled");
    let mut samples = Samples::default();
    let mut done = 0;
    let mut ticker = tokio::time::interval(policy.interval().max(Duration::from_millis(100)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let now = Instant::now();
        let current = node.revision();
        let target = match policy {
            AutoCompaction::Periodic(period) => {
                samples.record(now, current);
                samples.compactable(now, period)
            }
            AutoCompaction::Revision(keep) => Some(current - keep),
        };
        // Only the leader proposes, so members do not race each other with the same compaction. A
        // target at or below what is already compacted (by a client, or an earlier leader) is refused
        // by apply with "required revision has been compacted", which is no failure here.
        let Some(target) = target.filter(|&t| t > done && node.is_leader()) else {
            continue;
        };
        let request = CompactionRequest { revision: target, physical: false };
        let proposal = InternalRaftRequest { compaction: Some(Box::new(request)), ..Default::default() };
        match node.propose(proposal, &Requester::Member).await {
            Ok(_) => {
                done = target;
                tracing::info!(revision = target, ?policy, "auto compaction done");
            }
            Err(EtcdError::Compacted) => done = target,
            Err(e) => tracing::warn!(revision = target, error = %e, "auto compaction failed; retrying later"),
        }
    }
}

/// The revision at each sampling time, oldest first.
#[derive(Default)]
struct Samples(VecDeque<(Instant, i64)>);

impl Samples {
    fn record(&mut self, at: Instant, revision: i64) {
        self.0.push_back((at, revision));
    }

    /// The newest sampled revision taken at least `period` ago; older samples are dropped.
    fn compactable(&mut self, now: Instant, period: Duration) -> Option<i64> {
        let old_enough = |&(at, _): &(Instant, i64)| now.duration_since(at) >= period;
        while self.0.len() >= 2 && old_enough(&self.0[1]) {
            self.0.pop_front();
        }
        self.0.front().filter(|s| old_enough(s)).map(|&(_, revision)| revision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periodic_keeps_at_least_the_retention() {
        let start = Instant::now();
        let period = Duration::from_secs(60);
        let mut samples = Samples::default();
        for (secs, revision) in [(0, 10), (6, 20), (12, 30)] {
            samples.record(start + Duration::from_secs(secs), revision);
        }
        assert_eq!(samples.compactable(start + Duration::from_secs(59), period), None);
        assert_eq!(samples.compactable(start + Duration::from_secs(60), period), Some(10));
        // At 67 s, the sample of 6 s is old enough, the one of 12 s not yet.
        assert_eq!(samples.compactable(start + Duration::from_secs(67), period), Some(20));
        assert_eq!(samples.0.len(), 2);
    }
}
