//! Verified Basic credentials: `user:password` → the token the gRPC Authenticate issued for them, so a
//! request with Basic credentials costs a bcrypt only when they are new or their token went stale.
//!
//! Entries are keyed by a keyed hash (HMAC-SHA256 under a random per-process key) of the user and the
//! password; no password is stored. A lookup never decides on its own that a password is right: a
//! hit needs the exact credentials that Authenticate accepted, so any other password misses and pays
//! a full Authenticate (a bcrypt) like everyone else — a wrong password is never cheaper. Failures are
//! never cached. A token the member no longer accepts (auth revision moved: a password change, a
//! deleted user, any auth change; or expired) is forgotten by the caller and the credentials are
//! verified again, so the cache is never weaker than Authenticate.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tonic::Status;

use crate::identity::credentials::Basic;

/// How many verified credentials are kept; beyond that an idle entry is dropped.
const MAX_LOGINS: usize = 4096;

/// A token Authenticate issued for verified credentials.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Login {
    pub token: String,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Login {{ token: .. }}")
    }
}

/// Where a login came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    Cached,
    /// Authenticate ran for this request.
    Verified,
}

type Digest = [u8; 32];
/// One entry; its lock makes concurrent requests with the same new credentials wait for one
/// Authenticate instead of each running bcrypt.
type Slot = Arc<tokio::sync::Mutex<Option<Login>>>;

pub(crate) struct Logins {
    key: [u8; 32],
    slots: Mutex<HashMap<Digest, Slot>>,
}

impl Default for Logins {
    fn default() -> Self {
        Logins::new()
    }
}

impl Logins {
    pub(crate) fn new() -> Logins {
        Logins { key: rand::random(), slots: Mutex::new(HashMap::new()) }
    }

    /// The login for `basic`: the cached one, or the one `authenticate` returns (called only when none
    /// is cached). `Ok(None)` from `authenticate` means auth is not enabled: nothing to log in to, and
    /// nothing is cached.
    pub(crate) async fn login<F, Fut>(&self, basic: &Basic, authenticate: F) -> Result<Option<(Login, Source)>, Status>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Option<Login>, Status>>,
    {
        let digest = self.digest(basic);
        let slot = self.slot(digest);
        let mut cached = slot.lock().await;
        if let Some(login) = cached.as_ref() {
            return Ok(Some((login.clone(), Source::Cached)));
        }
        let verified = authenticate().await;
        match &verified {
            Ok(Some(login)) => *cached = Some(login.clone()),
            // Nothing to keep: drop the empty slot (unless another request filled it meanwhile).
            _ => {
                drop(cached);
                self.remove_if_empty(digest, &slot);
            }
        }
        Ok(verified?.map(|login| (login, Source::Verified)))
    }

    /// Forgets `stale` (a token the member refused) unless another request already replaced it.
    pub(crate) async fn forget(&self, basic: &Basic, stale: &Login) {
        let digest = self.digest(basic);
        let Some(slot) = self.lock_slots().get(&digest).cloned() else { return };
        let mut cached = slot.lock().await;
        if cached.as_ref() == Some(stale) {
            *cached = None;
        }
    }

