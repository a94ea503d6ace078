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

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// etcd's `auth.DefaultTTL` for JWTs.
pub const DEFAULT_JWT_TTL: Duration = Duration::from_secs(5 * 60);

const OPT_SIGN_METHOD: &str = "sign-method";
const OPT_PUBLIC_KEY: &str = "pub-key";
const OPT_PRIVATE_KEY: &str = "priv-key";
const OPT_TTL: &str = "ttl";

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

/// Parses an `--auth-token` value (see the module documentation).
pub(crate) fn parse(s: &str) -> Result<TokenConfig, String> {
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

/// Go's `time.ParseDuration`: `[-+]?([0-9]*(\.[0-9]*)?[a-z]+)+` or `0`, units ns, us (µs, μs), ms,
/// s, m, h. Negative durations are refused (Go accepts them; no caller here wants one). Overflow
/// past Go's limit (int64 nanoseconds, about 292 years) is an error, as in Go.
///
/// Written here rather than taken from a crate: the one crate that ports Go's parser,
/// `go-parse-duration` 0.1.1 (unmaintained since 2021), writes Go's `1<<63 - 1` as Rust's `1 << 63 - 1`
/// (= 2^62: it refuses `1500000h`, which Go accepts), mixes char and byte indices (`"1µs"` and `"1sµ"`
/// panic) and never returns on `0.9999999999999999999s`; `humantime` reads a different syntax (spaces,
/// other unit names). The test `go_durations` pins Go's behaviour.
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    const MAX_NANOS: u128 = i64::MAX as u128;
    let orig = s;
    let invalid = || format!("invalid duration {orig:?}");
    let mut s = s;
    let mut negative = false;
    if let Some(rest) = s.strip_prefix('-') {
        negative = true;
        s = rest;
    } else if let Some(rest) = s.strip_prefix('+') {
        s = rest;
    }
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    let mut total: u128 = 0;
    while !s.is_empty() {
        // integer part
        let int_len = s.bytes().take_while(u8::is_ascii_digit).count();
        let (int_digits, rest) = s.split_at(int_len);
        s = rest;
        // fraction
        let mut frac_digits = "";
        let has_dot = s.starts_with('.');
        if has_dot {
            s = &s[1..];
            let frac_len = s.bytes().take_while(u8::is_ascii_digit).count();
            (frac_digits, s) = s.split_at(frac_len);
        }
        if int_digits.is_empty() && frac_digits.is_empty() {
            // no digits at all (e.g. ".s" or "h")
            return Err(invalid());
        }
        // unit: everything up to the next digit or '.'
        let unit_len = s.char_indices().find(|&(_, c)| c == '.' || c.is_ascii_digit()).map_or(s.len(), |(i, _)| i);
        let (unit, rest) = s.split_at(unit_len);
        s = rest;
        let unit_nanos: u128 = match unit {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 3_600 * 1_000_000_000,
            "" => return Err(format!("missing unit in duration {orig:?}")),
            other => return Err(format!("unknown unit {other:?} in duration {orig:?}")),
        };
        let mut value: u128 = 0;
        for d in int_digits.bytes() {
            value = value * 10 + u128::from(d - b'0');
            if value > MAX_NANOS {
                return Err(invalid());
            }
        }
        let mut nanos = value * unit_nanos;
        if nanos > MAX_NANOS {
            return Err(invalid());
        }
        // Fractional digits beyond 1e-18 of a unit cannot matter (the largest unit is 3.6e12 ns).
        let mut frac: u128 = 0;
        let mut scale: u128 = 1;
        for d in frac_digits.bytes().take(18) {
            frac = frac * 10 + u128::from(d - b'0');
            scale *= 10;
        }
        nanos += frac * unit_nanos / scale;
        total += nanos;
        if total > MAX_NANOS {
            return Err(invalid());
        }
    }
    if negative && total != 0 {
        return Err(format!("negative duration {orig:?}"));
    }
    let total = u64::try_from(total).map_err(|_| invalid())?;
    Ok(Duration::from_nanos(total))
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

    #[test]
    fn go_durations() {
        let d = |s: &str| parse_go_duration(s);
        assert_eq!(d("0"), Ok(Duration::ZERO));
        assert_eq!(d("-0"), Ok(Duration::ZERO));
        assert_eq!(d("1ns"), Ok(Duration::from_nanos(1)));
        assert_eq!(d("1us"), Ok(Duration::from_micros(1)));
        assert_eq!(d("1µs"), Ok(Duration::from_micros(1)));
        assert_eq!(d("1μs"), Ok(Duration::from_micros(1)));
        assert_eq!(d("1.5ms"), Ok(Duration::from_micros(1500)));
        assert_eq!(d(".5s"), Ok(Duration::from_millis(500)));
        assert_eq!(d("5.s"), Ok(Duration::from_secs(5)));
        assert_eq!(d("2h45m30.5s"), Ok(Duration::from_millis((2 * 3600 + 45 * 60 + 30) * 1000 + 500)));
        assert_eq!(d("1m1m"), Ok(Duration::from_secs(120)));
        assert_eq!(d("2562047h"), Ok(Duration::from_secs(2562047 * 3600)));
        assert_eq!(d("1500000h"), Ok(Duration::from_secs(1500000 * 3600)));
        assert_eq!(d("0.5000000000000000000001s"), Ok(Duration::from_millis(500)));
        assert!(d("1sµ").unwrap_err().contains("unknown unit"));
        assert!(d("2562048h").is_err());
        assert!(d("9223372036854775808ns").is_err());
        assert!(d("").is_err());
        assert!(d("s").is_err());
        assert!(d(".s").is_err());
        assert!(d("1").is_err());
        assert!(d("1.2.3s").is_err());
        assert!(d("1h ").is_err());
        assert!(d("1H").is_err());
        assert!(d("-1s").is_err());
    }
}
