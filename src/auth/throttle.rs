//! Login throttling: failed password checks slow down the next attempts from the same place, so a
//! password cannot be guessed at bcrypt speed (etcd has no limit at all).
//!
//! Attempts are counted per (user, source) and per source alone (one source trying many user
//! names). The source is the client certificate's identity when the client proved one (its own at
//! the handshake, or one a trusted proxy forwarded: many clients behind one proxy, sidecar or NAT
//! share an address), else the client's address (IPv6 by its /64).
//!
//! **Attempts, not results, are counted.** An attempt is counted when it is admitted, and counts as
//! a failure until it succeeds, so concurrent attempts cannot all slip through before the first one
//! fails. The first `free_failures` attempts of a key (four times as many for a source alone) are
//! checked at once; beyond them the attempts of a key queue behind each other: one at a time, each
//! after the previous one finished and the key's wait passed (`base_delay`, doubling with every
//! failure, at most `max_delay`). At most one password check per key is in flight beyond the free
//! allowance. An attempt whose place in the queue would wait longer than `max_delay` is refused at
//! once with etcd's "too many requests", and none waits longer than `max_delay`.
//!
//! An [`Attempt`] is a guard: dropped while it waits (the client gave up: the handler's future is
//! dropped), it gives its place back and counts for nothing; dropped while its password is checked,
//! it counts as a failure (bcrypt ran; nobody learns its result). A success clears its own (user,
//! source) key only: the source's count survives, so logins to the attacker's own account do not
//! reset a password spraying. The same user from another source is never slowed down: an attacker
//! cannot lock a user out.
//!
//! In a cluster the leader keeps the one table; the other members ask it (`node/login_throttle.rs`).
//! The table forgets keys idle for `FORGET_AFTER` and holds at most `MAX_KEYS`; at most
//! `MAX_LIVE_ATTEMPTS` attempts are in progress at once, whatever their sources.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::EtcdError;

/// A key idle this long is forgotten (its failures too).
const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);
/// Keys kept at most; beyond, the oldest idle ones are forgotten first.
const MAX_KEYS: usize = 100_000;
/// Attempts admitted and not yet settled, at most, across all keys: each may hold a stream from a
/// follower and a bcrypt job; beyond, "too many requests" (the bcrypt queue holds 256 anyway).
const MAX_LIVE_ATTEMPTS: usize = 1024;
/// How many more failures a source alone gets free than a (user, source) pair.
const SOURCE_FACTOR: u32 = 4;

/// The limits (`--login-throttle-*` flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub free_failures: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { free_failures: 5, base_delay: Duration::from_millis(200), max_delay: Duration::from_secs(30) }
    }
}

/// Where a login attempt comes from, as it is counted.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Source {
    /// The client's address (`None`: unknown, e.g. a Unix socket).
    Address(Option<IpAddr>),
    /// The identity of a client certificate the client proved.
    Certificate(String),
}

/// A source as keys hold it: IPv4 whole, IPv6 by its /64 (one host owns many).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Origin {
    V4(u32),
    V6(u64),
    UnknownAddress,
    Certificate(String),
}

impl Origin {
    fn of(source: &Source) -> Origin {
        match source {
            Source::Address(ip) => match ip.map(|ip| ip.to_canonical()) {
                Some(IpAddr::V4(v4)) => Origin::V4(v4.into()),
                Some(IpAddr::V6(v6)) => Origin::V6((u128::from(v6) >> 64) as u64),
                None => Origin::UnknownAddress,
            },
            Source::Certificate(name) => Origin::Certificate(name.clone()),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    UserFrom(String, Origin),
    From(Origin),
}

/// How an attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Succeeded,
    Failed,
    /// Nothing was found wrong (it gave up waiting, or no password was judged): as if never made.
    Withdrawn,
}

struct Entry {
    /// Attempts that failed.
    failures: u32,
    /// Admitted attempts not yet settled (waiting or being checked), by ticket: admission order.
    live: BTreeSet<u64>,
    /// The next attempt beyond the free allowance is not checked before this instant.
    ready_at: Instant,
    last_seen: Instant,
    /// Woken when an attempt of this key settles: the next in its queue may go.
    settled: Arc<Notify>,
}

impl Entry {
    fn new(now: Instant) -> Entry {
        Entry { failures: 0, live: BTreeSet::new(), ready_at: now, last_seen: now, settled: Arc::new(Notify::new()) }
    }
}

struct Table {
    entries: HashMap<Key, Entry>,
    next_ticket: u64,
    /// Attempts admitted and not yet settled.
    live: usize,
}

pub(crate) struct LoginThrottle {
    limits: Limits,
    table: Mutex<Table>,
}

/// Whether an attempt may be checked now.
enum Turn {
    Now,
    /// Its queue is ready at this instant.
    At(Instant),
    /// An earlier attempt of its queue has to settle first.
    AfterEarlier,
}

impl LoginThrottle {
    pub(crate) fn new(limits: Limits) -> LoginThrottle {
        LoginThrottle { limits, table: Mutex::new(Table { entries: HashMap::new(), next_ticket: 0, live: 0 }) }
    }

