//! etcd's watch fragmentation, for a watcher created with `fragment`: a response too large for one
//! message goes as several, each flagged `fragment` but the last, which the client joins again.

use prost::Message;

use crate::proto::etcdserverpb::{ResponseHeader, WatchResponse};
use crate::proto::mvccpb::Event;

/// etcd's watch fragmentation (`sendFragments`), for a watcher created with `fragment`: the limit is
/// `--max-request-bytes` plus the gRPC overhead allowance, because etcd's watch server is handed
/// `MaxRequestBytes + grpcOverheadBytes` — with the flag alone, a large revision at a small
/// `--max-request-bytes` would come in far more (one-event) fragments than etcd sends.
pub(super) fn fragments(
    id: i64,
    header: Option<ResponseHeader>,
    events: Vec<Event>,
    max_request_bytes: usize,
) -> Vec<WatchResponse> {
    let whole = WatchResponse { header, watch_id: id, events, ..Default::default() };
    split(whole, max_request_bytes + crate::config::GRPC_OVERHEAD_BYTES)
}

/// etcd's splitting rule: a response is split only when its whole encoded size (header included)
/// reaches `limit` and it has two or more events. Each fragment, counted with its header and its
/// `fragment` flag set, then takes events while it stays under `limit`, but always at least one (a
/// single oversized event travels alone); every fragment but the last has `fragment` set.
fn split(mut whole: WatchResponse, limit: usize) -> Vec<WatchResponse> {
    if whole.encoded_len() < limit || whole.events.len() < 2 {
        return vec![whole];
    }
    /// `WatchResponse.events` is field 11.
    const EVENTS_FIELD: u32 = 11;
    let events = std::mem::take(&mut whole.events);
    let template = WatchResponse { fragment: true, ..whole };
    // A repeated message field's encoded length is the sum of its elements', so a fragment's size is
    // the template's plus that of each event it holds (etcd recomputes `Size()` after each append).
    let base = template.encoded_len();
    let mut parts = Vec::new();
    let mut current = Vec::new();
    let mut size = base;
    for event in events {
        let len = prost::encoding::message::encoded_len(EVENTS_FIELD, &event);
        if !current.is_empty() && size + len >= limit {
            parts.push(std::mem::take(&mut current));
            size = base;
        }
        size += len;
        current.push(event);
    }
    parts.push(current);
    let last = parts.len() - 1;
    parts
        .into_iter()
        .enumerate()
        .map(|(i, events)| WatchResponse { events, fragment: i != last, ..template.clone() })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::mvccpb::event::EventType;
    use crate::proto::mvccpb::KeyValue;

    fn put_event(key: &[u8]) -> Event {
        Event { kv: Some(KeyValue { key: key.to_vec(), ..Default::default() }), ..Default::default() }
    }

    /// etcd's `createResponse`: `events` events whose keys are `key_len` bytes, no header.
    fn response(key_len: usize, events: usize) -> WatchResponse {
        let events = (0..events).map(|_| put_event(&vec![b'a'; key_len])).collect();
        WatchResponse { events, ..Default::default() }
    }

    fn event_counts(parts: &[WatchResponse]) -> Vec<usize> {
        parts.iter().map(|r| r.events.len()).collect()
    }

    fn assert_only_last_unflagged(parts: &[WatchResponse]) {
        let flags: Vec<bool> = parts.iter().map(|r| r.fragment).collect();
        let mut expected = vec![true; parts.len()];
        *expected.last_mut().unwrap() = false;
        assert_eq!(flags, expected);
    }

    /// etcd 3.4's `TestSendFragment` table (etcdserver/api/v3rpc/watch_test.go).
    #[test]
    fn split_matches_etcds_send_fragment_cases() {
        let cases = [
            (response(100, 1), i32::MAX as usize, 1),
            (response(10, 2), 50, 1),
            (response(1024, 1), 1, 1),
            (response(11, 5), 20, 5),
            (response(15, 5), 10, 5),
            (response(10, 4), 35, 2),
        ];
        for (i, (resp, limit, want)) in cases.into_iter().enumerate() {
            let parts = split(resp, limit);
            assert_eq!(parts.len(), want, "case {i}: {:?}", event_counts(&parts));
            assert_only_last_unflagged(&parts);
        }
    }

    /// The whole response is split when its size (header included) reaches the limit, not only above it;
    /// a fragment also closes when adding an event would bring it to the limit.
    #[test]
    fn split_at_exactly_the_limit() {
        let header = Some(ResponseHeader { cluster_id: u64::MAX, member_id: 7, revision: 9, raft_term: 2 });
        let whole = WatchResponse { header, watch_id: 3, ..response(10, 4) };
        let size = whole.encoded_len();
        assert_eq!(split(whole.clone(), size + 1), vec![whole.clone()]);
        let parts = split(whole.clone(), size);
        assert_eq!(event_counts(&parts), [3, 1]);
        assert_only_last_unflagged(&parts);
        assert!(parts.iter().all(|p| p.header == header && p.watch_id == 3));

        // Each fragment is measured with its header and `fragment: true`: a limit one byte above
        // three events' fragment keeps three together.
        let three = split(whole.clone(), size)[0].encoded_len();
        assert_eq!(event_counts(&split(whole.clone(), three + 1)), [3, 1]);
        assert_eq!(event_counts(&split(whole, three)), [2, 2]);
    }

    /// A single event larger than the limit travels alone, and so do its oversized neighbours.
    #[test]
    fn split_keeps_at_least_one_event_per_fragment() {
        let parts = split(response(1000, 3), 100);
        assert_eq!(event_counts(&parts), [1, 1, 1]);
        assert_only_last_unflagged(&parts);
    }

    /// The limit is `--max-request-bytes` plus etcd's 512 KiB gRPC overhead allowance: etcd splits a
    /// 200-key delete of 3 KB values with prev_kv at --max-request-bytes=4096 into 173 + 27 events
    /// (with the flag alone as the limit it would be 200 one-event fragments).
    #[test]
    fn fragment_limit_includes_grpc_overhead() {
        let header = Some(ResponseHeader { cluster_id: u64::MAX, member_id: u64::MAX, revision: 202, raft_term: 2 });
        let events: Vec<Event> = (0..200)
            .map(|i| {
                let key = format!("fr/{i:06}").into_bytes();
                let mut value = format!("v{i}").into_bytes();
                value.resize(3_000, b'.');
                let rev = i as i64 + 2;
                let prev =
                    KeyValue { key: key.clone(), create_revision: rev, mod_revision: rev, version: 1, value, lease: 0 };
                Event {
                    r#type: EventType::Delete as i32,
                    kv: Some(KeyValue { key, mod_revision: 202, ..Default::default() }),
                    prev_kv: Some(prev),
                }
            })
            .collect();
        let parts = fragments(0, header, events.clone(), 4096);
        assert_eq!(event_counts(&parts), [173, 27]);
        assert_only_last_unflagged(&parts);

        // Under the flag plus the allowance, a response goes whole even though it exceeds the flag.
        let small = fragments(0, header, events[..100].to_vec(), 4096);
        assert_eq!(event_counts(&small), [100]);
        assert!(!small[0].fragment);
    }
}
