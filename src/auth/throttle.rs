//! Login throttling: failed password checks slow down the next attempts from the same place, so a
//! password cannot be guessed at bcrypt speed (etcd has no limit at all).
//!
//! Failures are counted per (user, client address) and per client address alone (one address trying
//! many user names). After `free_failures` failures of a key (four times as many for an address
//! alone), each further attempt waits before its password is even checked: `base_delay`, doubling
//! with every failure, at most `max_delay`. Attempts of one key queue behind each other, so sending
//! them concurrently gains nothing; an attempt that would have to wait longer than `max_delay` is
//! refused at once with etcd's "too many requests". A success clears both keys. The same user from
//! another address is not slowed down: an attacker cannot lock a user out.
//!
//! Addresses are the connection's peer address (IPv6 by its /64), or the client's address a trusted
//! keyward proxy forwarded (`IdentityRules::client_addr`). The table forgets keys idle for `FORGET_AFTER` and holds at most `MAX_KEYS`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::EtcdError;

/// A key idle this long is forgotten (its failures too).
const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);
/// Keys kept at most; beyond, the oldest are forgotten first.
const MAX_KEYS: usize = 100_000;
/// How many more failures an address alone gets free than a (user, address) pair.
const ADDRESS_FACTOR: u32 = 4;

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

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    UserAt(String, Address),
    Address(Address),
}

/// A client address as throttling sees it: IPv4 whole, IPv6 by its /64 (one host owns many).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Address {
    V4(u32),
    V6(u64),
    Unknown,
}

impl Address {
    fn of(ip: Option<IpAddr>) -> Address {
        match ip.map(|ip| ip.to_canonical()) {
            Some(IpAddr::V4(v4)) => Address::V4(v4.into()),
            Some(IpAddr::V6(v6)) => Address::V6((u128::from(v6) >> 64) as u64),
            None => Address::Unknown,
        }
    }
}

struct Entry {
    failures: u32,
    /// No attempt of this key is checked before this instant.
    next: Instant,
    last_seen: Instant,
}

pub struct LoginThrottle {
    limits: Limits,
    entries: Mutex<HashMap<Key, Entry>>,
}

impl LoginThrottle {
    pub fn new(limits: Limits) -> LoginThrottle {
        LoginThrottle { limits, entries: Mutex::new(HashMap::new()) }
    }

    fn keys(user: &str, ip: Option<IpAddr>) -> [(Key, u32); 2] {
        let address = Address::of(ip);
        [(Key::UserAt(user.to_string(), address), 1), (Key::Address(address), ADDRESS_FACTOR)]
    }

    /// The delay after `failures` failures of a key whose free allowance is `free`.
    fn delay(&self, failures: u32, free: u32) -> Duration {
        let Some(beyond) = failures.checked_sub(free) else { return Duration::ZERO };
        let factor = 1u32.checked_shl(beyond.min(31)).unwrap_or(u32::MAX);
        self.limits.base_delay.saturating_mul(factor).min(self.limits.max_delay)
    }

    /// Admits an attempt of `user` from `ip`: how long it must wait before its password is checked,
    /// or "too many requests" if that would be longer than `max_delay`. The wait is reserved, so the
    /// key's next attempt queues behind this one.
    pub fn admit(&self, user: &str, ip: Option<IpAddr>) -> Result<Duration, EtcdError> {
        let now = Instant::now();
        let mut entries = self.lock();
        let keys = Self::keys(user, ip);
        let mut wait = Duration::ZERO;
        for (key, factor) in &keys {
            let Some(entry) = entries.get(key) else { continue };
            if !self.delay(entry.failures, self.limits.free_failures.saturating_mul(*factor)).is_zero() {
                wait = wait.max(entry.next.saturating_duration_since(now));
            }
        }
        if wait > self.limits.max_delay {
            return Err(EtcdError::TooManyRequests);
        }
        for (key, factor) in keys {
            let Some(entry) = entries.get_mut(&key) else { continue };
            let delay = self.delay(entry.failures, self.limits.free_failures.saturating_mul(factor));
            if !delay.is_zero() {
                entry.next = entry.next.max(now) + delay;
                entry.last_seen = now;
            }
        }
        Ok(wait)
    }

