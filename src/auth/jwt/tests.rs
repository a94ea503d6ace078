//! Tests of the JWT provider: every supported method, etcd's claims, the attacks a verifier must
//! refuse, the verification cache, key configuration. Keys come from the openssl CLI (RSA keys cannot
//! be generated with rcgen's ring backend).

use super::*;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde_json::{json, Value};

struct KeyPair {
    private: Vec<u8>,
    public: Vec<u8>,
}

fn openssl(args: &[&str], stdin: Option<&[u8]>) -> Vec<u8> {
    let mut child = Command::new("openssl")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl CLI is needed for these tests");
    let mut input = child.stdin.take().unwrap();
    if let Some(data) = stdin {
        input.write_all(data).unwrap();
    }
    drop(input);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

fn generate(args: &[&str]) -> KeyPair {
    let mut full = vec!["genpkey"];
    full.extend_from_slice(args);
    let private = openssl(&full, None);
    let public = openssl(&["pkey", "-pubout"], Some(&private));
    KeyPair { private, public }
}

macro_rules! key {
    ($name:ident, $($arg:expr),+) => {
        fn $name() -> &'static KeyPair {
            static K: OnceLock<KeyPair> = OnceLock::new();
            K.get_or_init(|| generate(&[$($arg),+]))
        }
    };
}
key!(rsa_a, "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048");
key!(rsa_b, "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048");
key!(p256_a, "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256");
key!(p256_b, "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256");
key!(p384, "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384");
key!(ed_a, "-algorithm", "ed25519");
key!(ed_b, "-algorithm", "ed25519");

fn key_for(method: SignMethod) -> &'static KeyPair {
    match method {
        SignMethod::ES256 => p256_a(),
        SignMethod::ES384 | SignMethod::ES512 => p384(),
        SignMethod::EdDSA => ed_a(),
        _ => rsa_a(),
    }
}

/// The methods keyward signs with: `SignMethod::ALL` (the one table of sign methods) less those
/// `algorithm_of` refuses.
fn supported() -> Vec<SignMethod> {
    SignMethod::ALL.into_iter().filter(|m| algorithm_of(*m).is_ok()).collect()
}

/// Writes the given PEMs into a fresh temp dir and builds options naming them.
fn opts(method: SignMethod, private: Option<&[u8]>, public: Option<&[u8]>) -> (tempfile::TempDir, JwtOptions) {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, data: Option<&[u8]>| {
        data.map(|d| {
            let p = dir.path().join(name);
            std::fs::write(&p, d).unwrap();
            p
        })
    };
    let o = JwtOptions {
        private_key: write("priv.pem", private),
        public_key: write("pub.pem", public),
        sign_method: method,
        ttl: Duration::from_secs(300),
    };
    (dir, o)
}

fn build(method: SignMethod, private: Option<&[u8]>, public: Option<&[u8]>) -> JwtTokens {
    let (_dir, o) = opts(method, private, public);
    JwtTokens::new(&o).unwrap_or_else(|e| panic!("{method}: {e}"))
}

fn build_err(method: SignMethod, private: Option<&[u8]>, public: Option<&[u8]>) -> String {
    let (_dir, o) = opts(method, private, public);
    JwtTokens::new(&o).expect_err("expected a configuration error")
}

fn signer(method: SignMethod) -> JwtTokens {
    build(method, Some(&key_for(method).private), None)
}

fn verifier(method: SignMethod) -> JwtTokens {
    build(method, None, Some(&key_for(method).public))
}

