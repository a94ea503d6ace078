//! The configured token provider (`--auth-token`): simple (stateful, issued through raft) or JWT
//! (signed, stateless).

use std::time::Duration;

use super::jwt::JwtTokens;
use super::simple::SimpleTokens;
use super::token_config::TokenConfig;
use crate::error::EtcdError;
use crate::identity::TokenResolver;

pub(crate) enum Tokens {
    Simple(SimpleTokens),
    Jwt(Box<JwtTokens>),
}

impl Tokens {
    pub(crate) fn new(config: &TokenConfig, simple_ttl: Duration) -> Result<Self, String> {
        Ok(match config {
            TokenConfig::Simple => Tokens::Simple(SimpleTokens::new(simple_ttl)),
            TokenConfig::Jwt(options) => Tokens::Jwt(Box::new(JwtTokens::new(options)?)),
        })
    }

    /// The user and auth revision a token stands for.
    pub(crate) fn resolve(&self, token: &str) -> Result<(String, u64), EtcdError> {
        match self {
            Tokens::Simple(simple) => simple.info(token).ok_or(EtcdError::InvalidAuthToken),
            Tokens::Jwt(jwt) => jwt.verify(token),
        }
    }

    pub(crate) fn simple(&self) -> Option<&SimpleTokens> {
        match self {
            Tokens::Simple(simple) => Some(simple),
            Tokens::Jwt(_) => None,
        }
    }
}

/// Tokens are what `identity/rules.rs` resolves a request's `token` metadata with.
impl TokenResolver for Tokens {
    fn resolve(&self, token: &str) -> Result<(String, u64), EtcdError> {
        Tokens::resolve(self, token)
    }
}