    /// Records a failed check (wrong password, unknown user, a user without password).
    pub fn failed(&self, user: &str, ip: Option<IpAddr>) {
        let now = Instant::now();
        let mut entries = self.lock();
        if entries.len() >= MAX_KEYS {
            prune(&mut entries, now);
        }
        for (key, factor) in Self::keys(user, ip) {
            let entry = entries.entry(key).or_insert(Entry { failures: 0, next: now, last_seen: now });
            entry.failures = entry.failures.saturating_add(1);
            let delay = self.delay(entry.failures, self.limits.free_failures.saturating_mul(factor));
            entry.next = entry.next.max(now + delay);
            entry.last_seen = now;
        }
    }

    /// Records a successful login: both keys start afresh.
    pub fn succeeded(&self, user: &str, ip: Option<IpAddr>) {
        let mut entries = self.lock();
        for (key, _) in Self::keys(user, ip) {
            entries.remove(&key);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Forgets idle keys; if the table is still full, the least recently seen half.
fn prune(entries: &mut HashMap<Key, Entry>, now: Instant) {
    entries.retain(|_, e| now.saturating_duration_since(e.last_seen) < FORGET_AFTER);
    if entries.len() >= MAX_KEYS {
        let mut seen: Vec<Instant> = entries.values().map(|e| e.last_seen).collect();
        seen.sort_unstable();
        let cutoff = seen[seen.len() / 2];
        entries.retain(|_, e| e.last_seen > cutoff);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn throttle() -> LoginThrottle {
        LoginThrottle::new(Limits {
            free_failures: 2,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
        })
    }

    const A: Option<IpAddr> = Some(IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1)));
    const B: Option<IpAddr> = Some(IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2)));

    #[test]
    fn failures_beyond_the_free_ones_double_the_wait_up_to_the_limit() {
        let t = throttle();
        let delays: Vec<Duration> = (0..8).map(|f| t.delay(f, 2)).collect();
        let ms: Vec<u128> = delays.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [0, 0, 100, 200, 400, 800, 1000, 1000]);
        assert_eq!(t.delay(u32::MAX, 0), Duration::from_secs(1), "no overflow");
    }

    #[test]
    fn a_throttled_user_logs_in_at_once_from_another_address_and_a_success_resets() {
        let t = throttle();
        for _ in 0..2 {
            assert_eq!(t.admit("root", A).unwrap(), Duration::ZERO);
            t.failed("root", A);
        }
        // The third failure's delay applies to the next attempt.
        t.admit("root", A).unwrap();
        t.failed("root", A);
        assert!(t.admit("root", A).unwrap() > Duration::from_millis(150), "throttled from A");
        assert_eq!(t.admit("root", B).unwrap(), Duration::ZERO, "not from B");
        t.succeeded("root", A);
        assert_eq!(t.admit("root", A).unwrap(), Duration::ZERO, "a success starts afresh");
    }

    #[test]
    fn concurrent_attempts_queue_and_a_long_queue_is_refused() {
        let t = throttle();
        for _ in 0..4 {
            t.admit("root", A).unwrap();
            t.failed("root", A);
        }
        // Each admitted attempt pushes the next one back by the current delay (400 ms): queueing them
        // concurrently gains nothing, and a wait beyond the 1 s limit is refused outright.
        let waits: Vec<Result<Duration, EtcdError>> = (0..5).map(|_| t.admit("root", A)).collect();
        let ok: Vec<u128> = waits.iter().filter_map(|w| w.as_ref().ok()).map(Duration::as_millis).collect();
        assert!(ok.windows(2).all(|w| w[1] >= w[0] + 390), "each waits behind the previous: {ok:?}");
        assert!(waits.iter().any(|w| matches!(w, Err(EtcdError::TooManyRequests))), "{waits:?}");
    }

    #[test]
    fn one_address_trying_many_users_is_throttled_as_an_address() {
        let t = throttle();
        // 2 free failures x 4 for the address alone: the ninth user from A waits, from B not.
        for i in 0..9 {
            t.admit(&format!("user{i}"), A).unwrap();
            t.failed(&format!("user{i}"), A);
        }
        assert!(t.admit("someone-else", A).unwrap() > Duration::ZERO);
        assert_eq!(t.admit("someone-else", B).unwrap(), Duration::ZERO);
    }

    #[test]
    fn ipv6_clients_are_keyed_by_their_64_prefix_and_mapped_ipv4_as_ipv4() {
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        assert_eq!(Address::of(Some(a)), Address::of(Some(b)));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(Address::of(Some(mapped)), Address::of(A));
    }
}
