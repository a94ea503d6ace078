//! Where log lines go and how they look: etcd's `--logger` and `--log-outputs`.
//!
//! `--logger zap` writes one JSON object per line with etcd's keys, in etcd's order — `level`, `ts`,
//! `caller`, `msg`, then the event's fields — so log pipelines built for etcd read keyward's.
//! `--logger capnslog` (the default) is tracing's human-readable text, one line per event: a line
//! break left inside an event (a client-chosen value not put through `log_text::Quoted`) is escaped
//! on its way out (`OneLine`), so no client can forge a log line. `KEYWARD_LOG` (an `EnvFilter`
//! directive) overrides `--log-level` for finer filtering.
//!
//! Log files are created 0600 (they name keys and users).

pub(crate) mod limit;
pub(crate) mod private_file;
pub(crate) mod slow;
pub(crate) mod text;

use std::fmt::Write as _;
use std::fs::File;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriter, MakeWriterExt};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// `--logger`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// `zap`: JSON lines as etcd's.
    Json,
    /// `capnslog`: text lines.
    Text,
}

/// One of `--log-outputs`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogOutput {
    Stderr,
    Stdout,
    /// Appended to.
    File(PathBuf),
}

/// `--logger` and `--log-outputs`, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogSettings {
    pub format: LogFormat,
    pub outputs: Vec<LogOutput>,
}

impl Default for LogSettings {
    fn default() -> Self {
        LogSettings { format: LogFormat::Text, outputs: vec![LogOutput::Stderr] }
    }
}

impl LogSettings {
    pub fn from_flags(logger: &str, outputs: &[String]) -> Result<LogSettings, String> {
        let format = match logger {
            "zap" => LogFormat::Json,
            "capnslog" => LogFormat::Text,
            other => return Err(format!("--logger {other:?}: want \"zap\" or \"capnslog\"")),
        };
        let mut parsed = Vec::new();
        for output in outputs.iter().map(|o| o.trim()).filter(|o| !o.is_empty()) {
            let output = match output {
                "default" | "stderr" => LogOutput::Stderr,
                "stdout" => LogOutput::Stdout,
                "systemd/journal" => {
                    return Err("--log-outputs systemd/journal is not supported: use stderr (journald collects a \
                                service's stderr)"
                        .into())
                }
                path => LogOutput::File(PathBuf::from(path)),
            };
            if !parsed.contains(&output) {
                parsed.push(output);
            }
        }
        if parsed.is_empty() {
            parsed.push(LogOutput::Stderr);
        }
        Ok(LogSettings { format, outputs: parsed })
    }

    /// Whether log lines reach standard error (then an error logged there need not be printed again).
    pub fn writes_to_stderr(&self) -> bool {
        self.outputs.contains(&LogOutput::Stderr)
    }
}

/// Installs the global subscriber: `level` (an `EnvFilter` directive) unless `KEYWARD_LOG` is set.
/// Fails when a log file cannot be opened, naming it.
pub fn init(level: &str, settings: &LogSettings) -> Result<(), String> {
    let filter = tracing_subscriber::EnvFilter::try_from_env("KEYWARD_LOG").unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!("{level},openraft=warn,h2=warn,tower=warn,hyper=warn"))
    });
    let mut writer: Option<BoxMakeWriter> = None;
    for output in &settings.outputs {
        let next = match output {
            LogOutput::Stderr => BoxMakeWriter::new(std::io::stderr),
            LogOutput::Stdout => BoxMakeWriter::new(std::io::stdout),
            LogOutput::File(path) => BoxMakeWriter::new(Arc::new(open_log_file(path)?)),
        };
        writer = Some(match writer {
            None => next,
            Some(before) => BoxMakeWriter::new(before.and(next)),
        });
    }
    let writer = writer.unwrap_or_else(|| BoxMakeWriter::new(std::io::stderr));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let installed = match settings.format {
        LogFormat::Json => builder.with_writer(writer).event_format(ZapJson).try_init(),
        LogFormat::Text => {
            let ansi = settings.outputs == [LogOutput::Stderr] && std::io::stderr().is_terminal();
            builder.with_ansi(ansi).with_writer(OneLine(writer)).try_init()
        }
    };
    installed.map_err(|e| format!("cannot install the logger: {e}"))
}

fn open_log_file(path: &std::path::Path) -> Result<File, String> {
    crate::logging::private_file::open_append(path).map_err(|e| format!("--log-outputs {}: {e}", path.display()))
}

/// The text logger's writer: each event arrives as one buffer (tracing-subscriber formats an event,
/// then writes it with one `write_all`); every line break in it but the last is escaped.
struct OneLine<M>(M);

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for OneLine<M> {
    type Writer = OneLineWriter<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        OneLineWriter(self.0.make_writer())
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Self::Writer {
        OneLineWriter(self.0.make_writer_for(meta))
    }
}

struct OneLineWriter<W>(W);

