//! Login throttling (`auth/throttle.rs`) attacked the way a hostile client would, through the real
//! client listener: a burst of concurrent wrong passwords, clients that give up, password spraying
//! between logins to the attacker's own account, and failures spread over the members of a cluster.
//!
//! The oracle is `keyward_auth_password_checks_total` (bcrypt checks by outcome): how many guesses
//! actually reached bcrypt. Other client addresses are other loopback addresses (127.0.0.2 needs no
//! setup on Linux: the client socket binds it as its source). Numbers are printed with `eprintln!`.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use crate::common::auth::*;
use crate::common::cluster::{Cluster, Member, Options};
use crate::common::etcd_errors::AUTH_FAILED;
use crate::common::{self, pki, Kind};

const TOO_MANY_REQUESTS: &str = "etcdserver: too many requests";
const ATTACKER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const ELSEWHERE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// The tests of this file take turns: their bounds are about one server's schedule, not a shared CPU.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// bcrypt checks that found a guess wrong (a wrong password, an unknown user) a member ran so far.
fn wrong_checks(ep: &str) -> f64 {
    let (_, text) = common::http_get(ep, "/metrics");
    ["mismatch", "unknown_user"]
        .iter()
        .map(|outcome| {
            common::metric_if_any(&text, &format!("keyward_auth_password_checks_total{{outcome=\"{outcome}\"}}"))
                .unwrap_or(0.0)
        })
        .sum()
}

fn throttled(ep: &str, action: &str) -> f64 {
    let (_, text) = common::http_get(ep, "/metrics");
    common::metric(&text, &format!("keyward_auth_logins_throttled_total{{action=\"{action}\"}}"))
}

/// The throttle's schedule for one key: `free` attempts at once, then one attempt after each wait
/// (`base`, doubling, each at most `cap`), none that would wait longer than `cap`. How many password
/// checks it allows within `elapsed` of the first attempt.
fn allowed_within(elapsed: Duration, free: u32, base: Duration, cap: Duration) -> u32 {
    let (mut at, mut delay, mut allowed) = (Duration::ZERO, base, free);
    loop {
        at += delay.min(cap);
        if at > cap || at > elapsed {
            return allowed;
        }
        allowed += 1;
        delay *= 2;
    }
}

/// How a burst's attempts ended.
#[derive(Debug, Default)]
struct Outcomes {
    wrong: usize,
    refused: usize,
    gave_up: usize,
    other: Vec<String>,
}

impl Outcomes {
    fn of(results: Vec<Result<String, tonic::Status>>) -> Outcomes {
        let mut outcomes = Outcomes::default();
        for result in results {
            match result {
                Err(e) if e.message() == AUTH_FAILED => outcomes.wrong += 1,
                Err(e) if e.message() == TOO_MANY_REQUESTS => outcomes.refused += 1,
                Err(e) if matches!(e.code(), tonic::Code::DeadlineExceeded | tonic::Code::Cancelled) => {
                    outcomes.gave_up += 1
                }
                other => outcomes.other.push(format!("{other:?}")),
            }
        }
        outcomes
    }
}

/// A wrong-password Authenticate that gives up after `patience` (the client's deadline).
async fn impatient_login(
    ch: &tonic::transport::Channel,
    user: &str,
    pw: &str,
    patience: Duration,
) -> Result<String, tonic::Status> {
    let mut auth = pb::auth_client::AuthClient::new(ch.clone());
    let mut req = tonic::Request::new(pb::AuthenticateRequest { name: user.into(), password: pw.into() });
    req.set_timeout(patience);
    auth.authenticate(req).await.map(|r| r.into_inner().token)
}

