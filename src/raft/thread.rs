//! The raft thread: openraft's core, its state machine worker, its replication tasks and the proposer
//! run on one OS thread of their own (a current-thread tokio runtime), as etcd's raft loop runs in
//! one goroutine.
//!
//! Why: a write is a chain of hand-offs (proposer → core → log append → core → apply → core →
//! proposer). On the multi-thread runtime each hop could wake another thread, and the log append and
//! the apply each went to the blocking pool and back; on a virtual machine a parked thread's wake-up
//! costs tens of microseconds. On one thread those hops are task switches, and the log append
//! (`log/wal/mod.rs`) and the apply (`state_machine/`) run inline: the thread blocks in `fdatasync` as
//! etcd's raft goroutine does. Two hand-offs still cross threads: the request in, the reply out.
//!
//! Blocking it is fine because nothing else runs on it: gRPC serving, the peer connections (their
//! tasks live on the main runtime, `cluster/peers.rs`) and the node's background jobs stay on the
//! main runtime. What may take long — snapshots, an apply paused by a defragment, retries on a full
//! disk — still goes to the blocking pool.

use std::future::Future;

use tokio::runtime::{Builder, Handle};
use tokio::sync::oneshot;

/// The raft thread's runtime; dropping this stops it (the tasks still on it are dropped).
pub(crate) struct RaftThread {
    handle: Handle,
    /// Dropped with this: the thread's runtime stops. The thread is not joined: a drop inside an
    /// async task must not block its worker on the raft thread's last task.
    _stop: oneshot::Sender<()>,
}

impl RaftThread {
    pub(crate) fn start() -> std::io::Result<Self> {
        let runtime = Builder::new_current_thread().enable_all().thread_name("raft-blocking").build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new().name("raft".into()).spawn(move || {
            // Runs the runtime until the owner drops its `RaftThread`.
            let _ = runtime.block_on(stopped);
            // Blocking work in flight (a snapshot being written) finishes in the background; the
            // process may exit meanwhile, as it may after any task.
            runtime.shutdown_background();
        })?;
        Ok(RaftThread { handle, _stop: stop })
    }

    /// Runs `future` on the raft thread and waits for its output there. Tasks it spawns (openraft's
    /// core, when it is `Raft::new`) stay on the raft thread.
    pub(crate) async fn run<F>(&self, future: F) -> F::Output
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match self.handle.spawn(future).await {
            Ok(output) => output,
            Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
            Err(join) => panic!("the raft thread stopped before the future finished: {join}"),
        }
    }

    pub(crate) fn handle(&self) -> &Handle {
        &self.handle
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn futures_run_on_the_raft_thread_and_so_do_their_tasks() {
        let raft = RaftThread::start().unwrap();
        let (outer, inner) = raft
            .run(async {
                let outer = std::thread::current().name().map(str::to_owned);
                let inner = tokio::spawn(async { std::thread::current().name().map(str::to_owned) }).await.unwrap();
                (outer, inner)
            })
            .await;
        assert_eq!(outer.as_deref(), Some("raft"));
        assert_eq!(inner.as_deref(), Some("raft"));
        assert_ne!(std::thread::current().name(), Some("raft"));
    }

    #[tokio::test]
    async fn dropping_it_stops_its_tasks() {
        let raft = RaftThread::start().unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
        raft.handle().spawn(async move {
            let _tx = tx; // dropped with the task
            std::future::pending::<()>().await
        });
        drop(raft);
        assert!(rx.recv().await.is_none(), "the task was dropped with the runtime");
    }
}
