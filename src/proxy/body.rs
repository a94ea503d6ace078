//! The one body type the proxy passes both ways: a client's request body on its way to a member, a
//! member's response on its way back, or a short answer of the proxy's own.

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A streamed body; neither side's frames are buffered.
pub(crate) type Body = UnsyncBoxBody<Bytes, BoxError>;

/// Any body as the proxy's `Body`.
pub(crate) fn boxed<B>(body: B) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}

/// A complete body of the proxy's own (`/health`).
pub(crate) fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed_unsync()
}
