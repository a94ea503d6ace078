//! Request bodies without their trailers: what every listener hands on, so that metadata is the
//! request's headers and nothing else (`identity/metadata.rs`).
//!
//! Why: for a unary or server-streaming call, tonic reads the request's trailers after the message and
//! merges them into the metadata, replacing header values of the same name. A client that put
//! `keyward-forwarded-client-cert` in its trailers would have it arrive at the member after the
//! proxy's checks of the headers, looking as if the trusted proxy had sent it. gRPC clients send no
//! request trailers, and neither does an HTTP/JSON client that means anything by them, so they are
//! dropped (not refused: a refusal could come only once the body has ended, after a streaming call's
//! messages were already acted on).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

/// `B` with any trailers frame left out; data frames and errors pass unchanged.
pub(crate) struct WithoutTrailers<B> {
    inner: B,
}

impl<B> WithoutTrailers<B> {
    pub(crate) fn new(inner: B) -> WithoutTrailers<B> {
        WithoutTrailers { inner }
    }
}

impl<B> Body for WithoutTrailers<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        loop {
            match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                    Err(frame) => {
                        if let Some(trailers) = frame.trailers_ref() {
                            let names: Vec<&str> = trailers.keys().map(|name| name.as_str()).collect();
                            tracing::debug!(?names, "request trailers dropped");
                        }
                    }
                },
                other => return other,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A request with its body's trailers left out (the member's listeners apply this to every request;
/// `axum::middleware::map_request`).
pub(crate) async fn drop_request_trailers(request: axum::extract::Request) -> axum::extract::Request {
    request.map(|body| axum::body::Body::new(WithoutTrailers::new(body)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue};
    use http_body_util::{BodyExt, StreamBody};

    #[tokio::test]
    async fn data_passes_and_trailers_do_not() {
        let mut trailers = HeaderMap::new();
        trailers.insert("keyward-forwarded-client-cert", HeaderValue::from_static("cm9vdA=="));
        let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = vec![
            Ok(Frame::data(Bytes::from_static(b"one"))),
            Ok(Frame::trailers(trailers.clone())),
            Ok(Frame::data(Bytes::from_static(b"two"))),
            Ok(Frame::trailers(trailers)),
        ];
        let body = WithoutTrailers::new(StreamBody::new(futures::stream::iter(frames)));
        let collected = body.collect().await.unwrap();
        assert!(collected.trailers().is_none());
        assert_eq!(collected.to_bytes(), Bytes::from_static(b"onetwo"));
    }
}
