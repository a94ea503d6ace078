//! The dialing side of the peer protocol (`proto/keywardpb/peer.proto`): one lazily connected gRPC
//! channel per peer URL, over mTLS with `--peer-cert-file`/`--peer-key-file` when the URL is
//! `https://`. Raft's transport (`cluster/network.rs`) and the follower's forwarding to the leader
//! both dial through here, so a peer has one connection (HTTP/2 multiplexes their calls).
//!
//! Every request carries this member's cluster id and member id as metadata; the receiving member
//! refuses a request from another cluster (`peer_service.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::ClientConfig;
use tonic::transport::Channel;

use crate::proto::keywardpb::peer_client::PeerClient;

/// Metadata naming the sender's cluster (a member refuses requests of another cluster), and the
/// sending member; their trust rules: `identity/metadata.rs`.
pub(crate) use crate::identity::metadata::{CLUSTER_ID as CLUSTER_ID_HEADER, MEMBER_ID as MEMBER_ID_HEADER};

/// How long dialing a peer may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// An unreachable peer is logged at most this often.
const UNREACHABLE_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Largest peer message, at least: a raft AppendEntries of several entries, or a snapshot chunk.
const MIN_PEER_MESSAGE_BYTES: usize = 64 << 20;

/// The largest peer message for a member taking requests of up to `max_request_bytes`: an
/// AppendEntries must carry at least one whole entry (up to `max_request_bytes` of requests, or one
/// larger request) with room to spare. `max_append_entries` keeps openraft's batches within it.
pub(crate) fn max_peer_message_bytes(max_request_bytes: usize) -> usize {
    MIN_PEER_MESSAGE_BYTES.max(max_request_bytes.saturating_mul(2).saturating_add(8 << 20))
}

/// How many entries one AppendEntries may carry so that it stays within `max_peer_message_bytes`
/// (openraft's default is 300, which at 1.5 MiB entries would be 450 MiB).
pub(crate) fn max_append_entries(max_request_bytes: usize) -> u64 {
    let half = max_peer_message_bytes(max_request_bytes) / 2;
    (half / max_request_bytes.max(1)).clamp(1, 300) as u64
}

pub(crate) struct Peers {
    tls: Option<Arc<ClientConfig>>,
    max_message_bytes: usize,
    member_id: AtomicU64,
    /// 0 while a joining member does not know its cluster yet.
    cluster_id: AtomicU64,
    /// One connection per peer URL, and one more per peer for snapshot chunks (`snapshot_client`).
    channels: Mutex<HashMap<String, Channel>>,
    /// The runtime the connections' tasks run on: the one `new` was called on, never the raft thread,
    /// which blocks in log syncs (`raft/thread.rs`).
    runtime: tokio::runtime::Handle,
    /// When each peer URL was last reported unreachable (so a down peer is one log line per interval).
    unreachable_since: Mutex<HashMap<String, Instant>>,
}

impl Peers {
    pub(crate) fn new(tls: Option<Arc<ClientConfig>>, max_message_bytes: usize) -> Self {
        Peers {
            tls,
            max_message_bytes,
            member_id: AtomicU64::new(0),
            cluster_id: AtomicU64::new(0),
            channels: Default::default(),
            runtime: tokio::runtime::Handle::current(),
            unreachable_since: Default::default(),
        }
    }

    /// Sets who this member is, once known (at bootstrap or after joining).
    pub(crate) fn identify(&self, member_id: u64, cluster_id: u64) {
        self.member_id.store(member_id, Ordering::Release);
        self.cluster_id.store(cluster_id, Ordering::Release);
    }

    /// The largest message a peer may send or receive.
    pub(crate) fn max_message_bytes(&self) -> usize {
        self.max_message_bytes
    }

    /// A client for the peer at `url`; connects on first use.
    pub(crate) fn client(&self, url: &str) -> Result<PeerClient<Channel>, tonic::Status> {
        self.client_on(url, url.to_string())
    }

    /// A client for snapshot chunks to the peer at `url`, on a connection of its own (as etcd sends
    /// snapshots apart from its message streams): megabytes of chunks in flight on the raft
    /// connection would hold up heartbeats behind them, and the follower would campaign.
    pub(crate) fn snapshot_client(&self, url: &str) -> Result<PeerClient<Channel>, tonic::Status> {
        self.client_on(url, format!("{url} (snapshots)"))
    }

    fn client_on(&self, url: &str, connection: String) -> Result<PeerClient<Channel>, tonic::Status> {
        let mut channels = self.channels.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let channel = match channels.get(&connection) {
            Some(channel) => channel.clone(),
            None => {
                // The channel spawns its connection task on the runtime entered here.
                let _main = self.runtime.enter();
                let channel = crate::frontend::tls::client::lazy_channel(url, self.tls.as_ref(), CONNECT_TIMEOUT)
                    .map_err(tonic::Status::invalid_argument)?;
                channels.insert(connection, channel.clone());
                channel
            }
        };
        Ok(PeerClient::new(channel)
            .max_decoding_message_size(self.max_message_bytes)
            .max_encoding_message_size(self.max_message_bytes))
    }

    /// A request carrying this member's identity, failing after `timeout`.
    pub(crate) fn request<T>(&self, message: T, timeout: Option<Duration>) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        let metadata = request.metadata_mut();
        let cluster = format!("{:x}", self.cluster_id.load(Ordering::Acquire));
        let member = format!("{:x}", self.member_id.load(Ordering::Acquire));
        if let (Ok(cluster), Ok(member)) = (cluster.parse(), member.parse()) {
            metadata.insert(CLUSTER_ID_HEADER, cluster);
            metadata.insert(MEMBER_ID_HEADER, member);
        }
        if let Some(timeout) = timeout {
            request.set_timeout(timeout);
        }
        request
    }

    /// Logs that the peer at `url` could not be reached (once per interval), with the reason.
    pub(crate) fn report_unreachable(&self, peer: u64, url: &str, reason: &str) {
        let mut since = self.unreachable_since.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        match since.get(url) {
            Some(last) if now.duration_since(*last) < UNREACHABLE_LOG_INTERVAL => {}
            _ => {
                tracing::warn!(peer = format!("{peer:x}"), url, reason, "peer unreachable; retrying with backoff");
                since.insert(url.to_string(), now);
            }
        }
    }

    /// Notes that the peer at `url` answered; logs it if it had been reported unreachable.
    pub(crate) fn report_reachable(&self, peer: u64, url: &str) {
        let mut since = self.unreachable_since.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if since.remove(url).is_some() {
            tracing::info!(peer = format!("{peer:x}"), url, "peer became active");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_append_entries_of_whole_entries_fits_the_message_limit() {
        for max_request in [1, 1024, 1_572_864, 10 << 20, 100 << 20, u32::MAX as usize] {
            let limit = max_peer_message_bytes(max_request);
            let entries = max_append_entries(max_request) as usize;
            assert!(entries >= 1);
            assert!(entries.saturating_mul(max_request) <= limit / 2 || entries == 1, "{max_request}");
            assert!(limit >= 2 * max_request, "one entry, even of one oversized request, fits");
        }
        assert_eq!(max_append_entries(1_572_864), 21);
    }
}
