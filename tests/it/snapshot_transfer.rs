//! The snapshot transfer between members (issue 30, part C), through the real peer listener:
//!
//! - a follower killed (SIGKILL) in the middle of receiving a snapshot keeps what it received
//!   (`<member>/snap/receiving.part`) and, restarted, resumes at that offset: it receives less than
//!   the whole snapshot the second time, and ends with the others' `HashKV`;
//! - the receiver is a trust boundary on the peer port: a peer without a member certificate is
//!   refused, and one with a member certificate that sends chunks out of order, past the end, at a
//!   huge offset, of another snapshot mid-transfer, or a last chunk that is garbage, truncated, of
//!   another snapshot or with a bad checksum gets an error for each, never an installed snapshot;
//!   the member keeps serving, and a real snapshot installs on it afterwards;
//! - chunks that overtake one another (the leader keeps several in flight) are taken in order: one a
//!   little ahead waits for those before it, a few at most; one more, or one far ahead, is refused;
//! - the partial file is bounded by the snapshot size the leader announces, and by the free disk.
//!
//! The chunks a hostile peer sends are openraft's `InstallSnapshotRequest`, postcard-encoded as a
//! member encodes them (`cluster/network.rs`), with an empty membership in their metadata.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions};
use keyward::proto::keywardpb::peer_client::PeerClient;
use keyward::proto::keywardpb::RaftMessage;
use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::InstallSnapshotResponse;
use openraft::{BasicNode, CommittedLeaderId, LogId, SnapshotMeta, StoredMembership, Vote};
use rcgen::SanType;
use tonic::transport::Channel;

