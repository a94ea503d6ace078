//! bcrypt hashing and verification, on a pool of low-priority threads of their own.
//!
//! bcrypt is expensive by design (~80 ms at cost 10), so it runs in the API layer, never on the apply
//! path or the async threads. The pool has one thread per core, so Authenticate alone can use every
//! core; each thread runs at a low scheduling priority (nice 10), so when the apply loop or request
//! handling wants a core the kernel gives it to them (CFS weighs nice 10 at 110 against 1024 for
//! nice 0): a burst of Authenticate calls slows down, not the writes. Not the lowest (nice 19, weight
//! 15): there a login waited behind any other busy process on the host about 70 times its own CPU
//! time (a cost-10 login took over 5 s beside a compiler, past etcdctl's 2 s dial timeout, which
//! covers its login); at nice 10 about 10 times.
//!
//! The queue is bounded: when it is full a login is refused at once with etcd's "too many requests"
//! rather than queued without limit, and a queued job whose caller has gone (the client hung up) is
//! dropped unrun. A login for a user that does not exist costs one bcrypt at the configured cost
//! too (`verify_nobody`), so the answer's timing does not tell which user names exist.

use std::sync::mpsc;
use std::sync::{Arc, LazyLock, Mutex, OnceLock};

use tokio::sync::oneshot;

use crate::error::EtcdError;

/// The nice value of bcrypt threads: below the write path's, not starved by other processes.
const BCRYPT_NICE: i32 = 10;

/// Jobs waiting for a bcrypt thread: about ten seconds of work at cost 10 on two cores. Past it,
/// "too many requests".
const QUEUE_CAPACITY: usize = 256;

type Job = Box<dyn FnOnce() + Send>;

static POOL: LazyLock<mpsc::SyncSender<Job>> = LazyLock::new(|| {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    start_pool(cores, QUEUE_CAPACITY)
});

/// Starts `threads` bcrypt threads fed by a queue of `capacity` jobs.
fn start_pool(threads: usize, capacity: usize) -> mpsc::SyncSender<Job> {
    let (jobs, queue) = mpsc::sync_channel::<Job>(capacity);
    let queue = Arc::new(Mutex::new(queue));
    for i in 0..threads {
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
}

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
    run_on(&POOL, work).await
}

async fn run_on<T: Send + 'static>(
    pool: &mpsc::SyncSender<Job>,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, EtcdError> {
    let (done, result) = oneshot::channel();
    let job: Job = Box::new(move || {
        // The caller is gone (its client hung up): nobody waits for this answer.
        if done.is_closed() {
            crate::metrics::PASSWORD_CHECKS.with_label_values(&["abandoned"]).inc();
            return;
        }
        let _ = done.send(work());
    });
    pool.try_send(job).map_err(|e| match e {
        mpsc::TrySendError::Full(_) => {
            crate::metrics::PASSWORD_CHECKS.with_label_values(&["queue_full"]).inc();
            EtcdError::TooManyRequests
        }
        mpsc::TrySendError::Disconnected(_) => EtcdError::Internal,
    })?;
    result.await.map_err(|_| EtcdError::Internal)
}

/// bcrypt reads at most this many bytes of a password and ignores the rest.
pub(crate) const MAX_PASSWORD_BYTES: usize = 72;

/// The bcrypt hash of `password`; a password longer than bcrypt reads is refused, never cut.
pub(crate) async fn hash(password: String, cost: u32) -> Result<String, EtcdError> {
    if password.len() > MAX_PASSWORD_BYTES {
        return Err(EtcdError::PasswordTooLong);
    }
    on_pool(move || bcrypt::hash(password, cost)).await?.map_err(|e| {
        tracing::error!(error = %e, "bcrypt hashing failed");
        EtcdError::Internal
    })
}

