//! What the auth service (`server/auth.rs`) needs of the member beyond the replicated auth state:
//! the password hashing cost, the login throttle, the passwords already verified, and the audit log.

use std::sync::Arc;

use crate::auth::audit::AuditLog;
use crate::auth::throttle::LoginThrottle;
use crate::auth::verified::VerifiedPasswords;
use crate::config::Config;
use crate::error::EtcdError;
use crate::identity::Origin;
use crate::raft::state_machine::State;

pub(crate) struct AuthService {
    /// `--bcrypt-cost`: the cost of the passwords this member hashes.
    pub(crate) bcrypt_cost: u32,
    /// Login attempts slow down the next ones from the same source (`auth/throttle.rs`); the
    /// leader's decides for the cluster (`node/login_throttle.rs`).
    pub(crate) login_throttle: Arc<LoginThrottle>,
    /// Passwords Authenticate verified (`auth/verified.rs`).
    pub(crate) verified_passwords: VerifiedPasswords,
    /// `--audit-log`: every auth decision as a JSON line (`auth/audit.rs`).
    pub(crate) audit: Option<Arc<AuditLog>>,
}

impl AuthService {
    /// Opens the audit log, if there is one, for the auth checks of `state` too.
    pub(super) fn start(config: &Config, state: &State) -> anyhow::Result<AuthService> {
        // Entries replayed at start are audited again: their lines carry the same raft index.
        let audit = match &config.audit {
            Some(audit) => {
                let log = Arc::new(AuditLog::open(audit.clone(), config.name.clone()).map_err(anyhow::Error::msg)?);
                let _ = state.auth.audit.set(log.clone());
                Some(log)
            }
            None => None,
        };
        Ok(AuthService {
            bcrypt_cost: config.bcrypt_cost,
            login_throttle: Arc::new(LoginThrottle::new(config.login_throttle)),
            verified_passwords: Default::default(),
            audit,
        })
    }

    /// Records a login's outcome in the audit log, if there is one, at `auth_revision`.
    pub(super) fn audit_login<T>(
        &self,
        user: &str,
        origin: Origin,
        outcome: &Result<T, EtcdError>,
        auth_revision: u64,
    ) {
        let Some(log) = &self.audit else { return };
        let client = origin.client.map(|a| a.to_string());
        log.record(&crate::auth::audit::Decision {
            time: crate::auth::audit::now(),
            member: log.member(),
            client: client.as_deref(),
            source: origin.credential.as_str(),
            user,
            op: "authenticate",
            key: None,
            range_end: None,
            allowed: outcome.is_ok(),
            reason: outcome.as_ref().err().map(ToString::to_string),
            auth_revision,
            raft_index: None,
        });
    }
}
