//! What the gateway writes back, byte-compatible with etcd 3.4's gateway (grpc-gateway v1 with its
//! default `JSONPb{OrigName: true}` marshaller):
//! - a unary answer: the response message as proto3 JSON;
//! - an error: `{"error": msg, "message": msg, "code": grpc code}` with the HTTP status grpc-gateway
//!   maps the code to (`HTTPStatusFromCode`), except that credentials in the `Authorization` header
//!   that fail to verify are 401;
//! - a stream: one `{"result": message}` per line; a stream that fails ends with
//!   `{"error": {"grpc_code", "http_code", "message", "http_status"}}` (no newline).

use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use http::header::{CONTENT_TYPE, WWW_AUTHENTICATE};
use http::{HeaderValue, StatusCode};
use serde::Serialize;
use tonic::{Code, Status};

use crate::error::EtcdError;

const JSON: HeaderValue = HeaderValue::from_static("application/json");
/// The challenge a 401 carries, so HTTP clients know Basic credentials are accepted.
const CHALLENGE: HeaderValue = HeaderValue::from_static("Basic realm=\"keyward\", charset=\"UTF-8\"");

/// A refused request: etcd's status, and the HTTP status it is answered with.
#[derive(Debug)]
pub(super) struct Failure {
    pub status: Status,
    pub http: StatusCode,
}

impl Failure {
    /// A failure with grpc-gateway's HTTP status for its code.
    pub(super) fn new(status: Status) -> Failure {
        let http = http_status(status.code());
        Failure { status, http }
    }

    /// Credentials from the `Authorization` header that did not verify: 401, whatever etcd's code.
    pub(super) fn unauthorized(status: Status) -> Failure {
        Failure { status, http: StatusCode::UNAUTHORIZED }
    }

    /// A request body that is not the JSON of the request message (grpc-gateway: InvalidArgument).
    pub(super) fn bad_body(why: impl std::fmt::Display) -> Failure {
        Failure::new(Status::invalid_argument(why.to_string()))
    }
}

impl From<Status> for Failure {
    fn from(status: Status) -> Failure {
        Failure::new(status)
    }
}

impl From<EtcdError> for Failure {
    fn from(error: EtcdError) -> Failure {
        Failure::new(error.into())
    }
}

/// grpc-gateway's `errorBody`, in its field order.
#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    message: &'a str,
    code: i32,
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let message = self.status.message();
        let body = ErrorBody { error: message, message, code: self.status.code() as i32 };
        let mut response = (self.http, [(CONTENT_TYPE, JSON)], to_json(&body)).into_response();
        if self.http == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(WWW_AUTHENTICATE, CHALLENGE);
        }
        response
    }
}

/// A unary answer.
pub(super) fn message<M: Serialize>(message: &M) -> Response {
    (StatusCode::OK, [(CONTENT_TYPE, JSON)], to_json(message)).into_response()
}

/// A streamed answer: `status`, and the chunks as they come.
pub(super) fn stream(status: StatusCode, chunks: impl futures::Stream<Item = Bytes> + Send + 'static) -> Response {
    let body = axum::body::Body::from_stream(futures::StreamExt::map(chunks, Ok::<_, std::convert::Infallible>));
    (status, [(CONTENT_TYPE, JSON)], body).into_response()
}

/// One message of a stream: `{"result": ...}` and a newline.
pub(super) fn stream_result<M: Serialize>(message: &M) -> Bytes {
    #[derive(Serialize)]
    struct Chunk<'a, M> {
        result: &'a M,
    }
    let mut line = to_json(&Chunk { result: message });
    line.push(b'\n');
    Bytes::from(line)
}

/// The last chunk of a stream that failed.
pub(super) fn stream_error(status: &Status) -> Bytes {
    #[derive(Serialize)]
    struct StreamError<'a> {
        #[serde(skip_serializing_if = "is_zero")]
        grpc_code: i32,
        #[serde(skip_serializing_if = "is_zero")]
        http_code: i32,
        #[serde(skip_serializing_if = "str::is_empty")]
        message: &'a str,
        #[serde(skip_serializing_if = "str::is_empty")]
        http_status: &'a str,
    }
    #[derive(Serialize)]
    struct Chunk<'a> {
        error: StreamError<'a>,
    }
    let http = http_status(status.code());
    let error = StreamError {
        grpc_code: status.code() as i32,
        http_code: i32::from(http.as_u16()),
        message: status.message(),
        http_status: http.canonical_reason().unwrap_or(""),
    };
    Bytes::from(to_json(&Chunk { error }))
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

fn to_json<T: Serialize>(value: &T) -> Vec<u8> {
    // Every value the gateway writes is a generated message or a plain struct of strings and numbers,
    // which serde_json always serialises; an error here would be a bug in generated code.
    serde_json::to_vec(value).unwrap_or_else(|e| {
        tracing::error!(error = %e, "cannot serialise a gateway response");
        br#"{"error":"failed to marshal error message"}"#.to_vec()
    })
}

/// grpc-gateway v1's `HTTPStatusFromCode`.
pub(super) fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::Cancelled => StatusCode::REQUEST_TIMEOUT,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::FailedPrecondition => StatusCode::PRECONDITION_FAILED,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body(response: Response) -> (StatusCode, Option<HeaderValue>, String) {
        let status = response.status();
        let challenge = response.headers().get(WWW_AUTHENTICATE).cloned();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (status, challenge, String::from_utf8(bytes.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn errors_have_grpc_gateways_shape_and_status() {
        let (status, challenge, text) = body(Failure::from(EtcdError::PermissionDenied).into_response()).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert_eq!(challenge, None);
        assert_eq!(
            text,
            r#"{"error":"etcdserver: permission denied","message":"etcdserver: permission denied","code":7}"#
        );
        let (status, _, _) = body(Failure::from(EtcdError::UserEmpty).into_response()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
    }

    #[tokio::test]
    async fn bad_credentials_are_401_with_a_basic_challenge_and_etcds_code() {
        let (status, challenge, text) = body(Failure::unauthorized(EtcdError::AuthFailed.into()).into_response()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(challenge.unwrap().to_str().unwrap().starts_with("Basic "));
        assert!(text.ends_with(r#""code":3}"#), "{text}");
        let (status, challenge, _) = body(Failure::from(EtcdError::InvalidAuthToken).into_response()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(challenge.is_some());
    }

    #[test]
    fn stream_chunks() {
        let resp = crate::proto::etcdserverpb::WatchResponse { watch_id: -1, created: true, ..Default::default() };
        assert_eq!(&stream_result(&resp)[..], b"{\"result\":{\"watch_id\":\"-1\",\"created\":true}}\n");
        assert_eq!(
            &stream_error(&EtcdError::InvalidAuthToken.into())[..],
            br#"{"error":{"grpc_code":16,"http_code":401,"message":"etcdserver: invalid auth token","http_status":"Unauthorized"}}"#
        );
    }
}
