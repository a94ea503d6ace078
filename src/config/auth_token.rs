//! `--auth-token`: which kind of auth token the server hands out, parsed the way etcd 3.4 parses it
//! (`auth/store.go` `decomposeOpts` + `auth/options.go`), but strictly.
//!
//! Syntax: `TYPE[,KEY=VALUE]...`, split on `,` and then each option on `=` (so no value may contain
//! `,` or `=`; there is no quoting, no whitespace trimming, keys and values are case-sensitive):
//!
//! - `simple`: etcd's default; opaque random tokens whose lifetime is `--auth-token-ttl` (300 s).
//! - `jwt,sign-method=M[,priv-key=FILE][,pub-key=FILE][,ttl=DURATION]`: signed JSON web tokens.
//!   `sign-method` is required; at least one of `priv-key` / `pub-key` is required (with only
//!   `pub-key` the server can verify tokens but not issue them); `ttl` is a Go duration (`5m`, `300s`,
//!   `1h30m`, `1.5h`) and defaults to 5 minutes, as in etcd.
//!
//! Where etcd is lenient, keyward refuses to start instead, with a message naming the problem:
//! unknown options (etcd logs a warning and ignores them, so a typo such as `tll=1h` silently
//! becomes the default), options after `simple` (ignored by etcd), an empty type (etcd then
//! disables token issuing altogether), empty values such as `pub-key=` (etcd treats them as absent),
//! and a `ttl` that is zero, negative or under one second (tokens carry whole-second expiries).
//! HMAC methods (`HS256`/`HS384`/`HS512`, which etcd accepts with the `priv-key` file's raw bytes as
//! the shared secret) and `none` are refused.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use super::duration::parse_go_duration;
use crate::auth::token_config::{JwtOptions, SignMethod, TokenConfig, DEFAULT_JWT_TTL};

const OPT_SIGN_METHOD: &str = "sign-method";
const OPT_PUBLIC_KEY: &str = "pub-key";
const OPT_PRIVATE_KEY: &str = "priv-key";
const OPT_TTL: &str = "ttl";

/// Parses an `--auth-token` value (see the module documentation).
pub(super) fn parse(s: &str) -> Result<TokenConfig, String> {
    let mut parts = s.split(',');
    let token_type = parts.next().unwrap_or_default();

    // decomposeOpts: every option is exactly KEY=VALUE, no key twice.
    let mut opts: Vec<(&str, &str)> = Vec::new();
    for part in parts {
        let mut kv = part.split('=');
        let (Some(key), Some(value), None) = (kv.next(), kv.next(), kv.next()) else {
            return Err(format!("--auth-token: malformed option {part:?} in {s:?}: expected KEY=VALUE"));
        };
        if key.is_empty() {
            return Err(format!("--auth-token: option {part:?} has no name"));
        }
        if opts.iter().any(|(k, _)| *k == key) {
            return Err(format!("--auth-token: option {key:?} given more than once"));
        }
        if value.is_empty() {
            return Err(format!("--auth-token: option {key:?} has an empty value"));
        }
        opts.push((key, value));
    }

    match token_type {
        "simple" => {
            if let Some((key, _)) = opts.first() {
                return Err(format!(
                    "--auth-token: token type \"simple\" takes no options (got {key:?}); \
                     its lifetime is set with --auth-token-ttl"
                ));
            }
            Ok(TokenConfig::Simple)
        }
        "jwt" => parse_jwt(&opts).map(TokenConfig::Jwt),
        "" => Err("--auth-token: token type is empty; expected \"simple\" or \"jwt,...\"".into()),
        other => Err(format!("--auth-token: unknown token type {other:?}; expected \"simple\" or \"jwt,...\"")),
    }
}

