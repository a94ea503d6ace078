//! The streaming paths: `/v3/watch` and `/v3/lease/keepalive` (each JSON value of the body is one
//! request, sent as it arrives; the end of the body half-closes the stream, which stays open for
//! answers, as with etcd) and `/v3/maintenance/snapshot` (one request). Answers are written one per
//! line as they come, as etcd's gateway writes them.

use std::future::Future;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{post, MethodRouter};
use futures::StreamExt;
use http::StatusCode;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::service::Routes;
use tonic::{Status, Streaming};

use super::calls::{call_request, Gateway};
use super::reply::{self, Failure};
use super::request_body;
use crate::identity::credentials::Credentials;

/// Requests read from the body ahead of the stream taking them.
const REQUESTS_IN_FLIGHT: usize = 16;

/// `POST` handler for a bidirectional stream `call`.
pub(super) fn bidirectional<Req, Resp, F, Fut>(call: F) -> MethodRouter<Gateway>
where
    Req: DeserializeOwned + Send + 'static,
    Resp: Serialize + Send + 'static,
    F: Fn(Routes, tonic::Request<ReceiverStream<Req>>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<tonic::Response<Streaming<Resp>>, Status>> + Send + 'static,
{
    post(move |State(gateway): State<Gateway>, request: Request| {
        let call = call.clone();
        async move { gateway.bidirectional(request, call).await.unwrap_or_else(IntoResponse::into_response) }
    })
    .fallback(super::unknown_path::gateway_method_not_allowed)
}

/// `POST` handler for a server stream `call` (one request, many answers).
pub(super) fn server_stream<Req, Resp, F, Fut>(call: F) -> MethodRouter<Gateway>
where
    Req: DeserializeOwned + Default + Send + 'static,
    Resp: Serialize + Send + 'static,
    F: Fn(Routes, tonic::Request<Req>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<tonic::Response<Streaming<Resp>>, Status>> + Send + 'static,
{
    post(move |State(gateway): State<Gateway>, request: Request| {
        let call = call.clone();
        async move {
            let answer = async {
                let (parts, body) = request.into_parts();
                let credentials = credentials(&parts.headers)?;
                let message: Req = request_body::one(body, gateway.body_limit()).await?;
                let token = gateway.stream_token(&credentials, &parts.extensions).await?;
                let answers = call(gateway.grpc(), call_request(message, &parts.extensions, token.value())?).await?;
                Ok::<_, Failure>(relay(answers.into_inner()).await)
            };
            answer.await.unwrap_or_else(IntoResponse::into_response)
        }
    })
    .fallback(super::unknown_path::gateway_method_not_allowed)
}

fn credentials(headers: &http::HeaderMap) -> Result<Credentials, Failure> {
    Credentials::from_headers(headers).map_err(|e| Failure::unauthorized(e.into()))
}

impl Gateway {
    async fn bidirectional<Req, Resp, F, Fut>(&self, request: Request, call: F) -> Result<Response, Failure>
    where
        Req: DeserializeOwned + Send + 'static,
        Resp: Serialize + Send + 'static,
        F: Fn(Routes, tonic::Request<ReceiverStream<Req>>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Streaming<Resp>>, Status>>,
    {
        let (parts, body) = request.into_parts();
        let credentials = credentials(&parts.headers)?;
        let mut requests = request_body::many::<Req>(body, self.body_limit()).boxed();
        // As etcd's gateway: the first request is read before the stream opens, and a bad one is a
        // plain error answer; a bad later one ends the client's side of the stream.
        let first = requests.next().await.transpose()?;
        let (sender, input) = mpsc::channel(REQUESTS_IN_FLIGHT);
        tokio::spawn(async move {
            let Some(first) = first else { return };
            if sender.send(first).await.is_err() {
                return;
            }
            while let Some(request) = requests.next().await {
                let request = match request {
                    Ok(request) => request,
                    Err(e) => {
                        return tracing::debug!(error = %e, "gateway stream: bad request; closing the client's side")
                    }
                };
                if sender.send(request).await.is_err() {
                    return;
                }
            }
        });
        let input = ReceiverStream::new(input);
        let token = self.stream_token(&credentials, &parts.extensions).await?;
        let answers = call(self.grpc(), call_request(input, &parts.extensions, token.value())?).await?;
        Ok(relay(answers.into_inner()).await)
    }
}

/// Writes the answers as they come. The HTTP status goes out with the first answer (as Go's
/// `ResponseWriter` does): a stream that fails before answering at all gets its error's status.
async fn relay<Resp: Serialize + Send + 'static>(mut answers: Streaming<Resp>) -> Response {
    let first = match answers.next().await {
        None => return reply::stream(StatusCode::OK, futures::stream::empty()),
        Some(Err(status)) => {
            let chunk = reply::stream_error(&status);
            return reply::stream(reply::http_status(status.code()), futures::stream::once(async { chunk }));
        }
        Some(Ok(first)) => reply::stream_result(&first),
    };
    let rest = futures::stream::unfold(Some(answers), |answers| async move {
        let mut answers = answers?;
        match answers.next().await? {
            Ok(answer) => Some((reply::stream_result(&answer), Some(answers))),
            // The error is the last chunk.
            Err(status) => Some((reply::stream_error(&status), None)),
        }
    });
    reply::stream(StatusCode::OK, futures::stream::once(async { first }).chain(rest))
}
