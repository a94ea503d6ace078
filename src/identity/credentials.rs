//! What a gateway request's `Authorization` header presents: nothing, an etcd token (etcd's gateway
//! forwards the header's value as the token), or `Basic base64(user:password)`.

use base64::Engine as _;
use http::header::AUTHORIZATION;
use http::HeaderMap;

use crate::error::EtcdError;

/// The credentials a request presents in its header, parsed once at the edge.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Credentials {
    /// No `Authorization` header: the connection's certificate identity, if any, applies.
    None,
    /// `Authorization: <token>`, a token from Authenticate, as etcd's gateway takes it.
    Token(String),
    /// `Authorization: Basic ...`: a user name and password.
    Basic(Basic),
}

/// A user name and password from `Authorization: Basic`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Basic {
    pub user: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    // Never prints a password or a token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::None => f.write_str("None"),
            Credentials::Token(_) => f.write_str("Token(..)"),
            Credentials::Basic(basic) => write!(f, "Basic({:?}, ..)", basic.user),
        }
    }
}

impl Credentials {
    /// Reads the `Authorization` header. More than one, a Basic value that is not base64 of UTF-8
    /// `user:password`, or a token that is not visible ASCII is refused, never read as "no
    /// credentials": the request would otherwise run with less (or another) identity than meant.
    pub(crate) fn from_headers(headers: &HeaderMap) -> Result<Credentials, EtcdError> {
        let mut values = headers.get_all(AUTHORIZATION).iter();
        let Some(value) = values.next() else { return Ok(Credentials::None) };
        if values.next().is_some() {
            return Err(EtcdError::InvalidAuthToken);
        }
        let bytes = value.as_bytes();
        if let Some(encoded) = strip_scheme(bytes, b"basic") {
            return Basic::decode(encoded).map(Credentials::Basic).ok_or(EtcdError::AuthFailed);
        }
        let token = value.to_str().map_err(|_| EtcdError::InvalidAuthToken)?;
        Ok(Credentials::Token(token.to_string()))
    }
}

impl Basic {
    /// RFC 7617: base64 (standard alphabet) of `user:password`; the user ends at the first colon.
    fn decode(encoded: &[u8]) -> Option<Basic> {
        let decoded = base64::engine::general_purpose::STANDARD.decode(encoded.trim_ascii()).ok()?;
        let text = String::from_utf8(decoded).ok()?;
        let (user, password) = text.split_once(':')?;
        Some(Basic { user: user.to_string(), password: password.to_string() })
    }
}

/// The rest of `value` after the auth scheme `scheme` (case-insensitive) and its space.
fn strip_scheme<'v>(value: &'v [u8], scheme: &[u8]) -> Option<&'v [u8]> {
    let (head, rest) = value.split_at_checked(scheme.len())?;
    (head.eq_ignore_ascii_case(scheme) && rest.first() == Some(&b' ')).then(|| &rest[1..])
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn parse(values: &[&[u8]]) -> Result<Credentials, EtcdError> {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(AUTHORIZATION, HeaderValue::from_bytes(v).unwrap());
        }
        Credentials::from_headers(&headers)
    }

    fn basic(user: &str, password: &str) -> Credentials {
        Credentials::Basic(Basic { user: user.into(), password: password.into() })
    }

    #[test]
    fn basic_credentials_split_at_the_first_colon() {
        // "alice:pa:ss" and "bob:" in base64.
        assert_eq!(parse(&[b"Basic YWxpY2U6cGE6c3M="]), Ok(basic("alice", "pa:ss")));
        assert_eq!(parse(&[b"basic Ym9iOg=="]), Ok(basic("bob", "")));
        assert_eq!(parse(&[b"BASIC Ym9iOg=="]), Ok(basic("bob", "")));
    }

    #[test]
    fn malformed_basic_credentials_are_refused() {
        for bad in [&b"Basic !!!"[..], b"Basic YWxpY2U=" /* no colon */, b"Basic /w==" /* not UTF-8 */] {
            assert_eq!(parse(&[bad]), Err(EtcdError::AuthFailed), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn anything_else_is_an_etcd_token() {
        assert_eq!(parse(&[]), Ok(Credentials::None));
        assert_eq!(parse(&[b"kWzJzYFbMSkWfGyH.12"]), Ok(Credentials::Token("kWzJzYFbMSkWfGyH.12".into())));
        // Not the Basic scheme: a token that merely starts with the letters.
        assert_eq!(parse(&[b"Basically"]), Ok(Credentials::Token("Basically".into())));
        assert_eq!(parse(&[b"tok\xffen"]), Err(EtcdError::InvalidAuthToken));
        assert_eq!(parse(&[b"a", b"b"]), Err(EtcdError::InvalidAuthToken), "two headers");
    }

    #[test]
    fn debug_output_hides_secrets() {
        let shown = format!("{:?} {:?}", basic("alice", "secret"), Credentials::Token("tok".into()));
        assert!(!shown.contains("secret") && !shown.contains("tok)"), "{shown}");
    }
}
