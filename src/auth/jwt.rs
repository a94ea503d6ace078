//! The JWT token provider (`--auth-token jwt,...`), compatible with etcd 3.4's `auth/jwt.go`.
//!
//! Tokens are JWS compact serialisations with etcd's claims exactly: `{"exp":…,"revision":…,
//! "username":…}` (`exp` in Unix seconds = now + ttl, `revision` the auth revision at issue time), so a
//! keyward server and an etcd server configured with the same key pair accept each other's tokens.
//!
//! Keys are PEM files. RSA private keys may be PKCS#1 or PKCS#8; EC and Ed25519 private keys must be
//! PKCS#8 (`openssl pkcs8 -topk8 -nocrypt` converts an `EC PRIVATE KEY`); public keys are
//! SubjectPublicKeyInfo (`openssl pkey -pubout`) or an X.509 certificate (as in etcd's own tests).
//! RSA keys larger than 4096 bits are refused by the crypto backend. ES512 is not supported (the
//! `jsonwebtoken` backend has no P-521). With `priv-key` the server signs and verifies; with
//! `pub-key` as well it verifies with `pub-key` after checking at startup that the two belong together
//! (etcd means to check this but its comparison is wrong and accepts mismatched pairs); with only
//! `pub-key` it is verify-only and cannot issue tokens (as etcd).
//!
//! Verification is deliberately stricter than etcd's (which lets a token without `exp` live forever and
//! panics on a signed token missing `username` or `revision`): the header `alg` must be the configured
//! method (so no `none` and no RS/HS key confusion); `username` (string), `revision` (unsigned integer)
//! and `exp` (unsigned integer) are required; `nbf` and `iat`, if present, must be unsigned integers
//! not in the future. Expiry is strict, with no leeway, exactly etcd's rule: valid while
//! `now <= exp` (whole seconds). Any failure is `EtcdError::InvalidAuthToken`.
//!
//! Successful verifications are cached (token → username, revision, exp) in a bounded map, since
//! signature checks cost far more than a hash lookup; a cached token is still refused once expired.

use std::collections::HashMap;
use std::fmt;
use std::io::Read;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use super::token_config::{JwtOptions, SignMethod};
use crate::error::EtcdError;

/// How many verified tokens are remembered.
pub(crate) const DEFAULT_CACHE_CAPACITY: usize = 10_000;

/// Longer tokens are refused before any parsing. A token with a 4096-bit RSA signature is about
/// 800 bytes plus the user name.
pub(crate) const MAX_TOKEN_LEN: usize = 8 * 1024;

/// Key files larger than this are refused (a PEM key is a few KiB at most).
const MAX_KEY_FILE_LEN: u64 = 1024 * 1024;

/// What keyward signs: etcd's claims, in the order Go's JSON encoder writes a map (sorted keys).
#[derive(Serialize)]
struct IssuedClaims<'a> {
    exp: u64,
    revision: u64,
    username: &'a str,
}

/// What a token must carry. Unknown claims are ignored (as etcd); duplicate claims are refused.
#[derive(Deserialize)]
struct ReceivedClaims {
    username: String,
    revision: u64,
    exp: u64,
    #[serde(default)]
    nbf: Option<u64>,
    #[serde(default)]
    iat: Option<u64>,
}

#[derive(Clone, Debug)]
struct Verified {
    username: String,
    revision: u64,
    exp: u64,
}

/// Issues and verifies JWTs. All methods take `&self`; share it in an `Arc`.
pub(crate) struct JwtTokens {
    sign_method: SignMethod,
    algorithm: Algorithm,
    ttl: Duration,
    /// `None` in verify-only mode.
    encoding_key: Option<EncodingKey>,
    decoding_key: DecodingKey,
    validation: Validation,
    cache: Mutex<HashMap<String, Verified>>,
    cache_capacity: usize,
}

impl fmt::Debug for JwtTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtTokens")
            .field("sign_method", &self.sign_method)
            .field("ttl", &self.ttl)
            .field("verify_only", &self.is_verify_only())
            .finish_non_exhaustive()
    }
}

