//! Permission decisions: may this requester touch these keys, decided against one transaction's auth
//! state. Used by the apply phase (writes, at the revision they are ordered at) and by the read path
//! (after the read index, against the current auth state).

use std::sync::Arc;
use std::time::Duration;

use heed::RoTxn;

use super::cache::{CachedUser, UserPermissions};
use super::permissions::{Access, PermissionSet};
use super::store::{is_root, AuthStore};
use crate::error::EtcdError;
use crate::identity::Requester;
use crate::keyrange::KeyRange;
use crate::logging::limit::LogLimit;
use crate::logging::text::Quoted;
use crate::proto::etcdserverpb::request_op::Request;
use crate::proto::etcdserverpb::{DeleteRangeRequest, PutRequest, TxnRequest};

/// The key kube-apiserver's compactor writes before each compaction (k8s.io/apiserver
/// `pkg/storage/etcd3/compact.go`); write permission on it is permission to compact.
const COMPACTION_KEY: &[u8] = b"compact_rev_key";

pub(crate) struct Authorizer<'t> {
    store: &'t AuthStore,
    txn: &'t RoTxn<'t>,
    enabled: bool,
    revision: u64,
    /// Tokens issued before this auth revision are void (`AuthStore::tokens_valid_from`).
    tokens_valid_from: u64,
    /// The raft index of the entry being applied (`None` on the read path), for the audit log.
    index: Option<u64>,
}

impl<'t> Authorizer<'t> {
    pub(crate) fn new(store: &'t AuthStore, txn: &'t RoTxn<'t>) -> Result<Self, EtcdError> {
        Ok(Authorizer {
            store,
            txn,
            enabled: store.enabled(txn)?,
            revision: store.revision(txn)?,
            tokens_valid_from: store.tokens_valid_from(txn)?,
            index: None,
        })
    }

    /// The same authorizer, deciding for the entry at raft index `index` (apply).
    pub(crate) fn at_index(mut self, index: u64) -> Self {
        self.index = Some(index);
        self
    }

    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    pub(crate) fn revision(&self) -> u64 {
        self.revision
    }

    /// The user's merged permissions at this revision (`None`: no such user).
    fn user(&self, username: &str) -> Result<Option<Arc<CachedUser>>, EtcdError> {
        if username.is_empty() {
            return Ok(None); // no user has an empty name (and LMDB has no empty keys)
        }
        if let Some(cached) = self.store.cache.get(username, self.revision) {
            return Ok(Some(cached));
        }
        let Some(user) = self.store.user(self.txn, username)? else { return Ok(None) };
        let permissions = if is_root(&user) {
            UserPermissions::Root
        } else {
            let mut perms = Vec::new();
            for role in &user.roles {
                if let Some(role) = self.store.role(self.txn, role)? {
                    perms.extend(role.key_permission);
                }
            }
            UserPermissions::Granted(PermissionSet::from_permissions(&perms))
        };
        let cached = Arc::new(CachedUser { credentials_revision: user.credentials_revision, permissions });
        self.store.cache.insert(username, self.revision, cached.clone());
        Ok(Some(cached))
    }

    /// A known user whose identity still stands (etcd's `isOpPermitted` up to the key check). A
    /// token is void once it predates its user's current credentials or the last auth disable
    /// ("revision of auth store is old", so clients log in again); any other auth change since its
    /// issue leaves it valid, and the permissions are those of this transaction.
    fn authenticated(&self, who: &Requester) -> Result<Option<Arc<CachedUser>>, EtcdError> {
        let Requester::Client { username, revision, .. } = who else {
            return Ok(Some(Arc::new(CachedUser { credentials_revision: 0, permissions: UserPermissions::Root })));
        };
        if *revision == 0 {
            return Err(EtcdError::UserEmpty);
        }
        // "": a verified certificate that names nobody (`Identity::requester`), no such user.
        let Some(user) = self.user(username)? else { return Ok(None) };
        if *revision < user.credentials_revision.max(self.tokens_valid_from) {
            return Err(EtcdError::AuthOldRevision);
        }
        Ok(Some(user))
    }

    /// May `who` read or write every key in `range`?
    pub(crate) fn check(
        &self,
        who: &Requester,
        op: &'static str,
        access: Access,
        range: &KeyRange,
    ) -> Result<(), EtcdError> {
        if !self.enabled || *who == Requester::Member {
            return Ok(());
        }
        let result = self.decide(who, access, range);
        if let Err(e) = &result {
            denied(who, op, Some(range), e);
        }
        self.audit(who, op, Some(range), &result);
        result
    }

    fn decide(&self, who: &Requester, access: Access, range: &KeyRange) -> Result<(), EtcdError> {
        let user = self.authenticated(who)?;
        let allowed = match user.as_ref().map(|u| &u.permissions) {
            Some(UserPermissions::Root) => true,
            Some(UserPermissions::Granted(set)) => set.allows(access, range),
            None => false,
        };
        if allowed {
            Ok(())
        } else {
            Err(EtcdError::PermissionDenied)
        }
    }

