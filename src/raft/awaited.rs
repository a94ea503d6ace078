//! Writes this member forwarded to the leader and answers from its own apply, as etcd's followers
//! do: the leader sends no answer for such a write when it succeeds (`cluster/propose_stream.rs`).
//!
//! Why: with clients on every member two writes in three are forwarded, and each cost the cluster
//! the leader's answer (its apply result encoded, a message on the stream, decoded, then a wait for
//! this member's own apply of the entry): without it a 3-member cluster spent 2–8 µs less CPU per
//! put (docs/performance.md, session 27). Every member applies every entry and gets the same
//! result, so the follower takes its own: a result a member hands its client is never one it has
//! not applied, as before.
//!
//! A request is known by the id in its header (unique per member: member bits, time, counter, as
//! etcd's idutil). The state machine looks ids up only while some write waits here (`any`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

use super::ApplyResult;
use crate::proto::etcdserverpb::InternalRaftRequest;

/// The writes waiting for their own apply on this member, by request id.
#[derive(Default)]
pub(crate) struct Awaited {
    waiting: Mutex<HashMap<u64, oneshot::Sender<ApplyResult>>>,
    /// `waiting.len()`, read without the lock by every applied batch.
    count: AtomicUsize,
}

/// A write's place in `Awaited`: its result arrives on `applied`; dropped, the place is given up.
pub(crate) struct Awaiting {
    awaited: Arc<Awaited>,
    id: u64,
    pub(crate) applied: oneshot::Receiver<ApplyResult>,
}

impl Drop for Awaiting {
    fn drop(&mut self) {
        self.awaited.forget(self.id);
    }
}

impl Awaited {
    /// Waits for the apply of the request with header id `id` (None for an id already waited for).
    pub(crate) fn register(self: &Arc<Self>, id: u64) -> Option<Awaiting> {
        let (answer, applied) = oneshot::channel();
        let mut waiting = self.lock();
        if waiting.contains_key(&id) {
            return None;
        }
        waiting.insert(id, answer);
        self.count.store(waiting.len(), Ordering::Release);
        Some(Awaiting { awaited: self.clone(), id, applied })
    }

    /// Whether any write waits: the applied batch looks its requests up only then.
    pub(crate) fn any(&self) -> bool {
        self.count.load(Ordering::Acquire) > 0
    }

    /// The waiters of those of `requests` (with `results`, one each) that a write here waits for,
    /// taken out into `owed`, each with a copy of its result: handed to them once the batch is
    /// committed.
    pub(crate) fn take_answers(&self, requests: &[InternalRaftRequest], results: &[ApplyResult], owed: &mut Owed) {
        let mut waiting = self.lock();
        for (req, result) in requests.iter().zip(results) {
            let Some(id) = req.header.as_ref().map(|h| h.id) else { continue };
            if let Some(answer) = waiting.remove(&id) {
                owed.push((answer, result.clone()));
            }
        }
        self.count.store(waiting.len(), Ordering::Release);
    }

    fn forget(&self, id: u64) {
        let mut waiting = self.lock();
        waiting.remove(&id);
        self.count.store(waiting.len(), Ordering::Release);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<ApplyResult>>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Waiters with their results.
pub(crate) type Owed = Vec<(oneshot::Sender<ApplyResult>, ApplyResult)>;

/// The answers an applied batch owes to writes waiting here, for the observer to hand out once the
/// batch is committed (`node/jobs/apply_observer.rs`, through the relay). Nothing is allocated for a
/// batch that owes none.
#[derive(Clone, Default)]
pub(crate) struct Answers(Option<Arc<Mutex<Owed>>>);

impl From<Owed> for Answers {
    fn from(owed: Owed) -> Answers {
        Answers((!owed.is_empty()).then(|| Arc::new(Mutex::new(owed))))
    }
}

impl Answers {
    /// Takes the answers out (each is handed once).
    pub(crate) fn take(&self) -> Owed {
        self.0
            .as_ref()
            .map(|owed| std::mem::take(&mut *owed.lock().unwrap_or_else(PoisonError::into_inner)))
            .unwrap_or_default()
    }
}

impl std::fmt::Debug for Answers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let owed = self.0.as_ref().map_or(0, |owed| owed.lock().unwrap_or_else(PoisonError::into_inner).len());
        write!(f, "Answers({owed})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::Applied;
    use crate::error::EtcdError;
    use crate::proto::etcdserverpb::{PutResponse, RequestHeader};

    fn request(id: u64) -> InternalRaftRequest {
        InternalRaftRequest { header: Some(RequestHeader { id, ..Default::default() }), ..Default::default() }
    }

    /// Only the requests waited for are answered, each with its own result; the others' are not
    /// copied, and a dropped wait leaves nothing behind.
    #[test]
    fn answers_only_the_writes_waited_for() {
        let awaited = Arc::new(Awaited::default());
        assert!(!awaited.any());
        let mut seven = awaited.register(7).unwrap();
        assert!(awaited.register(7).is_none(), "an id waited for twice");
        let nine = awaited.register(9).unwrap();
        drop(nine);
        assert!(awaited.any());
        let results: Vec<ApplyResult> =
            vec![Ok(Applied::Put(PutResponse::default())), Err(EtcdError::PermissionDenied), Ok(Applied::Nothing)];
        let mut owed = Owed::new();
        awaited.take_answers(&[request(6), request(7), request(9)], &results, &mut owed);
        let answers = Answers::from(owed).take();
        assert_eq!(answers.len(), 1);
        for (answer, result) in answers {
            answer.send(result).unwrap();
        }
        assert_eq!(seven.applied.try_recv().unwrap(), Err(EtcdError::PermissionDenied));
        assert!(!awaited.any());
    }
}
