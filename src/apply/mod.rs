//! The single place that turns a committed raft entry into effects on the store.
//!
//! Plain and synchronous: it runs inside the state machine's LMDB write transaction, which also records
//! the applied log id, so an entry is applied whole or not at all. For every entry, in this order:
//! 0. the request's shape, checked again as the API layer checks it: whatever a committed entry holds,
//!    applying it gives an etcd error, never a storage error (an empty key would reach LMDB);
//! 1. who asked (`Requester`, from the entry's header) and whether auth is on;
//! 2. every permission the operation needs, decided at the auth revision the entry is ordered at —
//!    a permission revoked by an earlier entry is already gone;
//! 3. the operation's own checks (compacted revision, lease exists, ...);
//! 4. the writes.
//!
//! Steps 1–3 never write, so a refused entry changes nothing.
//!
//! While a NOSPACE alarm is active (replicated state, `space/alarm.rs`), step 3 refuses puts, txns with a
//! put and lease grants with "database space exceeded" (etcd's `applierV3Capped`), identically on
//! every member; deletes, compaction and everything else still apply.

use std::collections::HashSet;

use heed::{RoTxn, RwTxn};
use serde::{Deserialize, Serialize};

use crate::auth::cache::Affected;
use crate::auth::check::Authorizer;
use crate::auth::permissions::Access;
use crate::auth::simple::SimpleTokens;
use crate::auth::store::AuthStore;
use crate::error::EtcdError;
use crate::identity::Requester;
use crate::keyrange::KeyRange;
use crate::lease::holders;
use crate::lease::store::{LeaseRecord, LeaseStore};
use crate::lease::{MAX_LEASE_TTL, MIN_LEASE_TTL};
use crate::mvcc::kv::{self, Leases};
use crate::mvcc::{self, KvStore, WriteTxn};
use crate::proto::etcdserverpb::alarm_request::AlarmAction;
use crate::proto::etcdserverpb::request_op::Request;
use crate::proto::etcdserverpb::{
    AlarmRequest, AlarmResponse, AlarmType, CompactionResponse, DeleteRangeResponse, InternalRaftRequest,
    LeaseCheckpointResponse, LeaseGrantResponse, LeaseRevokeResponse, PutRequest, PutResponse, RequestOp,
    ResponseHeader, TxnResponse,
};
use crate::proto::mvccpb::event::EventType;
use crate::proto::mvccpb::Event;
use crate::space::alarm::AlarmStore;

/// The replicated tables an entry can change, and the member-local token table that Authenticate
/// entries fill.
pub(crate) struct Stores<'a> {
    pub kv: &'a KvStore,
    pub leases: &'a LeaseStore,
    pub auth: &'a AuthStore,
    pub alarms: &'a AlarmStore,
    pub simple_tokens: Option<&'a SimpleTokens>,
}

/// What an applied entry changed, for the observers told after the transaction commits
/// (watchers, the lease clock, the auth state).
#[derive(Debug, Default, Clone)]
pub struct Effects {
    pub events: Vec<Event>,
    pub granted: Vec<(i64, i64)>,
    pub revoked: Vec<i64>,
    /// Whose permissions changed, when an auth entry changed any.
    pub auth: Option<Affected>,
    /// An alarm was raised or cleared.
    pub alarms_changed: bool,
}

