//! A follower's stream of forwarded writes to the leader (`cluster/propose_stream.rs`) at its edges,
//! through the real peer listener, as a hostile or stale member and an older leader would meet it
//! (issue 33):
//!
//! - a stranger's stream is refused; a member's stream is served, and once the member is removed its
//!   open stream is refused from its next write on and that write is not applied (the peer guard
//!   admits each write on a stream again: the peer port is a trust boundary, docs/threat-model.md);
//! - a leader that does not serve the stream (a keyward older than it: `Unimplemented`) gets one
//!   `Propose` call per forwarded write, and loses nothing; twin: a leader that serves it gets no call;
//! - a write the follower takes the result of from its own apply (`applied_here`) is answered only
//!   when it fails.

use std::time::{Duration, Instant};

use crate::append_stream::{assert_permission_denied, every_member_holds_each_put_once, fronted_cluster, puts};
use crate::common::cluster::{Cluster, Member, Options, SETTLE_TIMEOUT};
use crate::common::pki;
use keyward::proto::etcdserverpb::{InternalRaftRequest, PutRequest, RequestHeader};
use keyward::proto::keywardpb::peer_client::PeerClient;
use keyward::proto::keywardpb::{ProposeStreamReply, ProposeStreamRequest};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Status};

/// Runs blocking harness work (process starts, etcdctl) without stalling the runtime's other tasks.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// `Peer.ProposeStream` as a member opens it: the cluster id in its metadata, no deadline.
struct ProposeSent {
    requests: mpsc::Sender<ProposeStreamRequest>,
    replies: tonic::Streaming<ProposeStreamReply>,
    next_id: u64,
}

impl ProposeSent {
    async fn open(client: &mut PeerClient<Channel>, cluster_id: u64) -> Result<ProposeSent, Status> {
        let (requests, outgoing) = mpsc::channel(1);
        let mut request = tonic::Request::new(ReceiverStream::new(outgoing));
        request.metadata_mut().insert("keyward-cluster-id", format!("{cluster_id:x}").parse().unwrap());
        let opened = tokio::time::timeout(Duration::from_secs(10), client.propose_stream(request));
        let replies = opened.await.map_err(|_| Status::deadline_exceeded("opening the stream"))??.into_inner();
        Ok(ProposeSent { requests, replies, next_id: 1 })
    }

    /// Forwards a plain put of `key` (as a follower forwards a client's) and waits for its answer.
    async fn put(&mut self, key: &str) -> Result<ProposeStreamReply, Status> {
        let id = self.send(key, false).await?;
        let reply = self.reply().await?;
        assert_eq!(reply.id, id, "the answer to the write sent");
        outcome(reply)
    }

    /// Sends a plain put of `key`, answered only if it fails when `applied_here` (a follower that
    /// takes the result from its own apply); returns its id.
    async fn send(&mut self, key: &str, applied_here: bool) -> Result<u64, Status> {
        let request = InternalRaftRequest {
            header: Some(RequestHeader { id: self.next_id, ..Default::default() }),
            put: Some(Box::new(PutRequest { key: key.into(), value: b"v".to_vec(), ..Default::default() })),
            ..Default::default()
        };
        let id = self.next_id;
        self.next_id += 1;
        let sent = self.requests.send(ProposeStreamRequest { id, request: Some(request), applied_here }).await;
        sent.map_err(|_| Status::unavailable("the stream has ended"))?;
        Ok(id)
    }

    /// The next answer on the stream.
    async fn reply(&mut self) -> Result<ProposeStreamReply, Status> {
        let reply = tokio::time::timeout(Duration::from_secs(10), self.replies.message()).await;
        let reply = reply.map_err(|_| Status::deadline_exceeded("no answer"))??;
        reply.ok_or_else(|| Status::unavailable("the member ended the stream"))
    }
}

/// An answer as a result: the write's response, or its failure as a status.
fn outcome(reply: ProposeStreamReply) -> Result<ProposeStreamReply, Status> {
    match reply.response {
        Some(_) => Ok(reply),
        None => Err(Status::new(Code::from(reply.code), reply.message)),
    }
}

