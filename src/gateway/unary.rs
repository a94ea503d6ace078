//! A unary path: the body is the request message, the answer the response message (or etcd's error).

use std::future::Future;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{post, MethodRouter};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::service::Routes;
use tonic::Status;

use super::calls::{call_request, Gateway};
use super::reply::{self, Failure};
use super::request_body;
use crate::identity::credentials::Credentials;

/// `POST` handler calling the unary method `call` (etcd's gateway registers its paths for POST).
pub(super) fn unary<Req, Resp, F, Fut>(call: F) -> MethodRouter<Gateway>
where
    Req: DeserializeOwned + Default + Clone + Send + 'static,
    Resp: Serialize + Send + 'static,
    F: Fn(Routes, tonic::Request<Req>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<tonic::Response<Resp>, Status>> + Send + 'static,
{
    post(move |State(gateway): State<Gateway>, request: Request| {
        let call = call.clone();
        async move { gateway.unary(request, call).await.unwrap_or_else(IntoResponse::into_response) }
    })
    .fallback(super::unknown_path::gateway_method_not_allowed)
}

impl Gateway {
    async fn unary<Req, Resp, F, Fut>(&self, request: Request, call: F) -> Result<Response, Failure>
    where
        Req: DeserializeOwned + Default + Clone,
        Resp: Serialize,
        F: Fn(Routes, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
    {
        let (parts, body) = request.into_parts();
        let credentials = Credentials::from_headers(&parts.headers).map_err(|e| Failure::unauthorized(e.into()))?;
        let message: Req = request_body::one(body, self.body_limit()).await?;
        let token = self.token(&credentials, &parts.extensions).await?;
        let answer = call(self.grpc(), call_request(message.clone(), &parts.extensions, token.value())?).await;
        let answer = match answer {
            // A cached login whose token went stale: verify the credentials again and retry once. The
            // member refused the first call before it did anything, so the retry cannot apply twice.
            Err(status) if self.forget_if_stale(&credentials, &token, &status).await => {
                let token = self.token(&credentials, &parts.extensions).await?;
                call(self.grpc(), call_request(message, &parts.extensions, token.value())?).await
            }
            answer => answer,
        };
        Ok(reply::message(answer?.get_ref()))
    }
}