/// 60 wrong passwords for root sent at once from one address: only the free allowance reaches bcrypt
/// at once, the rest no faster than the doubling schedule allows (sampled from `/metrics` while the
/// burst runs) and at most as many as fit within the cap; the others are refused at once with
/// "too many requests". Meanwhile root logs in from another address without a wait; once the burst's
/// clients have given up, the right password from the attacker's address is served within the cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_concurrent_wrong_passwords_reach_bcrypt_no_faster_than_the_schedule() {
    if common::selftest() {
        return; // etcd has no login throttling
    }
    let _turn = TURN.lock().await;
    const FREE: u32 = 5;
    let (base, cap) = (Duration::from_millis(1000), Duration::from_millis(8000));
    let args = ["--bcrypt-cost", "4", "--login-throttle-free-failures", "5"]
        .into_iter()
        .chain(["--login-throttle-base-delay", "1000", "--login-throttle-max-delay", "8000"])
        .collect::<Vec<_>>();
    let s = AuthServer::start_with(Kind::Keyward, &args).await;
    let ep = s.ep();
    let before = wrong_checks(&ep);
    let attacker = channel_from(&ep, ATTACKER).await;
    let elsewhere = channel_from(&ep, ELSEWHERE).await;

    // A sampler reads the checks while the burst runs; each sample is bounded by the schedule up to
    // the moment its answer arrived (the server can only be slower than the schedule, never faster).
    let started = Instant::now();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (ep, done) = (ep.clone(), done.clone());
        tokio::task::spawn_blocking(move || {
            let mut samples = Vec::new();
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let checks = wrong_checks(&ep) - before;
                samples.push((started.elapsed(), checks));
                std::thread::sleep(Duration::from_millis(25));
            }
            samples
        })
    };
    // The burst's clients give up after 4 s: the attempts still waiting then are abandoned.
    let patience = Duration::from_secs(4);
    let burst = futures::future::join_all((0..60).map(|i| {
        let ch = attacker.clone();
        async move { impatient_login(&ch, "root", &format!("guess-{i}"), patience).await }
    }));
    let during = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        login_on(&elsewhere, "root", ROOT_PW).await
    };
    let (results, (elsewhere_result, elsewhere_took)) = tokio::join!(burst, during);
    let burst_took = started.elapsed();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let samples = sampler.await.unwrap();
    let outcomes = Outcomes::of(results);
    let checks = wrong_checks(&ep) - before;
    eprintln!(
        "60 concurrent wrong passwords: {outcomes:?}; bcrypt checks {checks}; burst over after {burst_took:?}; \
         root from 127.0.0.2 meanwhile took {elsewhere_took:?}"
    );
    let first_samples: Vec<_> = samples.iter().take(12).collect();
    eprintln!("checks sampled while the burst ran (elapsed, checks): {first_samples:?} ...");

    for (elapsed, sampled) in &samples {
        let allowed = allowed_within(*elapsed, FREE, base, cap) as f64;
        assert!(*sampled <= allowed, "{sampled} checks after {elapsed:?}: the schedule allows {allowed}");
    }
    let within_cap = allowed_within(Duration::MAX, FREE, base, cap) as usize;
    assert!(outcomes.other.is_empty(), "unexpected answers: {:?}", outcomes.other);
    assert!(outcomes.wrong >= FREE as usize, "the free allowance is checked: {outcomes:?}");
    assert!(outcomes.wrong <= within_cap, "at most {within_cap} checks within the cap: {outcomes:?}");
    assert!(outcomes.refused >= 60 - within_cap, "the rest are refused at once: {outcomes:?}");
    assert_eq!(checks as usize, outcomes.wrong, "every check answered, none behind the client's back");
    elsewhere_result.expect("root from another address during the burst");
    assert!(elsewhere_took < base, "root from 127.0.0.2 waited {elsewhere_took:?}");

    // The burst's clients are gone: the right password from the attacker's address is served within the cap.
    let (result, took) = login_on(&attacker, "root", ROOT_PW).await;
    eprintln!("right password from 127.0.0.1 after the burst: {:?} after {took:?}", result.as_ref().map(|_| "ok"));
    result.expect("the right password from the throttled address, after the burst's clients gave up");
    assert!(took <= cap + Duration::from_secs(5), "served within the cap (and a check): {took:?}");
}