    /// How many credentials are cached (for tests and metrics).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock_slots().len()
    }

    fn digest(&self, basic: &Basic) -> Digest {
        // `Hmac::new_from_slice` accepts keys of any length; 32 bytes cannot fail.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key).unwrap_or_else(|_| unreachable!());
        // The user's length first, so ("ab", "c") and ("a", "bc") never share an entry.
        mac.update(&(basic.user.len() as u64).to_be_bytes());
        mac.update(basic.user.as_bytes());
        mac.update(basic.password.as_bytes());
        mac.finalize().into_bytes().into()
    }

    fn lock_slots(&self) -> std::sync::MutexGuard<'_, HashMap<Digest, Slot>> {
        self.slots.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn slot(&self, digest: Digest) -> Slot {
        let mut slots = self.lock_slots();
        if let Some(slot) = slots.get(&digest) {
            return slot.clone();
        }
        if slots.len() >= MAX_LOGINS {
            // An idle entry: nobody holds it, so nobody is logging in with it right now.
            let idle = slots.iter().find(|(_, slot)| Arc::strong_count(slot) == 1).map(|(digest, _)| *digest);
            if let Some(idle) = idle {
                slots.remove(&idle);
            }
        }
        slots.entry(digest).or_default().clone()
    }

    fn remove_if_empty(&self, digest: Digest, slot: &Slot) {
        let mut slots = self.lock_slots();
        let unused = slots
            .get(&digest)
            .is_some_and(|current| Arc::ptr_eq(current, slot) && current.try_lock().is_ok_and(|login| login.is_none()));
        if unused {
            slots.remove(&digest);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn basic(user: &str, password: &str) -> Basic {
        Basic { user: user.into(), password: password.into() }
    }

    /// An Authenticate that accepts alice:right and counts its calls.
    struct FakeAuth {
        calls: AtomicUsize,
    }

    impl FakeAuth {
        fn new() -> FakeAuth {
            FakeAuth { calls: AtomicUsize::new(0) }
        }

        async fn authenticate(&self, basic: &Basic) -> Result<Option<Login>, Status> {
            let n = self.calls.fetch_add(1, Ordering::SeqCst);
            tokio::task::yield_now().await;
            if basic.user == "alice" && basic.password == "right" {
                Ok(Some(Login { token: format!("token-{n}") }))
            } else {
                Err(Status::invalid_argument("etcdserver: authentication failed, invalid user ID or password"))
            }
        }

        fn calls(&self) -> usize {
            self.calls.load(Ordering::SeqCst)
        }
    }

    #[tokio::test]
    async fn verified_credentials_are_reused_and_a_wrong_password_always_authenticates() {
        let (logins, auth) = (Logins::new(), FakeAuth::new());
        let alice = basic("alice", "right");
        let first = logins.login(&alice, || auth.authenticate(&alice)).await.unwrap().unwrap();
        assert_eq!(first.1, Source::Verified);
        let second = logins.login(&alice, || auth.authenticate(&alice)).await.unwrap().unwrap();
        assert_eq!((second.0.token.as_str(), second.1), ("token-0", Source::Cached));
        assert_eq!(auth.calls(), 1);
        // The wrong password never hits the right one's entry, however often it is tried, and is not cached.
        let wrong = basic("alice", "wrong");
        for round in 1..=3 {
            assert!(logins.login(&wrong, || auth.authenticate(&wrong)).await.is_err());
            assert_eq!(auth.calls(), 1 + round);
        }
        assert_eq!(logins.len(), 1);
    }

    #[tokio::test]
    async fn a_forgotten_token_is_verified_again() {
        let (logins, auth) = (Logins::new(), FakeAuth::new());
        let alice = basic("alice", "right");
        let (stale, _) = logins.login(&alice, || auth.authenticate(&alice)).await.unwrap().unwrap();
        logins.forget(&alice, &stale).await;
        let (fresh, source) = logins.login(&alice, || auth.authenticate(&alice)).await.unwrap().unwrap();
        assert_eq!((fresh.token.as_str(), source), ("token-1", Source::Verified));
        // Forgetting the old token again leaves the fresh one alone.
        logins.forget(&alice, &stale).await;
        let (kept, source) = logins.login(&alice, || auth.authenticate(&alice)).await.unwrap().unwrap();
        assert_eq!((kept.token.as_str(), source), ("token-1", Source::Cached));
    }

    #[tokio::test]
    async fn concurrent_logins_with_the_same_credentials_authenticate_once() {
        let (logins, auth) = (Logins::new(), FakeAuth::new());
        let alice = basic("alice", "right");
        let all = futures::future::join_all((0..8).map(|_| logins.login(&alice, || auth.authenticate(&alice)))).await;
        assert!(all.iter().all(|r| r.as_ref().unwrap().as_ref().unwrap().0.token == "token-0"));
        assert_eq!(auth.calls(), 1);
    }

    #[tokio::test]
    async fn no_auth_caches_nothing() {
        let logins = Logins::new();
        let alice = basic("alice", "right");
        assert_eq!(logins.login(&alice, || async { Ok(None) }).await.unwrap(), None);
        assert_eq!(logins.len(), 0);
    }

    #[test]
    fn entries_are_keyed_by_user_and_password_together() {
        let logins = Logins::new();
        assert_ne!(logins.digest(&basic("ab", "c")), logins.digest(&basic("a", "bc")));
        assert_eq!(logins.digest(&basic("a", "bc")), logins.digest(&basic("a", "bc")));
        // A different process key, a different digest: nothing about the password is fixed.
        assert_ne!(Logins::new().digest(&basic("a", "bc")), logins.digest(&basic("a", "bc")));
    }

    #[tokio::test]
    async fn the_cache_is_bounded() {
        let logins = Logins::new();
        for i in 0..MAX_LOGINS + 10 {
            let user = basic(&format!("u{i}"), "pw");
            let login = Login { token: format!("t{i}") };
            logins.login(&user, || async { Ok(Some(login)) }).await.unwrap();
        }
        assert_eq!(logins.len(), MAX_LOGINS);
    }
}
