//! The Auth service: etcd's 17 auth RPCs.
//!
//! Changes (enable/disable, users, roles, grants) are raft entries: apply checks that the requester is
//! root and bumps the auth revision. Reads (status, get, list) are linearizable reads with the same
//! checks against the current auth state. Passwords are hashed here, on the blocking pool, before
//! anything is proposed: no plaintext password enters the raft log, a snapshot, or a log line.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::requester::requester;
use crate::apply::Applied;
use crate::auth::password;
use crate::auth::simple::SimpleTokens;
use crate::auth::tokens::Tokens;
use crate::error::EtcdError;
use crate::identity::{Credential, Origin, Requester};
use crate::logging::limit::LogLimit;
use crate::logging::text::Quoted;
use crate::node::Node;
use crate::proto::etcdserverpb::auth_server::Auth;
use crate::proto::etcdserverpb::*;

/// How many times Authenticate re-checks a password whose auth revision moved meanwhile.
const AUTHENTICATE_ATTEMPTS: usize = 8;

pub(crate) struct AuthService {
    node: Arc<Node>,
}

impl AuthService {
    pub(crate) fn new(node: Arc<Node>) -> Self {
        AuthService { node }
    }

    /// Proposes an auth change and returns the filled response header.
    async fn change(&self, who: &Requester, req: InternalRaftRequest) -> Result<Option<ResponseHeader>, Status> {
        match self.node.propose(req, who).await? {
            Applied::AuthChanged { header } => Ok(header),
            other => Err(other.mismatch().into()),
        }
    }

    /// A linearizable read of auth state, returning the result and a filled header.
    async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(
                &crate::auth::check::Authorizer,
                &crate::auth::store::AuthStore,
                &heed::RoTxn,
            ) -> Result<T, EtcdError>
            + Send
            + 'static,
    ) -> Result<(T, Option<ResponseHeader>), Status> {
        let (value, revision) = self
            .node
            .read_state_linearizable(move |state, txn| {
                let authz = crate::auth::check::Authorizer::new(&state.auth, txn)?;
                Ok((read(&authz, &state.auth, txn)?, state.kv.view(txn)?.rev))
            })
            .await?;
        Ok((value, self.node.header(revision)))
    }

    /// Checks the password here (bcrypt, in parallel, off the apply path) at the auth revision it
    /// read, then proposes the token issue with that revision (see `authenticate`).
    async fn check_password_and_issue(
        &self,
        req: &AuthenticateRequest,
        origin: Origin,
    ) -> Result<AuthenticateResponse, EtcdError> {
        for _ in 0..AUTHENTICATE_ATTEMPTS {
            let name = req.name.clone();
            let (found, _) = self
                .read(move |authz, auth, txn| {
                    if !authz.enabled() {
                        return Err(EtcdError::AuthNotEnabled);
                    }
                    let user = auth.user(txn, &name)?;
                    Ok(user.map(|u| (u, authz.revision())))
                })
                .await?;
            let Some((user, checked_at)) = found else {
                // As long as a wrong password takes: the timing must not tell which names exist.
                password::verify_nobody(req.password.clone(), self.node.auth.bcrypt_cost).await?;
                log_failed_login(&req.name, "no such user");
                return Err(EtcdError::AuthFailed);
            };
            if user.options.is_some_and(|o| o.no_password) {
                log_failed_login(&req.name, "the user has no password (certificate only)");
                return Err(EtcdError::NoPasswordUser);
            }
            let verified = &self.node.auth.verified_passwords;
            if verified.contains(&req.name, &user.password, &req.password) {
                crate::metrics::PASSWORD_CHECKS.with_label_values(&["cached"]).inc();
            } else if password::verify(req.password.clone(), user.password.clone()).await? {
                verified.insert(&req.name, &user.password, &req.password);
            } else {
                log_failed_login(&req.name, "wrong password");
                return Err(EtcdError::AuthFailed);
            }
            // The token's secret part stays here: the entry carries only its digest.
            let prefix = SimpleTokens::prefix();
            let issue = InternalAuthenticateRequest {
                name: req.name.clone(),
                simple_token: SimpleTokens::digest(&prefix),
                // Never filled: the password was checked above and must not enter the log.
                password: String::new(),
            };
            let who = Requester::client(req.name.clone(), checked_at).with_origin(origin);
            match self.node.propose(internal(|r| r.authenticate = Some(Box::new(issue))), &who).await {
                Ok(Applied::Authenticated { index, auth_revision }) => {
                    let token = match self.node.tokens.as_ref() {
                        Tokens::Simple(_) => SimpleTokens::token(&prefix, index),
                        Tokens::Jwt(jwt) => jwt.sign(&req.name, auth_revision)?,
                    };
                    let header = self.node.header(self.node.revision());
                    return Ok(AuthenticateResponse { header, token });
                }
                Ok(other) => return Err(other.mismatch()),
                Err(EtcdError::AuthOldRevision) => {
                    tracing::info!(user = %Quoted::str(&req.name), "auth state changed while checking the password; checking again");
                }
                Err(e) => return Err(e),
            }
        }
        Err(EtcdError::Timeout)
    }
}