use crate::common;
use crate::common::cluster::{metric_sum, wait_for_revision, Cluster, Member, Options};
use crate::common::pki::{self, Cert};

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// A follower killed mid-transfer and restarted resumes at the offset it kept. Reverted to a temp
/// file that a restart loses, the second run receives the whole snapshot again (and logs no
/// "resuming").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_killed_mid_transfer_resumes_at_its_offset() {
    let Behind { mut cluster, down, last_revision } = a_follower_behind_a_snapshot().await;

    let partial = snap_dir(&cluster.members[down]).join("receiving.part");
    // The partial file must belong to the snapshot the leader sends after the restart. A build the
    // last puts triggered can end while an older snapshot is being sent: that run receives the older
    // one (the CI saw this), and the leader sends the newest once the follower is down (an attempt
    // ends at once on a peer it cannot reach, and the next one takes the newest snapshot). So the
    // follower is run and killed until what it received is the leader's newest snapshot, with no
    // build under way. The leader is asked again at every attempt: on a busy 2-core machine the
    // other two can hold elections while the values are put (the CI saw the leadership move, and
    // the snapshot received was then newer than any the first leader had built).
    let mut attempts = 0;
    let (kept, leader) = loop {
        attempts += 1;
        let leader = cluster.leader().await;
        wait_until_no_snapshot_is_building(&cluster.members[leader]).await;
        let log_before = cluster.members[down].log().len();
        blocking(|| cluster.members[down].spawn());
        // Killed as soon as this run has written bytes: a few chunks of a 100 MB snapshot.
        let waiting = Instant::now();
        let begun = |log: &str| log.contains("receiving a snapshot") || log.contains("resuming a snapshot");
        while !begun(&cluster.members[down].log()[log_before..])
            || std::fs::metadata(&partial).map_or(0, |m| m.len()) == 0
        {
            assert!(
                waiting.elapsed() < Duration::from_secs(300),
                "no snapshot received:\n{}",
                cluster.members[down].log_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        blocking(|| cluster.members[down].kill_9());
        let kept = std::fs::metadata(&partial).expect("the partial file survives the kill").len();
        let run_log = cluster.members[down].log()[log_before..].to_string();
        let received = last_snapshot_id_in(&run_log, |l| begun(l));
        let newest = last_snapshot_id(&cluster, leader, "snapshot built");
        if received.is_some() && received == newest && !snapshot_building(&cluster.members[leader]) {
            break (kept, leader);
        }
        eprintln!("attempt {attempts}: {received:?} was received, {newest:?} is the newest: receiving it again");
        assert!(
            attempts < 5,
            "the follower never received the newest snapshot:\n{}",
            snapshot_lines(&cluster.members[leader].log())
        );
    };
    let size = snapshot_size_sent(&cluster, leader);
    assert!(kept > 0 && kept < size, "kept {kept} of {size} bytes: the transfer was not interrupted");
    // The log of the second run only: the member appends to the same file.
    let log_before = cluster.members[down].log().len();
    blocking(|| cluster.members[down].spawn());
    wait_for_revision(&cluster.members[down], last_revision).await;
    let rejoined = &cluster.members[down];
    // The member serves the installed state a moment before the receiver logs the install done.
    wait_for_line(rejoined, log_before, "snapshot installed", Duration::from_secs(60)).await;
    let log = rejoined.log()[log_before..].to_string();
    let received = metric_sum(rejoined, "keyward_network_snapshot_received_bytes_total");
    eprintln!("snapshot of {size} bytes: {kept} kept across the kill, {received} received after the restart");
    assert!(log.contains("resuming a snapshot received in part"), "no resume:\n{log}");
    assert!(!log.contains("receiving a snapshot"), "the transfer began again at byte 0:\n{log}");
    assert!(received < size as f64, "{received} bytes received again for a snapshot of {size}");
    assert!(received >= (size - kept) as f64, "{received} bytes received: less than what was missing");
    assert!(!partial.exists(), "the partial file outlived the install");
    assert_hashkv_equal(&cluster);
}

/// A follower killed while it installs a received snapshot comes back. openraft 0.9 purged the log
/// up to the snapshot while the state machine was still installing it: the member killed in between
/// restarted with its log purged past its current snapshot, and openraft panicked at every start
/// (`purge_upto <= snapshot_last_log_id`). Reverted to purging at once (the `keyward patch` of
/// `Command::PurgeLog` in `vendor/openraft/src/core/raft_core.rs`), the restarted member panics and
/// never reaches the last revision. The restarted member has every byte, and answers the last chunk
/// sent again with the snapshot's size; reverted to treating that as the chunks after it
/// (`Step::Resume` in `src/cluster/snapshot_sender.rs`), the leader's sender had nothing left to
/// send, reported a storage error, and the leader's raft core stopped (the member exited).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_killed_while_installing_a_snapshot_comes_back() {
    let Behind { mut cluster, down, last_revision } = a_follower_behind_a_snapshot().await;
    wait_until_no_snapshot_is_building(&cluster.members[cluster.leader().await]).await;

    // Killed once the install has begun (the received file is synced inside it, and openraft
    // queued its purge with it) and before the state machine has loaded the snapshot: a load of
    // 100 MB takes far longer than this member's log takes to be read here.
    let log_before = cluster.members[down].log().len();
    blocking(|| cluster.members[down].spawn());
    let install_begun = "snapshot file flushed and synced for install";
    wait_for_line(&cluster.members[down], log_before, install_begun, Duration::from_secs(300)).await;
    blocking(|| cluster.members[down].kill_9());
    let first_run = cluster.members[down].log()[log_before..].to_string();
    assert!(
        !first_run.contains("snapshot loaded into the state machine"),
        "the install ended before the kill: nothing was tested\n{first_run}"
    );

    let log_before = cluster.members[down].log().len();
    blocking(|| cluster.members[down].spawn());
    let member = &cluster.members[down];
    let panicked = async {
        while !member.log()[log_before..].contains("panicked") {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::select! {
        () = wait_for_revision(member, last_revision) => {}
        () = panicked => panic!("the restarted member panicked:\n{}", member.log_tail(60)),
    }
    // Whichever of the others led meanwhile, none stopped.
    for other in (0..3).filter(|&i| i != down) {
        let log = cluster.members[other].log();
        assert!(!log.contains("raft core stopped"), "a member stopped:\n{}", snapshot_lines(&log));
    }
    assert_hashkv_equal(&cluster);
}

/// A 3-member cluster whose follower `down`, killed, missed writes up to `last_revision` (the key
/// `down/last`) that its leader's log no longer holds: it needs a snapshot of about 100 MB (192
/// values of 512 KiB), some seconds to send on loopback.
struct Behind {
    cluster: Cluster,
    down: usize,
    last_revision: i64,
}

async fn a_follower_behind_a_snapshot() -> Behind {
    let mut cluster = blocking(|| Cluster::start(Options::new(3).flags(&["--snapshot-count", "100"])));
    let leader = cluster.leader().await;
    let down = (0..3).find(|&i| i != leader).unwrap();
    let mut client = common::auth::connect(&cluster.members[leader].client_url).await;
    put_values(&client, 192, 512 << 10).await;
    let down_index = client.status().await.expect("status").raft_index();
    blocking(|| cluster.members[down].kill_9());
    for i in 0..350 {
        put_retrying(&mut client, &format!("down/{i:06}"), b"v").await;
    }
    // The leader purges its log only when no AppendEntries in flight still uses it (openraft's
    // `try_purge_log`), and it keeps retrying the dead member: on a busy machine the log could still
    // hold what `down` missed, which then catches up without a snapshot. More puts until both
    // others have purged past it (the CI saw the restarted member catch up from the log).
    let waiting = Instant::now();
    let mut more = 0;
    while !(0..3).filter(|&i| i != down).all(|i| purged_upto(&cluster.members[i]) > down_index) {
        assert!(waiting.elapsed() < Duration::from_secs(120), "no purge past {down_index} within 120 s");
        put_retrying(&mut client, &format!("down/more{more:06}"), b"v").await;
        more += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let last_revision = put_retrying(&mut client, "down/last", b"here").await;
    Behind { cluster, down, last_revision }
}

/// A hostile holder of a member certificate sends every malformed chunk the module doc lists to a
/// follower; each gets an error, the follower installs none of it and keeps serving, and a real
/// snapshot then installs on it. Reverted to installing without `format::verify`, the garbage last
/// chunk's install fails inside openraft, which stops the follower's raft for good (the real
/// snapshot then never installs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_peer_cannot_break_the_snapshot_receiver() {
    let mut cluster = blocking(|| Cluster::start(Options::new(3).peer_tls().flags(&["--snapshot-count", "100"])));
    let leader = cluster.leader().await;
    let target = (0..3).find(|&i| i != leader).unwrap();
    let mut admin = cluster.members[leader].client().await;
    for i in 0..20 {
        admin.put(format!("before/{i}"), "v", None).await.expect("put");
    }
    let status = admin.status().await.expect("status");
    let header = status.header().expect("header");
    let (cluster_id, term, leader_id) = (header.cluster_id(), status.raft_term(), status.leader());
    let vote = Vote::new_committed(term, leader_id);
    let peer_url = cluster.members[target].peer_url.clone();
    let ca = cluster.peer_ca_file();

    // Without a member certificate: a client certificate of the peer CA names no member.
    let outsider = cluster.peer_cert("outsider", pki::client_params(Some("outsider")));
    let mut as_outsider = peer_client(&peer_url, &ca, Some(&outsider));
    let refused =
        send(&mut as_outsider, cluster_id, &chunk(vote, &meta("outsider", term, leader_id), 0, b"x", false)).await;
    assert!(refused.is_err(), "a peer without a member certificate was served: {refused:?}");

    let mut params = pki::server_params("hostile-member");
    params.subject_alt_names = vec![SanType::IpAddress("127.0.0.1".parse().unwrap())];
    let member_cert = cluster.peer_cert("hostile-member", params);
    let mut hostile = peer_client(&peer_url, &ca, Some(&member_cert));
    let a = meta("hostile-a", term, leader_id);
    let b = meta("hostile-b", term, leader_id);
    let expect_error =
        async |hostile: &mut PeerClient<Channel>, what: &str, request: Chunk| match send(hostile, cluster_id, &request)
            .await
        {
            Ok(Ok(response)) => panic!("{what}: accepted ({response:?})"),
            Ok(Err(e)) => eprintln!("{what}: {e}"),
            Err(status) => eprintln!("{what}: {status:?}"),
        };
    expect_error(&mut hostile, "a first chunk not at 0", chunk(vote, &a, 4096, b"late", false)).await;
    let first = send(&mut hostile, cluster_id, &chunk(vote, &a, 0, &[7u8; 1000], false)).await;
    assert!(matches!(first, Ok(Ok(_))), "a first chunk at 0 is taken: {first:?}");
    expect_error(&mut hostile, "a chunk past the end", chunk(vote, &a, 5000, b"gap", false)).await;
    expect_error(&mut hostile, "a chunk out of order", chunk(vote, &a, 500, b"back", false)).await;
    expect_error(&mut hostile, "a huge offset", chunk(vote, &a, u64::MAX - 1, b"huge", false)).await;
    expect_error(&mut hostile, "another snapshot mid-transfer", chunk(vote, &b, 1000, b"other", false)).await;
    expect_error(&mut hostile, "a last chunk of garbage", chunk(vote, &a, 1000, &[9u8; 64], true)).await;
    // A file that starts as a snapshot and is cut short.
    let whole = forged_snapshot(&b, 6);
    let start = send(&mut hostile, cluster_id, &chunk(vote, &b, 0, &whole[..whole.len() / 2], false)).await;
    assert!(matches!(start, Ok(Ok(_))), "{start:?}");
    expect_error(&mut hostile, "a truncated last chunk", chunk(vote, &b, (whole.len() / 2) as u64, &[], true)).await;
    // Whole files that fail the check for one reason each.
    let c = meta("hostile-c", term, leader_id);
    let mut bad_checksum = forged_snapshot(&c, 6);
    let last = bad_checksum.len() - 1;
    bad_checksum[last] ^= 0xff;
    expect_error(&mut hostile, "a bad checksum", chunk(vote, &c, 0, &bad_checksum, true)).await;
    expect_error(
        &mut hostile,
        "a file of another snapshot than announced",
        chunk(vote, &c, 0, &forged_snapshot(&a, 6), true),
    )
    .await;
    expect_error(&mut hostile, "a file with no table", chunk(vote, &c, 0, &forged_snapshot(&c, 0), true)).await;
    // A chunk far beyond the peer port's message limit is refused before it is read whole.
    let huge = vec![0u8; 96 << 20];
    expect_error(&mut hostile, "a 96 MiB chunk", chunk(vote, &meta("hostile-d", term, leader_id), 0, &huge, false))
        .await;
    drop(huge);

    // The member is still up, still serves, and installed nothing: the five whole files were refused
    // by the receiver's check, not by a failed install.
    let follower = &cluster.members[target];
    let refused = follower.log().matches("fails its check").count();
    assert_eq!(refused, 5, "files refused by the check:\n{}", follower.log_tail(40));
    assert!(!follower.log().contains("snapshot installed"), "something was installed:\n{}", follower.log_tail(40));
    let mut direct = Client::connect([follower.client_url.as_str()], None).await.expect("the follower serves");
    let count = direct.get("before/", Some(GetOptions::new().with_prefix().with_count_only())).await.expect("get");
    assert_eq!(count.count(), 20, "the follower's data is intact");

    // A real snapshot installs on it afterwards (over the hostile partial file).
    blocking(|| cluster.members[target].kill_9());
    for i in 0..350 {
        put_retrying(&mut admin, &format!("down/{i:06}"), b"v").await;
    }
    let last_revision = put_retrying(&mut admin, "down/last", b"here").await;
    blocking(|| cluster.members[target].spawn());
    wait_for_revision(&cluster.members[target], last_revision).await;
    let follower = &cluster.members[target];
    assert!(
        follower.log().contains("snapshot installed"),
        "the real snapshot was not installed:\n{}",
        follower.log_tail(40)
    );
    assert!(!snap_dir(follower).join("receiving.part").exists(), "a partial file outlived the install");
    assert_hashkv_equal(&cluster);
}

/// The leader keeps several chunks in flight, and their calls may reach the follower in any order: a
/// chunk a little ahead of what was received waits for the ones before it instead of being refused,
/// a few at most (their bytes are held in memory), and one past that few, or far ahead, is refused at
/// once. Reverted to one chunk at a time (every chunk not at the end refused), the first chunk sent
/// ahead gets `SnapshotMismatch`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_that_overtake_one_another_are_taken_in_order() {
    let cluster = blocking(|| Cluster::start(Options::new(3).peer_tls()));
    let AtAFollower { target, cluster_id, term, leader_id, vote, client } = member_cert_at_a_follower(&cluster).await;
    let a = meta("overtaken", term, leader_id);
    let follower = &cluster.members[target];
    let waiting = || metric_sum(follower, "keyward_network_snapshot_chunks_waiting");
    let until_waiting = async |n: f64| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while waiting() != n {
            assert!(Instant::now() < deadline, "{} chunks waiting, not {n}", waiting());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let ahead = |offset: u64| {
        let (mut client, request) = (client.clone(), chunk(vote, &a, offset, &[(offset / 1000) as u8; 1000], false));
        tokio::spawn(async move { send(&mut client, cluster_id, &request).await })
    };

    // The second chunk arrives first and waits for the first.
    let second = ahead(1000);
    until_waiting(1.0).await;
    let first = send(&mut client.clone(), cluster_id, &chunk(vote, &a, 0, &[0u8; 1000], false)).await;
    assert!(matches!(first, Ok(Ok(_))), "the first chunk: {first:?}");
    let second = second.await.unwrap();
    assert!(matches!(second, Ok(Ok(_))), "the chunk that came before its turn: {second:?}");
    until_waiting(0.0).await;

    // Three wait at most; a fourth is refused at once, as is one beyond what the leader keeps in flight.
    let waiters: Vec<_> = [3000, 4000, 5000].into_iter().map(|offset| (offset, ahead(offset))).collect();
    until_waiting(3.0).await;
    let refused = send(&mut client.clone(), cluster_id, &chunk(vote, &a, 6000, &[1u8; 1000], false)).await;
    assert!(matches!(refused, Ok(Err(_))), "a fourth chunk ahead: {refused:?}");
    let far = send(&mut client.clone(), cluster_id, &chunk(vote, &a, 64 << 20, &[1u8; 1000], false)).await;
    assert!(matches!(far, Ok(Err(_))), "a chunk far ahead: {far:?}");
    let filled = send(&mut client.clone(), cluster_id, &chunk(vote, &a, 2000, &[2u8; 1000], false)).await;
    assert!(matches!(filled, Ok(Ok(_))), "the chunk the waiters wait for: {filled:?}");
    for (offset, waiter) in waiters {
        let answer = waiter.await.unwrap();
        assert!(matches!(answer, Ok(Ok(_))), "the chunk at {offset}: {answer:?}");
    }
    until_waiting(0.0).await;
    // All of it was written, in order: the next chunk is at 6000.
    let next = send(&mut client.clone(), cluster_id, &chunk(vote, &a, 6000, &[6u8; 1000], false)).await;
    assert!(matches!(next, Ok(Ok(_))), "the chunk at the end: {next:?}");
    let part = std::fs::read(snap_dir(follower).join("receiving.part")).expect("the partial file");
    let expected: Vec<u8> = (0..7u8).flat_map(|i| [i; 1000]).collect();
    assert!(part == expected, "the partial file is not the chunks in order ({} bytes)", part.len());
}

/// A leader announces the size of the snapshot it sends (`keyward-snapshot-size`) and the follower
/// holds it to that: no chunk past it, the last chunk ends there, the same size on every chunk, and a
/// snapshot larger than the free disk is refused at its first chunk, with an error and nothing
/// written. Reverted (no bound), the chunk past the announced size is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_partial_file_is_bounded_by_the_size_announced_and_the_free_disk() {
    let cluster = blocking(|| Cluster::start(Options::new(3).peer_tls()));
    let AtAFollower { target, cluster_id, term, leader_id, vote, mut client } =
        member_cert_at_a_follower(&cluster).await;
    let a = meta("announced", term, leader_id);
    let follower = &cluster.members[target];
    let part = || std::fs::metadata(snap_dir(follower).join("receiving.part")).map(|m| m.len()).unwrap_or(0);

    let first = send_announcing(&mut client, cluster_id, &chunk(vote, &a, 0, &[1u8; 1000], false), 2000).await;
    assert!(matches!(first, Ok(Ok(_))), "a first chunk within the size announced: {first:?}");
    let refusals = [
        ("a chunk past the size announced", chunk(vote, &a, 1000, &[2u8; 1500], false), 2000),
        ("a last chunk short of the size announced", chunk(vote, &a, 1000, &[2u8; 500], true), 2000),
        ("another size for the same snapshot", chunk(vote, &a, 1000, &[2u8; 500], false), 3000),
    ];
    for (what, request, size) in refusals {
        let answer = send_announcing(&mut client, cluster_id, &request, size).await;
        assert!(matches!(answer, Ok(Err(_))), "{what}: {answer:?}");
        assert_eq!(part(), 1000, "{what}: written");
    }
    let too_big = meta("larger-than-the-disk", term, leader_id);
    let answer =
        send_announcing(&mut client, cluster_id, &chunk(vote, &too_big, 0, &[3u8; 1000], false), 1 << 60).await;
    match answer {
        Ok(Err(e)) => assert!(e.to_string().contains("no space"), "a snapshot larger than the disk: {e}"),
        other => panic!("a snapshot larger than the disk: {other:?}"),
    }
    assert!(part() <= 1000, "the snapshot larger than the disk was written");
    assert!(follower.log().contains("a snapshot chunk refused"), "{}", follower.log_tail(20));
}

/// openraft's `InstallSnapshotRequest`, field for field, with a membership of no node (so any node
/// type encodes the same).
#[derive(serde::Serialize)]
struct Chunk {
    vote: Vote<u64>,
    meta: SnapshotMeta<u64, BasicNode>,
    offset: u64,
    data: Vec<u8>,
    done: bool,
}

type Answer = Result<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>>;

fn chunk(vote: Vote<u64>, meta: &SnapshotMeta<u64, BasicNode>, offset: u64, data: &[u8], done: bool) -> Chunk {
    Chunk { vote, meta: meta.clone(), offset, data: data.to_vec(), done }
}

/// A snapshot's metadata claiming an entry far ahead of anything applied (so it is never covered).
fn meta(id: &str, term: u64, leader: u64) -> SnapshotMeta<u64, BasicNode> {
    let last = LogId::new(CommittedLeaderId::new(term, leader), 1 << 40);
    SnapshotMeta { last_log_id: Some(last), last_membership: StoredMembership::default(), snapshot_id: id.into() }
}

/// A snapshot file in keyward's format (`raft/state_machine/snapshot/format.rs`) for `meta`, with
/// `tables` empty tables and a correct checksum.
fn forged_snapshot(meta: &SnapshotMeta<u64, BasicNode>, tables: u8) -> Vec<u8> {
    let encoded = postcard::to_allocvec(meta).unwrap();
    let mut file = b"keyward-snap-v2\n".to_vec();
    file.extend_from_slice(&(encoded.len() as u32).to_le_bytes());
    file.extend_from_slice(&encoded);
    file.push(tables);
    file.extend(std::iter::repeat_n(0u8, tables as usize));
    let crc = crc32c::crc32c(&file);
    file.extend_from_slice(&crc.to_le_bytes());
    file
}

async fn send(client: &mut PeerClient<Channel>, cluster_id: u64, chunk: &Chunk) -> Result<Answer, tonic::Status> {
    send_with(client, cluster_id, chunk, None).await
}

/// `send`, announcing the snapshot's size as a leader does.
async fn send_announcing(
    client: &mut PeerClient<Channel>,
    cluster_id: u64,
    chunk: &Chunk,
    size: u64,
) -> Result<Answer, tonic::Status> {
    send_with(client, cluster_id, chunk, Some(size)).await
}

async fn send_with(
    client: &mut PeerClient<Channel>,
    cluster_id: u64,
    chunk: &Chunk,
    size: Option<u64>,
) -> Result<Answer, tonic::Status> {
    let mut request = tonic::Request::new(RaftMessage { payload: postcard::to_allocvec(chunk).unwrap() });
    request.metadata_mut().insert("keyward-cluster-id", format!("{cluster_id:x}").parse().unwrap());
    if let Some(size) = size {
        request.metadata_mut().insert("keyward-snapshot-size", size.to_string().parse().unwrap());
    }
    request.set_timeout(Duration::from_secs(30));
    let answer = client.install_snapshot(request).await?.into_inner();
    Ok(postcard::from_bytes(&answer.payload).expect("a decodable answer"))
}

/// A peer-protocol client of `peer_url` presenting `cert`, trusting `ca` for the member's certificate.
fn peer_client(peer_url: &str, ca: &Path, cert: Option<&Cert>) -> PeerClient<Channel> {
    let tls = keyward::client_config(
        ca,
        cert.map(|c| (c.cert.as_path(), c.key.as_path())),
        ("--cacert", "--cert", "--key"),
        &keyward::TlsPolicy::default(),
    )
    .expect("client TLS configuration");
    let channel = keyward::lazy_channel(peer_url, Some(&tls), Duration::from_secs(5)).expect("a channel");
    PeerClient::new(channel).max_encoding_message_size(usize::MAX).max_decoding_message_size(usize::MAX)
}

fn snap_dir(member: &Member) -> PathBuf {
    member.data_dir().join("member").join("snap")
}

/// Waits until no snapshot build has been under way on `member` for two seconds: the build the last
/// applied writes triggered is done.
async fn wait_until_no_snapshot_is_building(member: &Member) {
    let (waiting, mut quiet_since) = (Instant::now(), Instant::now());
    while quiet_since.elapsed() < Duration::from_secs(2) {
        if snapshot_building(member) {
            quiet_since = Instant::now();
        }
        assert!(waiting.elapsed() < Duration::from_secs(300), "a snapshot build never ended:\n{}", member.log_tail(40));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether `member` is building a snapshot: its temp file is in the snap dir
/// (`src/raft/state_machine/snapshot/dir.rs`).
fn snapshot_building(member: &Member) -> bool {
    let entries = std::fs::read_dir(snap_dir(member)).into_iter().flatten().flatten();
    entries.into_iter().any(|entry| entry.file_name().to_string_lossy().starts_with("build-"))
}

/// How far `member` has purged its raft log (its last "raft log purged" line), 0 if not at all.
fn purged_upto(member: &Member) -> u64 {
    let log = member.log();
    let upto = field_of_last_line(&log, |l| l.contains("raft log purged"), "upto");
    upto.and_then(|n| n.parse().ok()).unwrap_or(0)
}

/// The snapshot id of the last line of the leader's log that contains `message`.
fn last_snapshot_id(cluster: &Cluster, leader: usize, message: &str) -> Option<String> {
    last_snapshot_id_in(&cluster.members[leader].log(), |l| l.contains(message))
}

/// The snapshot id of the last line of `log` that `matches`.
fn last_snapshot_id_in(log: &str, matches: impl Fn(&str) -> bool) -> Option<String> {
    field_of_last_line(log, matches, "snapshot").map(str::to_string)
}

/// The value of the log field `name` (` name=value`) in the last line of `log` that `matches`.
fn field_of_last_line<'a>(log: &'a str, matches: impl Fn(&str) -> bool, name: &str) -> Option<&'a str> {
    let line = log.lines().rev().find(|l| matches(l))?;
    line.split(&format!(" {name}=")).nth(1)?.split(' ').next()
}

/// Waits until `member`'s log past byte `since` has a line containing `text`, for `within` at most.
/// Read every 2 ms: a test that kills the member on that line kills it within a few ms of it.
async fn wait_for_line(member: &Member, since: usize, text: &str, within: Duration) {
    let waiting = Instant::now();
    while !member.log()[since..].contains(text) {
        assert!(waiting.elapsed() < within, "no \"{text}\" within {within:?}:\n{}", member.log_tail(40));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The lines of `log` about snapshots, the last hundred: what a failed wait for one shows.
fn snapshot_lines(log: &str) -> String {
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("snapshot")).collect();
    lines[lines.len().saturating_sub(100)..].join("\n")
}

/// A follower, the leader's committed vote, and a client of the follower's peer port with a member
/// certificate of the cluster's peer CA (any member certificate passes the peer guard).
struct AtAFollower {
    target: usize,
    cluster_id: u64,
    term: u64,
    leader_id: u64,
    vote: Vote<u64>,
    client: PeerClient<Channel>,
}

async fn member_cert_at_a_follower(cluster: &Cluster) -> AtAFollower {
    let leader = cluster.leader().await;
    let target = (0..3).find(|&i| i != leader).unwrap();
    let status = cluster.members[leader].client().await.status().await.expect("status");
    let header = status.header().expect("header");
    let (cluster_id, term, leader_id) = (header.cluster_id(), status.raft_term(), status.leader());
    let mut params = pki::server_params("member-like");
    params.subject_alt_names = vec![SanType::IpAddress("127.0.0.1".parse().unwrap())];
    let cert = cluster.peer_cert("member-like", params);
    let client = peer_client(&cluster.members[target].peer_url, &cluster.peer_ca_file(), Some(&cert));
    AtAFollower { target, cluster_id, term, leader_id, vote: Vote::new_committed(term, leader_id), client }
}

/// The size of the snapshot the leader logged sending.
fn snapshot_size_sent(cluster: &Cluster, leader: usize) -> u64 {
    let log = cluster.members[leader].log();
    let size = field_of_last_line(&log, |l| l.contains("sending a snapshot"), "size");
    size.expect("the leader logged sending a snapshot, with its size").parse().expect("a size")
}

/// Every member's `etcdctl endpoint hashkv` is the same.
fn assert_hashkv_equal(cluster: &Cluster) {
    let hashes: Vec<String> = cluster.members.iter().map(|m| blocking(|| m.hashkv())).collect();
    assert!(hashes.iter().all(|h| *h == hashes[0] && h != "null"), "HashKV differs: {hashes:?}");
}

/// `n` values of `bytes` bytes each under `value/`, two puts at a time. A put that failed
/// transiently (`transient`) is put again, for ten minutes at most: the same key, so the store
/// ends the same.
async fn put_values(client: &Client, n: usize, bytes: usize) {
    let value = vec![b'x'; bytes];
    let mut workers = Vec::new();
    let started = Instant::now();
    for worker in 0..2 {
        let (mut client, value) = (client.clone(), value.clone());
        workers.push(tokio::spawn(async move {
            for i in (worker..n).step_by(2) {
                loop {
                    match client.put(format!("value/{i:06}"), value.clone(), None).await {
                        Ok(_) => break,
                        Err(e) if transient(&e) => {
                            assert!(started.elapsed() < Duration::from_secs(600), "puts still fail: {e}")
                        }
                        Err(e) => panic!("put a value: {e}"),
                    }
                }
            }
        }));
    }
    for worker in workers {
        worker.await.expect("a put worker");
    }
}

/// Puts `key`, again while it fails transiently (`transient`; the same key, so the store ends the
/// same), for ten minutes at most; returns its revision.
async fn put_retrying(client: &mut Client, key: &str, value: &[u8]) -> i64 {
    let started = Instant::now();
    loop {
        match client.put(key, value, None).await {
            Ok(put) => return put.header().expect("header").revision(),
            Err(e) if transient(&e) => {
                assert!(started.elapsed() < Duration::from_secs(600), "puts still fail: {e}")
            }
            Err(e) => panic!("put {key}: {e}"),
        }
    }
}

/// An error a client retries: a member too busy to answer in time, or a leader lost to an election
/// on a loaded machine (two of the three members are up while the follower is down).
fn transient(e: &etcd_client::Error) -> bool {
    let e = e.to_string();
    ["request timed out", "no leader", "leader changed"].iter().any(|m| e.contains(m))
}