/// Password spraying: one wrong guess each for many user names from one address, between logins to
/// the attacker's own account. Those successes clear only the attacker's own (user, address) key:
/// the address is still throttled once it is past its allowance, and another address is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spraying_between_own_logins_still_throttles_the_address() {
    if common::selftest() {
        return;
    }
    let _turn = TURN.lock().await;
    // 2 free failures per (user, address), 8 for the address alone.
    let args = ["--bcrypt-cost", "4", "--login-throttle-free-failures", "2"]
        .into_iter()
        .chain(["--login-throttle-base-delay", "200", "--login-throttle-max-delay", "400"])
        .collect::<Vec<_>>();
    let mut s = AuthServer::start_with(Kind::Keyward, &args).await;
    s.add_user("mallory", "mallorypw", &[]).await;
    let ep = s.ep();
    let attacker = channel_from(&ep, ATTACKER).await;
    let elsewhere = channel_from(&ep, ELSEWHERE).await;
    let delayed_before = throttled(&ep, "delayed");
    let mut waits = Vec::new();
    for i in 0..14 {
        let (result, took) = login_on(&attacker, &format!("victim{i}"), "Winter2026!").await;
        assert_eq!(result.unwrap_err().message(), AUTH_FAILED, "guess {i}");
        waits.push(took);
        login_on(&attacker, "mallory", "mallorypw").await.0.expect("the attacker's own login");
    }
    let delayed = throttled(&ep, "delayed") - delayed_before;
    eprintln!("14 sprayed guesses between own logins: {delayed} attempts waited; guess latencies {waits:?}");
    assert!(delayed >= 6.0, "the guesses past the address's 8 free failures waited: {delayed}");

    let before = throttled(&ep, "delayed");
    let (result, took) = login_on(&elsewhere, "victim-x", "Winter2026!").await;
    assert_eq!(result.unwrap_err().message(), AUTH_FAILED);
    assert_eq!(throttled(&ep, "delayed"), before, "a guess from 127.0.0.2 waited ({took:?})");
}

