//! Auth under concurrency and from a client's point of view: the Authenticate/ChangePassword TOCTOU
//! race of the v3 auth design, writes racing a permission revoke, the re-authentication flow of etcd's
//! Go client, plaintext passwords never reaching disk or logs, and bcrypt staying off the apply path.
//!
//! Numbers (race hits, latencies) are printed with `eprintln!`; see them with `-- --nocapture`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::auth::*;
use crate::common::etcd_errors::{AUTH_FAILED, AUTH_OLD_REVISION, INVALID_AUTH_TOKEN, PERMISSION_DENIED};
use crate::common::{self, Kind, Server};
use etcd_client::{Client, ConnectOptions, GetOptions, Permission, RoleRevokePermissionOptions};

/// The tests of this file take turns (they are CPU-heavy: races, bcrypt at cost 10, a latency
/// measurement), so that one's load does not distort another's timing on a small machine.
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// ---------------------------------------------------------------------------
// Authenticate vs ChangePassword
// ---------------------------------------------------------------------------

/// One Authenticate call and when it ran.
struct Attempt {
    started: Instant,
    ended: Instant,
    result: Result<String, String>,
}

/// The `revision` claim of a JWT (base64url JSON payload), `None` for other tokens.
fn jwt_revision(token: &str) -> Option<u64> {
    let payload = token.split('.').nth(1)?;
    let mut bits: u32 = 0;
    let mut nbits = 0;
    let mut bytes = Vec::new();
    for c in payload.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' | b'+' => 62,
            b'_' | b'/' => 63,
            b'=' => break,
            _ => return None,
        };
        bits = (bits << 6) | v as u32;
        nbits += 6;
        if nbits >= 8 {
            nbits -= 8;
            bytes.push((bits >> nbits) as u8);
            bits &= (1 << nbits) - 1;
        }
    }
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    claims.get("revision")?.as_u64()
}

async fn auth_revision(ep: &str) -> u64 {
    let mut auth = pb::auth_client::AuthClient::new(channel(ep).await);
    let root = raw_token(ep, "root", ROOT_PW).await.expect("root token");
    let resp = auth.auth_status(with_token(pb::AuthStatusRequest {}, "token", &root)).await.expect("auth status");
    resp.into_inner().auth_revision
}