fn parse_jwt(opts: &[(&str, &str)]) -> Result<JwtOptions, String> {
    let mut public_key = None;
    let mut private_key = None;
    let mut sign_method = None;
    let mut ttl = DEFAULT_JWT_TTL;
    for &(key, value) in opts {
        match key {
            OPT_PUBLIC_KEY => public_key = Some(PathBuf::from(value)),
            OPT_PRIVATE_KEY => private_key = Some(PathBuf::from(value)),
            OPT_SIGN_METHOD => sign_method = Some(value.parse::<SignMethod>()?),
            OPT_TTL => {
                ttl = parse_go_duration(value).map_err(|e| format!("--auth-token: ttl {value:?}: {e}"))?;
                if ttl < Duration::from_secs(1) {
                    return Err(format!(
                        "--auth-token: ttl {value:?} is too short: JWT expiry has one-second \
                         resolution, use at least 1s"
                    ));
                }
            }
            other => {
                return Err(format!(
                    "--auth-token: unknown jwt option {other:?}; known options: \
                     {OPT_SIGN_METHOD}, {OPT_PRIVATE_KEY}, {OPT_PUBLIC_KEY}, {OPT_TTL}"
                ))
            }
        }
    }
    let Some(sign_method) = sign_method else {
        return Err(format!("--auth-token: jwt requires {OPT_SIGN_METHOD} (e.g. {OPT_SIGN_METHOD}=RS256)"));
    };
    if public_key.is_none() && private_key.is_none() {
        return Err(format!(
            "--auth-token: jwt requires {OPT_PRIVATE_KEY}=FILE (to issue and verify tokens) and/or \
             {OPT_PUBLIC_KEY}=FILE (to verify only)"
        ));
    }
    Ok(JwtOptions { public_key, private_key, sign_method, ttl })
}

impl FromStr for SignMethod {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(m) = SignMethod::ALL.iter().find(|m| m.as_str() == s) {
            return Ok(*m);
        }
        let supported = SignMethod::ALL.map(SignMethod::as_str).join(", ");
        match s {
            "HS256" | "HS384" | "HS512" => Err(format!(
                "--auth-token: sign-method {s} (HMAC with a shared secret) is not supported by keyward; \
                 use an asymmetric method: {supported}"
            )),
            "" => Err(format!("--auth-token: sign-method is empty; supported: {supported}")),
            _ => Err(format!("--auth-token: unknown sign-method {s:?}; supported: {supported}")),
        }
    }
}

impl TokenConfig {
    /// Parses an `--auth-token` value.
    pub fn parse(s: &str) -> Result<TokenConfig, String> {
        parse(s)
    }
}

impl FromStr for TokenConfig {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(s: &str) -> JwtOptions {
        match parse(s) {
            Ok(TokenConfig::Jwt(o)) => o,
            other => panic!("{s:?} parsed as {other:?}"),
        }
    }

    fn err(s: &str) -> String {
        match parse(s) {
            Err(e) => e,
            Ok(c) => panic!("{s:?} unexpectedly parsed as {c:?}"),
        }
    }

    #[test]
    fn simple() {
        assert_eq!(parse("simple"), Ok(TokenConfig::Simple));
        assert_eq!("simple".parse::<TokenConfig>(), Ok(TokenConfig::Simple));
        assert!(err("simple,ttl=5m").contains("takes no options"));
        assert!(err("Simple").contains("unknown token type \"Simple\""));
    }

    #[test]
    fn jwt_full_and_order_free() {
        let a = jwt("jwt,pub-key=/k/pub.pem,priv-key=/k/priv.pem,sign-method=RS256,ttl=10m");
        let b = jwt("jwt,ttl=10m,sign-method=RS256,priv-key=/k/priv.pem,pub-key=/k/pub.pem");
        assert_eq!(a, b);
        assert_eq!(
            a,
            JwtOptions {
                public_key: Some("/k/pub.pem".into()),
                private_key: Some("/k/priv.pem".into()),
                sign_method: SignMethod::RS256,
                ttl: Duration::from_secs(600),
            }
        );
    }

