//! The peer port speaks to members only (issue 28, finding 2), attacked through the real peer listener
//! with keyward's own peer-protocol client (`keyward::proto::keywardpb::peer_client`), as a hostile
//! holder of some certificate would:
//!
//! - one CA for clients and peers, `--peer-client-cert-auth`, no allow-list (how `deploy/` used to set
//!   peers up): alice's client certificate can neither read the membership nor propose a
//!   `member_internal` put; nor can a server certificate that names no member; the members still form
//!   a cluster and forward writes to the leader;
//! - a separate peer CA (how `deploy/` sets peers up now): the proxy's certificate is refused; a member
//!   added later joins with its peer-CA certificate;
//! - `--peer-cert-allowed-cn` / `--peer-cert-allowed-hostname` admit exactly what they name;
//! - a single member's plain-text peer port answers no one; a plain-text peer URL beyond loopback is
//!   refused at start unless `--peer-allow-plaintext` says so.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common;
use crate::common::cluster::{Cluster, Options, SETTLE_TIMEOUT};
use crate::common::pki::{self, Cert};
use keyward::proto::etcdserverpb::{InternalRaftRequest, PutRequest, RequestHeader};
use keyward::proto::keywardpb::peer_client::PeerClient;
use keyward::proto::keywardpb::{MembershipRequest, ReadIndexRequest};
use rcgen::{ExtendedKeyUsagePurpose, SanType};
use tonic::transport::Channel;
use tonic::Code;

/// Runs blocking harness work (process starts, etcdctl) without stalling the runtime's other tasks.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// A peer-protocol client of `peer_url` presenting `cert` (none on `http://`), trusting `ca` for the
/// member's certificate.
pub(crate) fn peer_client(peer_url: &str, ca: &Path, cert: Option<&Cert>) -> PeerClient<Channel> {
    let tls = match peer_url.starts_with("https://") {
        true => Some(
            keyward::client_config(
                ca,
                cert.map(|c| (c.cert.as_path(), c.key.as_path())),
                ("--cacert", "--cert", "--key"),
                &keyward::TlsPolicy::default(),
            )
            .expect("client TLS configuration"),
        ),
        false => None,
    };
    let channel =
        keyward::lazy_channel(peer_url, tls.as_ref(), Duration::from_secs(5)).expect("a channel to the peer port");
    PeerClient::new(channel)
}

/// A peer request claiming cluster `cluster_id` (the header every member sends; any client response
/// header tells it).
fn from_cluster<T>(message: T, cluster_id: u64) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert("keyward-cluster-id", format!("{cluster_id:x}").parse().unwrap());
    request.set_timeout(Duration::from_secs(10));
    request
}