/// What applying one request produced for its proposer (serialised into openraft's apply results, so
/// the protobuf responses travel as their encoding).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Applied {
    /// No response of its own (a step inside a larger operation).
    Nothing,
    Put(#[serde(with = "crate::proto::as_bytes")] PutResponse),
    DeleteRange(#[serde(with = "crate::proto::as_bytes")] DeleteRangeResponse),
    Txn(#[serde(with = "crate::proto::as_bytes")] TxnResponse),
    Compaction(#[serde(with = "crate::proto::as_bytes")] CompactionResponse),
    LeaseGrant(#[serde(with = "crate::proto::as_bytes")] LeaseGrantResponse),
    LeaseRevoke(#[serde(with = "crate::proto::as_bytes")] LeaseRevokeResponse),
    LeaseCheckpoint(#[serde(with = "crate::proto::as_bytes")] LeaseCheckpointResponse),
    Alarm(#[serde(with = "crate::proto::as_bytes")] AlarmResponse),
    /// A user/role/auth-config change was applied; the API layer builds the typed response.
    AuthChanged {
        #[serde(with = "crate::proto::option_as_bytes")]
        header: Option<ResponseHeader>,
    },
    /// A login was ordered at `index` and this auth revision: a simple token was issued there (its
    /// prefix is the proposer's; `auth/simple.rs`), or the API layer signs a JWT.
    Authenticated {
        index: u64,
        auth_revision: u64,
    },
}

impl Applied {
    /// The response header inside, for the kinds of result that carry one.
    pub fn header_mut(&mut self) -> Option<&mut Option<ResponseHeader>> {
        match self {
            Applied::Put(r) => Some(&mut r.header),
            Applied::DeleteRange(r) => Some(&mut r.header),
            Applied::Txn(r) => Some(&mut r.header),
            Applied::Compaction(r) => Some(&mut r.header),
            Applied::LeaseGrant(r) => Some(&mut r.header),
            Applied::LeaseRevoke(r) => Some(&mut r.header),
            Applied::LeaseCheckpoint(r) => Some(&mut r.header),
            Applied::Alarm(r) => Some(&mut r.header),
            Applied::AuthChanged { header } => Some(header),
            Applied::Nothing | Applied::Authenticated { .. } => None,
        }
    }

    /// The error for an apply result of the wrong kind for its proposal: the raft layer mixed up
    /// proposals, which is never expected.
    pub fn mismatch(self) -> EtcdError {
        tracing::error!(applied = ?self, "apply result does not match the proposal");
        EtcdError::Internal
    }
}

/// Applies one entry (`index` is its raft log index). `Err` is the etcd error for the proposer; the
/// transaction then holds no change from this entry. `EtcdError::Internal` means storage failed and the
/// whole batch must abort; `EtcdError::StorageFull` means the batch must abort and be applied again
/// once there is room.
pub(crate) fn apply(
    stores: &Stores,
    txn: &mut RwTxn,
    req: &InternalRaftRequest,
    index: u64,
) -> Result<(Applied, Effects), EtcdError> {
    let who = Requester::from_header(req.header.as_ref());
    if let Some(put) = &req.put {
        mvcc::txn::validate_put(put)?;
        authorize(stores, txn, index, |authz| check_put(authz, stores.leases, txn, &who, put))?;
        refuse_if_capped(stores, txn, req)?;
        write_kv(stores, txn, &[put.lease], |w, leases| {
            // Outside a txn etcd looks the lease up before anything else.
            if put.lease != 0 && !leases.exists(put.lease) {
                return Err(EtcdError::LeaseNotFound);
            }
            kv::check_put(&w.view(), put, leases)?;
            Ok(Applied::Put(kv::put(w, put)?))
        })
    } else if let Some(del) = &req.delete_range {
        authorize(stores, txn, index, |authz| authz.check_delete(&who, "delete", del))?;
        write_kv(stores, txn, &[], |w, _| Ok(Applied::DeleteRange(kv::delete_range(w, del)?)))
    } else if let Some(t) = &req.txn {
        // The op-count limit is each member's own flag, so it stays in the API layer.
        mvcc::txn::validate(t, usize::MAX)?;
        authorize(stores, txn, index, |authz| {
            authz.check_txn(&who, t, &mut |put| check_put(authz, stores.leases, txn, &who, put))
        })?;
        refuse_if_capped(stores, txn, req)?;
        let mut lease_ids = Vec::new();
        txn_leases(&t.success, &mut lease_ids);
        txn_leases(&t.failure, &mut lease_ids);
        write_kv(stores, txn, &lease_ids, |w, leases| Ok(Applied::Txn(mvcc::txn::txn(w, t, leases)?)))
    } else if let Some(compaction) = &req.compaction {
        authorize(stores, txn, index, |authz| authz.check_admin(&who, "compact"))?;
        write_kv(stores, txn, &[], |w, _| {
            w.compact(compaction.revision)?;
            Ok(Applied::Compaction(CompactionResponse { header: kv::header(w.rev()) }))
        })
    } else if let Some(grant) = &req.lease_grant {
        let owner = {
            let authz = Authorizer::new(stores.auth, txn)?.at_index(index);
            authz.check_user(&who, "lease_grant")?;
            holders::owner_of_grant(&authz, &who)
        };
        refuse_if_capped(stores, txn, req)?;
        if stores.leases.get(txn, grant.id)?.is_some() {
            return Err(EtcdError::LeaseExists);
        }
        if grant.ttl > MAX_LEASE_TTL {
            return Err(EtcdError::LeaseTtlTooLarge);
        }
        let ttl = grant.ttl.max(MIN_LEASE_TTL);
        stores.leases.put(txn, grant.id, &LeaseRecord::granted(ttl, owner))?;
        let header = kv::header(stores.kv.view(txn)?.rev);
        let resp = LeaseGrantResponse { header, id: grant.id, ttl, error: String::new() };
        Ok((Applied::LeaseGrant(resp), Effects { granted: vec![(grant.id, ttl)], ..Default::default() }))
    } else if let Some(revoke) = &req.lease_revoke {
        let Some(record) = stores.leases.get(txn, revoke.id)? else {
            return Err(EtcdError::LeaseNotFound);
        };
        let keys = stores.leases.attached_keys(txn, revoke.id)?;
        authorize(stores, txn, index, |authz| {
            authz.check_user(&who, "lease_revoke")?;
            // Revoking deletes every attached key: the requester must be allowed to delete each.
            keys.iter()
                .try_for_each(|k| authz.check(&who, "lease_revoke", Access::Write, &KeyRange::Single(k.clone())))?;
            // And the lease must be one the requester may use (a lease with no keys is its holder's).
            match holders::may_use(authz, stores.leases, txn, &who, revoke.id, &record)? {
                true => Ok(()),
                false => Err(authz.refuse(&who, "lease_revoke")),
            }
        })?;
        let (_, mut effects) = write_kv(stores, txn, &[], |w, _| {
            for key in &keys {
                w.delete_range(&KeyRange::Single(key.clone()))?;
            }
            Ok(Applied::Nothing)
        })?;
        stores.leases.remove(txn, revoke.id)?;
        effects.revoked.push(revoke.id);
        let header = kv::header(stores.kv.view(txn)?.rev);
        Ok((Applied::LeaseRevoke(LeaseRevokeResponse { header }), effects))
    } else if let Some(checkpoint) = &req.lease_checkpoint {
        authorize(stores, txn, index, |authz| authz.check_admin(&who, "lease_checkpoint"))?;
        for cp in &checkpoint.checkpoints {
            if let Some(mut record) = stores.leases.get(txn, cp.id)? {
                record.remaining_ttl = cp.remaining_ttl;
                stores.leases.put(txn, cp.id, &record)?;
            }
        }
        let header = kv::header(stores.kv.view(txn)?.rev);
        Ok((Applied::LeaseCheckpoint(LeaseCheckpointResponse { header }), Effects::default()))
    } else if let Some(alarm) = &req.alarm {
        // Raising or clearing an alarm changes what the whole cluster accepts: root's, with auth on.
        authorize(stores, txn, index, |authz| authz.check_admin(&who, "alarm"))?;
        apply_alarm(stores, txn, alarm)
    } else if let Some(auth) = &req.authenticate {
        authenticate(stores, txn, &who, &auth.name, &auth.simple_token, index)
    } else {
        apply_auth_admin(stores, txn, &who, req, index)
    }
}

/// While a NOSPACE alarm is active, a request that would take space (a put, a txn with a put on either
/// branch, a lease grant) is refused (etcd's `applierV3Capped`).
fn refuse_if_capped(stores: &Stores, txn: &RoTxn, req: &InternalRaftRequest) -> Result<(), EtcdError> {
    if crate::space::cost(req) > 0 && stores.alarms.active(txn, AlarmType::Nospace)? {
        return Err(EtcdError::NoSpace);
    }
    Ok(())
}

/// etcd's `applierV3backend.Alarm`: ACTIVATE records the alarm and answers it (also when it was
/// already set), DEACTIVATE clears it and answers it if it was set, GET lists (`AlarmType::None`:
/// every alarm). The response has no header, as etcd's.
fn apply_alarm(stores: &Stores, txn: &mut RwTxn, req: &AlarmRequest) -> Result<(Applied, Effects), EtcdError> {
    let mut resp = AlarmResponse::default();
    let mut changed = false;
    match AlarmAction::try_from(req.action) {
        Ok(AlarmAction::Get) => resp.alarms = stores.alarms.list(txn, req.alarm)?,
        Ok(AlarmAction::Activate) => {
            let (member, new) = stores.alarms.activate(txn, req.member_id, req.alarm)?;
            if new {
                tracing::warn!(alarm = %crate::space::alarm::go_text(&member), "alarm raised");
            }
            changed = new;
            resp.alarms.push(member);
        }
        Ok(AlarmAction::Deactivate) => {
            if let Some(member) = stores.alarms.deactivate(txn, req.member_id, req.alarm)? {
                tracing::warn!(alarm = %crate::space::alarm::go_text(&member), "alarm disarmed");
                changed = true;
                resp.alarms.push(member);
            }
        }
        Err(_) => return Err(EtcdError::Unsupported(format!("unknown alarm action {}", req.action))),
    }
    Ok((Applied::Alarm(resp), Effects { alarms_changed: changed, ..Default::default() }))
}

/// Runs permission checks against the auth state in `txn`, before anything is written.
fn authorize(
    stores: &Stores,
    txn: &RoTxn,
    index: u64,
    check: impl FnOnce(&Authorizer) -> Result<(), EtcdError>,
) -> Result<(), EtcdError> {
    check(&Authorizer::new(stores.auth, txn)?.at_index(index))
}

/// A put needs write on its key; with `prev_kv` also read; attaching a lease also needs write on every
/// key already attached to that lease, since revoking the lease will delete them all (CVE-2026-44283).
fn check_put(
    authz: &Authorizer,
    leases: &LeaseStore,
    txn: &RoTxn,
    who: &Requester,
    put: &PutRequest,
) -> Result<(), EtcdError> {
    if !authz.enabled() {
        return Ok(());
    }
    let key = KeyRange::Single(put.key.clone());
    authz.check(who, "put", Access::Write, &key)?;
    if put.prev_kv {
        authz.check(who, "put", Access::Read, &key)?;
    }
    if put.lease != 0 {
        for attached in leases.attached_keys(txn, put.lease)? {
            authz.check(who, "put", Access::Write, &KeyRange::Single(attached))?;
        }
        // Attaching a key to a lease uses it: only a lease the requester may use (`lease/holders.rs`),
        // or another user's lease would become the attacher's by the key attached.
        if let Some(record) = leases.get(txn, put.lease)? {
            if !holders::may_use(authz, leases, txn, who, put.lease, &record)? {
                return Err(authz.refuse(who, "put"));
            }
        }
    }
    Ok(())
}

/// Issues a token for a user whose password the API layer checked at the auth revision in the entry's
/// header. If the user's credentials changed since (a password change, the user deleted and added
/// again, or auth disabled), the check is stale and the entry is refused; the API layer checks again.
/// This closes the time-of-check/time-of-use gap. Other auth changes since the check do not matter.
fn authenticate(
    stores: &Stores,
    txn: &RoTxn,
    who: &Requester,
    name: &str,
    simple_token: &str,
    index: u64,
) -> Result<(Applied, Effects), EtcdError> {
    let auth = stores.auth;
    if !auth.enabled(txn)? {
        return Err(EtcdError::AuthNotEnabled);
    }
    let revision = auth.revision(txn)?;
    match who {
        Requester::Client { username, revision: checked_at, .. } if username == name => {
            if !auth.token_valid(txn, name, *checked_at)? {
                return Err(EtcdError::AuthOldRevision);
            }
        }
        _ => return Err(EtcdError::AuthFailed),
    }
    let user = auth.user(txn, name)?.ok_or(EtcdError::AuthFailed)?;
    if user.options.is_some_and(|o| o.no_password) {
        return Err(EtcdError::AuthFailed);
    }
    if let Some(tokens) = stores.simple_tokens {
        // `simple_token` is the digest of the token's prefix (`auth/simple.rs`); the proposer, who
        // alone knows the prefix, makes the token from it and this entry's index.
        tokens.assign(simple_token, index, name, revision);
    }
    // JWT: the API layer signs a token for (name, revision) once this entry is applied.
    Ok((Applied::Authenticated { index, auth_revision: revision }, Effects::default()))
}

/// User and role management: root only when auth is on.
fn apply_auth_admin(
    stores: &Stores,
    txn: &mut RwTxn,
    who: &Requester,
    req: &InternalRaftRequest,
    index: u64,
) -> Result<(Applied, Effects), EtcdError> {
    let auth = stores.auth;
    let op = admin_op_name(req).ok_or_else(|| EtcdError::Unsupported("request not supported by this member".into()))?;
    authorize(stores, txn, index, |authz| authz.check_admin(who, op))?;
    let affected = if req.auth_enable.is_some() {
        auth.enable(txn)?
    } else if req.auth_disable.is_some() {
        let affected = auth.disable(txn)?;
        if let Some(tokens) = stores.simple_tokens {
            tokens.clear();
        }
        affected
    } else if let Some(r) = &req.auth_user_add {
        auth.user_add(txn, &r.name, &r.hashed_password, r.options)?
    } else if let Some(r) = &req.auth_user_delete {
        let affected = auth.user_delete(txn, &r.name)?;
        if let Some(tokens) = stores.simple_tokens {
            tokens.invalidate_user(&r.name);
        }
        affected
    } else if let Some(r) = &req.auth_user_change_password {
        let affected = auth.user_change_password(txn, &r.name, &r.hashed_password)?;
        if let Some(tokens) = stores.simple_tokens {
            tokens.invalidate_user(&r.name);
        }
        affected
    } else if let Some(r) = &req.auth_user_grant_role {
        auth.user_grant_role(txn, &r.user, &r.role)?
    } else if let Some(r) = &req.auth_user_revoke_role {
        auth.user_revoke_role(txn, &r.name, &r.role)?
    } else if let Some(r) = &req.auth_role_add {
        auth.role_add(txn, &r.name)?
    } else if let Some(r) = &req.auth_role_delete {
        auth.role_delete(txn, &r.role)?
    } else if let Some(r) = &req.auth_role_grant_permission {
        let perm = r.perm.clone().ok_or(EtcdError::PermissionNotGranted)?;
        auth.role_grant_permission(txn, &r.name, perm)?
    } else if let Some(r) = &req.auth_role_revoke_permission {
        auth.role_revoke_permission(txn, &r.role, &r.key, &r.range_end)?
    } else {
        unreachable!("admin_op_name matched every request handled above")
    };
    let header = kv::header(stores.kv.view(txn)?.rev);
    Ok((Applied::AuthChanged { header }, Effects { auth: Some(affected), ..Default::default() }))
}

fn admin_op_name(req: &InternalRaftRequest) -> Option<&'static str> {
    Some(if req.auth_enable.is_some() {
        "auth_enable"
    } else if req.auth_disable.is_some() {
        "auth_disable"
    } else if req.auth_user_add.is_some() {
        "user_add"
    } else if req.auth_user_delete.is_some() {
        "user_delete"
    } else if req.auth_user_change_password.is_some() {
        "user_change_password"
    } else if req.auth_user_grant_role.is_some() {
        "user_grant_role"
    } else if req.auth_user_revoke_role.is_some() {
        "user_revoke_role"
    } else if req.auth_role_add.is_some() {
        "role_add"
    } else if req.auth_role_delete.is_some() {
        "role_delete"
    } else if req.auth_role_grant_permission.is_some() {
        "role_grant_permission"
    } else if req.auth_role_revoke_permission.is_some() {
        "role_revoke_permission"
    } else {
        return None;
    })
}

/// The leases named by puts anywhere in a transaction.
fn txn_leases(ops: &[RequestOp], out: &mut Vec<i64>) {
    for op in ops {
        match &op.request {
            Some(Request::RequestPut(p)) if p.lease != 0 => out.push(p.lease),
            Some(Request::RequestTxn(t)) => {
                txn_leases(&t.success, out);
                txn_leases(&t.failure, out);
            }
            _ => {}
        }
    }
}

/// Leases known to exist, looked up before the kv write transaction begins.
struct KnownLeases(HashSet<i64>);

impl Leases for KnownLeases {
    fn exists(&self, id: i64) -> bool {
        self.0.contains(&id)
    }
}

/// Runs a kv change at one new revision, then keeps lease attachments in step with what it changed.
fn write_kv(
    stores: &Stores,
    txn: &mut RwTxn,
    lease_ids: &[i64],
    op: impl FnOnce(&mut WriteTxn, &dyn Leases) -> Result<Applied, EtcdError>,
) -> Result<(Applied, Effects), EtcdError> {
    let mut known = HashSet::new();
    for &id in lease_ids.iter().filter(|&&id| id != 0) {
        if stores.leases.get(txn, id)?.is_some() {
            known.insert(id);
        }
    }
    let mut w = stores.kv.begin(txn)?;
    let applied = op(&mut w, &KnownLeases(known))?;
    let (_, events) = w.finish()?;
    for event in &events {
        let before = event.prev_kv.as_ref().map_or(0, |p| p.lease);
        let after = match (EventType::try_from(event.r#type), &event.kv) {
            (Ok(EventType::Put), Some(kv)) => kv.lease,
            _ => 0,
        };
        if before != after {
            let key = event.kv.as_ref().map_or(&[][..], |kv| &kv.key[..]);
            if before != 0 {
                stores.leases.detach(txn, before, key)?;
            }
            if after != 0 {
                stores.leases.attach(txn, after, key)?;
            }
        }
    }
    Ok((applied, Effects { events, ..Default::default() }))
}