fn algorithm_of(method: SignMethod) -> Result<Algorithm, String> {
    Ok(match method {
        SignMethod::RS256 => Algorithm::RS256,
        SignMethod::RS384 => Algorithm::RS384,
        SignMethod::RS512 => Algorithm::RS512,
        SignMethod::PS256 => Algorithm::PS256,
        SignMethod::PS384 => Algorithm::PS384,
        SignMethod::PS512 => Algorithm::PS512,
        SignMethod::ES256 => Algorithm::ES256,
        SignMethod::ES384 => Algorithm::ES384,
        SignMethod::EdDSA => Algorithm::EdDSA,
        SignMethod::ES512 => {
            return Err("--auth-token: sign-method ES512 (P-521) is not supported by keyward; \
                 use ES256, ES384, EdDSA, RS* or PS*"
                .into())
        }
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum KeyKind {
    Rsa,
    Ec,
    Ed,
}

impl KeyKind {
    fn of(alg: Algorithm) -> KeyKind {
        match alg {
            Algorithm::ES256 | Algorithm::ES384 => KeyKind::Ec,
            Algorithm::EdDSA => KeyKind::Ed,
            _ => KeyKind::Rsa,
        }
    }

    fn describe(self, alg: Algorithm) -> &'static str {
        match (self, alg) {
            (KeyKind::Rsa, _) => "an RSA",
            (KeyKind::Ec, Algorithm::ES384) => "a P-384 EC",
            (KeyKind::Ec, _) => "a P-256 EC",
            (KeyKind::Ed, _) => "an Ed25519",
        }
    }
}

fn read_key_file(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    let file =
        std::fs::File::open(path).map_err(|e| format!("--auth-token: cannot open {what} {}: {e}", path.display()))?;
    let mut buf = Vec::new();
    file.take(MAX_KEY_FILE_LEN + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("--auth-token: cannot read {what} {}: {e}", path.display()))?;
    if buf.len() as u64 > MAX_KEY_FILE_LEN {
        return Err(format!("--auth-token: {what} {} is too large to be a PEM key", path.display()));
    }
    Ok(buf)
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The public half of a key as JWK parameters, which makes keys of one kind comparable.
fn public_params_of_private(key: &EncodingKey, alg: Algorithm) -> Option<AlgorithmParameters> {
    catch_unwind(AssertUnwindSafe(|| Jwk::from_encoding_key(key, alg))).ok()?.ok().map(|jwk| jwk.algorithm)
}

fn public_params(key: &DecodingKey, alg: Algorithm) -> Option<AlgorithmParameters> {
    let params = catch_unwind(AssertUnwindSafe(|| Jwk::from_decoding_key(key, Some(alg)))).ok()?.ok()?.algorithm;
    // The key must fit the method: for EC the curve is fixed by the method.
    let fits = match (&params, alg) {
        (AlgorithmParameters::RSA(_), a) => KeyKind::of(a) == KeyKind::Rsa,
        (AlgorithmParameters::EllipticCurve(p), Algorithm::ES256) => p.curve == EllipticCurve::P256,
        (AlgorithmParameters::EllipticCurve(p), Algorithm::ES384) => p.curve == EllipticCurve::P384,
        (AlgorithmParameters::OctetKeyPair(p), Algorithm::EdDSA) => p.curve == EllipticCurve::Ed25519,
        _ => false,
    };
    fits.then_some(params)
}

/// The private key in `path`, with the parameters of its public half (deriving them proves the key
/// parses as a private key of the kind `method` needs).
fn read_private_key(
    path: &Path,
    method: SignMethod,
    alg: Algorithm,
) -> Result<(EncodingKey, AlgorithmParameters), String> {
    let kind = KeyKind::of(alg);
    let pem = read_key_file(path, "priv-key")?;
    let parsed = match kind {
        KeyKind::Rsa => EncodingKey::from_rsa_pem(&pem),
        KeyKind::Ec => EncodingKey::from_ec_pem(&pem),
        KeyKind::Ed => EncodingKey::from_ed_pem(&pem),
    };
    let pkcs8_hint = match kind {
        KeyKind::Rsa => "",
        _ => {
            " (EC and Ed25519 private keys must be PKCS#8 \"BEGIN PRIVATE KEY\": convert with \
              `openssl pkcs8 -topk8 -nocrypt`)"
        }
    };
    let bad = || {
        format!(
            "--auth-token: priv-key {} is not {} private key in PEM, as sign-method \
             {method} needs{pkcs8_hint}",
            path.display(),
            kind.describe(alg)
        )
    };
    let key = parsed.map_err(|_| bad())?;
    let params = public_params_of_private(&key, alg).ok_or_else(bad)?;
    Ok((key, params))
}

/// The public key (or certificate) in `path`, with its parameters, checked to fit `method`.
fn read_public_key(
    path: &Path,
    method: SignMethod,
    alg: Algorithm,
) -> Result<(DecodingKey, AlgorithmParameters), String> {
    let kind = KeyKind::of(alg);
    let pem = read_key_file(path, "pub-key")?;
    let parsed = match kind {
        KeyKind::Rsa => DecodingKey::from_rsa_pem(&pem),
        KeyKind::Ec => DecodingKey::from_ec_pem(&pem),
        KeyKind::Ed => DecodingKey::from_ed_pem(&pem),
    };
    let bad = || {
        format!(
            "--auth-token: pub-key {} is not {} public key (or certificate) in PEM, \
             as sign-method {method} needs",
            path.display(),
            kind.describe(alg)
        )
    };
    let key = parsed.map_err(|_| bad())?;
    let params = public_params(&key, alg).ok_or_else(bad)?;
    Ok((key, params))
}

/// Signature checks only: time and claim checks are done on typed claims, with etcd's rule and no
/// leeway.
fn validation(alg: Algorithm) -> Validation {
    let mut validation = Validation::new(alg);
    validation.leeway = 0;
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = false;
    validation.required_spec_claims.clear();
    validation
}

impl JwtTokens {
    /// Reads the key files named in `opts` and checks that they fit the sign method and each other.
    /// The error is a message for the operator, naming the file and the problem.
    pub(crate) fn new(opts: &JwtOptions) -> Result<JwtTokens, String> {
        let alg = algorithm_of(opts.sign_method)?;
        if opts.ttl < Duration::from_secs(1) {
            return Err("--auth-token: jwt ttl must be at least 1s".into());
        }
        let private = match &opts.private_key {
            Some(path) => Some(read_private_key(path, opts.sign_method, alg)?),
            None => None,
        };
        let derived_params = private.as_ref().map(|(_, params)| params.clone());
        let decoding_key = match (&opts.public_key, derived_params) {
            (Some(path), derived) => {
                let (key, params) = read_public_key(path, opts.sign_method, alg)?;
                if derived.is_some_and(|derived| derived != params) {
                    return Err(format!(
                        "--auth-token: pub-key {} does not match priv-key {}",
                        path.display(),
                        opts.private_key.as_deref().unwrap_or(Path::new("")).display()
                    ));
                }
                key
            }
            (None, Some(derived)) => {
                let jwk = Jwk { common: Default::default(), algorithm: derived };
                DecodingKey::from_jwk(&jwk)
                    .map_err(|e| format!("--auth-token: cannot use priv-key's public key: {e}"))?
            }
            (None, None) => {
                return Err("--auth-token: jwt requires priv-key and/or pub-key".into());
            }
        };
        let tokens = JwtTokens {
            sign_method: opts.sign_method,
            algorithm: alg,
            ttl: opts.ttl,
            encoding_key: private.map(|(key, _)| key),
            decoding_key,
            validation: validation(alg),
            cache: Mutex::new(HashMap::new()),
            cache_capacity: DEFAULT_CACHE_CAPACITY,
        };
        tokens.probe()?;
        Ok(tokens)
    }

    /// A full round trip through the real crypto path, so a key the backend cannot use (e.g. an
    /// RSA key over 4096 bits) fails at start and not at the first login.
    fn probe(&self) -> Result<(), String> {
        if self.encoding_key.is_none() {
            return Ok(());
        }
        let (now, method) = (unix_now(), self.sign_method);
        let probe = self
            .sign_at("keyward-startup-probe", 0, now)
            .map_err(|_| format!("--auth-token: cannot sign with priv-key using {method}"))?;
        self.verify_uncached(&probe, now)
            .map_err(|_| format!("--auth-token: a token signed with priv-key does not verify using {method}"))?;
        Ok(())
    }

    #[cfg(test)]
    pub(crate) fn sign_method(&self) -> SignMethod {
        self.sign_method
    }

    /// True when only a public key was given: tokens can be verified but not issued.
    pub(crate) fn is_verify_only(&self) -> bool {
        self.encoding_key.is_none()
    }

    /// Issues a token for `username` at auth revision `revision`, expiring `ttl` from now.
    ///
    /// In verify-only mode this fails, as etcd's `ErrVerifyOnly` ("auth: token signing attempted with
    /// verify-only key"), here as `EtcdError::Unsupported` with that text.
    pub(crate) fn sign(&self, username: &str, revision: u64) -> Result<String, EtcdError> {
        let exp = SystemTime::now()
            .checked_add(self.ttl)
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_secs())
            .ok_or(EtcdError::Internal)?;
        self.sign_with_exp(username, revision, exp)
    }

    fn sign_at(&self, username: &str, revision: u64, now: u64) -> Result<String, EtcdError> {
        self.sign_with_exp(username, revision, now.saturating_add(self.ttl.as_secs()))
    }

    fn sign_with_exp(&self, username: &str, revision: u64, exp: u64) -> Result<String, EtcdError> {
        let Some(key) = &self.encoding_key else {
            return Err(EtcdError::Unsupported("auth: token signing attempted with verify-only key".into()));
        };
        let claims = IssuedClaims { exp, revision, username };
        jsonwebtoken::encode(&Header::new(self.algorithm), &claims, key).map_err(|e| {
            tracing::error!(error = %e, sign_method = %self.sign_method, "failed to sign a JWT");
            EtcdError::Internal
        })
    }

    /// Checks a token and returns its (username, revision). Every failure is `InvalidAuthToken`.
    pub(crate) fn verify(&self, token: &str) -> Result<(String, u64), EtcdError> {
        self.verify_at(token, unix_now())
    }

    fn verify_at(&self, token: &str, now: u64) -> Result<(String, u64), EtcdError> {
        if token.is_empty() || token.len() > MAX_TOKEN_LEN {
            return Err(EtcdError::InvalidAuthToken);
        }
        {
            let mut cache = self.lock_cache();
            if let Some(hit) = cache.get(token) {
                if now <= hit.exp {
                    return Ok((hit.username.clone(), hit.revision));
                }
                // The signed expiry has passed: the token can never be valid again.
                cache.remove(token);
                return Err(EtcdError::InvalidAuthToken);
            }
        }
        let verified = self.verify_uncached(token, now)?;
        let result = (verified.username.clone(), verified.revision);
        self.remember(token, verified, now);
        Ok(result)
    }

    fn verify_uncached(&self, token: &str, now: u64) -> Result<Verified, EtcdError> {
        if token.is_empty() || token.len() > MAX_TOKEN_LEN {
            return Err(EtcdError::InvalidAuthToken);
        }
        // The backend is not expected to panic on hostile input; if it ever does, that is still
        // just an invalid token.
        let decoded = catch_unwind(AssertUnwindSafe(|| {
            jsonwebtoken::decode::<ReceivedClaims>(token, &self.decoding_key, &self.validation)
        }));
        let claims = match decoded {
            Ok(Ok(data)) if data.header.alg == self.algorithm => data.claims,
            _ => return Err(EtcdError::InvalidAuthToken),
        };
        if now > claims.exp || claims.nbf.is_some_and(|nbf| nbf > now) || claims.iat.is_some_and(|iat| iat > now) {
            return Err(EtcdError::InvalidAuthToken);
        }
        Ok(Verified { username: claims.username, revision: claims.revision, exp: claims.exp })
    }

    fn lock_cache(&self) -> MutexGuard<'_, HashMap<String, Verified>> {
        // The map is always consistent between statements; a panic elsewhere cannot corrupt it.
        self.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn remember(&self, token: &str, verified: Verified, now: u64) {
        if self.cache_capacity == 0 {
            return;
        }
        let mut cache = self.lock_cache();
        if cache.len() >= self.cache_capacity && !cache.contains_key(token) {
            cache.retain(|_, v| now <= v.exp);
            if cache.len() >= self.cache_capacity {
                // Still full of live tokens: drop the tenth that expires soonest (so the O(n) sweep above
                // is amortised). Ordered by (expiry, token), which decides every tie: what is evicted
                // never depends on the map's randomised iteration order.
                let drop = (self.cache_capacity / 10).clamp(1, cache.len());
                let mut by_expiry: Vec<(u64, &String)> = cache.iter().map(|(token, v)| (v.exp, token)).collect();
                by_expiry.select_nth_unstable(drop - 1);
                let victims: Vec<String> = by_expiry[..drop].iter().map(|(_, token)| (*token).clone()).collect();
                for victim in victims {
                    cache.remove(&victim);
                }
            }
        }
        cache.insert(token.to_owned(), verified);
    }
}

#[cfg(test)]
mod tests;
