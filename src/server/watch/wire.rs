//! The Watch service's wire: its responses encoded by keyward, so that the events of a batch, shared
//! by every watcher, are encoded once (`mvcc/encoded_events.rs`) rather than once per watcher.
//!
//! A `WatchReply` is either a whole `WatchResponse` (created, canceled, progress, fragments, replays
//! from the store), or a response's header and watch id with its events already encoded, each as an
//! element of the repeated field `events`. The latter is written as `WatchResponse`'s fields 1 and
//! 2, then those elements as they are: the bytes prost writes for the same response (a test checks
//! it). `mod.rs`'s `WatchServer` serves the service on this codec.

use bytes::{BufMut, Bytes};
use prost::encoding::{int64, message};
use prost::Message;
use tonic::codec::{Codec, EncodeBuf, Encoder};
use tonic::Status;
use tonic_prost::ProstDecoder;

use crate::proto::etcdserverpb::{ResponseHeader, WatchRequest, WatchResponse};

/// One response on a watch stream.
#[derive(Debug)]
pub(crate) enum WatchReply {
    Response(WatchResponse),
    /// A response of events only: each of `events` is one encoded element of `WatchResponse.events`
    /// (`mvcc/encoded_events.rs`).
    Events {
        header: Option<ResponseHeader>,
        watch_id: i64,
        events: Vec<Bytes>,
    },
}

/// `WatchResponse`'s field numbers that `WatchReply::Events` writes.
const HEADER: u32 = 1;
const WATCH_ID: u32 = 2;

impl WatchReply {
    pub(crate) fn encoded_len(&self) -> usize {
        match self {
            WatchReply::Response(response) => response.encoded_len(),
            WatchReply::Events { header, watch_id, events } => {
                header.as_ref().map_or(0, |h| message::encoded_len(HEADER, h))
                    + if *watch_id != 0 { int64::encoded_len(WATCH_ID, watch_id) } else { 0 }
                    + events.iter().map(Bytes::len).sum::<usize>()
            }
        }
    }

    fn encode(&self, buf: &mut impl BufMut) {
        match self {
            WatchReply::Response(response) => response.encode_raw(buf),
            WatchReply::Events { header, watch_id, events } => {
                // In field order, defaults left out, as prost writes a message.
                if let Some(header) = header {
                    message::encode(HEADER, header, buf);
                }
                if *watch_id != 0 {
                    int64::encode(WATCH_ID, watch_id, buf);
                }
                for event in events {
                    buf.put_slice(event);
                }
            }
        }
    }
}

#[cfg(test)]
impl WatchReply {
    /// The response a client decodes from this reply.
    pub(crate) fn into_response(self) -> WatchResponse {
        let mut buf = Vec::with_capacity(self.encoded_len());
        self.encode(&mut buf);
        WatchResponse::decode(&buf[..]).expect("a reply decodes as a WatchResponse")
    }
}

impl From<WatchResponse> for WatchReply {
    fn from(response: WatchResponse) -> Self {
        WatchReply::Response(response)
    }
}

/// Decodes `WatchRequest`s with prost; encodes `WatchReply`s itself.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct WatchCodec;

impl Codec for WatchCodec {
    type Encode = WatchReply;
    type Decode = WatchRequest;
    type Encoder = ReplyEncoder;
    type Decoder = ProstDecoder<WatchRequest>;

    fn encoder(&mut self) -> Self::Encoder {
        ReplyEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::default()
    }
}

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct ReplyEncoder;

impl Encoder for ReplyEncoder {
    type Item = WatchReply;
    type Error = Status;

    fn encode(&mut self, reply: WatchReply, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        // The whole response at once: a large one (a catch-up of many revisions) grows the buffer
        // once instead of doubling it as it goes.
        dst.reserve(reply.encoded_len());
        reply.encode(dst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::encoded_events::EncodedEvents;
    use crate::proto::mvccpb::{Event, KeyValue};

    fn event(key: &[u8], revision: i64) -> Event {
        let kv = KeyValue { key: key.to_vec(), value: b"v".to_vec(), mod_revision: revision, ..Default::default() };
        Event { r#type: 1, kv: Some(kv.clone()), prev_kv: Some(kv) }
    }

    fn written(reply: &WatchReply) -> Vec<u8> {
        let mut buf = Vec::new();
        reply.encode(&mut buf);
        assert_eq!(buf.len(), reply.encoded_len());
        buf
    }

    #[test]
    fn encoded_events_are_written_as_prost_writes_the_same_response() {
        let events = vec![event(b"a", 7), event(b"b", 8)];
        let header = Some(ResponseHeader { cluster_id: 1, member_id: 2, revision: 8, raft_term: 3 });
        for watch_id in [0, 5] {
            let response = WatchResponse { header, watch_id, events: events.clone(), ..Default::default() };
            let shared = EncodedEvents::default().get(&events, true).to_vec();
            let reply = WatchReply::Events { header, watch_id, events: shared };
            assert_eq!(written(&reply), response.encode_to_vec(), "watch id {watch_id}");
            assert_eq!(WatchResponse::decode(&written(&reply)[..]).unwrap(), response);
        }
        let whole = WatchResponse { watch_id: 3, created: true, ..Default::default() };
        assert_eq!(written(&WatchReply::from(whole.clone())), whole.encode_to_vec());
    }
}
