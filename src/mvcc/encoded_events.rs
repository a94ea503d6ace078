//! A committed batch's events encoded as they travel in a `WatchResponse`, made at most once per
//! form and shared by every watcher that sends them.
//!
//! A put seen by a thousand watchers was cloned and encoded a thousand times, once per watcher's
//! response. Encoded here once, each watcher's response holds reference-counted handles to the same
//! bytes (`server/watch/wire.rs`), and writing a response copies them. Made lazily, by the first
//! watcher that needs them: a batch nobody watches costs nothing.

use std::sync::OnceLock;

use crate::proto::mvccpb::Event;
use bytes::Bytes;

/// `WatchResponse.events`' field number.
pub(crate) const EVENTS_FIELD: u32 = 11;

/// The two forms a watcher may send: with the previous key-value (`prev_kv` watchers), or without.
#[derive(Debug, Default, Clone)]
pub(crate) struct EncodedEvents {
    plain: OnceLock<Vec<Bytes>>,
    with_prev: OnceLock<Vec<Bytes>>,
}

impl EncodedEvents {
    /// Each of `events` encoded as one element of `WatchResponse.events` (the field's key, the
    /// length, the `mvccpb.Event` message), in order. `events` must be the batch's own events, the
    /// same on every call.
    pub(crate) fn get(&self, events: &[Event], prev_kv: bool) -> &[Bytes] {
        let encode = |event: &Event| {
            let mut field = Vec::with_capacity(prost::encoding::message::encoded_len(EVENTS_FIELD, event));
            prost::encoding::message::encode(EVENTS_FIELD, event, &mut field);
            Bytes::from(field)
        };
        if prev_kv {
            self.with_prev.get_or_init(|| events.iter().map(encode).collect())
        } else {
            self.plain.get_or_init(|| {
                events.iter().map(|e| encode(&Event { r#type: e.r#type, kv: e.kv.clone(), prev_kv: None })).collect()
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::proto::etcdserverpb::WatchResponse;
    use crate::proto::mvccpb::KeyValue;

    fn event(key: &[u8], prev: Option<&[u8]>) -> Event {
        let kv = |value: &[u8]| KeyValue { key: key.to_vec(), value: value.to_vec(), ..Default::default() };
        Event { r#type: 0, kv: Some(kv(b"new")), prev_kv: prev.map(kv) }
    }

    #[test]
    fn each_form_is_the_events_encoding_with_or_without_the_previous_value() {
        let events = [event(b"a", Some(b"old")), event(b"b", None)];
        let encoded = EncodedEvents::default();
        // One event alone in a response's `events` is exactly the element.
        let field =
            |event: Event| Bytes::from(WatchResponse { events: vec![event], ..Default::default() }.encode_to_vec());
        let with_prev: Vec<Bytes> = events.iter().cloned().map(field).collect();
        let plain: Vec<Bytes> = events.iter().map(|e| field(Event { prev_kv: None, ..e.clone() })).collect();
        assert_eq!(encoded.get(&events, true), with_prev);
        assert_eq!(encoded.get(&events, false), plain);
        assert_ne!(with_prev[0], plain[0], "the first event has a previous value");
        // Made once: a second call hands out the same bytes, not a new encoding.
        assert_eq!(encoded.get(&events, false)[0].as_ptr(), encoded.get(&events, false)[0].as_ptr());
    }
}