/// A stream to `member` presenting `cert`, with one put of `key` answered: the stream, or why it
/// (or the put) was refused.
async fn stream_with_a_put(
    cluster: &Cluster,
    member: &Member,
    cert: &pki::Cert,
    key: &str,
) -> Result<ProposeSent, Status> {
    let mut client = crate::peer_port::peer_client(&member.peer_url, &cluster.peer_ca_file(), Some(cert));
    let cluster_id = crate::peer_port::cluster_id(cluster).await;
    let mut stream = ProposeSent::open(&mut client, cluster_id).await?;
    stream.put(key).await?;
    Ok(stream)
}

/// Whether `key` exists, read linearizably on member `i`.
async fn key_exists(cluster: &Cluster, i: usize, key: &str) -> bool {
    let mut client = cluster.members[i].client().await;
    client.get(key, None).await.expect("get").count() > 0
}

/// A stranger (a peer-CA certificate that names only 127.0.0.4, no member) is refused a propose
/// stream by the leader and its put is not written. Added as a member (a learner that never starts:
/// what it sends is the test's), its stream is served and its puts applied. Removed while the stream
/// is open, its next write is refused (`permission denied`), the stream ends, and that write is not
/// applied anywhere.
///
/// Fails if `StreamCaller::admit_again` is not called on each write (`propose_stream.rs`, `serve`):
/// the stream opened while it was a member is then served after its removal ("still served").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_members_open_propose_stream_is_refused_at_its_next_write() {
    let cluster = blocking(|| Cluster::start(Options::new(3).peer_tls()));
    let mut params = pki::server_params("member-m4");
    params.subject_alt_names = vec![rcgen::SanType::IpAddress("127.0.0.4".parse().unwrap())];
    let m4_cert = cluster.peer_cert("peer-m4", params);
    let m4_url = format!("https://127.0.0.4:{}", crate::common::free_port());
    let leader = cluster.leader().await;
    let at_leader = &cluster.members[leader];

    assert_permission_denied(
        "a stranger's propose stream",
        stream_with_a_put(&cluster, at_leader, &m4_cert, "/stranger/put").await,
    );

    let out = blocking(|| cluster.members[0].ctl(&["member", "add", "m4", "--learner", "--peer-urls", &m4_url]));
    let id = out.split_whitespace().nth(1).and_then(|id| u64::from_str_radix(id, 16).ok());
    let id = id.unwrap_or_else(|| panic!("no member id in {out}"));
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    let mut stream = loop {
        match stream_with_a_put(&cluster, at_leader, &m4_cert, "/member/first").await {
            Ok(stream) => break stream,
            Err(status) if Instant::now() < deadline && status.code() == Code::PermissionDenied => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(status) => panic!("the member's propose stream is refused: {status:?}"),
        }
    };
    assert!(key_exists(&cluster, leader, "/member/first").await, "the member's put was applied");

    blocking(|| cluster.members[leader].ctl(&["member", "remove", &format!("{id:x}")]));
    // Served until the leader has the membership without m4 (the removal is committed before the
    // command returns, so at most a write or two), refused from then on.
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    let mut n = 0;
    let (refused, key) = loop {
        n += 1;
        let key = format!("/member/after-removal/{n}");
        match stream.put(&key).await {
            Ok(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
            Ok(_) => panic!("still served {SETTLE_TIMEOUT:?} after the removal ({n} writes)"),
            Err(status) => break (status, key),
        }
    };
    assert_permission_denied("the removed member's next write", Err::<(), _>(refused));
    let after = stream.put("/member/after-refusal").await;
    assert!(after.is_err(), "the stream goes on after a refusal: {:?}", after.map(|_| ()));
    for i in 0..3 {
        for key in ["/stranger/put", key.as_str(), "/member/after-refusal"] {
            assert!(!key_exists(&cluster, i, key).await, "{key} was written (seen on {})", cluster.members[i].name);
        }
    }
}