/// Any client can cause failed logins: at most 5 lines per user name per 10 s (the audit log and
/// `keyward_auth_password_checks_total` have them all).
fn log_failed_login(user: &str, why: &str) {
    static LIMIT: LogLimit = LogLimit::new(5, std::time::Duration::from_secs(10));
    if let Some(suppressed) = LIMIT.admit(user) {
        tracing::info!(user = %Quoted::str(user), why, suppressed_before = suppressed, "authentication failed");
    }
}

fn internal<T>(build: impl FnOnce(&mut InternalRaftRequest) -> T) -> InternalRaftRequest {
    let mut req = InternalRaftRequest::default();
    build(&mut req);
    req
}

#[tonic::async_trait]
impl Auth for AuthService {
    async fn auth_enable(&self, request: Request<AuthEnableRequest>) -> Result<Response<AuthEnableResponse>, Status> {
        let who = requester(&self.node, &request)?;
        let header = self.change(&who, internal(|r| r.auth_enable = Some(Box::new(AuthEnableRequest {})))).await?;
        Ok(Response::new(AuthEnableResponse { header }))
    }

    async fn auth_disable(
        &self,
        request: Request<AuthDisableRequest>,
    ) -> Result<Response<AuthDisableResponse>, Status> {
        let who = requester(&self.node, &request)?;
        let header = self.change(&who, internal(|r| r.auth_disable = Some(Box::new(AuthDisableRequest {})))).await?;
        Ok(Response::new(AuthDisableResponse { header }))
    }

    async fn auth_status(&self, _request: Request<AuthStatusRequest>) -> Result<Response<AuthStatusResponse>, Status> {
        let ((enabled, auth_revision), header) =
            self.read(|authz, _, _| Ok((authz.enabled(), authz.revision()))).await?;
        Ok(Response::new(AuthStatusResponse { header, enabled, auth_revision }))
    }

    /// Login: throttled by earlier attempts from the same source (`auth/throttle.rs`; the leader's
    /// table, `node/login_throttle.rs`), then `check_password_and_issue`. Apply refuses the token
    /// issue if the user's credentials changed since the check, and the check runs again: a token is
    /// never issued for a password that was no longer current when the token was ordered in the log.
    async fn authenticate(
        &self,
        request: Request<AuthenticateRequest>,
    ) -> Result<Response<AuthenticateResponse>, Status> {
        let client = super::requester::client(&self.node, &request);
        let source = super::requester::login_source(&self.node, &request);
        let req = request.into_inner();
        // Waits for its turn here; a client that gives up meanwhile drops this call, and its place
        // with it: nothing is checked for it.
        let attempt = self.node.login_attempt(&req.name, &source).await.inspect_err(|e| {
            if *e == EtcdError::TooManyRequests {
                crate::metrics::LOGINS_THROTTLED.with_label_values(&["refused"]).inc();
                tracing::info!(user = %Quoted::str(&req.name), source = ?source, "authentication refused: too many failed logins");
            }
        })?;
        if attempt.waited() {
            crate::metrics::LOGINS_THROTTLED.with_label_values(&["delayed"]).inc();
        }
        let origin = Origin { client, credential: Credential::Password };
        let outcome = self.check_password_and_issue(&req, origin).await;
        self.node.audit_login(&req.name, origin, &outcome);
        match &outcome {
            Ok(_) => attempt.succeeded(),
            Err(EtcdError::AuthFailed | EtcdError::NoPasswordUser) => attempt.failed(),
            // No password was found wrong (none was checked, or the token's proposal failed after a
            // right one).
            Err(_) => attempt.withdrawn(),
        }
        Ok(Response::new(outcome?))
    }

    async fn user_add(&self, request: Request<AuthUserAddRequest>) -> Result<Response<AuthUserAddResponse>, Status> {
        let who = requester(&self.node, &request)?;
        let mut req = request.into_inner();
        if req.name.is_empty() {
            return Err(EtcdError::UserEmpty.into());
        }
        let no_password = req.options.is_some_and(|o| o.no_password);
        let plaintext = std::mem::take(&mut req.password);
        if !no_password {
            req.hashed_password = password::hash(plaintext, self.node.auth.bcrypt_cost).await?;
        }
        let header = self.change(&who, internal(|r| r.auth_user_add = Some(Box::new(req)))).await?;
        Ok(Response::new(AuthUserAddResponse { header }))
    }

    async fn user_get(&self, request: Request<AuthUserGetRequest>) -> Result<Response<AuthUserGetResponse>, Status> {
        let who = requester(&self.node, &request)?;
        let name = request.into_inner().name;
        let (roles, header) = self
            .read(move |authz, auth, txn| {
                // Users may read their own record; anything else is root's.
                if !authz.is_user(&who, &name)? {
                    authz.check_admin(&who, "user_get")?;
                }
                Ok(auth.user(txn, &name)?.ok_or(EtcdError::UserNotFound)?.roles)
            })
            .await?;
        Ok(Response::new(AuthUserGetResponse { header, roles }))
    }

