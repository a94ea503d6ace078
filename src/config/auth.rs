//! The authentication flags: the token type (`--auth-token`, its syntax in `auth_token.rs`) and the
//! simple tokens' lifetime, bcrypt's cost, the login throttle and the audit log.

use std::time::Duration;

use super::auth_token;
use super::error::{invalid, ConfigError};
use crate::auth::audit::AuditConfig;
use crate::auth::throttle::Limits;
use crate::auth::token_config::TokenConfig;
use crate::cli::member::ServeArgs;

/// `--auth-token`. The parser's messages already start with the flag's name.
pub(super) fn auth_token(flag: &str) -> Result<TokenConfig, ConfigError> {
    auth_token::parse(flag).map_err(invalid)
}

/// `--bcrypt-cost`, within bcrypt's range.
pub(super) fn check_bcrypt_cost(cost: u32) -> Result<(), ConfigError> {
    if !(4..=31).contains(&cost) {
        return Err(invalid(format!("--bcrypt-cost {cost} is out of range [4, 31]")));
    }
    Ok(())
}

/// `--login-throttle-*`: the first wait may not exceed the longest.
pub(super) fn login_throttle(args: &ServeArgs) -> Result<Limits, ConfigError> {
    if args.login_throttle_base_delay > args.login_throttle_max_delay {
        return Err(invalid(format!(
            "--login-throttle-base-delay {} is above --login-throttle-max-delay {}",
            args.login_throttle_base_delay, args.login_throttle_max_delay
        )));
    }
    Ok(Limits {
        free_failures: args.login_throttle_free_failures,
        base_delay: Duration::from_millis(args.login_throttle_base_delay),
        max_delay: Duration::from_millis(args.login_throttle_max_delay),
    })
}

/// `--auth-token-ttl`, in seconds.
pub(super) fn auth_token_ttl(seconds: u64) -> Result<Duration, ConfigError> {
    if seconds == 0 {
        return Err(invalid("--auth-token-ttl must be at least 1 second"));
    }
    Ok(Duration::from_secs(seconds))
}

/// `--audit-log*` (`None`: no audit log).
pub(super) fn audit(args: &ServeArgs) -> Option<AuditConfig> {
    args.audit_log.clone().map(|path| AuditConfig {
        path,
        max_size: args.audit_log_max_size,
        max_backups: args.audit_log_max_backups,
    })
}
