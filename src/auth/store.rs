//! The replicated auth state in the kv environment, changed only by applied raft entries:
//! - `auth_users`: name → `authpb::User` (bcrypt hash or no password, sorted role names)
//! - `auth_roles`: name → `authpb::Role` (key permissions, sorted by key)
//!
//! Both are [`Table`]s: etcd takes names of any length, LMDB keys stop at 511 bytes.
//! - `auth_meta`:  whether auth is enabled, the auth revision, and the revision of the last disable
//!
//! Every mutation that changes who may do what bumps the auth revision, exactly where etcd's does.
//! A token is tied to its user's own record, not to the revision: it is refused ("revision of auth
//! store is old") once it predates its user's `credentials_revision` (the user was added again or
//! its password changed) or the last auth disable (`token_valid`). Any other change leaves it valid;
//! permissions are always those in force where the request is checked.

use heed::{RoTxn, RwTxn};
use prost::Message;

use super::cache::{Affected, PermissionCache};
use crate::error::EtcdError;
use crate::proto::authpb::{Permission, Role, User, UserAddOptions};
use crate::storage::table::{LongKeys, Table};
use crate::storage::Db;

pub(crate) const ROOT_USER: &str = "root";
pub(crate) const ROOT_ROLE: &str = "root";

const ENABLED: &[u8] = b"enabled";
const REVISION: &[u8] = b"revision";
/// The auth revision of the last disable: every token issued before it is void.
const DISABLED_AT: &[u8] = b"disabled_at";

pub(crate) struct AuthStore {
    users: Table,
    roles: Table,
    meta: Db,
    pub cache: PermissionCache,
    /// Where the checks record their decisions (`--audit-log`), once the member has opened it.
    pub audit: std::sync::OnceLock<std::sync::Arc<crate::auth::audit::AuditLog>>,
}

fn corrupt() -> EtcdError {
    tracing::error!("corrupt auth record");
    EtcdError::Internal
}

