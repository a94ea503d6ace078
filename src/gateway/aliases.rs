//! etcd 3.4's older spelling of the gateway's paths: `/v3beta/...` is served as `/v3/...` (etcd's
//! access controller rewrites the path before its mux sees it, for clients written against etcd 3.3).
//! Applied to a listener's whole router, ahead of routing, so every gateway path has it.

use std::convert::Infallible;

use axum::extract::Request;
use axum::response::Response;
use axum::Router;
use http::Uri;
use tonic::codegen::Service;

const OLD_PREFIX: &str = "/v3beta/";
const PREFIX: &str = "/v3/";

/// `router`, with `/v3beta/` paths routed as `/v3/`.
pub(crate) fn with_v3beta_paths(router: Router) -> Router {
    // A layer on the router would run after routing: the rewrite runs in front of it instead, as the
    // one handler of a router of no routes.
    Router::new().fallback(move |mut request: Request| {
        let mut inner = router.clone();
        async move {
            if let Some(uri) = v3_uri(request.uri()) {
                *request.uri_mut() = uri;
            }
            // An axum router is always ready, and never fails.
            let answered: Result<Response, Infallible> = inner.call(request).await;
            answered.unwrap_or_else(|never| match never {})
        }
    })
}

/// The `/v3/` URI for a `/v3beta/` one (query kept); `None` for any other.
fn v3_uri(uri: &Uri) -> Option<Uri> {
    let rest = uri.path().strip_prefix(OLD_PREFIX)?;
    let path_and_query = match uri.query() {
        Some(query) => format!("{PREFIX}{rest}?{query}"),
        None => format!("{PREFIX}{rest}"),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(path_and_query.parse().ok()?);
    Uri::from_parts(parts).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_v3beta_paths_are_rewritten() {
        let uri = |s: &str| s.parse::<Uri>().unwrap();
        assert_eq!(v3_uri(&uri("/v3beta/kv/range")), Some(uri("/v3/kv/range")));
        assert_eq!(v3_uri(&uri("/v3beta/kv/range?x=1")), Some(uri("/v3/kv/range?x=1")));
        assert_eq!(v3_uri(&uri("/v3/kv/range")), None);
        assert_eq!(v3_uri(&uri("/v3beta")), None);
        assert_eq!(v3_uri(&uri("/etcdserverpb.KV/Range")), None);
    }
}