    #[test]
    fn jwt_defaults_and_key_requirements() {
        let o = jwt("jwt,priv-key=k.pem,sign-method=ES256");
        assert_eq!(o.ttl, DEFAULT_JWT_TTL);
        assert_eq!(o.ttl, Duration::from_secs(300));
        assert_eq!(o.public_key, None);
        assert_eq!(o.private_key, Some(PathBuf::from("k.pem")));
        // verify-only
        let o = jwt("jwt,pub-key=p.pem,sign-method=EdDSA");
        assert_eq!((o.public_key.is_some(), o.private_key.is_none()), (true, true));
        assert_eq!(o.sign_method, SignMethod::EdDSA);
        // sign-method is required
        assert!(err("jwt,priv-key=k.pem").contains("requires sign-method"));
        // some key is required
        assert!(err("jwt,sign-method=RS256").contains("requires priv-key"));
        assert!(err("jwt").contains("requires sign-method"));
    }

    #[test]
    fn all_sign_methods() {
        for m in SignMethod::ALL {
            let o = jwt(&format!("jwt,priv-key=k,sign-method={m}"));
            assert_eq!(o.sign_method, m);
            assert_eq!(m.as_str().parse::<SignMethod>(), Ok(m));
        }
    }

    #[test]
    fn rejected_sign_methods() {
        for hs in ["HS256", "HS384", "HS512"] {
            let e = err(&format!("jwt,priv-key=k,sign-method={hs}"));
            assert!(e.contains("HMAC") && e.contains("not supported"), "{e}");
        }
        for bad in ["none", "rs256", "RS1024", "eddsa", "ES256K"] {
            let e = err(&format!("jwt,priv-key=k,sign-method={bad}"));
            assert!(e.contains("unknown sign-method") && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn malformed_options() {
        assert!(err("jwt,priv-key").contains("malformed option \"priv-key\""));
        assert!(err("jwt,priv-key=a=b,sign-method=RS256").contains("malformed option"));
        assert!(err("jwt,,priv-key=k,sign-method=RS256").contains("malformed option \"\""));
        assert!(err("jwt,priv-key=k,sign-method=RS256,").contains("malformed option"));
        assert!(err("jwt,=k").contains("has no name"));
        assert!(err("jwt,priv-key=,sign-method=RS256").contains("empty value"));
        let e = err("jwt,priv-key=a,priv-key=b,sign-method=RS256");
        assert!(e.contains("more than once") && e.contains("priv-key"), "{e}");
    }

    #[test]
    fn unknown_options_and_types() {
        let e = err("jwt,priv-key=k,sign-method=RS256,tll=1h");
        assert!(e.contains("unknown jwt option \"tll\""), "{e}");
        // no trimming: " ttl" is not "ttl"
        assert!(err("jwt,priv-key=k,sign-method=RS256, ttl=1h").contains("unknown jwt option"));
        assert!(err("JWT,priv-key=k,sign-method=RS256").contains("unknown token type \"JWT\""));
        assert!(err("oauth").contains("unknown token type \"oauth\""));
        assert!(err("").contains("token type is empty"));
        assert!(err(",priv-key=k").contains("token type is empty"));
    }

    #[test]
    fn ttl_values() {
        let ttl = |t: &str| jwt(&format!("jwt,priv-key=k,sign-method=RS256,ttl={t}")).ttl;
        assert_eq!(ttl("5m"), Duration::from_secs(300));
        assert_eq!(ttl("300s"), Duration::from_secs(300));
        assert_eq!(ttl("1h30m"), Duration::from_secs(5400));
        assert_eq!(ttl("1.5h"), Duration::from_secs(5400));
        assert_eq!(ttl("1s"), Duration::from_secs(1));
        assert_eq!(ttl("+2h"), Duration::from_secs(7200));
        let e = |t: &str| err(&format!("jwt,priv-key=k,sign-method=RS256,ttl={t}"));
        assert!(e("5").contains("missing unit"));
        assert!(e("5x").contains("unknown unit"));
        assert!(e("0").contains("too short"));
        assert!(e("0s").contains("too short"));
        assert!(e("500ms").contains("too short"));
        assert!(e("-5m").contains("negative"));
        assert!(e("abc").contains("invalid duration"));
        assert!(e("3000000h").contains("invalid duration"));
    }
}