/// Whether `password` matches `hash`; a malformed hash never matches, and neither does a password
/// longer than bcrypt reads (its first 72 bytes alone must not log in). An error when the check
/// could not run (the queue is full).
pub(crate) async fn verify(password: String, hash: Vec<u8>) -> Result<bool, EtcdError> {
    if password.len() > MAX_PASSWORD_BYTES {
        return Ok(false);
    }
    let matched = on_pool(move || {
        let Ok(hash) = String::from_utf8(hash) else { return false };
        bcrypt::verify(password, &hash).unwrap_or(false)
    })
    .await?;
    crate::metrics::PASSWORD_CHECKS.with_label_values(&[if matched { "match" } else { "mismatch" }]).inc();
    Ok(matched)
}

/// The cost of checking a password for a user that does not exist: one bcrypt at `cost`, against a
/// hash of a random password made once. Never matches.
pub(crate) async fn verify_nobody(password: String, cost: u32) -> Result<(), EtcdError> {
    static NOBODY: OnceLock<(u32, String)> = OnceLock::new();
    let hash = match NOBODY.get() {
        Some((made_at, hash)) if *made_at == cost => hash.clone(),
        _ => {
            let random: String = (0..32).map(|_| char::from(b'a' + rand::random::<u8>() % 26)).collect();
            let hash = hash(random, cost).await?;
            let _ = NOBODY.set((cost, hash.clone()));
            hash
        }
    };
    on_pool(move || bcrypt::verify(password, &hash).unwrap_or(false)).await?;
    crate::metrics::PASSWORD_CHECKS.with_label_values(&["unknown_user"]).inc();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_password_longer_than_bcrypt_reads_is_refused_not_cut() {
        let limit = "A".repeat(MAX_PASSWORD_BYTES);
        let hashed = hash(limit.clone(), 4).await.unwrap();
        assert!(verify(limit.clone(), hashed.clone().into_bytes()).await.unwrap());
        assert!(!verify(format!("{limit}anything"), hashed.into_bytes()).await.unwrap(), "the 73rd byte counts");
        assert_eq!(hash(format!("{limit}B"), 4).await, Err(EtcdError::PasswordTooLong));
    }

    #[tokio::test]
    async fn a_full_queue_answers_too_many_requests_and_abandoned_jobs_never_run() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let pool = start_pool(1, 1);
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let p = pool.clone();
        let busy = tokio::spawn(async move {
            run_on(&p, move || {
                let _ = started_tx.send(());
                let _ = release_rx.recv();
            })
            .await
        });
        started_rx.await.unwrap(); // the one thread is taken
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        let mut queued = Box::pin(run_on(&pool, move || r.store(true, Ordering::SeqCst)));
        // Its first poll puts the job in the queue (of one) and waits for the answer.
        assert!(futures::poll!(&mut queued).is_pending());
        assert_eq!(run_on(&pool, || ()).await, Err(EtcdError::TooManyRequests));
        drop(queued); // its client went away
        release_tx.send(()).unwrap();
        busy.await.unwrap().unwrap();
        // A job queued after the abandoned one runs only once that one was taken (and skipped).
        while run_on(&pool, || ()).await == Err(EtcdError::TooManyRequests) {
            tokio::task::yield_now().await;
        }
        assert!(!ran.load(Ordering::SeqCst), "a job whose caller is gone is not run");
    }

    #[tokio::test]
    async fn verifies_what_it_hashed() {
        let hashed = hash("secret".into(), 4).await.unwrap();
        assert!(verify("secret".into(), hashed.clone().into_bytes()).await.unwrap());
        assert!(!verify("Secret".into(), hashed.into_bytes()).await.unwrap());
        assert!(!verify("secret".into(), b"not a bcrypt hash".to_vec()).await.unwrap());
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn runs_at_the_lowest_priority() {
        let nice = on_pool(|| rustix::process::getpriority_process(Some(rustix::thread::gettid()))).await.unwrap();
        assert_eq!(nice.unwrap(), BCRYPT_NICE);
    }
}
