//! bcrypt hashing and verification, on a pool of low-priority threads of their own.
//!
//! bcrypt is expensive by design (~80 ms at cost 10), so it runs in the API layer, never on the apply
//! path or the async threads. The pool has one thread per core, so Authenticate alone can use every
//! core; each thread runs at the lowest scheduling priority (nice 19), so when the apply loop or
//! request handling wants a core the kernel gives it to them (CFS weighs nice 19 at 15 against 1024
//! for nice 0): a burst of Authenticate calls slows down, not the writes.

use std::sync::mpsc;
use std::sync::{Arc, LazyLock, Mutex};

use tokio::sync::oneshot;

use crate::error::EtcdError;

pub const DEFAULT_COST: u32 = 10;

/// The nice value of bcrypt threads: the lowest priority that still gets idle cores.
const BCRYPT_NICE: i32 = 19;

type Job = Box<dyn FnOnce() + Send>;

static POOL: LazyLock<mpsc::Sender<Job>> = LazyLock::new(|| {
    let (jobs, queue) = mpsc::channel::<Job>();
    let queue = Arc::new(Mutex::new(queue));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    for i in 0..cores {
        let queue = queue.clone();
        let spawned = std::thread::Builder::new().name(format!("bcrypt-{i}")).spawn(move || {
            lower_priority();
            loop {
                // The lock is held only while waiting for the next job, never while hashing.
                let job = match queue.lock() {
                    Ok(queue) => queue.recv(),
                    Err(_) => return,
                };
                match job {
                    Ok(job) => job(),
                    Err(_) => return,
                }
            }
        });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start a bcrypt thread");
        }
    }
    jobs
});

#[cfg(target_os = "linux")]
fn lower_priority() {
    // On Linux, setpriority with a thread id sets that thread's nice value alone.
    let me = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(me), BCRYPT_NICE) {
        tracing::warn!(error = %e, "bcrypt thread keeps normal priority");
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_priority() {}

/// Runs `work` on the bcrypt pool.
async fn on_pool<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T, EtcdError> {
    let (done, result) = oneshot::channel();
    let job: Job = Box::new(move || {
        let _ = done.send(work());
    });
    POOL.send(job).map_err(|_| EtcdError::Internal)?;
    result.await.map_err(|_| EtcdError::Internal)
}

/// bcrypt reads at most this many bytes of a password and ignores the rest.
pub const MAX_PASSWORD_BYTES: usize = 72;

/// The bcrypt hash of `password`; a password longer than bcrypt reads is refused, never cut.
pub async fn hash(password: String, cost: u32) -> Result<String, EtcdError> {
    if password.len() > MAX_PASSWORD_BYTES {
        return Err(EtcdError::PasswordTooLong);
    }
    on_pool(move || bcrypt::hash(password, cost)).await?.map_err(|e| {
        tracing::error!(error = %e, "bcrypt hashing failed");
        EtcdError::Internal
    })
}

/// Whether `password` matches `hash`; a malformed hash never matches, and neither does a password
/// longer than bcrypt reads (its first 72 bytes alone must not log in).
pub async fn verify(password: String, hash: Vec<u8>) -> bool {
    if password.len() > MAX_PASSWORD_BYTES {
        return false;
    }
    on_pool(move || {
        let Ok(hash) = String::from_utf8(hash) else { return false };
        bcrypt::verify(password, &hash).unwrap_or(false)
    })
    .await
    .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_password_longer_than_bcrypt_reads_is_refused_not_cut() {
        let limit = "A".repeat(MAX_PASSWORD_BYTES);
        let hashed = hash(limit.clone(), 4).await.unwrap();
        assert!(verify(limit.clone(), hashed.clone().into_bytes()).await);
        assert!(!verify(format!("{limit}anything"), hashed.into_bytes()).await, "the 73rd byte counts");
        assert_eq!(hash(format!("{limit}B"), 4).await, Err(EtcdError::PasswordTooLong));
    }

    #[tokio::test]
    async fn verifies_what_it_hashed() {
        let hashed = hash("secret".into(), 4).await.unwrap();
        assert!(verify("secret".into(), hashed.clone().into_bytes()).await);
        assert!(!verify("Secret".into(), hashed.into_bytes()).await);
        assert!(!verify("secret".into(), b"not a bcrypt hash".to_vec()).await);
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn runs_at_the_lowest_priority() {
        let nice = on_pool(|| rustix::process::getpriority_process(Some(rustix::thread::gettid()))).await.unwrap();
        assert_eq!(nice.unwrap(), BCRYPT_NICE);
    }
}
