//! Passwords Authenticate has verified, so that a client logging in again with the same user and
//! password does not pay bcrypt again (a member serves logins at a few dozen per second per core
//! otherwise).
//!
//! What is kept is a keyed hash — HMAC-SHA256 under a random per-process key — of the user name, the
//! user's stored bcrypt hash and the password; never the password. The stored hash is part of the key,
//! so a password change (or a deleted and re-added user) makes every earlier entry unreachable. A
//! lookup never decides that a password is wrong: a miss pays the full bcrypt like any first login, so
//! a wrong password is never cheaper, and unknown users never reach this cache. Only a successful
//! bcrypt check inserts. Login throttling runs before the check, hit or miss.
//!
//! Trade-off, written down: someone who can read this process's memory could test guesses against
//! these digests much faster than against bcrypt hashes. Such a reader also sees passwords as clients
//! send them, so the cache gives little more; nothing of it is ever written to disk.

use std::collections::HashMap;
use std::sync::Mutex;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// How many verified credentials are kept; beyond that the least recently used one is dropped.
const CAPACITY: usize = 4096;

type Digest = [u8; 32];

pub(crate) struct VerifiedPasswords {
    key: [u8; 32],
    /// Digest → when it was last used (a logical clock, for eviction).
    entries: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    used: HashMap<Digest, u64>,
    clock: u64,
}

impl Default for VerifiedPasswords {
    fn default() -> Self {
        VerifiedPasswords { key: rand::random(), entries: Mutex::default() }
    }
}

impl VerifiedPasswords {
    /// Whether `password` was verified for `user` while its stored hash was `stored_hash`.
    pub(crate) fn contains(&self, user: &str, stored_hash: &[u8], password: &str) -> bool {
        let digest = self.digest(user, stored_hash, password);
        let mut entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        entries.clock += 1;
        let now = entries.clock;
        match entries.used.get_mut(&digest) {
            Some(used) => {
                *used = now;
                true
            }
            None => false,
        }
    }

    /// Records that bcrypt accepted `password` for `user` with `stored_hash`.
    pub(crate) fn insert(&self, user: &str, stored_hash: &[u8], password: &str) {
        let digest = self.digest(user, stored_hash, password);
        let mut entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        entries.clock += 1;
        let now = entries.clock;
        if entries.used.len() >= CAPACITY && !entries.used.contains_key(&digest) {
            // A scan, but only when full and a new login arrives: rare next to bcrypt's cost.
            if let Some(oldest) = entries.used.iter().min_by_key(|(_, used)| **used).map(|(d, _)| *d) {
                entries.used.remove(&oldest);
            }
        }
        entries.used.insert(digest, now);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner).used.len()
    }

    fn digest(&self, user: &str, stored_hash: &[u8], password: &str) -> Digest {
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.key) else {
            unreachable!("HMAC takes a key of any length")
        };
        // Lengths first, so no two (user, hash, password) triples feed the same bytes.
        for part in [user.as_bytes(), stored_hash, password.as_bytes()] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac.finalize().into_bytes().into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_verified_triple_hits() {
        let cache = VerifiedPasswords::default();
        cache.insert("alice", b"$2b$hash1", "pw");
        assert!(cache.contains("alice", b"$2b$hash1", "pw"));
        assert!(!cache.contains("alice", b"$2b$hash1", "pw2"), "another password");
        assert!(!cache.contains("alice", b"$2b$hash2", "pw"), "the password changed");
        assert!(!cache.contains("bob", b"$2b$hash1", "pw"), "another user");
        // Length-prefixed: moving bytes between the parts is another triple.
        assert!(!cache.contains("alic", b"e$2b$hash1", "pw"));
    }

    #[test]
    fn another_process_key_never_hits() {
        let (a, b) = (VerifiedPasswords::default(), VerifiedPasswords::default());
        a.insert("alice", b"h", "pw");
        assert!(!b.contains("alice", b"h", "pw"));
    }

    #[test]
    fn bounded_and_the_least_recently_used_goes_first() {
        let cache = VerifiedPasswords::default();
        for i in 0..CAPACITY {
            cache.insert(&format!("u{i}"), b"h", "pw");
        }
        assert!(cache.contains("u0", b"h", "pw")); // u0 used again: u1 is now the oldest
        cache.insert("new", b"h", "pw");
        assert_eq!(cache.len(), CAPACITY);
        assert!(cache.contains("u0", b"h", "pw"));
        assert!(!cache.contains("u1", b"h", "pw"));
        assert!(cache.contains("new", b"h", "pw"));
    }
}