/// The design's TOCTOU: Authenticate checks the password in the API layer, outside raft, and a
/// ChangePassword can complete in between. What can be asserted soundly, for every iteration
/// (alice's password goes from `old` to `new` while 8 tasks keep authenticating with `old`):
///
/// 1. An Authenticate with `old` that *started after ChangePassword returned* must fail: the change
///    was applied before its response, so any later password check sees the new hash.
/// 2. An Authenticate with `old` that started before may succeed (it may be ordered before the
///    change), but then its token must be unusable once the change has returned: the token was issued
///    at an auth revision older than the change's, so a request with it gets "revision of auth store
///    is old" (or "invalid auth token", as a password change also drops the user's simple tokens).
///    This is the property that matters: *no token obtained with the old password works after the
///    change*. It fails if a token is ever issued at or after the change's auth revision for a
///    password checked before it (the TOCTOU lapse the design describes).
/// 3. With JWTs the issue revision is visible: it must be older than the auth revision right after
///    the change.
/// 4. The new password works at once.
///
/// It cannot be asserted that racing attempts fail: one ordered before the change legitimately wins.
async fn toctou(token_kind: TokenKind) {
    const ITERATIONS: usize = 40;
    const AUTHENTICATORS: usize = 8;
    let _heavy = HEAVY.lock().await;
    let mut s = AuthServer::start_with_token(token_kind).await;
    s.add_user("alice", "pw0", &[Permission::read("k")]).await;
    let ep = s.ep();
    let ch = channel(&ep).await;
    let (mut total, mut old_ok, mut raced_ok, mut late_attempts) = (0usize, 0usize, 0usize, 0usize);
    for i in 0..ITERATIONS {
        let (old, new) = (format!("pw{i}"), format!("pw{}", i + 1));
        let stop = Arc::new(AtomicBool::new(false));
        let tasks: Vec<_> = (0..AUTHENTICATORS)
            .map(|_| {
                let (ch, old, stop) = (ch.clone(), old.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut auth = pb::auth_client::AuthClient::new(ch);
                    let mut attempts = Vec::new();
                    while !stop.load(Ordering::Acquire) {
                        let started = Instant::now();
                        let req = pb::AuthenticateRequest { name: "alice".into(), password: old.clone() };
                        let result = auth
                            .authenticate(req)
                            .await
                            .map(|r| r.into_inner().token)
                            .map_err(|e| e.message().to_string());
                        attempts.push(Attempt { started, ended: Instant::now(), result });
                    }
                    attempts
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(2 + (i % 5) as u64)).await;
        assert_ok("change password", s.root.user_change_password("alice", new.as_str()).await);
        let changed = Instant::now();
        let rev_after = auth_revision(&ep).await;
        tokio::time::sleep(Duration::from_millis(15)).await;
        stop.store(true, Ordering::Release);
        let mut attempts = Vec::new();
        for t in tasks {
            attempts.extend(t.await.expect("authenticator task"));
        }
        for a in &attempts {
            total += 1;
            if a.started > changed {
                late_attempts += 1;
                assert_eq!(
                    a.result.as_ref().err().map(String::as_str),
                    Some(AUTH_FAILED),
                    "iteration {i}: Authenticate with the old password started {:?} after ChangePassword returned",
                    a.started - changed
                );
                continue;
            }
            let token = match &a.result {
                Ok(t) => t,
                Err(e) => {
                    assert_eq!(e, AUTH_FAILED, "iteration {i}: unexpected Authenticate error");
                    continue;
                }
            };
            old_ok += 1;
            if a.ended > changed {
                raced_ok += 1;
            }
            match (token_kind, jwt_revision(token)) {
                (_, Some(rev)) => assert!(
                    rev < rev_after,
                    "iteration {i}: old-password JWT issued at auth revision {rev} >= {rev_after} (after the change)"
                ),
                (TokenKind::Jwt, None) => panic!("iteration {i}: a JWT server issued a non-JWT token {token:?}"),
                (TokenKind::Simple, None) => {}
            }
            let used = raw_get(&ch, token, "k").await;
            match used {
                Ok(_) => panic!("iteration {i}: a token obtained with the old password works after the change"),
                Err(e) => assert!(
                    e.message() == AUTH_OLD_REVISION || e.message() == INVALID_AUTH_TOKEN,
                    "iteration {i}: unexpected error using an old-password token: {e:?}"
                ),
            }
        }
        let fresh = raw_token(&ep, "alice", &new).await.expect("the new password works");
        raw_get(&ch, &fresh, "k").await.expect("a token for the new password works");
    }
    let log = std::fs::read_to_string(s.server.log_path()).unwrap_or_default();
    let retries = log.matches("auth state changed while checking the password").count();
    eprintln!(
        "toctou ({token_kind:?}): {ITERATIONS} password changes, {total} Authenticate calls with the old password: \
         {old_ok} succeeded, ordered before the change ({raced_ok} of them answered only after the change had returned), \
         {late_attempts} started after the change returned (all failed); server re-checked {retries} times"
    );
    assert!(late_attempts > 0, "no Authenticate started after a change: the race was not exercised");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn authenticate_toctou_password_change_never_yields_token_for_old_password() {
    toctou(TokenKind::Simple).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn authenticate_toctou_password_change_never_yields_token_for_old_password_jwt() {
    toctou(TokenKind::Jwt).await;
}

// ---------------------------------------------------------------------------
// writes racing a revoke
// ---------------------------------------------------------------------------

#[derive(Default)]
struct WriterStats {
    /// (key, revision of the put's response header)
    written: Vec<(String, i64)>,
    denied: usize,
    reauths: usize,
}

/// 8 writers with long-lived authenticated clients keep putting unique keys under `race/` (which
/// their role may read and write) while root revokes that permission. Writers re-authenticate on
/// "revision of auth store is old" (as etcd's Go client does), so after the revoke their writes reach
/// apply with current tokens and must be refused there. The revoke's response header carries the kv
/// revision at which it was applied: no key may have a later mod_revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn revoke_race_no_write_after_revoke_revision() {
    const WRITERS: usize = 8;
    let _heavy = HEAVY.lock().await;
    let mut s = AuthServer::start().await;
    s.add_user("writer", "writerpw", &[Permission::read_write("race/").with_prefix()]).await;
    let ep = s.ep();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let mut c = connect_as(&ep, "writer", "writerpw").await;
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut stats = WriterStats::default();
            let mut n = 0;
            while !stop.load(Ordering::Acquire) {
                let key = format!("race/{w}/{n:06}");
                n += 1;
                match c.put(key.as_str(), "v", None).await {
                    Ok(resp) => stats.written.push((key, resp.header().unwrap().revision())),
                    Err(e) if msg(&e) == AUTH_OLD_REVISION => {
                        stats.reauths += 1;
                        c.refresh_token().await.expect("re-authenticate");
                    }
                    Err(e) if msg(&e) == PERMISSION_DENIED => stats.denied += 1,
                    Err(e) => panic!("writer {w}: unexpected error {e:?}"),
                }
            }
            stats
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let revoke =
        s.root.role_revoke_permission("writer-role", "race/", Some(RoleRevokePermissionOptions::new().with_prefix()));
    let revoke = assert_ok("revoke", revoke.await);
    let revoke_rev = revoke.header().unwrap().revision();
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Release);
    let mut all = WriterStats::default();
    for t in tasks {
        let st = t.await.expect("writer task");
        all.written.extend(st.written);
        all.denied += st.denied;
        all.reauths += st.reauths;
    }
    let mut root = connect_as(&ep, "root", ROOT_PW).await;
    let kvs = assert_ok("read back", root.get("race/", Some(GetOptions::new().with_prefix())).await);
    let late: Vec<_> = kvs.kvs().iter().filter(|kv| kv.mod_revision() > revoke_rev).collect();
    eprintln!(
        "revoke race: revoke applied at kv revision {revoke_rev}; {} puts acknowledged (all at revision <= {}), \
         {} keys stored, {} keys with mod_revision > revoke revision, {} puts denied after the revoke, \
         {} re-authentications",
        all.written.len(),
        all.written.iter().map(|w| w.1).max().unwrap_or(0),
        kvs.kvs().len(),
        late.len(),
        all.denied,
        all.reauths
    );
    assert!(
        late.is_empty(),
        "keys written after the revoke (revision {revoke_rev}): {:?}",
        late.iter().take(5).collect::<Vec<_>>()
    );
    for (key, rev) in &all.written {
        assert!(*rev <= revoke_rev, "put of {key} acknowledged at revision {rev}, after the revoke at {revoke_rev}");
    }
    assert_eq!(kvs.kvs().len(), all.written.len(), "every acknowledged put is stored, and nothing else");
    assert!(all.written.len() > WRITERS * 10, "too few writes before the revoke to exercise the race");
    assert!(all.denied > WRITERS, "too few writes after the revoke reached the permission check");
}

// ---------------------------------------------------------------------------
// client re-authentication
// ---------------------------------------------------------------------------

/// Puts like etcd's Go client (clientv3's retry interceptor): on "revision of auth store is old",
/// fetch a new token and retry once.
async fn go_style_put(c: &mut Client, key: &str, value: &str) -> Result<(), etcd_client::Error> {
    match c.put(key, value, None).await {
        Err(e) if msg(&e) == AUTH_OLD_REVISION => {
            c.refresh_token().await?;
            c.put(key, value, None).await.map(|_| ())
        }
        other => other.map(|_| ()),
    }
}

/// Pins the flow a client sees around auth changes: token issued; an auth change unrelated to alice
/// (root adds a user) leaves her token and her clients working, with no re-authentication; her own
/// password change voids the token ("revision of auth store is old" for a JWT, "invalid auth token"
/// for a forgotten simple token), and a client holding the old password can no longer log in.
///
/// The etcd-client crate (0.21) does *not* re-authenticate on "revision of auth store is old" (etcd's
/// Go client does): its automatic refresh only reacts to Unauthenticated / "invalid auth token";
/// `go_style_put` does what the Go client does.
#[tokio::test]
async fn go_client_style_reauth_flow() {
    let _heavy = HEAVY.lock().await;
    for token in [TokenKind::Simple, TokenKind::Jwt] {
        let mut s = AuthServer::start_with_token(token).await;
        s.add_user("alice", "alicepw", &[Permission::read_write("k")]).await;
        let ep = s.ep();
        let mut alice = connect_as(&ep, "alice", "alicepw").await;
        let auto_opts = ConnectOptions::new().with_user("alice", "alicepw").with_auto_token_refresh(true);
        let mut auto = Client::connect([ep.as_str()], Some(auto_opts)).await.expect("connect with auto refresh");
        assert_ok("put with the issued token", alice.put("k", "1", None).await);
        let held = raw_token(&ep, "alice", "alicepw").await.expect("authenticate");
        let ch = channel(&ep).await;
        raw_get(&ch, &held, "k").await.expect("the held token works before the change");

        assert_ok("unrelated auth change", s.root.user_add("zed", "zedpw", None).await);
        if !(common::selftest() && token == TokenKind::Jwt) {
            raw_get(&ch, &held, "k").await.unwrap_or_else(|e| panic!("{token:?}: held token after it: {e:?}"));
            assert_ok("etcd-client put after the change", alice.put("k", "2", None).await);
            assert_ok("etcd-client put with auto refresh", auto.put("k", "2", None).await);
        }
        go_style_put(&mut alice, "k", "3").await.unwrap_or_else(|e| panic!("{token:?}: put: {e:?}"));

        assert_ok("alice's password changes", s.root.user_change_password("alice", "newpw").await);
        let status = raw_get(&ch, &held, "k").await.expect_err("the held token after her password changed");
        let expected = if token == TokenKind::Jwt { AUTH_OLD_REVISION } else { INVALID_AUTH_TOKEN };
        assert_eq!(status.message(), expected, "{token:?}: {status:?}");
        // A client with the old password cannot log in again (the Go client's reaction fails).
        let err = go_style_put(&mut alice, "k", "4").await.expect_err("a client with the old password");
        assert!([AUTH_FAILED, expected].contains(&msg(&err).as_str()), "{token:?}: {err:?}");
        let fresh = raw_token(&ep, "alice", "newpw").await.expect("authenticate with the new password");
        assert_ne!(fresh, held, "{token:?}: a new login must issue a new token");
        let resp = raw_get(&ch, &fresh, "k").await.expect("the new token works");
        assert_eq!(resp.kvs[0].value, b"3");
    }
}

// ---------------------------------------------------------------------------
// plaintext passwords
// ---------------------------------------------------------------------------

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read dir {}: {e}", dir.display())) {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

async fn refresh_token(c: &Client) {
    assert_ok("re-authenticate", c.refresh_token().await);
}

/// Every password a user is created with, changed to, or authenticates with (right or wrong) must
/// never appear in plaintext in the data dir (raft log and kv LMDB files, the snapshot dir) or in the
/// server log, at the default log level and at `--log-level debug`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_plaintext_password_in_lmdb_or_logs() {
    const ROOT: &str = "Root-Plaintext-9f3b1c77";
    const ALICE: &str = "Alice-Plaintext-4e7d2a19";
    const ALICE_NEW: &str = "Alice-Changed-Plaintext-81c0ff3e";
    const BOB: &str = "Bob-Etcdctl-Plaintext-6b2e90d4";
    const BOB_NEW: &str = "Bob-Passwd-Plaintext-0c5a7e21";
    const WRONG: &str = "Wrong-Guess-Plaintext-55aa11cc";
    const CAROL: &str = "Carol-NoPassword-Plaintext-3d9f";
    let _heavy = HEAVY.lock().await;
    let secrets = [ROOT, ALICE, ALICE_NEW, BOB, BOB_NEW, WRONG, CAROL];
    for log_level in ["info", "debug"] {
        let mut server = Server::start_with(
            Kind::Keyward,
            &["--bcrypt-cost", "4", "--log-level", log_level, "--snapshot-count", "100"],
        );
        let ep = server.endpoint();
        let mut c = connect(&ep).await;
        assert_ok("user add root", c.user_add("root", ROOT, None).await);
        assert_ok("grant root", c.user_grant_role("root", "root").await);
        assert_ok("auth enable", c.auth_enable().await);
        let mut root = connect_as(&ep, "root", ROOT).await;
        assert_ok("user add alice", root.user_add("alice", ALICE, None).await);
        raw_token(&ep, "alice", ALICE).await.expect("authenticate alice");
        assert_ok("change alice", root.user_change_password("alice", ALICE_NEW).await);
        let no_pw = etcd_client::UserAddOptions::new().with_no_pwd();
        assert_ok("user add carol (no password)", root.user_add("carol", CAROL, Some(no_pw)).await);
        for (user, pw) in [("alice", ALICE), ("alice", WRONG), ("root", WRONG), ("nobody", WRONG)] {
            let status = raw_token(&ep, user, pw).await.expect_err("a wrong password");
            assert_eq!(status.message(), AUTH_FAILED);
        }
        // A --no-password user gets etcd's own refusal for a password login.
        let status = raw_token(&ep, "carol", CAROL).await.expect_err("a password for a no-password user");
        assert_eq!(status.message(), "auth: authentication failed, password was given for no password user");
        raw_token(&ep, "alice", ALICE_NEW).await.expect("the new password works");
        // through etcdctl too
        let root_flag = format!("--user=root:{ROOT}");
        server.etcdctl(&[&root_flag, "user", "add", &format!("bob:{BOB}")]).assert_ok();
        server
            .etcdctl_stdin(&[&root_flag, "user", "passwd", "bob", "--interactive=false"], &format!("{BOB_NEW}\n"))
            .assert_ok();
        server.etcdctl(&[&format!("--user=bob:{BOB_NEW}"), "user", "get", "bob"]).assert_ok();
        assert!(!server.etcdctl(&[&format!("--user=bob:{BOB}"), "user", "get", "bob"]).success());

        // enough entries for a raft snapshot (--snapshot-count 100), so the snapshot dir holds one
        refresh_token(&root).await;
        let started = Instant::now();
        let mut writers = Vec::new();
        for w in 0..8 {
            let mut c = root.clone();
            writers.push(tokio::spawn(async move {
                for n in 0..40 {
                    c.put(format!("fill/{w}/{n}"), "x", None).await.expect("fill put");
                }
            }));
        }
        for w in writers {
            w.await.expect("fill writer");
        }
        let fill_time = started.elapsed();
        server.kill_9();

        let mut files = Vec::new();
        files_under(&server.data_dir(), &mut files);
        files.push(server.log_path());
        let snapshots: Vec<_> = files.iter().filter(|f| f.components().any(|c| c.as_os_str() == "snap")).collect();
        let mut scanned = 0u64;
        for file in &files {
            let bytes = std::fs::read(file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
            scanned += bytes.len() as u64;
            for secret in secrets {
                assert!(
                    !contains(&bytes, secret.as_bytes()),
                    "log level {log_level}: plaintext password {secret:?} found in {}",
                    file.display()
                );
            }
        }
        let log = std::fs::read_to_string(server.log_path()).unwrap_or_default();
        eprintln!(
            "plaintext scan (log level {log_level}): {} files, {scanned} bytes, {} snapshot files, {} log lines; \
             320 fill puts took {fill_time:?}",
            files.len(),
            snapshots.len(),
            log.lines().count()
        );
        assert!(!snapshots.is_empty(), "no snapshot was written, so the snapshot dir was not scanned: {files:?}");
    }
}

// ---------------------------------------------------------------------------
// bcrypt outside apply
// ---------------------------------------------------------------------------

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// How long one bcrypt verification at `cost` takes on this machine now (the median of three), in this
/// process, with the same crate the server uses.
fn bcrypt_verification_time(cost: u32) -> Duration {
    let hash = bcrypt::hash("alicepw", cost).expect("bcrypt hash");
    let mut times: Vec<Duration> = (0..3)
        .map(|_| {
            let t = Instant::now();
            assert!(bcrypt::verify("alicepw", &hash).expect("bcrypt verify"));
            t.elapsed()
        })
        .collect();
    median(&mut times)
}

/// At the default bcrypt cost (10), 16 Authenticate calls kept in flight must not stall writes:
/// password checks run in the API layer on the blocking pool, not in apply. If they ran in apply, a
/// put would queue behind them, on average behind half of the 16 verifications; here a put's median
/// latency stays under two verifications' time, measured on this machine in the same run (so a busy
/// machine slows the bound along with the puts).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bcrypt_runs_outside_apply() {
    const IN_FLIGHT: usize = 16;
    const PUTS: usize = 20;
    let _heavy = HEAVY.lock().await;
    // the one test at the default cost: no --bcrypt-cost
    let mut s = AuthServer::start_with(Kind::under_test(), &[]).await;
    s.add_user("alice", "alicepw", &[]).await;
    let ep = s.ep();
    let mut root = connect_as(&ep, "root", ROOT_PW).await;

    let mut idle = Vec::new();
    for n in 0..PUTS {
        let t = Instant::now();
        assert_ok("idle put", root.put(format!("idle/{n}"), "v", None).await);
        idle.push(t.elapsed());
    }

    let stop = Arc::new(AtomicBool::new(false));
    let ch = channel(&ep).await;
    let mut authenticators = Vec::new();
    for _ in 0..IN_FLIGHT {
        let (ch, stop) = (ch.clone(), stop.clone());
        authenticators.push(tokio::spawn(async move {
            let mut auth = pb::auth_client::AuthClient::new(ch);
            let mut done = Vec::new();
            while !stop.load(Ordering::Acquire) {
                let req = pb::AuthenticateRequest { name: "alice".into(), password: "alicepw".into() };
                auth.authenticate(req).await.expect("authenticate");
                done.push(Instant::now());
            }
            done
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let window_start = Instant::now();
    let mut loaded = Vec::new();
    for n in 0..PUTS {
        let t = Instant::now();
        assert_ok("put under load", root.put(format!("loaded/{n}"), "v", None).await);
        loaded.push(t.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let window = window_start.elapsed();
    // Measured while the Authenticate calls still run, so under the same load as the puts.
    let bcrypt_time = tokio::task::spawn_blocking(|| bcrypt_verification_time(10)).await.expect("bcrypt timing");
    stop.store(true, Ordering::Release);
    let mut completed = 0;
    for a in authenticators {
        completed += a
            .await
            .expect("authenticator")
            .iter()
            .filter(|t| **t >= window_start && t.duration_since(window_start) <= window)
            .count();
    }
    let (idle_max, loaded_max) = (*idle.iter().max().unwrap(), *loaded.iter().max().unwrap());
    let (idle_median, loaded_median) = (median(&mut idle), median(&mut loaded));
    eprintln!(
        "bcrypt cost 10: idle puts median {idle_median:?} max {idle_max:?}; with {IN_FLIGHT} Authenticate calls in flight \
         ({completed} completed in the {window:?} window, {:.1}/s): puts median {loaded_median:?} max {loaded_max:?}; \
         one verification here {bcrypt_time:?}",
        completed as f64 / window.as_secs_f64()
    );
    // bcrypt leaves one core to the rest of the server, so Authenticates complete at one core's pace;
    // what matters is that they kept completing while the puts were measured.
    assert!(completed >= 2, "the authenticates did not keep running during the measurement");
    assert!(
        loaded_median < bcrypt_time * 2,
        "puts stall behind bcrypt: median {loaded_median:?}, one verification {bcrypt_time:?}"
    );
}

/// A simple token cannot be rebuilt from the raft log: the Authenticate entry holds only the SHA-256
/// of the token's random prefix (etcd's holds the prefix, so anyone who reads the log can log in).
#[tokio::test]
async fn simple_tokens_never_enter_the_raft_log() {
    if common::selftest() {
        return; // etcd writes the token's prefix into its WAL
    }
    let s = AuthServer::start_with(Kind::Keyward, &["--bcrypt-cost", "4"]).await;
    let token = raw_token(&s.ep(), "root", ROOT_PW).await.unwrap();
    let (prefix, _index) = token.rsplit_once('.').expect("a simple token is PREFIX.INDEX");
    let digest: String = {
        use sha2::Digest;
        sha2::Sha256::digest(prefix.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
    };
    let mut log = Vec::new();
    for segment in std::fs::read_dir(s.server.data_dir().join("member/wal")).unwrap() {
        log.extend(std::fs::read(segment.unwrap().path()).unwrap());
    }
    let contains = |needle: &str| log.windows(needle.len()).any(|w| w == needle.as_bytes());
    assert!(contains(&digest), "the entry is in the log, with the prefix's digest");
    assert!(!contains(prefix), "the token's secret prefix is not in the log");
}

/// A login for a user that does not exist costs one bcrypt, like a wrong password, so timing does not
/// tell which user names exist (`keyward_auth_password_checks_total` counts the checks).
#[tokio::test]
async fn an_unknown_user_costs_a_password_check_like_a_wrong_password() {
    if common::selftest() {
        return; // keyward's own metric
    }
    let s = AuthServer::start_with(Kind::Keyward, &["--bcrypt-cost", "4"]).await;
    let checks = |outcome: &str| {
        let (_, text) = common::http_get(&s.ep(), "/metrics");
        common::metric(&text, &format!("keyward_auth_password_checks_total{{outcome=\"{outcome}\"}}"))
    };
    assert_eq!(raw_token(&s.ep(), "nosuchuser", "pw").await.unwrap_err().message(), AUTH_FAILED);
    assert_eq!(checks("unknown_user"), 1.0);
    assert_eq!(raw_token(&s.ep(), "root", "wrong").await.unwrap_err().message(), AUTH_FAILED);
    assert_eq!(checks("mismatch"), 1.0);
}

/// Logging in again with a verified password costs no bcrypt (`auth/verified.rs`), and nothing
/// else is cheaper: a wrong password, the old password after a change, and the old password of a user
/// deleted and added again all pay a full bcrypt and are refused.
#[tokio::test]
async fn a_verified_password_logs_in_again_without_bcrypt_and_nothing_else_does() {
    if common::selftest() {
        return; // keyward's own metric
    }
    let mut s = AuthServer::start_with(Kind::Keyward, &["--bcrypt-cost", "4"]).await;
    let ep = s.ep();
    let checks = |outcome: &str| {
        let (_, text) = common::http_get(&ep, "/metrics");
        let series = format!("keyward_auth_password_checks_total{{outcome=\"{outcome}\"}}");
        common::metric_if_any(&text, &series).unwrap_or(0.0)
    };
    s.add_user("alice", "first", &[]).await;
    let (matched, cached) = (checks("match"), checks("cached"));
    for _ in 0..5 {
        raw_token(&s.ep(), "alice", "first").await.expect("login");
    }
    assert_eq!(checks("match"), matched + 1.0, "one bcrypt for the first login");
    assert_eq!(checks("cached"), cached + 4.0, "none for the next four");

    let mismatched = checks("mismatch");
    assert_eq!(raw_token(&s.ep(), "alice", "firsT").await.unwrap_err().message(), AUTH_FAILED);
    assert_eq!(checks("mismatch"), mismatched + 1.0, "a wrong password pays bcrypt");

    assert_ok("change password", s.root.user_change_password("alice", "second").await);
    assert_eq!(raw_token(&s.ep(), "alice", "first").await.unwrap_err().message(), AUTH_FAILED);
    assert_eq!(checks("mismatch"), mismatched + 2.0, "the old password is checked by bcrypt, and refused");
    raw_token(&s.ep(), "alice", "second").await.expect("new password");

    assert_ok("delete", s.root.user_delete("alice").await);
    assert_ok("add again", s.root.user_add("alice", "third", None).await);
    assert_eq!(raw_token(&s.ep(), "alice", "second").await.unwrap_err().message(), AUTH_FAILED);
    assert_eq!(checks("mismatch"), mismatched + 3.0);
}

/// 1,000 logged-in clients (tokens spread over 10 connections) and one role change that concerns
/// none of them: every client's next request succeeds with the token it holds, so none has to log in
/// again (no bcrypt storm). etcd 3.4 keeps simple tokens too, but its JWTs all go stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrelated_role_change_makes_no_client_log_in_again() {
    const CLIENTS: usize = 1000;
    let _heavy = HEAVY.lock().await;
    for token_kind in [TokenKind::Simple, TokenKind::Jwt] {
        let mut s = AuthServer::start_with_token(token_kind).await;
        s.add_user("app", "apppw", &[Permission::read_write("app/").with_prefix()]).await;
        let ep = s.ep();
        let mut channels = Vec::new();
        for _ in 0..10 {
            channels.push(channel(&ep).await);
        }
        let mut tokens = Vec::new();
        for _ in 0..CLIENTS {
            tokens.push(raw_token(&ep, "app", "apppw").await.expect("authenticate"));
        }
        let checks = || {
            let (_, text) = common::http_get(&ep, "/metrics");
            common::metric(&text, "keyward_auth_password_checks_total{outcome=\"match\"}")
        };
        let before = if common::selftest() { 0.0 } else { checks() };
        assert_ok("unrelated role change", s.root.role_add("reporting").await);
        let mut stale = 0;
        for (i, token) in tokens.iter().enumerate() {
            match raw_put(&channels[i % channels.len()], token, &format!("app/{i}"), "v").await {
                Ok(_) => {}
                Err(e) if e.message() == AUTH_OLD_REVISION || e.message() == INVALID_AUTH_TOKEN => stale += 1,
                Err(e) => panic!("{token_kind:?}: client {i}: {e:?}"),
            }
        }
        eprintln!(
            "{token_kind:?}: {stale} of {CLIENTS} clients would have to log in again after an unrelated role change"
        );
        if common::selftest() && token_kind == TokenKind::Jwt {
            assert_eq!(stale, CLIENTS, "etcd: every JWT is stale");
            continue;
        }
        assert_eq!(stale, 0, "{token_kind:?}: clients that must log in again");
        if !common::selftest() {
            assert_eq!(checks(), before, "{token_kind:?}: no password was checked after the change");
        }
    }
}

/// 300 wrong passwords for root from one address get slower and slower (each failure beyond the
/// free ones doubles the wait, up to the limit), while root from another address logs in without
/// any wait; the right password from the throttled address still works (after its wait). The waits
/// are counted by `keyward_auth_logins_throttled_total`; the latencies are compared within this run
/// only.
#[tokio::test]
async fn failed_logins_slow_down_their_address_but_not_the_same_user_elsewhere() {
    if common::selftest() {
        return; // etcd has no login throttling: all 300 answer at bcrypt speed
    }
    let _heavy = HEAVY.lock().await;
    let args = ["--bcrypt-cost", "4", "--login-throttle-free-failures", "5"]
        .into_iter()
        .chain(["--login-throttle-base-delay", "1", "--login-throttle-max-delay", "32"])
        .collect::<Vec<_>>();
    let s = AuthServer::start_with(Kind::Keyward, &args).await;
    let ep = s.ep();
    let throttled = |action: &str| {
        let (_, text) = common::http_get(&ep, "/metrics");
        common::metric(&text, &format!("keyward_auth_logins_throttled_total{{action=\"{action}\"}}"))
    };
    let attacker = channel_from(&ep, std::net::Ipv4Addr::new(127, 0, 0, 1)).await;
    let elsewhere = channel_from(&ep, std::net::Ipv4Addr::new(127, 0, 0, 2)).await;
    let mut latencies = Vec::new();
    for i in 0..300 {
        let (result, took) = login_on(&attacker, "root", "wrong").await;
        assert_eq!(result.unwrap_err().message(), AUTH_FAILED, "attempt {i}");
        latencies.push(took);
        if i == 150 {
            // Meanwhile root logs in from another address: no wait at all.
            let delayed = throttled("delayed");
            let (result, took) = login_on(&elsewhere, "root", ROOT_PW).await;
            result.expect("root from another address");
            assert_eq!(throttled("delayed"), delayed, "the login from 127.0.0.2 waited (took {took:?})");
            eprintln!("root from 127.0.0.2 during the attack: {took:?}");
        }
    }
    let median = |slice: &[Duration]| {
        let mut v = slice.to_vec();
        v.sort();
        v[v.len() / 2]
    };
    let (first, last) = (median(&latencies[..5]), median(&latencies[250..]));
    eprintln!("wrong passwords from 127.0.0.1: median of the first 5 {first:?}, of the last 50 {last:?}");
    assert!(last > first * 2, "later attempts are slower: first {first:?}, last {last:?}");
    assert!(throttled("delayed") >= 290.0, "every attempt beyond the free ones waited");
    let increasing = latencies[5..12].windows(2).filter(|w| w[1] > w[0]).count();
    assert!(increasing >= 4, "the wait grows attempt by attempt: {:?}", &latencies[5..12]);
    // The right password from the throttled address: admitted after its wait. (It clears root's own
    // (user, address) key only; that the address's count survives is `login_throttle.rs`'s
    // spraying test.)
    login_on(&attacker, "root", ROOT_PW).await.0.expect("the right password still works");
}

/// Logging in as a user that does not exist takes as long as a wrong password (both run one bcrypt
/// at the configured cost), so timing does not tell which names exist: medians within 20%, measured
/// in the same run, alternating.
#[tokio::test]
async fn an_unknown_user_takes_as_long_as_a_wrong_password() {
    if common::selftest() {
        return; // etcd answers an unknown user without bcrypt
    }
    let _heavy = HEAVY.lock().await;
    let args = ["--bcrypt-cost", "10", "--login-throttle-free-failures", "1000"];
    let s = AuthServer::start_with(Kind::Keyward, &args).await;
    let ch = channel(&s.ep()).await;
    let (mut unknown, mut wrong) = (Vec::new(), Vec::new());
    for _ in 0..15 {
        let (result, took) = login_on(&ch, "nosuchuser", "pw").await;
        assert_eq!(result.unwrap_err().message(), AUTH_FAILED);
        unknown.push(took);
        let (result, took) = login_on(&ch, "root", "wrong").await;
        assert_eq!(result.unwrap_err().message(), AUTH_FAILED);
        wrong.push(took);
    }
    unknown.sort();
    wrong.sort();
    let (u, w) = (unknown[7].as_secs_f64(), wrong[7].as_secs_f64());
    eprintln!(
        "median login time: unknown user {:.1} ms, wrong password {:.1} ms (ratio {:.2})",
        u * 1e3,
        w * 1e3,
        u / w
    );
    assert!((0.8..=1.25).contains(&(u / w)), "unknown {u:.4}s vs wrong password {w:.4}s");
}