impl AuthStore {
    pub(crate) const TABLES: [&'static str; 3] = ["auth_users", "auth_roles", "auth_meta"];

    pub(crate) fn new([users, roles, meta]: [Db; 3], long: LongKeys) -> Self {
        AuthStore {
            users: Table::new(users, long),
            roles: Table::new(roles, long),
            meta,
            cache: PermissionCache::default(),
            audit: std::sync::OnceLock::new(),
        }
    }

    pub(crate) fn tables(&self) -> [Db; 3] {
        [self.users.main_db(), self.roles.main_db(), self.meta]
    }

    pub(crate) fn enabled(&self, txn: &RoTxn) -> Result<bool, EtcdError> {
        Ok(self.meta.get(txn, ENABLED)? == Some(&[1][..]))
    }

    /// The auth revision; a fresh store is at 1, as etcd's.
    pub(crate) fn revision(&self, txn: &RoTxn) -> Result<u64, EtcdError> {
        match self.meta.get(txn, REVISION)? {
            None => Ok(1),
            Some(bytes) => Ok(u64::from_be_bytes(bytes.try_into().map_err(|_| corrupt())?)),
        }
    }

    /// Tokens issued before this auth revision are void, whoever they belong to (0: none yet).
    pub(crate) fn tokens_valid_from(&self, txn: &RoTxn) -> Result<u64, EtcdError> {
        match self.meta.get(txn, DISABLED_AT)? {
            None => Ok(0),
            Some(bytes) => Ok(u64::from_be_bytes(bytes.try_into().map_err(|_| corrupt())?)),
        }
    }

    /// Whether a token of `name` issued at auth revision `issued` still stands: the user exists,
    /// its credentials are the ones the token was issued for, and auth was not disabled since.
    pub(crate) fn token_valid(&self, txn: &RoTxn, name: &str, issued: u64) -> Result<bool, EtcdError> {
        let Some(user) = self.user(txn, name)? else { return Ok(false) };
        Ok(issued >= user.credentials_revision && issued >= self.tokens_valid_from(txn)?)
    }

    pub(crate) fn user(&self, txn: &RoTxn, name: &str) -> Result<Option<User>, EtcdError> {
        self.users.get(txn, name.as_bytes())?.map(|b| User::decode(b).map_err(|_| corrupt())).transpose()
    }

    pub(crate) fn role(&self, txn: &RoTxn, name: &str) -> Result<Option<Role>, EtcdError> {
        self.roles.get(txn, name.as_bytes())?.map(|b| Role::decode(b).map_err(|_| corrupt())).transpose()
    }

    /// All user names in byte order (etcd lists them sorted).
    pub(crate) fn user_names(&self, txn: &RoTxn) -> Result<Vec<String>, EtcdError> {
        let mut out = Vec::new();
        for item in self.users.iter(txn)? {
            let (name, _) = item?;
            out.push(String::from_utf8_lossy(&name).into_owned());
        }
        Ok(out)
    }

    pub(crate) fn role_names(&self, txn: &RoTxn) -> Result<Vec<String>, EtcdError> {
        let mut out = Vec::new();
        for item in self.roles.iter(txn)? {
            let (name, _) = item?;
            out.push(String::from_utf8_lossy(&name).into_owned());
        }
        Ok(out)
    }

    fn users_with_role(&self, txn: &RoTxn, role: &str) -> Result<Vec<User>, EtcdError> {
        let mut out = Vec::new();
        for item in self.users.iter(txn)? {
            let (_, bytes) = item?;
            let user = User::decode(bytes).map_err(|_| corrupt())?;
            if user.roles.iter().any(|r| r == role) {
                out.push(user);
            }
        }
        Ok(out)
    }

    fn put_user(&self, txn: &mut RwTxn, user: &User) -> Result<(), EtcdError> {
        Ok(self.users.put(txn, &user.name, &user.encode_to_vec())?)
    }

    fn put_role(&self, txn: &mut RwTxn, role: &Role) -> Result<(), EtcdError> {
        Ok(self.roles.put(txn, &role.name, &role.encode_to_vec())?)
    }

    /// Bumps the auth revision and moves still-valid cache entries forward to it.
    fn commit_revision(&self, txn: &mut RwTxn, affected: Affected) -> Result<Affected, EtcdError> {
        let old = self.revision(txn)?;
        self.meta.put(txn, REVISION, &(old + 1).to_be_bytes())?;
        self.cache.advance(old, old + 1, &affected);
        Ok(affected)
    }

    pub(crate) fn enable(&self, txn: &mut RwTxn) -> Result<Affected, EtcdError> {
        if self.enabled(txn)? {
            return Ok(Affected::Nobody);
        }
        let root = self.user(txn, ROOT_USER)?.ok_or(EtcdError::RootUserNotExist)?;
        if !root.roles.iter().any(|r| r == ROOT_ROLE) {
            return Err(EtcdError::RootRoleNotExist);
        }
        self.meta.put(txn, ENABLED, &[1])?;
        // etcd does not bump the revision here: nothing about who may do what changed.
        Ok(Affected::Everyone)
    }

    pub(crate) fn disable(&self, txn: &mut RwTxn) -> Result<Affected, EtcdError> {
        if !self.enabled(txn)? {
            return Ok(Affected::Nobody);
        }
        self.meta.put(txn, ENABLED, &[0])?;
        let affected = self.commit_revision(txn, Affected::Everyone)?;
        self.meta.put(txn, DISABLED_AT, &self.revision(txn)?.to_be_bytes())?;
        Ok(affected)
    }

    pub(crate) fn user_add(
        &self,
        txn: &mut RwTxn,
        name: &str,
        hashed_password: &str,
        options: Option<UserAddOptions>,
    ) -> Result<Affected, EtcdError> {
        if name.is_empty() {
            return Err(EtcdError::UserEmpty);
        }
        if self.user(txn, name)?.is_some() {
            return Err(EtcdError::UserAlreadyExist);
        }
        let options = options.unwrap_or_default();
        let password = if options.no_password { Vec::new() } else { hashed_password.as_bytes().to_vec() };
        let user = User {
            name: name.as_bytes().to_vec(),
            password,
            roles: Vec::new(),
            options: Some(options),
            credentials_revision: self.revision(txn)? + 1,
        };
        self.put_user(txn, &user)?;
        self.commit_revision(txn, Affected::Users(vec![name.to_string()]))
    }

    pub(crate) fn user_delete(&self, txn: &mut RwTxn, name: &str) -> Result<Affected, EtcdError> {
        if self.enabled(txn)? && name == ROOT_USER {
            return Err(EtcdError::InvalidAuthMgmt);
        }
        if self.user(txn, name)?.is_none() {
            return Err(EtcdError::UserNotFound);
        }
        self.users.delete(txn, name.as_bytes())?;
        self.commit_revision(txn, Affected::Users(vec![name.to_string()]))
    }

    pub(crate) fn user_change_password(
        &self,
        txn: &mut RwTxn,
        name: &str,
        hashed_password: &str,
    ) -> Result<Affected, EtcdError> {
        let mut user = self.user(txn, name)?.ok_or(EtcdError::UserNotFound)?;
        user.password = hashed_password.as_bytes().to_vec();
        user.credentials_revision = self.revision(txn)? + 1;
        self.put_user(txn, &user)?;
        self.commit_revision(txn, Affected::Users(vec![name.to_string()]))
    }

    pub(crate) fn user_grant_role(&self, txn: &mut RwTxn, name: &str, role: &str) -> Result<Affected, EtcdError> {
        let mut user = self.user(txn, name)?.ok_or(EtcdError::UserNotFound)?;
        // The root role need not exist as a record: granting it makes a user root.
        if role != ROOT_ROLE && self.role(txn, role)?.is_none() {
            return Err(EtcdError::RoleNotFound);
        }
        match user.roles.binary_search_by(|r| r.as_str().cmp(role)) {
            Ok(_) => Ok(Affected::Nobody),
            Err(at) => {
                user.roles.insert(at, role.to_string());
                self.put_user(txn, &user)?;
                self.commit_revision(txn, Affected::Users(vec![name.to_string()]))
            }
        }
    }

    pub(crate) fn user_revoke_role(&self, txn: &mut RwTxn, name: &str, role: &str) -> Result<Affected, EtcdError> {
        if self.enabled(txn)? && name == ROOT_USER && role == ROOT_ROLE {
            return Err(EtcdError::InvalidAuthMgmt);
        }
        let mut user = self.user(txn, name)?.ok_or(EtcdError::UserNotFound)?;
        let before = user.roles.len();
        user.roles.retain(|r| r != role);
        if user.roles.len() == before {
            return Err(EtcdError::RoleNotGranted);
        }
        self.put_user(txn, &user)?;
        self.commit_revision(txn, Affected::Users(vec![name.to_string()]))
    }

    pub(crate) fn role_add(&self, txn: &mut RwTxn, name: &str) -> Result<Affected, EtcdError> {
        if name.is_empty() {
            return Err(EtcdError::RoleEmpty);
        }
        if self.role(txn, name)?.is_some() {
            return Err(EtcdError::RoleAlreadyExist);
        }
        self.put_role(txn, &Role { name: name.as_bytes().to_vec(), key_permission: Vec::new() })?;
        // A new role has no permissions and no users yet.
        self.commit_revision(txn, Affected::Nobody)
    }

    pub(crate) fn role_delete(&self, txn: &mut RwTxn, name: &str) -> Result<Affected, EtcdError> {
        if self.enabled(txn)? && name == ROOT_ROLE {
            return Err(EtcdError::InvalidAuthMgmt);
        }
        if self.role(txn, name)?.is_none() {
            return Err(EtcdError::RoleNotFound);
        }
        self.roles.delete(txn, name.as_bytes())?;
        let mut affected = Vec::new();
        for mut user in self.users_with_role(txn, name)? {
            user.roles.retain(|r| r != name);
            self.put_user(txn, &user)?;
            affected.push(String::from_utf8_lossy(&user.name).into_owned());
        }
        self.commit_revision(txn, Affected::Users(affected))
    }

    pub(crate) fn role_grant_permission(
        &self,
        txn: &mut RwTxn,
        name: &str,
        perm: Permission,
    ) -> Result<Affected, EtcdError> {
        let mut role = self.role(txn, name)?.ok_or(EtcdError::RoleNotFound)?;
        match role.key_permission.iter_mut().find(|p| p.key == perm.key && p.range_end == perm.range_end) {
            Some(existing) => existing.perm_type = perm.perm_type,
            None => {
                role.key_permission.push(perm);
                role.key_permission.sort_by(|a, b| a.key.cmp(&b.key));
            }
        }
        self.put_role(txn, &role)?;
        let users = self.users_with_role(txn, name)?;
        self.commit_revision(
            txn,
            Affected::Users(users.iter().map(|u| String::from_utf8_lossy(&u.name).into_owned()).collect()),
        )
    }

    pub(crate) fn role_revoke_permission(
        &self,
        txn: &mut RwTxn,
        name: &str,
        key: &[u8],
        range_end: &[u8],
    ) -> Result<Affected, EtcdError> {
        let mut role = self.role(txn, name)?.ok_or(EtcdError::RoleNotFound)?;
        let before = role.key_permission.len();
        role.key_permission.retain(|p| p.key != key || p.range_end != range_end);
        if role.key_permission.len() == before {
            return Err(EtcdError::PermissionNotGranted);
        }
        self.put_role(txn, &role)?;
        let users = self.users_with_role(txn, name)?;
        self.commit_revision(
            txn,
            Affected::Users(users.iter().map(|u| String::from_utf8_lossy(&u.name).into_owned()).collect()),
        )
    }
}

/// Writing another store's auth state as it stands (`keyward migrate`): no mutation semantics, no
/// revision bumps, so the records, the enabled flag and the revision are exactly the source's.
impl AuthStore {
    pub(crate) fn import_user(&self, txn: &mut RwTxn, user: &User) -> Result<(), EtcdError> {
        self.put_user(txn, user)
    }

    pub(crate) fn import_role(&self, txn: &mut RwTxn, role: &Role) -> Result<(), EtcdError> {
        self.put_role(txn, role)
    }

    pub(crate) fn import_state(&self, txn: &mut RwTxn, enabled: bool, revision: u64) -> Result<(), EtcdError> {
        self.meta.put(txn, ENABLED, &[u8::from(enabled)])?;
        self.meta.put(txn, REVISION, &revision.to_be_bytes())?;
        Ok(())
    }
}

/// Whether the user holds the root role (which may do everything).
pub(crate) fn is_root(user: &User) -> bool {
    user.roles.iter().any(|r| r == ROOT_ROLE)
}