    async fn user_list(&self, request: Request<AuthUserListRequest>) -> Result<Response<AuthUserListResponse>, Status> {
        let who = requester(&self.node, &request)?;
        let (users, header) = self
            .read(move |authz, auth, txn| {
                authz.check_admin(&who, "user_list")?;
                auth.user_names(txn)
            })
            .await?;
        Ok(Response::new(AuthUserListResponse { header, users }))
    }

    async fn user_delete(
        &self,
        request: Request<AuthUserDeleteRequest>,
    ) -> Result<Response<AuthUserDeleteResponse>, Status> {
        let who = requester(&self.node, &request)?;
        let req = request.into_inner();
        let header = self.change(&who, internal(|r| r.auth_user_delete = Some(Box::new(req)))).await?;
        Ok(Response::new(AuthUserDeleteResponse { header }))
    }

    async fn user_change_password(
        &self,
        request: Request<AuthUserChangePasswordRequest>,
    ) -> Result<Response<AuthUserChangePasswordResponse>, Status> {
        let who = requester(&self.node, &request)?;
        let mut req = request.into_inner();
        let plaintext = std::mem::take(&mut req.password);
        req.hashed_password = password::hash(plaintext, self.node.auth.bcrypt_cost).await?;
        let header = self.change(&who, internal(|r| r.auth_user_change_password = Some(Box::new(req)))).await?;
        Ok(Response::new(AuthUserChangePasswordResponse { header }))
    }

    async fn user_grant_role(
        &self,
        request: Request<AuthUserGrantRoleRequest>,
    ) -> Result<Response<AuthUserGrantRoleResponse>, Status> {
        let who = requester(&self.node, &request)?;
        let req = request.into_inner();
        let header = self.change(&who, internal(|r| r.auth_user_grant_role = Some(Box::new(req)))).await?;
        Ok(Response::new(AuthUserGrantRoleResponse { header }))
    }

    async fn user_revoke_role(
        &self,
        request: Request<AuthUserRevokeRoleRequest>,
    ) -> Result<Response<AuthUserRevokeRoleResponse>, Status> {
        let who = requester(&self.node, &request)?;
        let req = request.into_inner();
        let header = self.change(&who, internal(|r| r.auth_user_revoke_role = Some(Box::new(req)))).await?;
        Ok(Response::new(AuthUserRevokeRoleResponse { header }))
    }

    async fn role_add(&self, request: Request<AuthRoleAddRequest>) -> Result<Response<AuthRoleAddResponse>, Status> {
        let who = requester(&self.node, &request)?;
        let req = request.into_inner();
        if req.name.is_empty() {
            return Err(EtcdError::RoleEmpty.into());
        }
        let header = self.change(&who, internal(|r| r.auth_role_add = Some(Box::new(req)))).await?;
        Ok(Response::new(AuthRoleAddResponse { header }))
    }

    async fn role_get(&self, request: Request<AuthRoleGetRequest>) -> Result<Response<AuthRoleGetResponse>, Status> {
        let who = requester(&self.node, &request)?;
        let role = request.into_inner().role;
        let (perm, header) = self
            .read(move |authz, auth, txn| {
                // Users may read the roles they hold; anything else is root's.
                if !authz.has_role(&who, &role)? {
                    authz.check_admin(&who, "role_get")?;
                }
                Ok(auth.role(txn, &role)?.ok_or(EtcdError::RoleNotFound)?.key_permission)
            })
            .await?;
        Ok(Response::new(AuthRoleGetResponse { header, perm }))
    }

    async fn role_list(&self, request: Request<AuthRoleListRequest>) -> Result<Response<AuthRoleListResponse>, Status> {
        let who = requester(&self.node, &request)?;
        let (roles, header) = self
            .read(move |authz, auth, txn| {
                authz.check_admin(&who, "role_list")?;
                auth.role_names(txn)
            })
            .await?;
        Ok(Response::new(AuthRoleListResponse { header, roles }))
    }

    async fn role_delete(
        &self,
        request: Request<AuthRoleDeleteRequest>,
    ) -> Result<Response<AuthRoleDeleteResponse>, Status> {
        let who = requester(&self.node, &request)?;
        let req = request.into_inner();
        let header = self.change(&who, internal(|r| r.auth_role_delete = Some(Box::new(req)))).await?;
        Ok(Response::new(AuthRoleDeleteResponse { header }))
    }

    async fn role_grant_permission(
        &self,
        request: Request<AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<AuthRoleGrantPermissionResponse>, Status> {
        let who = requester(&self.node, &request)?;
        let req = request.into_inner();
        let header = self.change(&who, internal(|r| r.auth_role_grant_permission = Some(Box::new(req)))).await?;
        Ok(Response::new(AuthRoleGrantPermissionResponse { header }))
    }

    async fn role_revoke_permission(
        &self,
        request: Request<AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<AuthRoleRevokePermissionResponse>, Status> {
        let who = requester(&self.node, &request)?;
        let req = request.into_inner();
        let header = self.change(&who, internal(|r| r.auth_role_revoke_permission = Some(Box::new(req)))).await?;
        Ok(Response::new(AuthRoleRevokePermissionResponse { header }))
    }
}