/// The leader's peer port stops serving the propose stream (an older keyward, as in a rolling
/// upgrade: `Unimplemented`): a follower's forwarded writes go as `Propose` calls, every one is
/// acknowledged and applied once, and the follower asks for the stream once, not per write. Twin,
/// before the refusal: the same follower's writes go on the stream, with no call.
///
/// Fails if the follower does not fall back to calls (the unary branch of `propose_on_leader` in
/// `node/leader.rs` made an error): each write then fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_without_the_propose_stream_gets_calls_and_loses_nothing() {
    let (cluster, fronts) = fronted_cluster().await;
    let leader = cluster.leader().await;
    let follower = &cluster.members[(leader + 1) % 3];
    let before = puts(follower, "forwarded/", 0..20, |_| {}).await;
    let streamed = fronts[leader].relayed();
    assert!(streamed.propose_streams >= 1, "the follower streamed its writes: {streamed:?}");
    assert_eq!(streamed.proposes, 0, "a call while the stream is served: {streamed:?}");

    fronts[leader].refuse_propose_stream();
    fronts[leader].cut();
    // The first write after the cut may meet the old stream before the follower has seen it break:
    // etcd's retryable "leader changed". It was not applied (the cut closed the link before it was
    // sent), so it is put again.
    let first = {
        let mut client = follower.client().await;
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        loop {
            match client.put("forwarded/0020", "v20", None).await {
                Ok(put) => break ("forwarded/0020".to_string(), put.header().expect("header").revision()),
                Err(e) if Instant::now() < deadline && e.to_string().contains("leader changed") => {}
                Err(e) => panic!("the first put after the cut: {e}"),
            }
        }
    };
    let after = puts(follower, "forwarded/", 21..80, |_| {}).await;
    let done: Vec<_> = before.into_iter().chain([first]).chain(after).collect();
    every_member_holds_each_put_once(&cluster, "forwarded/", &done).await;

    let relayed = fronts[leader].relayed();
    assert!(relayed.propose_streams_refused >= 1, "{relayed:?}");
    assert!(relayed.proposes >= 60, "a call per write after the refusal: {relayed:?}");
    assert!(relayed.propose_streams_refused <= 2, "the follower asked for the stream again: {relayed:?}");
}

/// A write sent with `applied_here` (the follower takes its result from its own apply,
/// `raft/awaited.rs`) is applied, and the leader sends no answer for it; the writes beside it that
/// ask for one get theirs. Sent to a member that does not lead, the same write is refused and the
/// refusal is answered: a follower learns of every failure.
///
/// Fails if the leader answers a successful `applied_here` write (`serve`'s `quiet` check in
/// `cluster/propose_stream.rs`), or if it does not answer a failed one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_applied_at_the_follower_is_answered_only_when_it_fails() {
    let cluster = blocking(|| Cluster::start(Options::new(3)));
    let leader = cluster.leader().await;
    let cluster_id = crate::peer_port::cluster_id(&cluster).await;
    let stream_to = |i: usize| {
        let mut client = crate::peer_port::peer_client(&cluster.members[i].peer_url, &cluster.peer_ca_file(), None);
        async move { ProposeSent::open(&mut client, cluster_id).await.expect("a member's propose stream") }
    };

    let mut stream = stream_to(leader).await;
    let quiet = stream.send("/quiet/1", true).await.expect("sent");
    let first = stream.send("/answered/1", false).await.expect("sent");
    let first_answer = stream.reply().await.expect("an answer");
    // Proposed after the quiet write was applied: any answer to it would have come before this one's.
    let second = stream.send("/answered/2", false).await.expect("sent");
    let mut answered = vec![first_answer.id];
    while *answered.last().unwrap() != second {
        answered.push(stream.reply().await.expect("an answer").id);
    }
    assert!(!answered.contains(&quiet), "the quiet write was answered: {answered:?}");
    assert_eq!(answered, vec![first, second]);
    assert!(key_exists(&cluster, leader, "/quiet/1").await, "the quiet write was applied");

    let not_leader = (leader + 1) % 3;
    let mut stream = stream_to(not_leader).await;
    let refused = stream.send("/quiet/refused", true).await.expect("sent");
    let reply = stream.reply().await.expect("the refusal is answered");
    assert_eq!(reply.id, refused);
    let status = outcome(reply).expect_err("a member that does not lead refuses the write");
    assert_eq!(status.message(), "etcdserver: not leader", "{status:?}");
    assert!(!key_exists(&cluster, leader, "/quiet/refused").await, "the refused write was applied");
}
