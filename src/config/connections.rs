//! The client connection flags (`--max-client-connections`, `--client-idle-timeout`,
//! `--grpc-keepalive-*`, `--max-concurrent-streams`) checked into the `ConnectionLimits` that
//! `frontend/connection_limits.rs` enforces; shared by the member and the proxy.

use super::duration::parse_go_duration;
use crate::frontend::connection_limits::ConnectionLimits;

/// The limits from their flags' values (durations in Go's syntax, as etcd takes them), checked
/// as the member and the proxy both need them: errors name the flag.
pub(crate) fn connection_limits(
    max_connections: usize,
    idle_timeout: &str,
    keepalive_interval: &str,
    keepalive_timeout: &str,
    max_concurrent_streams: u32,
) -> Result<ConnectionLimits, String> {
    let duration = |flag: &str, text: &str| parse_go_duration(text).map_err(|e| format!("--{flag}: {e}"));
    let limits = ConnectionLimits {
        max_connections,
        idle_timeout: duration("client-idle-timeout", idle_timeout)?,
        keepalive_interval: duration("grpc-keepalive-interval", keepalive_interval)?,
        keepalive_timeout: duration("grpc-keepalive-timeout", keepalive_timeout)?,
        max_concurrent_streams,
    };
    if limits.max_connections == 0 || limits.max_concurrent_streams == 0 {
        return Err("--max-client-connections and --max-concurrent-streams must be at least 1".into());
    }
    if limits.idle_timeout.is_zero() {
        return Err("--client-idle-timeout must be above 0".into());
    }
    if !limits.keepalive_interval.is_zero()
        && limits.idle_timeout <= limits.keepalive_interval + limits.keepalive_timeout
    {
        return Err(format!(
            "--client-idle-timeout {idle_timeout} must be above --grpc-keepalive-interval + --grpc-keepalive-timeout, \
             or quiet live clients (an idle watch) are cut off"
        ));
    }
    Ok(limits)
}
