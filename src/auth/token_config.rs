//! What `--auth-token` asks for: the kind of auth token the server hands out (`TokenConfig`) and, for
//! JWTs, their options and signing method. `config/auth_token.rs` parses the flag's value.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// etcd's `auth.DefaultTTL` for JWTs.
pub const DEFAULT_JWT_TTL: Duration = Duration::from_secs(5 * 60);

/// The parsed `--auth-token` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenConfig {
    Simple,
    Jwt(JwtOptions),
}

/// Options of `--auth-token jwt,...`. The key files are only named here; `jwt::JwtTokens::new`
/// reads them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JwtOptions {
    pub public_key: Option<PathBuf>,
    pub private_key: Option<PathBuf>,
    pub sign_method: SignMethod,
    pub ttl: Duration,
}

/// The asymmetric JWS algorithms etcd's `sign-method` names (case-sensitive, as in etcd).
#[allow(clippy::upper_case_acronyms)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SignMethod {
    RS256,
    RS384,
    RS512,
    PS256,
    PS384,
    PS512,
    ES256,
    ES384,
    ES512,
    EdDSA,
}

impl SignMethod {
    pub const ALL: [SignMethod; 10] = [
        SignMethod::RS256,
        SignMethod::RS384,
        SignMethod::RS512,
        SignMethod::PS256,
        SignMethod::PS384,
        SignMethod::PS512,
        SignMethod::ES256,
        SignMethod::ES384,
        SignMethod::ES512,
        SignMethod::EdDSA,
    ];

    /// The JWS `alg` name, which is also the `sign-method` spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            SignMethod::RS256 => "RS256",
            SignMethod::RS384 => "RS384",
            SignMethod::RS512 => "RS512",
            SignMethod::PS256 => "PS256",
            SignMethod::PS384 => "PS384",
            SignMethod::PS512 => "PS512",
            SignMethod::ES256 => "ES256",
            SignMethod::ES384 => "ES384",
            SignMethod::ES512 => "ES512",
            SignMethod::EdDSA => "EdDSA",
        }
    }
}

impl fmt::Display for SignMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
