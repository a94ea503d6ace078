//! The lease clock: when each lease expires, on this member.
//!
//! Grants and revokes reach it from applied entries, a snapshot's lease table when one is installed
//! (both through the apply observer, `node/jobs/apply_observer.rs`), keep-alives from clients (`renew`).
//! Renewals are leader-local, as in etcd; remaining TTLs are persisted through periodic checkpoint
//! entries, so after a restart a lease resumes with the remaining TTL of its last checkpoint.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::store::LeaseRecord;
use crate::proto::etcdserverpb::{LeaseCheckpoint, LeaseCheckpointRequest};

#[derive(Debug, Clone, Copy)]
struct Clock {
    ttl: i64,
    expiry: Instant,
    /// When a revoke for this lease was last proposed (so it is not proposed again while in flight).
    revoking_since: Option<Instant>,
}

#[derive(Default)]
pub(crate) struct Lessor {
    leases: Mutex<HashMap<i64, Clock>>,
}

/// How long a proposed revoke may take before it is proposed again.
const REVOKE_RETRY: Duration = Duration::from_secs(3);

impl Lessor {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Clock>> {
        // A panic while holding this lock cannot leave the map half-updated (single inserts/removes).
        self.leases.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Loads the leases found in the store at startup.
    pub(crate) fn recover(&self, leases: impl IntoIterator<Item = (i64, LeaseRecord)>) {
        let now = Instant::now();
        let mut map = self.lock();
        for (id, record) in leases {
            let left = if record.remaining_ttl > 0 { record.remaining_ttl } else { record.ttl };
            map.insert(id, Clock { ttl: record.ttl, expiry: now + secs(left), revoking_since: None });
        }
    }

    /// A snapshot install replaced the lease table with `leases`: leases it no longer holds are
    /// dropped, the others resume from their last checkpoint (as after a restart).
    pub(crate) fn follow_installed(&self, leases: Vec<(i64, LeaseRecord)>) {
        let kept: HashSet<i64> = leases.iter().map(|&(id, _)| id).collect();
        for (id, _) in self.remaining() {
            if !kept.contains(&id) {
                self.revoked(id);
            }
        }
        self.recover(leases);
    }

    pub(crate) fn granted(&self, id: i64, ttl: i64) {
        self.lock().insert(id, Clock { ttl, expiry: Instant::now() + secs(ttl), revoking_since: None });
    }

    pub(crate) fn revoked(&self, id: i64) {
        self.lock().remove(&id);
    }

    /// This member has become leader: every lease expires a full TTL plus `extend` from now (etcd's
    /// `Promote`). Keep-alives went to the previous leader, whose clock this member never saw, so no
    /// lease may expire here before its holders had time to reach the new leader.
    pub(crate) fn promote(&self, extend: Duration) {
        let now = Instant::now();
        for clock in self.lock().values_mut() {
            clock.expiry = now + extend + secs(clock.ttl);
            clock.revoking_since = None;
        }
    }

    /// Restarts the lease's full TTL; `None` when the lease does not exist (or has expired).
    pub(crate) fn renew(&self, id: i64) -> Option<i64> {
        let mut map = self.lock();
        let clock = map.get_mut(&id)?;
        let now = Instant::now();
        if clock.expiry <= now {
            return None;
        }
        clock.expiry = now + secs(clock.ttl);
        Some(clock.ttl)
    }

    /// `(granted TTL, remaining seconds)`.
    pub(crate) fn time_to_live(&self, id: i64) -> Option<(i64, i64)> {
        let map = self.lock();
        let clock = map.get(&id)?;
        let left = clock.expiry.saturating_duration_since(Instant::now());
        Some((clock.ttl, left.as_secs() as i64))
    }

    /// Leases past their expiry that have no revoke in flight; marks them as being revoked.
    pub(crate) fn take_expired(&self) -> Vec<i64> {
        let now = Instant::now();
        let mut out = Vec::new();
        for (&id, clock) in self.lock().iter_mut() {
            let in_flight = clock.revoking_since.is_some_and(|since| now.duration_since(since) < REVOKE_RETRY);
            if clock.expiry <= now && !in_flight {
                clock.revoking_since = Some(now);
                out.push(id);
            }
        }
        out.sort_unstable();
        out
    }

