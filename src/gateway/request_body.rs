//! Reading a gateway request's body as the JSON of a protobuf request (etcd's gateway maps every body
//! to the whole request message): one message for a unary call, a sequence of messages for a
//! client stream (`/v3/watch`, `/v3/lease/keepalive`: each JSON value in the body is one request,
//! sent as soon as it is complete).

use axum::body::Body;
use futures::{Stream, StreamExt};
use serde::de::DeserializeOwned;
use tonic::Status;

use super::reply::Failure;
use crate::error::EtcdError;

/// The body as one message; an empty body is the default message (grpc-gateway reads it as EOF).
pub(super) async fn one<M: DeserializeOwned + Default>(body: Body, limit: usize) -> Result<M, Failure> {
    let bytes = axum::body::to_bytes(body, limit).await.map_err(|e| too_large_or(e.to_string()))?;
    if bytes.trim_ascii().is_empty() {
        return Ok(M::default());
    }
    serde_json::from_slice(&bytes).map_err(Failure::bad_body)
}

fn too_large_or(why: String) -> Failure {
    // axum reports an exceeded limit as "length limit exceeded"; anything else is a broken body.
    if why.contains("length limit") {
        EtcdError::RequestTooLarge.into()
    } else {
        Failure::bad_body(why)
    }
}

/// The body as a stream of messages, each yielded once its JSON value is complete. A value that is
/// not valid JSON of `M`, a truncated value at the end, or one larger than `limit` ends the stream
/// with the error.
pub(super) fn many<M: DeserializeOwned + Send + 'static>(
    body: Body,
    limit: usize,
) -> impl Stream<Item = Result<M, Status>> + Send + 'static {
    let state = Some(Reader { data: body.into_data_stream(), buffered: Vec::new(), limit });
    futures::stream::unfold(state, |state| async move {
        let mut reader = state?;
        match reader.next::<M>().await {
            Ok(Some(message)) => Some((Ok(message), Some(reader))),
            Ok(None) => None,
            Err(status) => Some((Err(status), None)),
        }
    })
}

struct Reader {
    data: axum::body::BodyDataStream,
    buffered: Vec<u8>,
    limit: usize,
}

impl Reader {
    async fn next<M: DeserializeOwned>(&mut self) -> Result<Option<M>, Status> {
        loop {
            let mut values = serde_json::Deserializer::from_slice(&self.buffered).into_iter::<M>();
            match values.next() {
                Some(Ok(message)) => {
                    let used = values.byte_offset();
                    self.buffered.drain(..used);
                    return Ok(Some(message));
                }
                Some(Err(e)) if !e.is_eof() => return Err(Status::invalid_argument(e.to_string())),
                // Incomplete (or only whitespace so far): read on.
                _ => {}
            }
            if self.buffered.len() > self.limit {
                return Err(EtcdError::RequestTooLarge.into());
            }
            match self.data.next().await {
                Some(Ok(chunk)) => self.buffered.extend_from_slice(&chunk),
                Some(Err(e)) => return Err(Status::invalid_argument(e.to_string())),
                None if self.buffered.trim_ascii().is_empty() => return Ok(None),
                None => return Err(Status::invalid_argument("unexpected EOF")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Bytes;

    use crate::proto::etcdserverpb::{RangeRequest, WatchRequest};

    use super::*;

    fn chunked(parts: &[&'static str]) -> Body {
        let chunks: Vec<Result<Bytes, std::io::Error>> =
            parts.iter().map(|p| Ok(Bytes::from_static(p.as_bytes()))).collect();
        Body::from_stream(futures::stream::iter(chunks))
    }

    #[tokio::test]
    async fn one_message_with_etcds_field_names_and_unknown_fields_ignored() {
        let req: RangeRequest =
            one(Body::from(r#"{"key":"Zm9v","range_end":"Zm9w","limit":"2","bogus":1}"#), 1024).await.unwrap();
        assert_eq!((req.key.as_slice(), req.range_end.as_slice(), req.limit), (&b"foo"[..], &b"fop"[..], 2));
        // The lowerCamelCase JSON names are accepted too, as by Go's jsonpb.
        let req: RangeRequest = one(Body::from(r#"{"key":"Zm9v","rangeEnd":"Zm9w"}"#), 1024).await.unwrap();
        assert_eq!(req.range_end, b"fop");
        let empty: RangeRequest = one(Body::empty(), 1024).await.unwrap();
        assert_eq!(empty, RangeRequest::default());
    }

    #[tokio::test]
    async fn a_bad_or_oversized_body_is_refused_with_etcds_status() {
        let bad = one::<RangeRequest>(Body::from("not json"), 1024).await.unwrap_err();
        assert_eq!(bad.status.code(), tonic::Code::InvalidArgument);
        let large = one::<RangeRequest>(Body::from(vec![b' '; 2048]), 1024).await.unwrap_err();
        assert_eq!(large.status.message(), "etcdserver: request is too large");
    }

    #[tokio::test]
    async fn many_messages_split_across_chunks_in_any_way() {
        let body =
            chunked(&[r#"{"create_request":{"ke"#, r#"y":"YQ=="}} {"cancel_request""#, r#":{"watch_id":"3"}}"#, "\n"]);
        let got: Vec<_> = many::<WatchRequest>(body, 1024).collect().await;
        assert_eq!(got.len(), 2);
        assert!(got.iter().all(|r| r.is_ok()));
        let truncated: Vec<_> = many::<WatchRequest>(chunked(&[r#"{"create_request":"#]), 1024).collect().await;
        assert!(matches!(truncated.as_slice(), [Err(_)]));
        let then_garbage: Vec<_> = many::<WatchRequest>(chunked(&["{} x {}"]), 1024).collect().await;
        assert!(matches!(then_garbage.as_slice(), [Ok(_), Err(_)]));
    }
}