    pub(crate) fn limits(&self) -> Limits {
        self.limits
    }

    /// Admits an attempt of `user` from `source` and waits for its turn; then its password may be
    /// checked, and the returned guard must be told the outcome. "Too many requests" when its wait
    /// would be longer than `max_delay`, at once if that is foreseeable. Dropping the future while it
    /// waits gives its place back.
    pub(crate) async fn attempt(self: &Arc<Self>, user: &str, source: &Source) -> Result<Attempt, EtcdError> {
        let admitted = Instant::now();
        let mut attempt = self.admit(user, source, admitted)?;
        let deadline = admitted + self.limits.max_delay;
        loop {
            let (first, second) = self.notifiers(&attempt);
            let (first, second) = (first.notified(), second.notified());
            tokio::pin!(first, second);
            // Registered before looking, so a settle in between is not missed.
            first.as_mut().enable();
            second.as_mut().enable();
            let until = match self.turn(&attempt, Instant::now()) {
                Turn::Now => {
                    attempt.state = State::Checking;
                    return Ok(attempt);
                }
                Turn::At(ready) => ready.min(deadline),
                Turn::AfterEarlier => deadline,
            };
            if Instant::now() >= deadline {
                return Err(EtcdError::TooManyRequests);
            }
            attempt.waited = true;
            tokio::select! {
                _ = first => {}
                _ = second => {}
                _ = tokio::time::sleep_until(until) => {}
            }
        }
    }

    fn admit(self: &Arc<Self>, user: &str, source: &Source, now: Instant) -> Result<Attempt, EtcdError> {
        let keys = self.keys(user, source);
        let mut table = self.lock();
        let wait = keys.iter().map(|(key, free)| self.projected_wait(table.entries.get(key), *free, now)).max();
        if wait.unwrap_or_default() > self.limits.max_delay || table.live >= MAX_LIVE_ATTEMPTS {
            return Err(EtcdError::TooManyRequests);
        }
        if table.entries.len() >= MAX_KEYS {
            prune(&mut table.entries, now);
        }
        let ticket = table.next_ticket;
        table.next_ticket += 1;
        table.live += 1;
        for (key, _) in &keys {
            let entry = table.entries.entry(key.clone()).or_insert_with(|| Entry::new(now));
            entry.live.insert(ticket);
            entry.last_seen = now;
        }
        Ok(Attempt { throttle: self.clone(), ticket, keys, state: State::Waiting, waited: false })
    }

    /// Each key with its free allowance.
    fn keys(&self, user: &str, source: &Source) -> [(Key, u32); 2] {
        let origin = Origin::of(source);
        let free = self.limits.free_failures;
        [
            (Key::UserFrom(user.to_string(), origin.clone()), free),
            (Key::From(origin), free.saturating_mul(SOURCE_FACTOR)),
        ]
    }

    /// The delay after `failures` failures of a key whose free allowance is `free`.
    fn delay(&self, failures: u32, free: u32) -> Duration {
        let Some(beyond) = failures.checked_sub(free) else { return Duration::ZERO };
        let factor = 1u32.checked_shl(beyond.min(31)).unwrap_or(u32::MAX);
        self.limits.base_delay.saturating_mul(factor).min(self.limits.max_delay)
    }

    /// How long a new attempt of a key would wait if every attempt ahead of it fails: the free ones
    /// in flight together, the others one after the other, each after its delay.
    fn projected_wait(&self, entry: Option<&Entry>, free: u32, now: Instant) -> Duration {
        let Some(entry) = entry else { return Duration::ZERO };
        let ahead = entry.live.len() as u32;
        if entry.failures.saturating_add(ahead) < free {
            return Duration::ZERO;
        }
        let mut at = entry.ready_at.max(now);
        for i in 0..ahead {
            let ordinal = entry.failures.saturating_add(i).saturating_add(1);
            let delay = self.delay(ordinal, free);
            at = if ordinal <= free { at.max(now + delay) } else { at + delay };
            if at - now > self.limits.max_delay {
                break;
            }
        }
        at - now
    }

