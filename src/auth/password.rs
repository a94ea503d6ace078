//! bcrypt hashing and verification on tokio's blocking pool: expensive by design (~100 ms at cost 10),
//! so it runs in the API layer, in parallel, and never on the apply path or the async threads.

use crate::error::EtcdError;

pub const DEFAULT_COST: u32 = 10;

pub async fn hash(password: String, cost: u32) -> Result<String, EtcdError> {
    tokio::task::spawn_blocking(move || bcrypt::hash(password, cost)).await.map_err(|_| EtcdError::Internal)?.map_err(
        |e| {
            tracing::error!(error = %e, "bcrypt hashing failed");
            EtcdError::Internal
        },
    )
}

/// Whether `password` matches `hash`; a malformed hash never matches.
pub async fn verify(password: String, hash: Vec<u8>) -> bool {
    tokio::task::spawn_blocking(move || {
        let Ok(hash) = String::from_utf8(hash) else { return false };
        bcrypt::verify(password, &hash).unwrap_or(false)
    })
    .await
    .unwrap_or(false)
}
