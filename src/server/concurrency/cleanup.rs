//! What a Lock or Campaign still does when its client goes away while it waits: tonic drops the
//! call's future, so the clean-up etcd runs on a cancelled context (delete the waiting key, or
//! resign) is spawned from `Drop` and runs to its end as the caller.

use futures::future::BoxFuture;

/// Runs `cleanup` on its own task if dropped while armed.
pub(crate) struct OnAbandon {
    cleanup: Option<BoxFuture<'static, ()>>,
}

impl OnAbandon {
    pub(crate) fn new(cleanup: BoxFuture<'static, ()>) -> OnAbandon {
        OnAbandon { cleanup: Some(cleanup) }
    }

    /// The call finished on its own: nothing to do when dropped.
    pub(crate) fn disarm(mut self) {
        self.cleanup = None;
    }
}

impl Drop for OnAbandon {
    fn drop(&mut self) {
        if let Some(cleanup) = self.cleanup.take() {
            // A drop outside a runtime (a process shutting down) has nothing to clean up with; the
            // key goes with its lease.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(cleanup);
            }
        }
    }
}
