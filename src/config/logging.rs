//! `--log-level`, as the filter keyward's logger takes (etcd's zap levels `dpanic`, `panic` and
//! `fatal` log as errors).

use super::error::{invalid, ConfigError};

pub(super) fn log_filter(level: &str) -> Result<&'static str, ConfigError> {
    match level {
        "debug" => Ok("debug"),
        "info" => Ok("info"),
        "warn" => Ok("warn"),
        "error" | "dpanic" | "panic" | "fatal" => Ok("error"),
        other => Err(invalid(format!("unknown log level {other:?} (want debug, info, warn, error, panic, or fatal)"))),
    }
}