    /// Records a decision in the audit log, if the member keeps one.
    fn audit(&self, who: &Requester, op: &str, range: Option<&KeyRange>, result: &Result<(), EtcdError>) {
        let Some(log) = self.store.audit.get() else { return };
        let Requester::Client { username, revision, origin } = who else { return };
        let client = origin.client.map(|a| a.to_string());
        let (key, range_end) = match range {
            None => (None, None),
            Some(KeyRange::Single(k)) => (Some(k.escape_ascii().to_string()), None),
            Some(KeyRange::Span { start, end }) => {
                (Some(start.escape_ascii().to_string()), Some(end.escape_ascii().to_string()))
            }
            Some(KeyRange::From(start)) => (Some(start.escape_ascii().to_string()), Some("\\x00".to_string())),
        };
        log.record(&crate::auth::audit::Decision {
            time: crate::auth::audit::now(),
            member: log.member(),
            client: client.as_deref(),
            source: origin.credential.as_str(),
            user: username,
            op,
            key,
            range_end,
            allowed: result.is_ok(),
            reason: result.as_ref().err().map(ToString::to_string),
            auth_revision: *revision,
            raft_index: self.index,
        });
    }

    /// A delete needs write on its range; with `prev_kv` also read (it returns the deleted values).
    pub(crate) fn check_delete(
        &self,
        who: &Requester,
        op: &'static str,
        del: &DeleteRangeRequest,
    ) -> Result<(), EtcdError> {
        let range = KeyRange::new(&del.key, &del.range_end);
        self.check(who, op, Access::Write, &range)?;
        if del.prev_kv {
            self.check(who, op, Access::Read, &range)?;
        }
        Ok(())
    }

    /// A txn needs read on every compare and range, the delete rules on every delete and `check_put`
    /// on every put, on both branches and recursively through nested txns (CVE-2026-33343): one denied
    /// op denies the whole txn. The put rule is the caller's, since it reads lease attachments.
    pub(crate) fn check_txn(
        &self,
        who: &Requester,
        t: &TxnRequest,
        check_put: &mut dyn FnMut(&PutRequest) -> Result<(), EtcdError>,
    ) -> Result<(), EtcdError> {
        if !self.enabled {
            return Ok(());
        }
        for compare in &t.compare {
            self.check(who, "txn", Access::Read, &KeyRange::new(&compare.key, &compare.range_end))?;
        }
        for op in t.success.iter().chain(&t.failure) {
            match &op.request {
                Some(Request::RequestRange(r)) => {
                    self.check(who, "txn", Access::Read, &KeyRange::new(&r.key, &r.range_end))?
                }
                Some(Request::RequestPut(p)) => check_put(p)?,
                Some(Request::RequestDeleteRange(d)) => self.check_delete(who, "txn", d)?,
                Some(Request::RequestTxn(inner)) => self.check_txn(who, inner, check_put)?,
                None => {}
            }
        }
        Ok(())
    }

    /// Requires an authenticated, existing user when auth is on (APIs without key ranges: leases,
    /// membership, alarms).
    pub(crate) fn check_user(&self, who: &Requester, op: &'static str) -> Result<(), EtcdError> {
        if !self.enabled || *who == Requester::Member {
            return Ok(());
        }
        let result = match self.authenticated(who) {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(EtcdError::PermissionDenied),
            Err(e) => Err(e),
        };
        if let Err(e) = &result {
            denied(who, op, None, e);
        }
        self.audit(who, op, None, &result);
        result
    }

    /// Who may compact when auth is on: root, or a user who may write [`COMPACTION_KEY`]. etcd 3.4
    /// lets any user compact, which lets a user confined to one prefix discard every other user's
    /// history; root alone would make kube-apiserver, whose compactor must run as its own
    /// least-privilege user, need root. kube-apiserver coordinates its compactions through a txn on
    /// that key, so the grant it needs anyway is the grant that lets it compact.
    pub(crate) fn check_compaction(&self, who: &Requester, op: &'static str) -> Result<(), EtcdError> {
        self.check(who, op, Access::Write, &KeyRange::Single(COMPACTION_KEY.to_vec()))
    }

    /// Requires the root role when auth is on (etcd's `IsAdminPermitted`, which has no revision
    /// check: there, a token issued before its user's password changed kept admin rights). Here a
    /// void token is refused as it is for keys.
    pub(crate) fn check_admin(&self, who: &Requester, op: &'static str) -> Result<(), EtcdError> {
        if !self.enabled || *who == Requester::Member {
            return Ok(());
        }
        let result = match who {
            Requester::Client { username, .. } if username.is_empty() => Err(EtcdError::UserEmpty),
            Requester::Client { username, revision, .. } => match self.store.user(self.txn, username)? {
                None => Err(EtcdError::UserNotFound),
                Some(user) if *revision < user.credentials_revision.max(self.tokens_valid_from) => {
                    Err(EtcdError::AuthOldRevision)
                }
                Some(user) if is_root(&user) => Ok(()),
                Some(_) => Err(EtcdError::PermissionDenied),
            },
            Requester::Member => Ok(()),
        };
        if let Err(e) = &result {
            denied(who, op, None, e);
        }
        self.audit(who, op, None, &result);
        result
    }

