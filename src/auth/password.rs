//! bcrypt hashing and verification on tokio's blocking pool: expensive by design (~100 ms at cost 10),
//! so it runs in the API layer, in parallel, and never on the apply path or the async threads.

use crate::error::EtcdError;

pub const DEFAULT_COST: u32 = 10;

/// bcrypt jobs allowed at once: one core is always left for the apply loop and request handling, so a
/// burst of Authenticate calls queues here instead of stalling writes.
static BCRYPT_SLOTS: std::sync::LazyLock<tokio::sync::Semaphore> = std::sync::LazyLock::new(|| {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    tokio::sync::Semaphore::new(cores.saturating_sub(1).max(1))
});

pub async fn hash(password: String, cost: u32) -> Result<String, EtcdError> {
    let _slot = BCRYPT_SLOTS.acquire().await.map_err(|_| EtcdError::Internal)?;
    tokio::task::spawn_blocking(move || bcrypt::hash(password, cost)).await.map_err(|_| EtcdError::Internal)?.map_err(
        |e| {
            tracing::error!(error = %e, "bcrypt hashing failed");
            EtcdError::Internal
        },
    )
}

/// Whether `password` matches `hash`; a malformed hash never matches.
pub async fn verify(password: String, hash: Vec<u8>) -> bool {
    let Ok(_slot) = BCRYPT_SLOTS.acquire().await else { return false };
    tokio::task::spawn_blocking(move || {
        let Ok(hash) = String::from_utf8(hash) else { return false };
        bcrypt::verify(password, &hash).unwrap_or(false)
    })
    .await
    .unwrap_or(false)
}
