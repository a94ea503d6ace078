//! What a client listener answers to a request no route takes, as etcd 3.4 answers it (its HTTP mux:
//! the grpc-gateway under `/v3/`, etcd's own handlers under `/`; gRPC by content type):
//! - a gRPC call of a method no service has: `Unimplemented` (HTTP 200, `grpc-status: 12`);
//! - an HTTP request under `/v3/` that is no gateway path: 404 `Not Found` (grpc-gateway's answer),
//!   and a gateway path with a method other than `POST`: 405 `Method Not Allowed`;
//! - any other HTTP path: 404 `404 page not found` (Go's `http.NotFound`);
//! - `OPTIONS` (a CORS preflight): 200 and no body, as etcd's access controller answers it first.
//!
//! The texts and headers are Go's `http.Error`'s: `text/plain; charset=utf-8`, `nosniff`, a newline.

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::header::{ALLOW, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS};
use http::{HeaderValue, Method, StatusCode};

/// The fallback of a listener's whole router (the member's; the proxy's gateway).
pub(crate) async fn unknown_path(request: Request) -> Response {
    if is_grpc(&request) {
        return tonic::Status::unimplemented("").into_http::<axum::body::Body>();
    }
    if request.method() == Method::OPTIONS {
        return StatusCode::OK.into_response();
    }
    if request.uri().path().starts_with("/v3/") {
        go_http_error(StatusCode::NOT_FOUND, "Not Found")
    } else {
        go_http_error(StatusCode::NOT_FOUND, "404 page not found")
    }
}

/// A gateway path asked with a method other than `POST` (grpc-gateway names no `Allow`).
pub(super) async fn gateway_method_not_allowed(request: Request) -> Response {
    if request.method() == Method::OPTIONS {
        return StatusCode::OK.into_response();
    }
    go_http_error(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed")
}

/// One of etcd's own `GET` endpoints (`/health`, `/version`, `/livez`, `/readyz`) asked with another
/// method: 405 naming `GET`, as etcd's handlers answer.
pub(crate) async fn get_only(request: Request) -> Response {
    if request.method() == Method::OPTIONS {
        return StatusCode::OK.into_response();
    }
    let mut response = go_http_error(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
    response.headers_mut().insert(ALLOW, HeaderValue::from_static("GET"));
    response
}

/// Go's `http.Error(w, text, status)`.
pub(crate) fn go_http_error(status: StatusCode, text: &str) -> Response {
    go_plain_text(status, format!("{text}\n"))
}

/// A `text/plain` answer with the headers Go's `http.Error` sets.
pub(crate) fn go_plain_text(status: StatusCode, body: String) -> Response {
    let headers = [
        (CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8")),
        (X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
    ];
    (status, headers, body).into_response()
}

fn is_grpc(request: &Request) -> bool {
    request.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("application/grpc"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    async fn answer(method: Method, path: &str, content_type: Option<&str>) -> (StatusCode, String, Option<String>) {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(content_type) = content_type {
            request = request.header(CONTENT_TYPE, content_type);
        }
        let response = unknown_path(request.body(Body::empty()).expect("request")).await;
        let status = response.status();
        let grpc_status = response.headers().get("grpc-status").map(|v| v.to_str().unwrap_or("").to_string());
        let body = axum::body::to_bytes(response.into_body(), 1024).await.expect("body");
        (status, String::from_utf8_lossy(&body).into_owned(), grpc_status)
    }

    #[tokio::test]
    async fn unknown_paths_get_etcds_answers() {
        assert_eq!(
            answer(Method::POST, "/v3/nonexistent", None).await,
            (StatusCode::NOT_FOUND, "Not Found\n".into(), None)
        );
        assert_eq!(
            answer(Method::GET, "/nonexistent", None).await,
            (StatusCode::NOT_FOUND, "404 page not found\n".into(), None)
        );
        assert_eq!(answer(Method::OPTIONS, "/v3/nonexistent", None).await, (StatusCode::OK, String::new(), None));
        let grpc = answer(Method::POST, "/v3lockpb.Lock/Lock", Some("application/grpc")).await;
        assert_eq!((grpc.0, grpc.2), (StatusCode::OK, Some("12".to_string())));
    }
}
