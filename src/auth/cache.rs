//! Per-user merged permissions, cached per auth revision.
//!
//! An entry is valid only at the auth revision it was built at. When an auth mutation moves the
//! revision from `r` to `r + 1`, entries of users it did not affect move forward to `r + 1`; the others
//! are dropped and rebuilt on next use. So a change rebuilds only the users it touches (etcd rebuilds
//! every user on every change), and an entry built from an older read transaction can never be used
//! at a newer revision.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::permissions::PermissionSet;

/// Whose permissions an auth mutation changed: the cache entries it invalidates, and the live watchers
/// whose read permission must be checked again. The store's mutations report it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Affected {
    Nobody,
    Users(Vec<String>),
    Everyone,
}

/// What a user may do: everything (root) or what its roles' merged permissions allow.
#[derive(Debug)]
pub(crate) enum UserPermissions {
    Root,
    Granted(PermissionSet),
}

/// What a check needs of one user: its permissions, and since when its credentials stand (tokens
/// issued before are void; `AuthStore::token_valid`).
#[derive(Debug)]
pub(crate) struct CachedUser {
    pub credentials_revision: u64,
    pub permissions: UserPermissions,
}

#[derive(Default)]
pub(crate) struct PermissionCache {
    entries: Mutex<HashMap<String, (u64, Arc<CachedUser>)>>,
}

impl PermissionCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u64, Arc<CachedUser>)>> {
        // The map holds no invariant across entries, so a poisoned lock is still usable.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn get(&self, user: &str, revision: u64) -> Option<Arc<CachedUser>> {
        self.lock().get(user).filter(|(at, _)| *at == revision).map(|(_, p)| p.clone())
    }

    pub(crate) fn insert(&self, user: &str, revision: u64, permissions: Arc<CachedUser>) {
        self.lock().insert(user.to_string(), (revision, permissions));
    }

    /// Moves unaffected entries built at `from` to `to`; drops the rest.
    pub(crate) fn advance(&self, from: u64, to: u64, affected: &Affected) {
        let mut entries = self.lock();
        entries.retain(|user, (at, _)| {
            let keep = *at == from
                && match affected {
                    Affected::Nobody => true,
                    Affected::Users(users) => !users.iter().any(|u| u == user),
                    Affected::Everyone => false,
                };
            if keep {
                *at = to;
            }
            keep
        });
    }

    /// Forgets everything (snapshot install).
    pub(crate) fn clear(&self) {
        self.lock().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> Arc<CachedUser> {
        Arc::new(CachedUser { credentials_revision: 1, permissions: UserPermissions::Root })
    }

    #[test]
    fn advancing_keeps_only_unaffected_users() {
        let cache = PermissionCache::default();
        cache.insert("alice", 5, root());
        cache.insert("bob", 5, root());
        cache.insert("carol", 4, root());
        cache.advance(5, 6, &Affected::Users(vec!["alice".into()]));
        assert!(cache.get("alice", 6).is_none(), "affected user must be rebuilt");
        assert!(cache.get("bob", 6).is_some(), "unaffected user moves forward");
        assert!(cache.get("carol", 6).is_none(), "an entry from an older revision is never promoted");
        assert!(cache.get("bob", 5).is_none());
    }
}
