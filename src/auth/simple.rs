//! etcd's "simple" tokens: random strings mapped to `(user, auth revision)` in memory, issued by applying
//! an Authenticate entry (so every member knows every token) and expiring after `--auth-token-ttl`
//! without use. Not signed: etcd recommends JWT for production, and so does keyward.
//!
//! A token is `PREFIX.INDEX`: a random prefix the API layer chose and the index of the entry that
//! issued it. The entry carries only the SHA-256 of the prefix (etcd's carries the prefix itself), so
//! nobody who reads the raft log, a snapshot or a peer's traffic can rebuild a token; members keep the
//! digest too, and hash the prefix of each token they are shown.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::Rng;

struct Entry {
    user: String,
    revision: u64,
    expires: Instant,
}

pub(crate) struct SimpleTokens {
    ttl: Duration,
    tokens: Mutex<HashMap<String, Entry>>,
}

/// Length of the random part (etcd's `defaultSimpleTokenLength`).
const PREFIX_LEN: usize = 16;

impl SimpleTokens {
    pub(crate) fn new(ttl: Duration) -> Self {
        SimpleTokens { ttl, tokens: Mutex::new(HashMap::new()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.tokens.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The random part of a new token, chosen by the API layer before proposing.
    pub(crate) fn prefix() -> String {
        const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
        let mut rng = rand::rng();
        (0..PREFIX_LEN).map(|_| LETTERS[rng.random_range(0..LETTERS.len())] as char).collect()
    }

    /// What the Authenticate entry carries for `prefix`: its SHA-256, in hex.
    pub(crate) fn digest(prefix: &str) -> String {
        use sha2::Digest;
        sha2::Sha256::digest(prefix.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The token a client gets for `prefix`, issued by the entry at `index`.
    pub(crate) fn token(prefix: &str, index: u64) -> String {
        format!("{prefix}.{index}")
    }

    /// Records the token whose prefix has `digest`, issued at `index` (apply phase). Expired tokens
    /// are swept at the same time.
    pub(crate) fn assign(&self, digest: &str, index: u64, user: &str, revision: u64) {
        let now = Instant::now();
        let mut tokens = self.lock();
        tokens.retain(|_, e| e.expires > now);
        let key = format!("{digest}.{index}");
        tokens.insert(key, Entry { user: user.to_string(), revision, expires: now + self.ttl });
    }

    /// The token's user and revision; using a token extends its life by the TTL.
    pub(crate) fn info(&self, token: &str) -> Option<(String, u64)> {
        let (prefix, index) = token.rsplit_once('.')?;
        let key = format!("{}.{index}", Self::digest(prefix));
        let now = Instant::now();
        let mut tokens = self.lock();
        let entry = tokens.get_mut(&key)?;
        if entry.expires <= now {
            tokens.remove(&key);
            return None;
        }
        entry.expires = now + self.ttl;
        Some((entry.user.clone(), entry.revision))
    }

    pub(crate) fn invalidate_user(&self, user: &str) {
        self.lock().retain(|_, e| e.user != user);
    }

    pub(crate) fn clear(&self) {
        self.lock().clear();
    }

    /// Keeps only the tokens for which `valid(user, issued at)` holds (after a snapshot install: see
    /// `State::rebuild_after_install`).
    pub(crate) fn retain(&self, mut valid: impl FnMut(&str, u64) -> bool) {
        self.lock().retain(|_, e| valid(&e.user, e.revision));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_resolve_until_invalidated_or_expired() {
        let tokens = SimpleTokens::new(Duration::from_millis(50));
        tokens.assign(&SimpleTokens::digest("t1"), 5, "alice", 3);
        assert_eq!(tokens.info("t1.5"), Some(("alice".into(), 3)));
        assert_eq!(tokens.info("t2.5"), None);
        assert_eq!(tokens.info("t1.6"), None, "the index is part of the token");
        tokens.invalidate_user("alice");
        assert_eq!(tokens.info("t1.5"), None);
        tokens.assign(&SimpleTokens::digest("t3"), 6, "bob", 4);
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(tokens.info("t3.6"), None, "an unused token expires after the TTL");
        assert_eq!(SimpleTokens::prefix().len(), 16);
    }

    /// What the log holds (the digest, with the index) does not resolve: only the prefix does.
    #[test]
    fn the_digest_in_the_log_is_not_a_token() {
        let tokens = SimpleTokens::new(Duration::from_secs(60));
        let digest = SimpleTokens::digest("secretprefix");
        tokens.assign(&digest, 9, "alice", 1);
        assert_eq!(tokens.info(&format!("{digest}.9")), None);
        assert_eq!(tokens.info(&SimpleTokens::token("secretprefix", 9)), Some(("alice".into(), 1)));
    }
}