/// Three members give one budget: wrong passwords for a user spread over all three members use up
/// one free allowance (the leader keeps the table; followers ask it over the peer port), then a
/// concurrent burst spread over the three gets one check in and the rest refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_spread_over_three_members_exhaust_one_budget() {
    if common::selftest() {
        return;
    }
    let _turn = TURN.lock().await;
    // 3 free; the 4th waits at most 1 s (within the 1.5 s cap), the 5th would wait 2 s more: refused.
    let options = Options::new(3).flags(&[
        "--login-throttle-free-failures",
        "3",
        "--login-throttle-base-delay",
        "1000",
        "--login-throttle-max-delay",
        "1500",
    ]);
    let mut cluster = tokio::task::spawn_blocking(|| Cluster::start(options)).await.unwrap();
    let addrs: Vec<String> = cluster.members.iter().map(Member::addr).collect();
    let mut root = enable_auth(&cluster.members[0].client_url).await;
    // The harness logs in as root (from 127.0.0.1) to find the leader: the guesses are for another
    // user, whose count those successes do not touch.
    cluster.set_admin("root", ROOT_PW);
    assert_ok("user add", root.user_add("victim", "victimpw", None).await);
    let checks = || addrs.iter().map(|a| wrong_checks(a)).sum::<f64>();
    let before = checks();

    for addr in &addrs {
        let (result, _) = login_on(&channel(addr).await, "victim", "wrong").await;
        assert_eq!(result.unwrap_err().message(), AUTH_FAILED, "a free failure on {addr}");
    }
    let mut channels = Vec::new();
    for addr in &addrs {
        channels.push(channel(addr).await);
    }
    let burst = futures::future::join_all((0..6).map(|i| {
        let ch = channels[i % 3].clone();
        async move { login_on(&ch, "victim", &format!("guess-{i}")).await.0 }
    }));
    let outcomes = Outcomes::of(burst.await);
    let checked = checks() - before;
    eprintln!(
        "after 3 failures (one per member), 6 concurrent guesses over 3 members: {outcomes:?}; {checked} checks in all"
    );
    assert!(outcomes.other.is_empty(), "{:?}", outcomes.other);
    assert_eq!((outcomes.wrong, outcomes.refused), (1, 5), "one budget for the cluster: {outcomes:?}");
    assert_eq!(checked, 4.0, "3 free checks and one after its wait");

    // The right password from another address, through a follower: at once.
    let leader = cluster.leader().await;
    let follower = (0..3).find(|&i| i != leader).unwrap();
    let (result, took) = login_on(&channel_from(&addrs[follower], ELSEWHERE).await, "victim", "victimpw").await;
    result.expect("victim from 127.0.0.2 through a follower");
    eprintln!("victim from 127.0.0.2 through a follower: {took:?}");

    // A guess through the follower that waits its turn at the leader, and whose client gives up:
    // the follower drops the call, and the leader gives its place back. Were it still held, the
    // right password after it would be refused (a second wait past the 1.5 s cap).
    let via_follower = channel(&addrs[follower]).await;
    // A failure just now: the next attempt waits 1.5 s.
    let (result, took) = login_on(&via_follower, "victim", "guess-now").await;
    eprintln!("a guess through the follower took {took:?}");
    assert_eq!(result.unwrap_err().message(), AUTH_FAILED);
    let gave_up = impatient_login(&via_follower, "victim", "guess-late", Duration::from_millis(300)).await;
    assert!(
        matches!(gave_up.as_ref().map_err(|e| e.code()), Err(tonic::Code::DeadlineExceeded | tonic::Code::Cancelled)),
        "the late guess waits past its client's deadline: {gave_up:?}"
    );
    // The leader learns of the abandonment when the follower's call to it ends, a moment later: a
    // refusal for an attempt in progress is retried for 500 ms. Were the place never given back, the
    // guess would hold it until its wait ends (over 1 s from now), and then make the next wait too long.
    let abandoned = std::time::Instant::now();
    let (result, took) = loop {
        let (result, took) = login_on(&via_follower, "victim", "victimpw").await;
        let in_progress = result.as_ref().is_err_and(|e| e.code() == tonic::Code::ResourceExhausted);
        if !in_progress || abandoned.elapsed() > Duration::from_millis(500) {
            break (result, took);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!(
        "right password through the follower after an abandoned guess: {:?} after {took:?}, {:?} after the abandonment",
        result.as_ref().map(|_| "ok"),
        abandoned.elapsed()
    );
    result.expect("the right password, once the abandoned guess gave its place back");
}

/// A channel to `member` over TLS presenting `cert` (from 127.0.0.1, as every client here).
async fn tls_channel(member: &Member, ca: &std::path::Path, cert: &pki::Cert) -> tonic::transport::Channel {
    use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(ca).unwrap()))
        .identity(Identity::from_pem(std::fs::read(&cert.cert).unwrap(), std::fs::read(&cert.key).unwrap()))
        .domain_name("localhost");
    Channel::from_shared(member.client_url.clone()).unwrap().tls_config(tls).unwrap().connect().await.unwrap()
}

