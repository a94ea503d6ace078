//! The log's writer thread: writes that must not block the raft thread run here, one at a time, in
//! the order they were submitted.
//!
//! Why a thread of its own and not the blocking pool: a leader submits its append and goes on to
//! replicate the entries while the write syncs (`mod.rs`, `append`); the next append, a truncation or
//! a vote may be submitted before that write has finished, and the log's writes must reach the disk
//! in the order openraft made them (an append after a truncation, never before). Two tasks of the
//! blocking pool could take the writer's lock in either order; one thread draining a queue cannot.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, PoisonError};

/// A write to run on the writer thread.
type Job = Box<dyn FnOnce() + Send>;

/// The queue of writes; the thread starts with the first write and ends when the queue is dropped.
#[derive(Default)]
pub(super) struct WriteQueue {
    sender: Mutex<Option<Sender<Job>>>,
    /// Writes submitted and not yet finished: while any is, a write made elsewhere would overtake it.
    pending: Arc<AtomicUsize>,
}

impl WriteQueue {
    /// Whether every write submitted so far has finished (so one made inline keeps the order).
    pub(super) fn is_idle(&self) -> bool {
        self.pending.load(Ordering::Acquire) == 0
    }

    /// Writes submitted and not finished.
    #[cfg(test)]
    pub(super) fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// Runs `job` on the writer thread after every job submitted before it.
    pub(super) fn submit(&self, job: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
        // Poison carries no meaning: the sender is replaced whole or not at all.
        let mut sender = self.sender.lock().unwrap_or_else(PoisonError::into_inner);
        if sender.is_none() {
            *sender = Some(self.start()?);
        }
        let Some(queue) = sender.as_ref() else { return Err(std::io::Error::other("raft log writer: no queue")) };
        self.pending.fetch_add(1, Ordering::AcqRel);
        let pending = Arc::clone(&self.pending);
        let job: Job = Box::new(move || {
            job();
            pending.fetch_sub(1, Ordering::AcqRel);
        });
        if queue.send(job).is_err() {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            *sender = None;
            return Err(std::io::Error::other("raft log writer thread stopped"));
        }
        Ok(())
    }

    /// Runs `job` on the writer thread after every job submitted before it, and waits for its result.
    pub(super) async fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> std::io::Result<T> + Send + 'static,
    ) -> std::io::Result<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit(move || {
            let _ = tx.send(job());
        })?;
        rx.await.unwrap_or_else(|_| Err(std::io::Error::other("raft log writer thread stopped")))
    }

    fn start(&self) -> std::io::Result<Sender<Job>> {
        let (sender, jobs) = channel::<Job>();
        std::thread::Builder::new().name("raft-log-writer".into()).spawn(move || {
            // Ends when the queue (its sender) is dropped with the log.
            for job in jobs {
                job();
            }
        })?;
        Ok(sender)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn runs_jobs_in_submission_order_and_counts_them_pending() {
        let queue = WriteQueue::default();
        assert!(queue.is_idle());
        let order = Arc::new(Mutex::new(Vec::new()));
        let (release, hold) = std::sync::mpsc::channel::<()>();
        {
            let order = Arc::clone(&order);
            // The first job waits, so the next ones queue behind it.
            queue
                .submit(move || {
                    let _ = hold.recv();
                    order.lock().unwrap().push(0);
                })
                .unwrap();
        }
        for i in 1..5 {
            let order = Arc::clone(&order);
            queue.submit(move || order.lock().unwrap().push(i)).unwrap();
        }
        assert!(!queue.is_idle(), "five jobs are pending");
        release.send(()).unwrap();
        let last = queue.run(|| Ok(5)).await.unwrap();
        assert_eq!(last, 5);
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
    }
}