    /// Whether `attempt` may be checked at `now`: on every key it is within the free allowance, or
    /// first in the queue with the key's wait passed.
    fn turn(&self, attempt: &Attempt, now: Instant) -> Turn {
        let table = self.lock();
        let mut turn = Turn::Now;
        for (key, free) in &attempt.keys {
            let Some(entry) = table.entries.get(key) else { continue };
            let earlier = entry.live.range(..attempt.ticket).count() as u32;
            if entry.failures.saturating_add(earlier) < *free {
                continue;
            }
            if earlier > 0 {
                return Turn::AfterEarlier;
            }
            if now < entry.ready_at {
                turn = match turn {
                    Turn::At(at) => Turn::At(at.max(entry.ready_at)),
                    _ => Turn::At(entry.ready_at),
                };
            }
        }
        turn
    }

    fn notifiers(&self, attempt: &Attempt) -> (Arc<Notify>, Arc<Notify>) {
        let table = self.lock();
        let notifier = |i: usize| {
            table.entries.get(&attempt.keys[i].0).map_or_else(|| Arc::new(Notify::new()), |e| e.settled.clone())
        };
        (notifier(0), notifier(1))
    }

    fn settle(&self, ticket: u64, keys: &[(Key, u32); 2], outcome: Outcome) {
        let now = Instant::now();
        let mut table = self.lock();
        table.live = table.live.saturating_sub(1);
        for (key, free) in keys {
            let Some(entry) = table.entries.get_mut(key) else { continue };
            entry.live.remove(&ticket);
            entry.last_seen = now;
            match (outcome, key) {
                (Outcome::Failed, _) => {
                    entry.failures = entry.failures.saturating_add(1);
                    entry.ready_at = entry.ready_at.max(now + self.delay(entry.failures, *free));
                }
                // A success clears its own (user, source) key...
                (Outcome::Succeeded, Key::UserFrom(..)) => {
                    entry.failures = 0;
                    entry.ready_at = now;
                }
                // ...not the source's: past its allowance, the next attempt from there waits as after
                // a failure, so successes in between do not make room for guesses.
                (Outcome::Succeeded, Key::From(_)) => {
                    entry.ready_at = entry.ready_at.max(now + self.delay(entry.failures, *free));
                }
                (Outcome::Withdrawn, _) => {}
            }
            entry.settled.notify_waiters();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Waiting,
    Checking,
    Settled,
}

/// An admitted login attempt; see the module docs for what dropping it means.
pub(crate) struct Attempt {
    throttle: Arc<LoginThrottle>,
    ticket: u64,
    keys: [(Key, u32); 2],
    state: State,
    waited: bool,
}

impl Attempt {
    /// Whether it had to wait for its turn.
    pub(crate) fn waited(&self) -> bool {
        self.waited
    }

    /// The password was right: its (user, source) key starts afresh.
    pub(crate) fn succeeded(mut self) {
        self.settle(Outcome::Succeeded);
    }

    /// Wrong password, unknown user, a user without password.
    pub(crate) fn failed(mut self) {
        self.settle(Outcome::Failed);
    }

    /// No password was found wrong (the check could not run, or what followed a right one failed).
    pub(crate) fn withdrawn(mut self) {
        self.settle(Outcome::Withdrawn);
    }

    fn settle(&mut self, outcome: Outcome) {
        if self.state != State::Settled {
            self.state = State::Settled;
            self.throttle.settle(self.ticket, &self.keys, outcome);
        }
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        match self.state {
            State::Waiting => self.settle(Outcome::Withdrawn),
            State::Checking => self.settle(Outcome::Failed),
            State::Settled => {}
        }
    }
}

impl std::fmt::Debug for Attempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attempt").field("ticket", &self.ticket).field("state", &self.state).finish()
    }
}

/// Forgets idle keys; if the table is still full, the least recently seen half. A key with attempts
/// in progress is kept.
fn prune(entries: &mut HashMap<Key, Entry>, now: Instant) {
    entries.retain(|_, e| !e.live.is_empty() || now.saturating_duration_since(e.last_seen) < FORGET_AFTER);
    if entries.len() >= MAX_KEYS {
        let mut seen: Vec<Instant> = entries.values().map(|e| e.last_seen).collect();
        seen.sort_unstable();
        let cutoff = seen[seen.len() / 2];
        entries.retain(|_, e| !e.live.is_empty() || e.last_seen > cutoff);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn throttle() -> Arc<LoginThrottle> {
        Arc::new(LoginThrottle::new(Limits {
            free_failures: 2,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
        }))
    }

    const A: Source = Source::Address(Some(IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1))));
    const B: Source = Source::Address(Some(IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2))));

    /// An attempt that must get its turn without waiting (time is paused: any wait would show).
    async fn at_once(t: &Arc<LoginThrottle>, user: &str, source: &Source) -> Attempt {
        let attempt = t.attempt(user, source).await.expect("admitted");
        assert!(!attempt.waited(), "{user} from {source:?} waited");
        attempt
    }

    async fn fail(t: &Arc<LoginThrottle>, user: &str, source: &Source, times: usize) {
        for _ in 0..times {
            t.attempt(user, source).await.expect("admitted").failed();
        }
    }

    #[test]
    fn failures_beyond_the_free_ones_double_the_wait_up_to_the_limit() {
        let t = throttle();
        let delays: Vec<Duration> = (0..8).map(|f| t.delay(f, 2)).collect();
        let ms: Vec<u128> = delays.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [0, 0, 100, 200, 400, 800, 1000, 1000]);
        assert_eq!(t.delay(u32::MAX, 0), Duration::from_secs(1), "no overflow");
    }

    /// Concurrent attempts are counted when admitted: two free ones are checked at once; the others
    /// queue, one check at a time after the previous one settled and the (doubling) delay; one whose
    /// place would wait past the 1 s limit is refused at once, and none waits longer than the limit.
    #[tokio::test(start_paused = true)]
    async fn concurrent_attempts_queue_from_the_first_and_a_long_queue_is_refused() {
        let t = throttle();
        let start = Instant::now();
        let first = at_once(&t, "root", &A).await;
        let second = at_once(&t, "root", &A).await;
        let mut queued = Vec::new();
        for _ in 0..3 {
            let t = t.clone();
            queued.push(tokio::spawn(async move { t.attempt("root", &A).await.map(|a| (Instant::now(), a)) }));
            tokio::task::yield_now().await;
        }
        // Places ahead wait 100 ms (after the free ones), 200 ms more, 400 ms more: 700 ms; the
        // next would wait 800 ms more.
        assert_eq!(t.attempt("root", &A).await.unwrap_err(), EtcdError::TooManyRequests);
        assert_eq!(Instant::now(), start, "refused at once");
        let mut queued = queued.into_iter();
        let (third, fourth, fifth) = (queued.next().unwrap(), queued.next().unwrap(), queued.next().unwrap());
        // Nothing beyond the allowance is checked while the free checks are in flight.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!third.is_finished(), "the third went while two checks were in flight");
        let settled = Instant::now();
        first.failed();
        second.failed();
        let (third_at, third) = third.await.unwrap().expect("the third is admitted");
        assert_eq!(third_at - settled, Duration::from_millis(100), "after the free ones failed, 100 ms");
        assert!(third.waited());
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!fourth.is_finished(), "one check beyond the allowance at a time");
        let settled = Instant::now();
        third.failed();
        let (fourth_at, fourth) = fourth.await.unwrap().expect("the fourth is admitted");
        assert_eq!(fourth_at - settled, Duration::from_millis(200), "the wait doubles");
        fourth.failed();
        // The fifth would be checked 400 ms later, past its 1 s limit: refused when the limit is up.
        assert_eq!(fifth.await.unwrap().unwrap_err(), EtcdError::TooManyRequests);
        assert_eq!(Instant::now() - start, Duration::from_secs(1));
    }

    /// The wait is never longer than the limit: an attempt still not checked by then is refused.
    #[tokio::test(start_paused = true)]
    async fn no_attempt_waits_longer_than_the_limit() {
        let t = throttle();
        let (first, second) = (at_once(&t, "root", &A).await, at_once(&t, "root", &A).await);
        let started = Instant::now();
        // The free checks never finish (a hung check): the third gives up at the limit.
        assert_eq!(t.attempt("root", &A).await.unwrap_err(), EtcdError::TooManyRequests);
        assert_eq!(Instant::now() - started, Duration::from_secs(1));
        drop((first, second));
    }

    /// An attempt whose client gave up (its future dropped while waiting) gives its place back and
    /// counts for nothing; one dropped while its password is checked counts as a failure.
    #[tokio::test(start_paused = true)]
    async fn an_abandoned_attempt_releases_its_place() {
        let t = throttle();
        fail(&t, "root", &A, 2).await;
        // A burst: the first waits 100 ms, the second 300 ms, the third 700 ms; the next is refused.
        let waiting: Vec<_> = (0..3)
            .map(|_| {
                let t = t.clone();
                tokio::spawn(async move { t.attempt("root", &A).await.map(Attempt::failed) })
            })
            .collect();
        tokio::task::yield_now().await;
        assert_eq!(t.attempt("root", &A).await.unwrap_err(), EtcdError::TooManyRequests);
        // Their clients give up: the right password queues behind no one.
        for task in &waiting {
            task.abort();
        }
        for task in waiting {
            assert!(task.await.unwrap_err().is_cancelled());
        }
        let before = Instant::now();
        let right = t.attempt("root", &A).await.expect("admitted after the burst gave up");
        assert!(Instant::now() - before <= Duration::from_millis(100), "one wait of the 2 failures");
        right.succeeded();
        at_once(&t, "root", &A).await.failed();

        // Dropped while being checked: a failure.
        let t = throttle();
        drop(at_once(&t, "root", &A).await);
        drop(at_once(&t, "root", &A).await);
        assert!(t.attempt("root", &A).await.unwrap().waited(), "the two dropped checks counted");
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttled_user_logs_in_at_once_from_another_source_and_a_success_resets_its_own_key() {
        let t = throttle();
        fail(&t, "root", &A, 3).await;
        let throttled = t.attempt("root", &A).await.unwrap();
        assert!(throttled.waited(), "throttled from A");
        throttled.failed();
        at_once(&t, "root", &B).await.succeeded();
        at_once(&t, "root", &Source::Certificate("root-laptop".into())).await.succeeded();
        t.attempt("root", &A).await.unwrap().succeeded();
        at_once(&t, "root", &A).await.failed();
    }

    /// Spraying: one source trying many users is throttled as a source (2 free failures x 4), and
    /// successes of another user from there (the attacker's own account) do not reset that.
    #[tokio::test(start_paused = true)]
    async fn a_source_spraying_many_users_stays_throttled_through_its_own_successes() {
        let t = throttle();
        for i in 0..7 {
            at_once(&t, &format!("user{i}"), &A).await.failed();
            at_once(&t, "mallory", &A).await.succeeded();
        }
        at_once(&t, "user7", &A).await.failed();
        let next = t.attempt("someone-else", &A).await.unwrap();
        assert!(next.waited(), "the source is past its allowance");
        next.failed();
        assert!(t.attempt("mallory", &A).await.unwrap().waited(), "its own login waits too");
        at_once(&t, "someone-else", &B).await.failed();
    }

    #[tokio::test(start_paused = true)]
    async fn certificates_are_keyed_by_identity_not_by_address() {
        let t = throttle();
        let mallory = Source::Certificate("mallory".into());
        fail(&t, "root", &mallory, 3).await;
        let throttled = t.attempt("root", &mallory).await.unwrap();
        assert!(throttled.waited());
        throttled.failed();
        // Another certificate behind the same proxy or NAT is another key.
        at_once(&t, "root", &Source::Certificate("alice".into())).await.failed();
    }

    #[tokio::test(start_paused = true)]
    async fn attempts_in_progress_are_bounded_over_all_sources() {
        let t = throttle();
        let mut held = Vec::new();
        for i in 0..MAX_LIVE_ATTEMPTS {
            held.push(at_once(&t, "root", &Source::Certificate(format!("client-{i}"))).await);
        }
        let another = Source::Certificate("one-more".into());
        assert_eq!(t.attempt("root", &another).await.unwrap_err(), EtcdError::TooManyRequests);
        held.pop().expect("held").withdrawn();
        at_once(&t, "root", &another).await.succeeded();
    }

    #[test]
    fn ipv6_clients_are_keyed_by_their_64_prefix_and_mapped_ipv4_as_ipv4() {
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        assert_eq!(Origin::of(&Source::Address(Some(a))), Origin::of(&Source::Address(Some(b))));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(Origin::of(&Source::Address(Some(mapped))), Origin::of(&A));
        assert_ne!(Origin::of(&Source::Certificate("10.0.0.1".into())), Origin::of(&A));
    }
}