    /// Whether a token's identity still stands, whether or not auth is on now (`AuthStore::token_valid`):
    /// its user exists, with the credentials the token was issued for, and auth was not disabled
    /// since. For a stream opened with a token, which ends once it does not ("revision of auth store
    /// is old", as etcd answers a token older than the auth state).
    pub(crate) fn token_stands(&self, who: &Requester, op: &'static str) -> Result<(), EtcdError> {
        let Requester::Client { username, revision, .. } = who else { return Ok(()) };
        // No user has an empty name (and LMDB has no empty keys).
        if !username.is_empty() && self.store.token_valid(self.txn, username, *revision)? {
            return Ok(());
        }
        denied(who, op, None, &EtcdError::AuthOldRevision);
        self.audit(who, op, None, &Err(EtcdError::AuthOldRevision));
        Err(EtcdError::AuthOldRevision)
    }

    /// Whether `who` may have `access` to all of `range`, decided quietly: for a filter (which leases a
    /// listing shows), where a refusal is not a refused request. A void identity is still an error.
    pub(crate) fn permits(&self, who: &Requester, access: Access, range: &KeyRange) -> Result<bool, EtcdError> {
        if !self.enabled || *who == Requester::Member {
            return Ok(true);
        }
        match self.decide(who, access, range) {
            Ok(()) => Ok(true),
            Err(EtcdError::PermissionDenied) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Whether `who` is root (or the member), by an identity that still stands; with auth off, everyone
    /// may do what root may.
    pub(crate) fn is_root(&self, who: &Requester) -> Result<bool, EtcdError> {
        if !self.enabled || *who == Requester::Member {
            return Ok(true);
        }
        Ok(self.authenticated(who)?.is_some_and(|user| matches!(user.permissions, UserPermissions::Root)))
    }

    /// Refuses `op` to `who` with "permission denied" for a reason decided outside this authorizer (a
    /// lease that is not theirs: `lease/holders.rs`), logged and audited as every refusal is.
    pub(crate) fn refuse(&self, who: &Requester, op: &'static str) -> EtcdError {
        denied(who, op, None, &EtcdError::PermissionDenied);
        self.audit(who, op, None, &Err(EtcdError::PermissionDenied));
        EtcdError::PermissionDenied
    }

    /// Whether `who` is the named user, by an identity that still stands (users may read their own
    /// record). A void token of that user is refused, not passed on to the root check.
    pub(crate) fn is_user(&self, who: &Requester, name: &str) -> Result<bool, EtcdError> {
        match who {
            Requester::Client { username, .. } if self.enabled && username == name => {
                Ok(self.authenticated(who)?.is_some())
            }
            _ => Ok(false),
        }
    }

    /// Whether `who` holds the named role, by an identity that still stands (users may read their own
    /// roles).
    pub(crate) fn has_role(&self, who: &Requester, role: &str) -> Result<bool, EtcdError> {
        let Requester::Client { username, revision, .. } = who else { return Ok(false) };
        if !self.enabled || username.is_empty() || *revision == 0 {
            return Ok(false);
        }
        if self.authenticated(who)?.is_none() {
            return Ok(false);
        }
        Ok(self.store.user(self.txn, username)?.is_some_and(|u| u.roles.iter().any(|r| r == role)))
    }
}

/// Logs one refused request and counts it.
fn denied(who: &Requester, op: &'static str, range: Option<&KeyRange>, reason: &EtcdError) {
    let reason_label = match reason {
        EtcdError::PermissionDenied => "permission_denied",
        EtcdError::UserEmpty => "user_empty",
        EtcdError::AuthOldRevision => "auth_old_revision",
        EtcdError::UserNotFound => "user_not_found",
        _ => "other",
    };
    crate::metrics::AUTH_DENIALS.with_label_values(&[op, reason_label]).inc();
    // Any client can cause these: at most 5 lines per user per 10 s (the metric counts them all).
    static LIMIT: LogLimit = LogLimit::new(5, Duration::from_secs(10));
    let Some(suppressed) = LIMIT.admit(who.describe()) else { return };
    let user = Quoted::str(who.describe());
    match range {
        Some(range) => tracing::warn!(
            user = %user, op, range = %describe_range(range), reason = %reason, suppressed_before = suppressed,
            "request denied"
        ),
        None => tracing::warn!(user = %user, op, reason = %reason, suppressed_before = suppressed, "request denied"),
    }
}

/// The refused keys as the log shows them: each quoted (`logging/text.rs`), so a key holding a newline
/// cannot forge a line.
fn describe_range(range: &KeyRange) -> String {
    match range {
        KeyRange::Single(k) => Quoted::bytes(k).to_string(),
        KeyRange::Span { start, end } => format!("[{}, {})", Quoted::bytes(start), Quoted::bytes(end)),
        KeyRange::From(start) => format!("[{}, <end>)", Quoted::bytes(start)),
    }
}
