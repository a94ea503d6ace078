//! Go's duration syntax (`5m`, `1h30m`, `1.5h`), in which etcd's duration flags are written: the
//! keepalive and idle timeouts, the auto-compaction retention, the JWT `ttl`, and keyward-bench's.

use std::time::Duration;

/// Go's `time.ParseDuration`: `[-+]?([0-9]*(\.[0-9]*)?[a-z]+)+` or `0`, units ns, us (µs, μs), ms,
/// s, m, h. Negative durations are refused (Go accepts them; no caller here wants one). Overflow
/// past Go's limit (int64 nanoseconds, about 292 years) is an error, as in Go.
///
/// Written here rather than taken from a crate: the one crate that ports Go's parser,
/// `go-parse-duration` 0.1.1 (unmaintained since 2021), writes Go's `1<<63 - 1` as Rust's `1 << 63 - 1`
/// (= 2^62: it refuses `1500000h`, which Go accepts), mixes char and byte indices (`"1µs"` and `"1sµ"`
/// panic) and never returns on `0.9999999999999999999s`; `humantime` reads a different syntax (spaces,
/// other unit names). The test `go_durations` pins Go's behaviour.
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    const MAX_NANOS: u128 = i64::MAX as u128;
    let orig = s;
    let invalid = || format!("invalid duration {orig:?}");
    let mut s = s;
    let mut negative = false;
    if let Some(rest) = s.strip_prefix('-') {
        negative = true;
        s = rest;
    } else if let Some(rest) = s.strip_prefix('+') {
        s = rest;
    }
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    let mut total: u128 = 0;
    while !s.is_empty() {
        // integer part
        let int_len = s.bytes().take_while(u8::is_ascii_digit).count();
        let (int_digits, rest) = s.split_at(int_len);
        s = rest;
        // fraction
        let mut frac_digits = "";
        let has_dot = s.starts_with('.');
        if has_dot {
            s = &s[1..];
            let frac_len = s.bytes().take_while(u8::is_ascii_digit).count();
            (frac_digits, s) = s.split_at(frac_len);
        }
        if int_digits.is_empty() && frac_digits.is_empty() {
            // no digits at all (e.g. ".s" or "h")
            return Err(invalid());
        }
        // unit: everything up to the next digit or '.'
        let unit_len = s.char_indices().find(|&(_, c)| c == '.' || c.is_ascii_digit()).map_or(s.len(), |(i, _)| i);
        let (unit, rest) = s.split_at(unit_len);
        s = rest;
        let unit_nanos: u128 = match unit {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 3_600 * 1_000_000_000,
            "" => return Err(format!("missing unit in duration {orig:?}")),
            other => return Err(format!("unknown unit {other:?} in duration {orig:?}")),
        };
        let mut value: u128 = 0;
        for d in int_digits.bytes() {
            value = value * 10 + u128::from(d - b'0');
            if value > MAX_NANOS {
                return Err(invalid());
            }
        }
        let mut nanos = value * unit_nanos;
        if nanos > MAX_NANOS {
            return Err(invalid());
        }
        // Fractional digits beyond 1e-18 of a unit cannot matter (the largest unit is 3.6e12 ns).
        let mut frac: u128 = 0;
        let mut scale: u128 = 1;
        for d in frac_digits.bytes().take(18) {
            frac = frac * 10 + u128::from(d - b'0');
            scale *= 10;
        }
        nanos += frac * unit_nanos / scale;
        total += nanos;
        if total > MAX_NANOS {
            return Err(invalid());
        }
    }
    if negative && total != 0 {
        return Err(format!("negative duration {orig:?}"));
    }
    let total = u64::try_from(total).map_err(|_| invalid())?;
    Ok(Duration::from_nanos(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        let d = |s: &str| parse_go_duration(s);
        assert_eq!(d("0"), Ok(Duration::ZERO));
        assert_eq!(d("-0"), Ok(Duration::ZERO));
        assert_eq!(d("1ns"), Ok(Duration::from_nanos(1)));
        assert_eq!(d("1us"), Ok(Duration::from_micros(1)));
        assert_eq!(d("1µs"), Ok(Duration::from_micros(1)));
        assert_eq!(d("1μs"), Ok(Duration::from_micros(1)));
        assert_eq!(d("1.5ms"), Ok(Duration::from_micros(1500)));
        assert_eq!(d(".5s"), Ok(Duration::from_millis(500)));
        assert_eq!(d("5.s"), Ok(Duration::from_secs(5)));
        assert_eq!(d("2h45m30.5s"), Ok(Duration::from_millis((2 * 3600 + 45 * 60 + 30) * 1000 + 500)));
        assert_eq!(d("1m1m"), Ok(Duration::from_secs(120)));
        assert_eq!(d("2562047h"), Ok(Duration::from_secs(2562047 * 3600)));
        assert_eq!(d("1500000h"), Ok(Duration::from_secs(1500000 * 3600)));
        assert_eq!(d("0.5000000000000000000001s"), Ok(Duration::from_millis(500)));
        assert!(d("1sµ").unwrap_err().contains("unknown unit"));
        assert!(d("2562048h").is_err());
        assert!(d("9223372036854775808ns").is_err());
        assert!(d("").is_err());
        assert!(d("s").is_err());
        assert!(d(".s").is_err());
        assert!(d("1").is_err());
        assert!(d("1.2.3s").is_err());
        assert!(d("1h ").is_err());
        assert!(d("1H").is_err());
        assert!(d("-1s").is_err());
    }
}
