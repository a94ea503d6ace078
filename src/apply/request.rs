//! What a committed entry asks for, decoded once: `Kind` is the one request an entry's
//! `InternalRaftRequest` carries, and `Kind::name` the operation name its permission checks and audit
//! lines use.

use crate::proto::etcdserverpb::{
    AlarmRequest, AuthRoleAddRequest, AuthRoleDeleteRequest, AuthRoleGrantPermissionRequest,
    AuthRoleRevokePermissionRequest, AuthUserAddRequest, AuthUserChangePasswordRequest, AuthUserDeleteRequest,
    AuthUserGrantRoleRequest, AuthUserRevokeRoleRequest, CompactionRequest, DeleteRangeRequest,
    InternalAuthenticateRequest, InternalRaftRequest, LeaseCheckpointRequest, LeaseGrantRequest, LeaseRevokeRequest,
    PutRequest, TxnRequest,
};

/// One request of an entry, borrowed from it.
#[derive(Clone, Copy, Debug)]
pub(super) enum Kind<'r> {
    Put(&'r PutRequest),
    DeleteRange(&'r DeleteRangeRequest),
    Txn(&'r TxnRequest),
    Compaction(&'r CompactionRequest),
    LeaseGrant(&'r LeaseGrantRequest),
    LeaseRevoke(&'r LeaseRevokeRequest),
    LeaseCheckpoint(&'r LeaseCheckpointRequest),
    Alarm(&'r AlarmRequest),
    Authenticate(&'r InternalAuthenticateRequest),
    /// User, role and auth-config management.
    AuthChange(AuthChange<'r>),
}

impl<'r> Kind<'r> {
    /// The request `req` carries, or `None` for one this member does not apply. An entry carries one;
    /// should it carry several, the first in this order is the one applied.
    pub(super) fn of(req: &'r InternalRaftRequest) -> Option<Kind<'r>> {
        req.put
            .as_deref()
            .map(Kind::Put)
            .or_else(|| req.delete_range.as_deref().map(Kind::DeleteRange))
            .or_else(|| req.txn.as_deref().map(Kind::Txn))
            .or_else(|| req.compaction.as_deref().map(Kind::Compaction))
            .or_else(|| req.lease_grant.as_deref().map(Kind::LeaseGrant))
            .or_else(|| req.lease_revoke.as_deref().map(Kind::LeaseRevoke))
            .or_else(|| req.lease_checkpoint.as_deref().map(Kind::LeaseCheckpoint))
            .or_else(|| req.alarm.as_deref().map(Kind::Alarm))
            .or_else(|| req.authenticate.as_deref().map(Kind::Authenticate))
            .or_else(|| AuthChange::of(req).map(Kind::AuthChange))
    }

    /// The operation's name in the permission checks' log and audit lines (`auth/audit.rs`). A put
    /// inside a txn is checked, and named, as a put.
    pub(super) fn name(&self) -> &'static str {
        match self {
            Kind::Put(_) => "put",
            Kind::DeleteRange(_) => "delete",
            Kind::Txn(_) => "txn",
            Kind::Compaction(_) => "compact",
            Kind::LeaseGrant(_) => "lease_grant",
            Kind::LeaseRevoke(_) => "lease_revoke",
            Kind::LeaseCheckpoint(_) => "lease_checkpoint",
            Kind::Alarm(_) => "alarm",
            Kind::Authenticate(_) => "authenticate",
            Kind::AuthChange(change) => change.name(),
        }
    }
}

/// A user, role or auth-config change: root's, with auth on.
#[derive(Clone, Copy, Debug)]
pub(super) enum AuthChange<'r> {
    AuthEnable,
    AuthDisable,
    UserAdd(&'r AuthUserAddRequest),
    UserDelete(&'r AuthUserDeleteRequest),
    UserChangePassword(&'r AuthUserChangePasswordRequest),
    UserGrantRole(&'r AuthUserGrantRoleRequest),
    UserRevokeRole(&'r AuthUserRevokeRoleRequest),
    RoleAdd(&'r AuthRoleAddRequest),
    RoleDelete(&'r AuthRoleDeleteRequest),
    RoleGrantPermission(&'r AuthRoleGrantPermissionRequest),
    RoleRevokePermission(&'r AuthRoleRevokePermissionRequest),
}

impl<'r> AuthChange<'r> {
    /// The change `req` carries, first in this order.
    fn of(req: &'r InternalRaftRequest) -> Option<AuthChange<'r>> {
        req.auth_enable
            .as_ref()
            .map(|_| Self::AuthEnable)
            .or_else(|| req.auth_disable.as_ref().map(|_| Self::AuthDisable))
            .or_else(|| req.auth_user_add.as_deref().map(Self::UserAdd))
            .or_else(|| req.auth_user_delete.as_deref().map(Self::UserDelete))
            .or_else(|| req.auth_user_change_password.as_deref().map(Self::UserChangePassword))
            .or_else(|| req.auth_user_grant_role.as_deref().map(Self::UserGrantRole))
            .or_else(|| req.auth_user_revoke_role.as_deref().map(Self::UserRevokeRole))
            .or_else(|| req.auth_role_add.as_deref().map(Self::RoleAdd))
            .or_else(|| req.auth_role_delete.as_deref().map(Self::RoleDelete))
            .or_else(|| req.auth_role_grant_permission.as_deref().map(Self::RoleGrantPermission))
            .or_else(|| req.auth_role_revoke_permission.as_deref().map(Self::RoleRevokePermission))
    }

    /// The change's name in the root check's log and audit lines.
    pub(super) fn name(&self) -> &'static str {
        match self {
            AuthChange::AuthEnable => "auth_enable",
            AuthChange::AuthDisable => "auth_disable",
            AuthChange::UserAdd(_) => "user_add",
            AuthChange::UserDelete(_) => "user_delete",
            AuthChange::UserChangePassword(_) => "user_change_password",
            AuthChange::UserGrantRole(_) => "user_grant_role",
            AuthChange::UserRevokeRole(_) => "user_revoke_role",
            AuthChange::RoleAdd(_) => "role_add",
            AuthChange::RoleDelete(_) => "role_delete",
            AuthChange::RoleGrantPermission(_) => "role_grant_permission",
            AuthChange::RoleRevokePermission(_) => "role_revoke_permission",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each request field decodes to its kind, named as the checks' log and audit lines name it.
    #[test]
    fn each_request_has_its_kind_and_op_name() {
        let d = InternalRaftRequest::default;
        let cases = [
            (InternalRaftRequest { put: Some(Default::default()), ..d() }, "put"),
            (InternalRaftRequest { delete_range: Some(Default::default()), ..d() }, "delete"),
            (InternalRaftRequest { txn: Some(Default::default()), ..d() }, "txn"),
            (InternalRaftRequest { compaction: Some(Default::default()), ..d() }, "compact"),
            (InternalRaftRequest { lease_grant: Some(Default::default()), ..d() }, "lease_grant"),
            (InternalRaftRequest { lease_revoke: Some(Default::default()), ..d() }, "lease_revoke"),
            (InternalRaftRequest { lease_checkpoint: Some(Default::default()), ..d() }, "lease_checkpoint"),
            (InternalRaftRequest { alarm: Some(Default::default()), ..d() }, "alarm"),
            (InternalRaftRequest { authenticate: Some(Default::default()), ..d() }, "authenticate"),
            (InternalRaftRequest { auth_enable: Some(Default::default()), ..d() }, "auth_enable"),
            (InternalRaftRequest { auth_disable: Some(Default::default()), ..d() }, "auth_disable"),
            (InternalRaftRequest { auth_user_add: Some(Default::default()), ..d() }, "user_add"),
            (InternalRaftRequest { auth_user_delete: Some(Default::default()), ..d() }, "user_delete"),
            (
                InternalRaftRequest { auth_user_change_password: Some(Default::default()), ..d() },
                "user_change_password",
            ),
            (InternalRaftRequest { auth_user_grant_role: Some(Default::default()), ..d() }, "user_grant_role"),
            (InternalRaftRequest { auth_user_revoke_role: Some(Default::default()), ..d() }, "user_revoke_role"),
            (InternalRaftRequest { auth_role_add: Some(Default::default()), ..d() }, "role_add"),
            (InternalRaftRequest { auth_role_delete: Some(Default::default()), ..d() }, "role_delete"),
            (
                InternalRaftRequest { auth_role_grant_permission: Some(Default::default()), ..d() },
                "role_grant_permission",
            ),
            (
                InternalRaftRequest { auth_role_revoke_permission: Some(Default::default()), ..d() },
                "role_revoke_permission",
            ),
        ];
        for (req, name) in &cases {
            assert_eq!(Kind::of(req).map(|k| k.name()), Some(*name), "{req:?}");
        }
    }

    /// Requests this member does not apply (reads, auth status and listings) have no kind; of several
    /// requests in one entry, the first in `Kind::of`'s order is applied.
    #[test]
    fn unknown_requests_have_no_kind_and_the_first_of_several_wins() {
        let d = InternalRaftRequest::default;
        assert!(Kind::of(&d()).is_none());
        assert!(Kind::of(&InternalRaftRequest { range: Some(Default::default()), ..d() }).is_none());
        assert!(Kind::of(&InternalRaftRequest { auth_user_list: Some(Default::default()), ..d() }).is_none());
        let put_and_enable =
            InternalRaftRequest { put: Some(Default::default()), auth_enable: Some(Default::default()), ..d() };
        assert!(matches!(Kind::of(&put_and_enable), Some(Kind::Put(_))));
        let enable_and_add = InternalRaftRequest {
            auth_enable: Some(Default::default()),
            auth_user_add: Some(Default::default()),
            ..d()
        };
        assert!(matches!(Kind::of(&enable_and_add), Some(Kind::AuthChange(AuthChange::AuthEnable))));
    }
}