/// A put of `key` that claims the member's own authority (`member_internal`): applied past every
/// permission check if a member proposes it.
fn forged_put(key: &str) -> InternalRaftRequest {
    InternalRaftRequest {
        header: Some(RequestHeader { member_internal: true, ..Default::default() }),
        put: Some(Box::new(PutRequest {
            key: key.as_bytes().to_vec(),
            value: b"forged".to_vec(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// What the peer port answered `who` for a membership query: the cluster id, or the refusal.
async fn membership_as(client: &mut PeerClient<Channel>, cluster_id: u64) -> Result<u64, tonic::Status> {
    client.membership(from_cluster(MembershipRequest {}, cluster_id)).await.map(|r| r.into_inner().cluster_id)
}

/// Asserts that the peer port refused the call: permission denied (the certificate names no
/// member), or a connection the TLS handshake refused (the certificate does not chain to the peer CA).
#[track_caller]
fn assert_refused<T: std::fmt::Debug>(what: &str, result: Result<T, tonic::Status>, handshake: bool) {
    match result {
        Ok(v) => panic!("{what}: the peer port served it: {v:?}"),
        Err(status) if handshake => {
            assert!(
                matches!(status.code(), Code::Unavailable | Code::Unknown | Code::Internal | Code::Cancelled),
                "{what}: want a refused connection, got {status:?}"
            )
        }
        Err(status) => {
            assert_eq!(status.code(), Code::PermissionDenied, "{what}: {status:?}");
            assert!(status.message().contains("peer"), "{what}: {status:?}");
        }
    }
}

/// The cluster id, as any client's response header tells it.
pub(crate) async fn cluster_id(cluster: &Cluster) -> u64 {
    let mut client = cluster.members[0].client().await;
    client.status().await.expect("status").header().expect("header").cluster_id()
}

/// Parameters of a server certificate (serverAuth + clientAuth) with CN `cn` and the given SANs only.
fn server_cert_params(cn: &str, sans: Vec<SanType>) -> rcgen::CertificateParams {
    let mut params = pki::server_params(cn);
    params.subject_alt_names = sans;
    params
}

fn loopback_ip() -> SanType {
    SanType::IpAddress("127.0.0.1".parse().unwrap())
}

fn dns(name: &str) -> SanType {
    SanType::DnsName(name.try_into().unwrap())
}

/// Whether `key` exists, read linearizably as the harness's client (root) on member `i`.
async fn key_exists(cluster: &Cluster, i: usize, key: &str) -> bool {
    let mut client = cluster.members[i].client().await;
    client.get(key, None).await.expect("get").count() > 0
}

/// One CA signs clients and peers, `--peer-client-cert-auth`, no allow-list. alice (a user with no
/// permission at all) calls the leader's peer port with her client certificate: the membership query
/// and a `member_internal` put are refused, and the key is not written. A server certificate of the
/// same CA that names no member's host is refused too, and so is a client certificate that names the
/// members' host (it is not a server certificate). Twin: the members themselves form the cluster and a
/// follower's forwarded write (the same Propose call) is applied; a server certificate naming the
/// members' host is admitted (on loopback every member's host is 127.0.0.1: a shared CA cannot tell
/// more apart, which is why `deploy/` gives peers a CA of their own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_client_certificate_is_no_member_under_a_shared_ca() {
    let cluster = blocking(|| Cluster::start(Options::new(3).peer_tls_shared_ca().client_tls()));
    blocking(|| {
        let m1 = &cluster.members[0];
        m1.ctl(&["user", "add", "root", "--no-password"]);
        m1.ctl(&["user", "add", "alice", "--no-password"]);
        m1.ctl(&["auth", "enable"]);
    });
    let id = cluster_id(&cluster).await;
    let leader = cluster.leader().await;
    let leader_peer = cluster.members[leader].peer_url.clone();
    let ca = cluster.pki.ca_file();
    let alice = cluster.client_cert("alice");
    // Through the client port alice may not write.
    blocking(|| {
        let put = cluster.members[leader].etcdctl_as(&alice, &["put", "/forged/client", "v"]);
        assert!(!put.success(), "alice has no permission: {put:?}");
    });

    let mut as_alice = peer_client(&leader_peer, &ca, Some(&alice));
    let propose = as_alice.propose(from_cluster(forged_put("/forged/alice"), id)).await;
    if propose.is_ok() {
        let written = key_exists(&cluster, leader, "/forged/alice").await;
        panic!("alice's member_internal put was served (the key is written: {written})");
    }
    assert_refused("alice's member_internal put", propose, false);
    assert_refused("alice's membership query", membership_as(&mut as_alice, id).await, false);
    let read_index = as_alice.read_index(from_cluster(ReadIndexRequest {}, id)).await;
    assert_refused("alice's read index", read_index, false);

    // A server certificate of the shared CA for another host (as the proxy's in deploy/).
    let elsewhere = cluster.pki.issue("elsewhere", server_cert_params("keyward-proxy", vec![dns("keyward-proxy")]));
    let mut as_elsewhere = peer_client(&leader_peer, &ca, Some(&elsewhere));
    assert_refused("a server certificate for another host", membership_as(&mut as_elsewhere, id).await, false);
    let propose = as_elsewhere.propose(from_cluster(forged_put("/forged/elsewhere"), id)).await;
    assert_refused("a server certificate's member_internal put", propose, false);

    // A client certificate that names the members' host is still a client certificate.
    let named = cluster.pki.client_with_sans("alice-named", Some("alice"), vec![loopback_ip()]);
    let mut as_named = peer_client(&leader_peer, &ca, Some(&named));
    assert_refused("a client certificate naming the members' host", membership_as(&mut as_named, id).await, false);
    let propose = as_named.propose(from_cluster(forged_put("/forged/named"), id)).await;
    assert_refused("a client certificate's member_internal put", propose, false);

    for i in 0..3 {
        for key in ["/forged/client", "/forged/alice", "/forged/elsewhere", "/forged/named"] {
            assert!(!key_exists(&cluster, i, key).await, "{key} was written (seen on {})", cluster.members[i].name);
        }
    }

    // Twin: a follower forwards a write to the leader over the same Propose call, and it replicates.
    let follower = (leader + 1) % 3;
    blocking(|| cluster.members[follower].ctl(&["put", "/through/follower", "v"]));
    for i in 0..3 {
        assert!(key_exists(&cluster, i, "/through/follower").await, "not on {}", cluster.members[i].name);
    }
    // Twin: a server certificate naming the members' host is a member's certificate here.
    let member_like = cluster.pki.issue("member-like", server_cert_params("member-like", vec![loopback_ip()]));
    let mut as_member = peer_client(&leader_peer, &ca, Some(&member_like));
    assert_eq!(membership_as(&mut as_member, id).await.expect("a member's certificate is served"), id);
}

/// A separate peer CA (as `deploy/` sets peers up): the proxy's certificate (a server and client
/// certificate of the client CA, naming 127.0.0.1 like the members) is refused at the peer port,
/// its `member_internal` put is not applied. Twin: a learner added with `etcdctl member add` and a
/// peer-CA certificate joins (before it has the membership it admits the leader by
/// `--initial-cluster`) and serves what the cluster holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxys_certificate_is_no_member_with_a_peer_ca() {
    let mut cluster = blocking(|| Cluster::start(Options::new(3).peer_tls().client_tls()));
    let id = cluster_id(&cluster).await;
    let leader = cluster.leader().await;
    let leader_peer = cluster.members[leader].peer_url.clone();
    let proxy = cluster.pki.issue("proxy", server_cert_params("keyward-proxy", vec![loopback_ip(), dns("localhost")]));
    let mut as_proxy = peer_client(&leader_peer, &cluster.peer_ca_file(), Some(&proxy));
    assert_refused("the proxy's membership query", membership_as(&mut as_proxy, id).await, true);
    let propose = as_proxy.propose(from_cluster(forged_put("/forged/proxy"), id)).await;
    assert_refused("the proxy's member_internal put", propose, true);
    for i in 0..3 {
        assert!(!key_exists(&cluster, i, "/forged/proxy").await, "written (seen on {})", cluster.members[i].name);
    }

    // Twin: a new member with its peer-CA certificate joins and catches up.
    blocking(|| cluster.members[0].ctl(&["put", "/before/join", "v"]));
    let joined = blocking(|| cluster.add_member(leader, "m4", true));
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        let out = blocking(|| {
            cluster.members[joined].etcdctl(&["get", "/before/join", "--print-value-only", "--consistency=s"])
        });
        if out.success() && out.stdout.trim() == "v" {
            break;
        }
        assert!(Instant::now() < deadline, "the new member never served the key: {out:?}\n{}", {
            cluster.members[joined].log_tail(30)
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `--peer-cert-allowed-cn` replaces the membership rule with the names it lists: a peer-CA server
/// certificate with a listed CN is admitted whatever its SANs, one naming the members' host but
/// another CN is refused, and a listed CN on a client-only certificate is refused (peer certificates
/// are server certificates). `--peer-cert-allowed-hostname` the same by host name, as Go's
/// `VerifyHostname` matches it (a wildcard SAN names one label).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_allow_lists_admit_exactly_what_they_name() {
    let cn_cluster = blocking(|| {
        Cluster::start(Options::new(1).peer_tls().flags(&["--peer-cert-allowed-cn", "member-m1,ops-peer"]))
    });
    let hostname_cluster = blocking(|| {
        Cluster::start(Options::new(1).peer_tls().flags(&["--peer-cert-allowed-hostname", "peer.keyward.test"]))
    });
    for (cluster, admitted, refused) in [
        (
            &cn_cluster,
            vec![server_cert_params("ops-peer", vec![]), server_cert_params("member-m1", vec![dns("anywhere.test")])],
            vec![
                server_cert_params("intruder", vec![loopback_ip()]),
                server_cert_params("Ops-Peer", vec![loopback_ip()]),
                {
                    let mut client_only = server_cert_params("ops-peer", vec![loopback_ip()]);
                    client_only.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
                    client_only
                },
            ],
        ),
        (
            &hostname_cluster,
            vec![
                server_cert_params("anyone", vec![dns("peer.keyward.test")]),
                server_cert_params("wildcard", vec![dns("*.keyward.test")]),
            ],
            vec![
                server_cert_params("loopback", vec![loopback_ip()]),
                server_cert_params("deeper", vec![dns("*.test")]),
                server_cert_params("peer.keyward.test", vec![dns("other.keyward.test")]),
            ],
        ),
    ] {
        let id = cluster_id(cluster).await;
        let peer_url = cluster.members[0].peer_url.clone();
        for (n, params) in admitted.into_iter().enumerate() {
            let cert = cluster.peer_cert(&format!("admitted-{n}"), params);
            let mut client = peer_client(&peer_url, &cluster.peer_ca_file(), Some(&cert));
            let answer = membership_as(&mut client, id).await;
            assert_eq!(answer.unwrap_or_else(|e| panic!("admitted #{n} refused: {e:?}")), id);
        }
        for (n, params) in refused.into_iter().enumerate() {
            let cert = cluster.peer_cert(&format!("refused-{n}"), params);
            let mut client = peer_client(&peer_url, &cluster.peer_ca_file(), Some(&cert));
            assert_refused(&format!("refused #{n}"), membership_as(&mut client, id).await, false);
        }
    }
}

/// A single member on the default plain-text peer URL: nobody else is a member, so its peer port
/// serves no one (a local process can neither read the membership nor propose a `member_internal`
/// put). Twin: a two-member plain-text cluster replicates a write forwarded by its follower.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_members_plaintext_peer_port_serves_no_one() {
    let cluster = blocking(|| Cluster::start(Options::new(1)));
    let id = cluster_id(&cluster).await;
    let peer_url = cluster.members[0].peer_url.clone();
    assert!(peer_url.starts_with("http://127.0.0.1:"));
    let mut local = peer_client(&peer_url, Path::new("/nonexistent"), None);
    assert_refused("a local process's membership query", membership_as(&mut local, id).await, false);
    let propose = local.propose(from_cluster(forged_put("/forged/local"), id)).await;
    assert_refused("a local process's member_internal put", propose, false);
    assert!(!key_exists(&cluster, 0, "/forged/local").await, "the forged put was applied");
    drop(cluster);

    let pair = blocking(|| Cluster::start(Options::new(2)));
    let leader = pair.leader().await;
    blocking(|| pair.members[1 - leader].ctl(&["put", "/through/follower", "v"]));
    assert!(key_exists(&pair, leader, "/through/follower").await);
}

/// `--listen-peer-urls http://` on a non-loopback address is refused before anything is bound, and
/// the message names the flag that allows it. (192.0.2.1 is TEST-NET-1: no interface has it, so a
/// member that did try to bind it would fail differently, and nothing beyond loopback is bound.)
/// Twin: with `--peer-allow-plaintext` the configuration is accepted and the member goes on to bind.
#[test]
fn a_plaintext_peer_url_beyond_loopback_is_refused_at_start() {
    let run = |extra: &[&str]| {
        let dir = tempfile::tempdir().unwrap();
        let port = common::free_port();
        let peer = format!("http://192.0.2.1:{port}");
        let client = format!("http://127.0.0.1:{}", common::free_port());
        let mut cmd = std::process::Command::new(common::keyward_bin());
        cmd.arg("serve")
            .args(["--data-dir", dir.path().join("data").to_str().unwrap()])
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(extra);
        common::scrub_env(&mut cmd);
        let out = cmd.output().expect("run keyward");
        assert!(!out.status.success(), "started: {out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let refused = run(&[]);
    assert!(refused.contains("--peer-allow-plaintext") && refused.contains("http://192.0.2.1:"), "{refused}");
    let allowed = run(&["--peer-allow-plaintext"]);
    assert!(!allowed.contains("--peer-allow-plaintext"), "{allowed}");
    assert!(allowed.contains("listen on http://192.0.2.1:"), "the member went on to bind: {allowed}");
}
