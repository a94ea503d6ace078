//! `ConfigError`: why a member's flags were refused, in one message naming the flag.

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

pub(super) fn invalid(msg: impl Into<String>) -> ConfigError {
    ConfigError(msg.into())
}