/// Clients that proved a certificate are counted by its identity, not by the address they share
/// (many clients behind one NAT, sidecar or proxy): mallory's concurrent guesses from 127.0.0.1 use
/// up mallory's budget (two checked, one after its wait, the last refused), while alice, from the
/// same address with her own certificate, logs in as the same user at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_clients_are_counted_by_certificate_not_by_shared_address() {
    if common::selftest() {
        return;
    }
    let _turn = TURN.lock().await;
    let metrics_port = common::free_port();
    let metrics_url = format!("http://127.0.0.1:{metrics_port}");
    let options = Options::new(1).client_tls().flags(&[
        "--listen-metrics-urls",
        &metrics_url,
        "--login-throttle-free-failures",
        "2",
        "--login-throttle-base-delay",
        "1000",
        "--login-throttle-max-delay",
        "1500",
    ]);
    let cluster = tokio::task::spawn_blocking(|| Cluster::start(options)).await.unwrap();
    let member = &cluster.members[0];
    let (mallory, alice) = (cluster.client_cert("mallory"), cluster.client_cert("alice"));
    tokio::task::block_in_place(|| {
        member.ctl(&["user", "add", "root", "--no-password"]);
        member.ctl(&["auth", "enable"]);
        member.ctl(&["user", "add", "victim:victimpw"]);
    });
    let ca = cluster.pki.ca_file();
    let (as_mallory, as_alice) = (tls_channel(member, &ca, &mallory).await, tls_channel(member, &ca, &alice).await);
    let ep = format!("127.0.0.1:{metrics_port}");
    let delayed_before = throttled(&ep, "delayed");

    let burst = futures::future::join_all((0..4).map(|i| {
        let ch = as_mallory.clone();
        async move { login_on(&ch, "victim", &format!("guess-{i}")).await.0 }
    }));
    let outcomes = Outcomes::of(burst.await);
    eprintln!("mallory's 4 concurrent guesses for victim: {outcomes:?}");
    assert!(outcomes.other.is_empty(), "{:?}", outcomes.other);
    assert_eq!((outcomes.wrong, outcomes.refused), (3, 1), "mallory's budget: {outcomes:?}");
    let delayed = throttled(&ep, "delayed");
    assert_eq!(delayed, delayed_before + 1.0, "the third guess waited");

    let (result, took) = login_on(&as_alice, "victim", "victimpw").await;
    result.expect("victim's password from alice's certificate, same address");
    assert_eq!(throttled(&ep, "delayed"), delayed, "alice's login waited ({took:?})");
    // Twin: mallory's own next attempt is still throttled.
    let (result, _) = login_on(&as_mallory, "victim", "victimpw").await;
    result.expect("the right password from mallory's certificate, after its wait");
    assert_eq!(throttled(&ep, "delayed"), delayed + 1.0, "mallory's next attempt waited");
}

/// The HTTP gateway's Basic credentials go through the same throttle (its Authenticate call carries
/// the connection): 20 concurrent requests with wrong passwords for root get the free allowance and
/// one check after its wait (401), the rest 429 with etcd's "too many requests".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_credentials_on_the_gateway_are_throttled_as_logins() {
    if common::selftest() {
        return;
    }
    let _turn = TURN.lock().await;
    let args = ["--bcrypt-cost", "4", "--login-throttle-free-failures", "5"]
        .into_iter()
        .chain(["--login-throttle-base-delay", "1000", "--login-throttle-max-delay", "1500"])
        .collect::<Vec<_>>();
    let s = AuthServer::start_with(Kind::Keyward, &args).await;
    let url = format!("http://{}/v3/kv/range", s.ep());
    let before = wrong_checks(&s.ep());
    let statuses = tokio::task::spawn_blocking(move || {
        let curls: Vec<_> = (0..20)
            .map(|i| {
                std::process::Command::new("curl")
                    .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", "--data", r#"{"key":"YQ=="}"#])
                    .args(["-u", &format!("root:guess-{i}"), &url])
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .expect("curl")
            })
            .collect();
        let mut statuses: Vec<String> =
            curls.into_iter().map(|c| String::from_utf8(c.wait_with_output().unwrap().stdout).unwrap()).collect();
        statuses.sort();
        statuses
    })
    .await
    .unwrap();
    let count = |code: &str| statuses.iter().filter(|s| *s == code).count();
    let checks = wrong_checks(&s.ep()) - before;
    eprintln!("20 concurrent gateway requests with wrong Basic credentials: {statuses:?}; {checks} checks");
    assert_eq!((count("401"), count("429")), (6, 14), "{statuses:?}");
    assert_eq!(checks, 6.0);
}