    /// The checkpoint entry of every live lease's remaining TTL, so that a restart resumes them where
    /// they were; none without a lease.
    pub(crate) fn checkpoint(&self) -> Option<LeaseCheckpointRequest> {
        let checkpoints: Vec<_> =
            self.remaining().into_iter().map(|(id, remaining_ttl)| LeaseCheckpoint { id, remaining_ttl }).collect();
        (!checkpoints.is_empty()).then_some(LeaseCheckpointRequest { checkpoints })
    }

    /// Every live lease's remaining TTL, for a checkpoint entry.
    pub(crate) fn remaining(&self) -> Vec<(i64, i64)> {
        let now = Instant::now();
        let mut out: Vec<_> = self
            .lock()
            .iter()
            .map(|(&id, clock)| (id, clock.expiry.saturating_duration_since(now).as_secs().max(1) as i64))
            .collect();
        out.sort_unstable();
        out
    }
}

fn secs(s: i64) -> Duration {
    Duration::from_secs(s.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renew_restarts_the_ttl_and_expired_leases_are_taken_once() {
        let lessor = Lessor::default();
        lessor.granted(1, 10);
        assert_eq!(lessor.renew(1), Some(10));
        assert_eq!(lessor.renew(2), None);
        assert!(lessor.take_expired().is_empty());
        lessor.recover([(3, LeaseRecord { ttl: 10, remaining_ttl: 0, owner: None })]);
        lessor.lock().get_mut(&3).unwrap().expiry = Instant::now();
        assert_eq!(lessor.take_expired(), vec![3]);
        assert!(lessor.take_expired().is_empty(), "a revoke in flight is not proposed twice");
        assert_eq!(lessor.renew(3), None, "an expired lease cannot be kept alive");
    }

    #[test]
    fn a_new_leader_gives_every_lease_its_full_ttl_and_more() {
        let lessor = Lessor::default();
        lessor.granted(1, 10);
        lessor.lock().get_mut(&1).unwrap().expiry = Instant::now();
        lessor.promote(Duration::from_secs(1));
        assert!(lessor.take_expired().is_empty());
        let (_, left) = lessor.time_to_live(1).unwrap();
        assert!((10..=11).contains(&left), "{left}");
    }

    #[test]
    fn a_checkpoint_carries_every_lease_and_none_is_made_without_one() {
        let lessor = Lessor::default();
        assert_eq!(lessor.checkpoint(), None);
        lessor.granted(2, 10);
        lessor.granted(1, 20);
        let checkpoint = lessor.checkpoint().expect("two leases");
        let ids: Vec<_> = checkpoint.checkpoints.iter().map(|c| c.id).collect();
        assert_eq!(ids, vec![1, 2]);
    }

    #[test]
    fn an_installed_lease_table_replaces_the_clock() {
        let lessor = Lessor::default();
        lessor.granted(1, 60);
        lessor.granted(2, 60);
        lessor.follow_installed(vec![(2, LeaseRecord { ttl: 60, remaining_ttl: 20, owner: None })]);
        assert_eq!(lessor.time_to_live(1), None, "a lease the installed table does not hold is dropped");
        let (ttl, left) = lessor.time_to_live(2).expect("lease 2");
        assert_eq!(ttl, 60);
        assert!((19..=20).contains(&left), "resumes from its checkpoint: {left}");
    }

    #[test]
    fn recovery_uses_the_checkpointed_remaining_ttl() {
        let lessor = Lessor::default();
        lessor.recover([(7, LeaseRecord { ttl: 100, remaining_ttl: 30, owner: None })]);
        let (granted, left) = lessor.time_to_live(7).unwrap();
        assert_eq!(granted, 100);
        assert!((29..=30).contains(&left));
    }
}