impl<W: std::io::Write> std::io::Write for OneLineWriter<W> {
    fn write(&mut self, event: &[u8]) -> std::io::Result<usize> {
        let (body, end) = match event.strip_suffix(b"\n") {
            Some(body) => (body, &b"\n"[..]),
            None => (event, &b""[..]),
        };
        let text = String::from_utf8_lossy(body);
        let mut line = crate::logging::text::escape_line_breaks(&text).into_owned().into_bytes();
        line.extend_from_slice(end);
        self.0.write_all(&line)?;
        Ok(event.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// etcd's zap encoder: `{"level":"info","ts":"…","caller":"mvcc/kv.rs:12","msg":"…",…fields}`.
struct ZapJson;

impl<S, N> FormatEvent<S, N> for ZapJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, _ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> std::fmt::Result {
        let meta = event.metadata();
        let mut ts = String::new();
        SystemTime.format_time(&mut Writer::new(&mut ts))?;
        let caller = match (meta.file(), meta.line()) {
            (Some(file), Some(line)) => format!("{}:{line}", file.trim_start_matches("src/")),
            _ => meta.target().to_string(),
        };
        let mut fields = JsonFields::default();
        event.record(&mut fields);
        let mut line = String::with_capacity(128);
        line.push_str("{\"level\":");
        push_json(&mut line, &meta.level().as_str().to_ascii_lowercase());
        line.push_str(",\"ts\":");
        push_json(&mut line, &ts);
        line.push_str(",\"caller\":");
        push_json(&mut line, &caller);
        line.push_str(",\"msg\":");
        push_json(&mut line, fields.message.as_deref().unwrap_or_default());
        for (name, value) in &fields.fields {
            line.push(',');
            push_json(&mut line, name);
            line.push(':');
            line.push_str(value);
        }
        line.push('}');
        writeln!(writer, "{line}")
    }
}

fn push_json(out: &mut String, text: &str) {
    // Serialising a &str cannot fail.
    let _ = write!(out, "{}", serde_json::Value::from(text));
}

/// An event's fields, each value already JSON; `message` apart.
#[derive(Default)]
struct JsonFields {
    message: Option<String>,
    fields: Vec<(&'static str, String)>,
}

impl JsonFields {
    fn add(&mut self, field: &Field, value: serde_json::Value) {
        if field.name() == "message" {
            self.message = Some(match value {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            });
        } else {
            self.fields.push((field.name(), value.to_string()));
        }
    }
}

impl Visit for JsonFields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.add(field, value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.add(field, value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.add(field, value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.add(field, value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.add(field, value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.add(field, value.to_string().into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.add(field, format!("{value:?}").into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_as_etcd_takes_them() {
        let parse = |logger: &str, outputs: &[&str]| {
            LogSettings::from_flags(logger, &outputs.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        };
        assert_eq!(parse("capnslog", &["default"]), Ok(LogSettings::default()));
        assert_eq!(
            parse("zap", &["stderr", "stdout", "/var/log/k.log", "stderr"]).unwrap(),
            LogSettings {
                format: LogFormat::Json,
                outputs: vec![LogOutput::Stderr, LogOutput::Stdout, LogOutput::File("/var/log/k.log".into())]
            }
        );
        assert!(parse("logrus", &[]).unwrap_err().contains("want \"zap\" or \"capnslog\""));
        assert!(parse("zap", &["systemd/journal"]).unwrap_err().contains("not supported"));
        assert!(!parse("zap", &["stdout"]).unwrap().writes_to_stderr());
    }

    /// A log writer the test reads back.
    #[derive(Clone, Default)]
    struct Buffer(Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_text_event_is_one_line_even_with_a_line_break_in_an_unquoted_field() {
        let buffer = Buffer::default();
        let sink = buffer.clone();
        let subscriber = tracing_subscriber::fmt().with_ansi(false).with_writer(OneLine(move || sink.clone())).finish();
        tracing::subscriber::with_default(subscriber, || {
            let hostile = "k\n2026-01-01T00:00:00Z  INFO forged\r\u{2028}";
            tracing::warn!(key = %hostile, "first");
            tracing::warn!("second");
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].ends_with("first key=k\\n2026-01-01T00:00:00Z  INFO forged\\r\\u{2028}"), "{text}");
        assert!(lines[1].ends_with("second"), "{text}");
    }

    #[test]
    fn zap_lines_are_json_with_etcds_keys_in_etcds_order() {
        let buffer = Buffer::default();
        let sink = buffer.clone();
        let subscriber = tracing_subscriber::fmt().event_format(ZapJson).with_writer(move || sink.clone()).finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(path = "/d \"x\"", count = 3_u64, ok = true, "data dir {} is shared", "d");
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        let line: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
        let keys: Vec<&str> = text.split("\":").map(|part| part.rsplit('"').next().unwrap()).collect();
        assert_eq!(&keys[..4], ["level", "ts", "caller", "msg"], "{text}");
        assert_eq!(line["level"], "warn");
        assert_eq!(line["msg"], "data dir d is shared");
        assert_eq!(line["path"], "/d \"x\"");
        assert_eq!(line["count"], 3);
        assert_eq!(line["ok"], true);
        assert!(line["caller"].as_str().unwrap().starts_with("logging/mod.rs:"), "{text}");
        assert!(line["ts"].as_str().unwrap().ends_with('Z'), "{text}");
    }
}