fn b64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (i, &b)| acc | (u32::from(b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

fn payload_of(token: &str) -> Value {
    jsonwebtoken::dangerous::insecure_decode::<Value>(token).unwrap().claims
}

/// Signs arbitrary claims with the real private key of `t` (for malformed-claims tests).
fn sign_claims(t: &JwtTokens, claims: &Value) -> String {
    jsonwebtoken::encode(&Header::new(t.algorithm), claims, t.encoding_key.as_ref().unwrap()).unwrap()
}

fn invalid(t: &JwtTokens, token: &str) {
    assert_eq!(t.verify(token), Err(EtcdError::InvalidAuthToken), "accepted {:?}", &token[..token.len().min(200)]);
}

#[test]
fn round_trip_every_supported_method() {
    // Every method but ES512 (see `es512_is_refused_clearly`).
    assert_eq!(supported().len(), SignMethod::ALL.len() - 1);
    for method in supported() {
        let keys = key_for(method);
        let t = signer(method);
        assert!(!t.is_verify_only());
        assert_eq!(t.sign_method(), method);
        let token = t.sign("alice", 42).unwrap();
        assert_eq!(t.verify(&token), Ok(("alice".to_string(), 42)), "{method}");
        // Both keys: sign with priv, verify with pub.
        let both = build(method, Some(&keys.private), Some(&keys.public));
        assert_eq!(both.verify(&token), Ok(("alice".to_string(), 42)));
        let token2 = both.sign("bob", 7).unwrap();
        assert_eq!(t.verify(&token2), Ok(("bob".to_string(), 7)));
        // Verify-only.
        let v = verifier(method);
        assert_eq!(v.verify(&token), Ok(("alice".to_string(), 42)));
        // The header names the method.
        let header = jsonwebtoken::decode_header(&token).unwrap();
        assert_eq!(header.alg, algorithm_of(method).unwrap());
    }
}

#[test]
fn es512_is_refused_clearly() {
    let e = build_err(SignMethod::ES512, Some(&p384().private), None);
    assert!(e.contains("ES512") && e.contains("not supported"), "{e}");
}

#[test]
fn claims_are_etcds() {
    let t = signer(SignMethod::RS256);
    let before = unix_now();
    let token = t.sign("alice", u64::MAX).unwrap();
    let claims = payload_of(&token);
    let obj = claims.as_object().unwrap();
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["exp", "revision", "username"]);
    assert_eq!(claims["username"], "alice");
    assert_eq!(claims["revision"], u64::MAX);
    let exp = claims["exp"].as_u64().unwrap();
    assert!(exp >= before + 300 && exp <= unix_now() + 300, "{exp}");
    assert_eq!(t.verify(&token), Ok(("alice".to_string(), u64::MAX)));
    // Non-ASCII and empty user names survive the round trip.
    for name in ["jürgen/管理者", ""] {
        let token = t.sign(name, 1).unwrap();
        assert_eq!(t.verify(&token), Ok((name.to_string(), 1)));
    }
}

#[test]
fn etcd_shaped_token_is_accepted() {
    // What etcd 3.4 (golang-jwt v3, MapClaims) produces: header {"alg","typ"} sorted, integers.
    let t = signer(SignMethod::ES256);
    let exp = unix_now() + 60;
    let token = sign_claims(&t, &json!({"exp": exp, "revision": 5, "username": "root", "extra": [1, 2]}));
    assert_eq!(t.verify(&token), Ok(("root".to_string(), 5)));
}

#[test]
fn verify_only_mode() {
    let v = verifier(SignMethod::PS256);
    assert!(v.is_verify_only());
    assert_eq!(
        v.sign("alice", 1),
        Err(EtcdError::Unsupported("auth: token signing attempted with verify-only key".into()))
    );
    let token = signer(SignMethod::PS256).sign("alice", 1).unwrap();
    assert_eq!(v.verify(&token), Ok(("alice".to_string(), 1)));
}

#[test]
fn rejects_alg_none() {
    for method in [SignMethod::RS256, SignMethod::ES256, SignMethod::EdDSA] {
        let t = signer(method);
        let good = t.sign("root", 1).unwrap();
        let payload = good.split('.').nth(1).unwrap();
        let sig = good.split('.').nth(2).unwrap();
        for header in [
            r#"{"alg":"none","typ":"JWT"}"#,
            r#"{"alg":"None"}"#,
            r#"{"alg":"NONE"}"#,
            r#"{"typ":"JWT"}"#,
            r#"{"alg":null}"#,
            r#"{"alg":""}"#,
        ] {
            let h = b64(header.as_bytes());
            invalid(&t, &format!("{h}.{payload}."));
            invalid(&t, &format!("{h}.{payload}.{sig}"));
            invalid(&t, &format!("{h}.{payload}"));
        }
    }
}

#[test]
fn rejects_hmac_key_confusion() {
    // The classic attack: HS256 with the (public) verification key's PEM bytes as the secret.
    for method in [SignMethod::RS256, SignMethod::ES256, SignMethod::EdDSA] {
        let keys = key_for(method);
        let claims = json!({"exp": unix_now() + 300, "revision": 1, "username": "root"});
        for secret in [&keys.public, &keys.private] {
            for alg in [Algorithm::HS256, Algorithm::HS384, Algorithm::HS512] {
                let forged =
                    jsonwebtoken::encode(&Header::new(alg), &claims, &EncodingKey::from_secret(secret)).unwrap();
                invalid(&signer(method), &forged);
                invalid(&verifier(method), &forged);
            }
        }
    }
}

#[test]
fn rejects_other_alg_with_same_key() {
    // Signed by the same RSA key, but with a method other than the configured one.
    let rs256 = signer(SignMethod::RS256);
    for other in [SignMethod::RS384, SignMethod::RS512, SignMethod::PS256, SignMethod::PS512] {
        let token = signer(other).sign("root", 1).unwrap();
        invalid(&rs256, &token);
        invalid(&verifier(SignMethod::RS256), &token);
    }
    let ps256 = signer(SignMethod::PS256);
    invalid(&ps256, &rs256.sign("root", 1).unwrap());
    // A token whose header says RS256 but whose signature is PS256 (same key, same bytes signed).
    let ps = ps256.sign("root", 1).unwrap();
    let rs = rs256.sign("root", 1).unwrap();
    let mut ps_parts = ps.split('.');
    let (_, ps_payload, ps_sig) = (ps_parts.next().unwrap(), ps_parts.next().unwrap(), ps_parts.next().unwrap());
    let rs_header = rs.split('.').next().unwrap();
    invalid(&rs256, &format!("{rs_header}.{ps_payload}.{ps_sig}"));
}

#[test]
fn rejects_missing_and_mistyped_claims() {
    let t = signer(SignMethod::ES256);
    let exp = unix_now() + 300;
    let cases = [
        json!({"revision": 1, "exp": exp}),
        json!({"username": "root", "exp": exp}),
        json!({"username": "root", "revision": 1}),
        json!({}),
        json!({"username": 5, "revision": 1, "exp": exp}),
        json!({"username": null, "revision": 1, "exp": exp}),
        json!({"username": ["root"], "revision": 1, "exp": exp}),
        json!({"username": "root", "revision": "1", "exp": exp}),
        json!({"username": "root", "revision": -1, "exp": exp}),
        json!({"username": "root", "revision": 1.5, "exp": exp}),
        json!({"username": "root", "revision": null, "exp": exp}),
        json!({"username": "root", "revision": 1, "exp": exp.to_string()}),
        json!({"username": "root", "revision": 1, "exp": -1}),
        json!({"username": "root", "revision": 1, "exp": null}),
        json!({"username": "root", "revision": 1, "exp": exp, "nbf": "0"}),
        json!({"username": "root", "revision": 1, "exp": exp, "iat": "0"}),
        json!(["root", 1, exp]),
        json!("root"),
        json!(null),
    ];
    for claims in cases {
        let token = sign_claims(&t, &claims);
        assert_eq!(t.verify(&token), Err(EtcdError::InvalidAuthToken), "{claims}");
    }
    // Duplicate claim names are refused rather than resolved.
    let h = b64(br#"{"alg":"ES256","typ":"JWT"}"#);
    let p = b64(format!(r#"{{"username":"a","username":"root","revision":1,"exp":{exp}}}"#).as_bytes());
    let sig =
        jsonwebtoken::crypto::sign(format!("{h}.{p}").as_bytes(), t.encoding_key.as_ref().unwrap(), Algorithm::ES256)
            .unwrap();
    invalid(&t, &format!("{h}.{p}.{sig}"));
    // Sanity: the same construction with a well-formed payload is accepted.
    let p = b64(format!(r#"{{"username":"root","revision":1,"exp":{exp}}}"#).as_bytes());
    let sig =
        jsonwebtoken::crypto::sign(format!("{h}.{p}").as_bytes(), t.encoding_key.as_ref().unwrap(), Algorithm::ES256)
            .unwrap();
    assert_eq!(t.verify(&format!("{h}.{p}.{sig}")), Ok(("root".to_string(), 1)));
}

#[test]
fn expiry_is_strict_like_etcd() {
    let t = signer(SignMethod::EdDSA);
    let now = unix_now();
    // etcd 3.4 (jwt-go v3): valid while now <= exp, no leeway.
    let at_now = sign_claims(&t, &json!({"username": "u", "revision": 1, "exp": now}));
    assert_eq!(t.verify_uncached(&at_now, now).unwrap().exp, now);
    assert!(t.verify_uncached(&at_now, now + 1).is_err());
    let expired = sign_claims(&t, &json!({"username": "u", "revision": 1, "exp": now - 1}));
    invalid(&t, &expired);
    let long_ago = sign_claims(&t, &json!({"username": "u", "revision": 1, "exp": 1}));
    invalid(&t, &long_ago);
    let zero = sign_claims(&t, &json!({"username": "u", "revision": 1, "exp": 0}));
    invalid(&t, &zero);
    // nbf / iat in the future are refused, in the past accepted.
    let exp = now + 300;
    let ok = sign_claims(&t, &json!({"username": "u", "revision": 1, "exp": exp, "nbf": now - 5, "iat": now - 5}));
    assert_eq!(t.verify(&ok), Ok(("u".to_string(), 1)));
    for (k, v) in [("nbf", now + 100), ("iat", now + 100)] {
        let mut c = json!({"username": "u", "revision": 1, "exp": exp});
        c[k] = json!(v);
        invalid(&t, &sign_claims(&t, &c));
    }
    // A token issued by sign() is valid for ttl and not after.
    let token = t.sign_at("u", 3, now).unwrap();
    assert!(t.verify_uncached(&token, now + 300).is_ok());
    assert!(t.verify_uncached(&token, now + 301).is_err());
}

#[test]
fn rejects_bad_signatures_and_foreign_keys() {
    for (method, other) in [
        (SignMethod::RS256, rsa_b()),
        (SignMethod::PS384, rsa_b()),
        (SignMethod::ES256, p256_b()),
        (SignMethod::EdDSA, ed_b()),
    ] {
        let t = signer(method);
        let token = t.sign("root", 9).unwrap();
        let (message, sig) = token.rsplit_once('.').unwrap();
        // Flip one signature character (not the last, whose low bits may be padding).
        let mut bytes = sig.as_bytes().to_vec();
        bytes[3] = if bytes[3] == b'A' { b'B' } else { b'A' };
        let flipped = String::from_utf8(bytes).unwrap();
        invalid(&t, &format!("{message}.{flipped}"));
        // Signature from another token.
        let other_sig = t.sign("mallory", 9).unwrap();
        let other_sig = other_sig.rsplit_once('.').unwrap().1;
        invalid(&t, &format!("{message}.{other_sig}"));
        // Payload changed, signature kept.
        let header = message.split('.').next().unwrap();
        let forged = b64(format!(r#"{{"exp":{},"revision":9,"username":"root2"}}"#, unix_now() + 300).as_bytes());
        invalid(&t, &format!("{header}.{forged}.{sig}"));
        // Empty signature.
        invalid(&t, &format!("{message}."));
        // Signed by another key of the same kind.
        let foreign = build(method, Some(&other.private), None).sign("root", 9).unwrap();
        invalid(&t, &foreign);
        invalid(&verifier(method), &foreign);
    }
}

#[test]
fn rejects_garbage() {
    let t = signer(SignMethod::RS256);
    let token = t.sign("root", 1).unwrap();
    for junk in [
        "",
        ".",
        "..",
        "...",
        "a",
        "a.b",
        "a.b.c",
        "a.b.c.d",
        "simple.token.1",
        "eyJhbGciOiJSUzI1NiJ9..",
        "eyJhbGciOiJSUzI1NiJ9.e30.",
        "\u{0}\u{0}.\u{0}.\u{0}",
        "é.é.é",
        "  ",
        "Bearer x.y.z",
    ] {
        invalid(&t, junk);
    }
    // Every proper prefix of a valid token.
    for cut in 0..token.len() {
        invalid(&t, &token[..cut]);
    }
    // Extra parts, whitespace, padding.
    invalid(&t, &format!("{token}."));
    invalid(&t, &format!("{token}.x"));
    invalid(&t, &format!(" {token}"));
    invalid(&t, &format!("{token}\n"));
    invalid(&t, &format!("{token}="));
    invalid(&t, &format!("Bearer {token}"));
    // Header that is not JSON / not an object.
    let (_, rest) = token.split_once('.').unwrap();
    for h in ["not json", "[]", "1", r#"{"alg":"RS256""#] {
        invalid(&t, &format!("{}.{rest}", b64(h.as_bytes())));
    }
}

/// Tokens longer than `MAX_TOKEN_LEN` are refused before any parsing: also a correctly signed one (a
/// user name long enough to carry it past the limit), which shows the length check itself refuses.
#[test]
fn rejects_huge_tokens() {
    let t = signer(SignMethod::RS256);
    let token = t.sign("root", 1).unwrap();
    let long_name = |len: usize| "u".repeat(len);
    let within = t.sign(&long_name(MAX_TOKEN_LEN / 2), 1).unwrap();
    assert!(within.len() <= MAX_TOKEN_LEN);
    assert!(t.verify(&within).is_ok(), "a long token within the limit is accepted");
    let beyond = t.sign(&long_name(MAX_TOKEN_LEN), 1).unwrap();
    assert!(beyond.len() > MAX_TOKEN_LEN);
    assert!(t.verify_uncached(&beyond, unix_now()).is_err());
    invalid(&t, &beyond);
    let junk = "A".repeat(10 * 1024 * 1024);
    invalid(&t, &junk);
    invalid(&t, &format!("{token}{junk}"));
    let (message, sig) = token.rsplit_once('.').unwrap();
    invalid(&t, &format!("{message}.{sig}{junk}"));
    invalid(&t, &format!("{}.{}.{sig}", b64(b"{\"alg\":\"RS256\"}"), junk));
    assert_eq!(t.lock_cache().len(), 1, "only the token within the limit was cached");
}

#[test]
fn cache_remembers_successes_only_and_honours_expiry() {
    let t = signer(SignMethod::ES256);
    let now = unix_now();
    let token = t.sign_at("alice", 4, now).unwrap();
    invalid(&t, "a.b.c");
    assert_eq!(t.lock_cache().len(), 0);
    assert_eq!(t.verify_at(&token, now), Ok(("alice".to_string(), 4)));
    assert_eq!(t.lock_cache().len(), 1);
    // A hit does not re-verify: it answers from the cache ...
    assert_eq!(t.verify_at(&token, now + 300), Ok(("alice".to_string(), 4)));
    assert_eq!(t.lock_cache().len(), 1);
    // ... but never past the token's own expiry, and the stale entry is dropped.
    assert_eq!(t.verify_at(&token, now + 301), Err(EtcdError::InvalidAuthToken));
    assert_eq!(t.lock_cache().len(), 0);
    assert_eq!(t.verify_at(&token, now + 301), Err(EtcdError::InvalidAuthToken));
    assert_eq!(t.lock_cache().len(), 0);
}

#[test]
fn cache_is_bounded() {
    let mut t = signer(SignMethod::EdDSA);
    t.cache_capacity = 20;
    let now = unix_now();
    // Token i expires at now + ttl + i: later tokens live longer.
    let tokens: Vec<String> = (0..100).map(|i| t.sign_at(&format!("user{i}"), i, now + i).unwrap()).collect();
    for (i, token) in tokens.iter().enumerate() {
        assert_eq!(t.verify_at(token, now), Ok((format!("user{i}"), i as u64)));
        assert!(t.lock_cache().len() <= 20);
    }
    // A full cache drops the entries that expire soonest: the newest token stayed, the oldest went.
    assert!(t.lock_cache().contains_key(&tokens[99]));
    assert!(!t.lock_cache().contains_key(&tokens[0]));
    // Evicted tokens still verify (they are simply checked again).
    for (i, token) in tokens.iter().enumerate() {
        assert_eq!(t.verify_at(token, now), Ok((format!("user{i}"), i as u64)));
    }
    // Expired entries are swept first when the cache is full: fill it exactly, then verify a token
    // at a time when every cached one has expired.
    t.lock_cache().clear();
    for token in &tokens[..20] {
        assert!(t.verify_at(token, now).is_ok());
    }
    assert_eq!(t.lock_cache().len(), 20);
    let fresh = t.sign_at("late", 1, now + 1000).unwrap();
    assert_eq!(t.verify_at(&fresh, now + 1000), Ok(("late".to_string(), 1)));
    assert_eq!(t.lock_cache().len(), 1);
    // Capacity zero disables caching.
    t.cache_capacity = 0;
    t.lock_cache().clear();
    assert!(t.verify_at(&fresh, now + 1000).is_ok());
    assert_eq!(t.lock_cache().len(), 0);
}

#[test]
fn concurrent_use() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<JwtTokens>();
    let t = signer(SignMethod::ES256);
    let tokens: Vec<String> = (0..8).map(|i| t.sign(&format!("u{i}"), i).unwrap()).collect();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..5 {
                    for (i, token) in tokens.iter().enumerate() {
                        assert_eq!(t.verify(token), Ok((format!("u{i}"), i as u64)));
                    }
                    assert!(t.sign("x", 1).is_ok());
                    invalid(&t, "x.y.z");
                }
            });
        }
    });
}

#[test]
fn key_configuration_errors() {
    let rsa = rsa_a();
    // Missing file.
    let o = JwtOptions {
        private_key: Some("/nonexistent/priv.pem".into()),
        public_key: None,
        sign_method: SignMethod::RS256,
        ttl: Duration::from_secs(300),
    };
    let e = JwtTokens::new(&o).unwrap_err();
    assert!(e.contains("/nonexistent/priv.pem"), "{e}");
    // No key at all.
    let (_d, mut o) = opts(SignMethod::RS256, None, None);
    assert!(JwtTokens::new(&o).unwrap_err().contains("priv-key"));
    o.ttl = Duration::ZERO;
    assert!(JwtTokens::new(&o).is_err());
    // Mismatched pairs, for every key kind.
    for (m, a, b) in [
        (SignMethod::RS256, rsa_a(), rsa_b()),
        (SignMethod::ES256, p256_a(), p256_b()),
        (SignMethod::EdDSA, ed_a(), ed_b()),
    ] {
        let e = build_err(m, Some(&a.private), Some(&b.public));
        assert!(e.contains("does not match"), "{m}: {e}");
    }
    // Public key given as the private key and vice versa (etcd's tests check these too).
    for m in [SignMethod::RS256, SignMethod::ES256, SignMethod::EdDSA] {
        let k = key_for(m);
        let e = build_err(m, Some(&k.public), None);
        assert!(e.contains("priv-key") && e.contains("private key"), "{m}: {e}");
        let e = build_err(m, Some(&k.public), Some(&k.public));
        assert!(e.contains("priv-key"), "{m}: {e}");
        let e = build_err(m, None, Some(&k.private));
        assert!(e.contains("pub-key") && e.contains("public key"), "{m}: {e}");
        let e = build_err(m, Some(&k.private), Some(&k.private));
        assert!(e.contains("pub-key"), "{m}: {e}");
    }
    // Key of the wrong kind or curve for the method.
    for (m, k) in [
        (SignMethod::RS256, p256_a()),
        (SignMethod::RS256, ed_a()),
        (SignMethod::PS256, p256_a()),
        (SignMethod::ES256, rsa),
        (SignMethod::ES256, p384()),
        (SignMethod::ES384, p256_a()),
        (SignMethod::ES256, ed_a()),
        (SignMethod::EdDSA, rsa),
        (SignMethod::EdDSA, p256_a()),
    ] {
        build_err(m, Some(&k.private), None);
        build_err(m, None, Some(&k.public));
    }
    // Not PEM at all.
    for m in [SignMethod::RS256, SignMethod::ES256, SignMethod::EdDSA] {
        build_err(m, Some(b"hello"), None);
        build_err(m, None, Some(b""));
        build_err(m, Some(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"), None);
    }
}

#[test]
fn key_formats() {
    // PKCS#1 RSA private key ("BEGIN RSA PRIVATE KEY") works.
    let pkcs1 = openssl(&["pkey", "-traditional"], Some(&rsa_a().private));
    assert!(String::from_utf8_lossy(&pkcs1).contains("BEGIN RSA PRIVATE KEY"));
    let t = build(SignMethod::RS256, Some(&pkcs1), Some(&rsa_a().public));
    let token = t.sign("a", 1).unwrap();
    assert!(verifier(SignMethod::RS256).verify(&token).is_ok());
    // SEC1 EC private key ("BEGIN EC PRIVATE KEY") is refused with a hint.
    let sec1 = openssl(&["pkey", "-traditional"], Some(&p256_a().private));
    assert!(String::from_utf8_lossy(&sec1).contains("BEGIN EC PRIVATE KEY"));
    let e = build_err(SignMethod::ES256, Some(&sec1), None);
    assert!(e.contains("PKCS#8"), "{e}");
    // An X.509 certificate as pub-key (as etcd's own tests configure it).
    for m in [SignMethod::RS256, SignMethod::ES256] {
        let k = key_for(m);
        let dir = tempfile::tempdir().unwrap();
        let key_path = dir.path().join("k.pem");
        std::fs::write(&key_path, &k.private).unwrap();
        let cert = openssl(
            &["req", "-x509", "-new", "-key", key_path.to_str().unwrap(), "-subj", "/CN=keyward-test", "-days", "1"],
            None,
        );
        let both = build(m, Some(&k.private), Some(&cert));
        let token = both.sign("a", 2).unwrap();
        let v = build(m, None, Some(&cert));
        assert_eq!(v.verify(&token), Ok(("a".to_string(), 2)));
        let other = if m == SignMethod::RS256 { rsa_b() } else { p256_b() };
        let e = build_err(m, Some(&other.private), Some(&cert));
        assert!(e.contains("does not match"), "{e}");
    }
}
