//! Certificate files reloaded while the process runs, one way for every user: the member's and the
//! proxy's TLS listeners (`listener.rs`: cert, key, CA, CRL), the verifier of forwarded client
//! certificates (`frontend/forwarded.rs`: CA, CRL) and the proxy's own certificate towards the
//! members (`proxy/client_tls.rs`: `--cert`, `--key`, `--cacert`).
//!
//! A renewed certificate is picked up without a restart. Every `RELOAD_INTERVAL` the files' contents
//! (their SHA-256) are compared with what was last looked at; when they differ the value is rebuilt
//! from the files, and a rebuild that succeeds becomes the next generation. Contents, not
//! modification times: a rotation that keeps the time (`cp -p`, an unpacked archive) or lands within
//! the file system's time granularity is still noticed, and touching a file is no reload. A change
//! that does not load (a half-written rotation, a broken CRL) keeps the previous value, is reported
//! once, and is tried again when the files change again: loading depends on the contents only, so
//! the same contents would fail the same way. A broken CRL therefore never means "nothing is
//! revoked".
//!
//! Two ways to drive the check, one rule: `spawn_checks` for a user with a runtime of its own (the
//! listeners, the proxy), `reload_if_due` for one checked on use (the forwarded-certificate verifier,
//! which the member builds before any runtime task and unit tests use without one).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// How often certificate files are compared with what was loaded.
pub(crate) const RELOAD_INTERVAL: Duration = Duration::from_secs(2);

/// What one check found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reload {
    /// The files are as they were last looked at (or the check was not due).
    Unchanged,
    /// The files changed and loaded: this generation is current now.
    Reloaded { generation: u64 },
    /// The files changed but do not load, and why; the previous value stays current.
    Failed(String),
}

/// A value built from files (a rustls configuration, a verifier), rebuilt when their contents change.
pub(crate) struct Reloading<T> {
    files: Vec<PathBuf>,
    load: Box<dyn Fn() -> Result<T, String> + Send + Sync>,
    current: RwLock<Loaded<T>>,
    /// When `reload_if_due` last checked; held while it reloads, so that a caller after the due time
    /// waits for the new value rather than use the old one.
    checked_at: Mutex<Instant>,
}

struct Loaded<T> {
    value: T,
    generation: u64,
    /// The files' contents when last looked at (loaded or not).
    seen: Fingerprint,
}

/// Each file's SHA-256 (`None`: it could not be read).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Fingerprint(Vec<Option<[u8; 32]>>);

impl Fingerprint {
    fn of(files: &[PathBuf]) -> Fingerprint {
        Fingerprint(files.iter().map(|f| std::fs::read(f).ok().map(|bytes| Sha256::digest(bytes).into())).collect())
    }
}

impl<T: Clone> Reloading<T> {
    /// Loads the value now (an error is the caller's: a missing or broken file fails startup) and
    /// remembers `files`, the files `load` reads.
    pub(crate) fn load(
        files: Vec<PathBuf>,
        load: impl Fn() -> Result<T, String> + Send + Sync + 'static,
    ) -> Result<Reloading<T>, String> {
        // Looked at before loading: a change made while loading is noticed at the next check.
        let seen = Fingerprint::of(&files);
        let value = load()?;
        Ok(Reloading {
            files,
            load: Box::new(load),
            current: RwLock::new(Loaded { value, generation: 0, seen }),
            checked_at: Mutex::new(Instant::now()),
        })
    }

    /// The current value and its generation (0 for the one loaded at startup).
    pub(crate) fn current(&self) -> (T, u64) {
        let loaded = self.current.read().unwrap_or_else(|e| e.into_inner());
        (loaded.value.clone(), loaded.generation)
    }

    /// The current generation.
    pub(crate) fn generation(&self) -> u64 {
        self.current.read().unwrap_or_else(|e| e.into_inner()).generation
    }

    /// Compares the files with those last looked at and, if they changed, rebuilds the value.
    pub(crate) fn reload_if_changed(&self) -> Reload {
        let now = Fingerprint::of(&self.files);
        {
            let mut loaded = self.current.write().unwrap_or_else(|e| e.into_inner());
            if now == loaded.seen {
                return Reload::Unchanged;
            }
            loaded.seen = now;
        }
        match (self.load)() {
            Ok(value) => {
                let mut loaded = self.current.write().unwrap_or_else(|e| e.into_inner());
                loaded.value = value;
                loaded.generation += 1;
                Reload::Reloaded { generation: loaded.generation }
            }
            Err(e) => Reload::Failed(e),
        }
    }

    /// `reload_if_changed` if `RELOAD_INTERVAL` has passed since the last check, for a user checked
    /// on use. Callers that arrive while another reloads wait for it.
    pub(crate) fn reload_if_due(&self) -> Reload {
        let mut checked_at = self.checked_at.lock().unwrap_or_else(|e| e.into_inner());
        if checked_at.elapsed() < RELOAD_INTERVAL {
            return Reload::Unchanged;
        }
        *checked_at = Instant::now();
        self.reload_if_changed()
    }
}

impl<T: Clone + Send + Sync + 'static> Reloading<T> {
    /// Checks the files every `RELOAD_INTERVAL` while `self` is in use (the task ends once only it
    /// holds it), handing what each check found to `report` (which logs it as its user says it).
    pub(crate) fn spawn_checks(self: &Arc<Reloading<T>>, report: impl Fn(Reload) + Send + Sync + 'static) {
        let reloading = Arc::downgrade(self);
        let report = Arc::new(report);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(RELOAD_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(reloading) = reloading.upgrade() else { return };
                let report = report.clone();
                // Reading a few small files and building a configuration: off the reactor.
                let _ = tokio::task::spawn_blocking(move || report(reloading.reload_if_changed())).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value that is the file's text, or fails to load when the text is "broken".
    fn text_of(path: PathBuf) -> Reloading<String> {
        let read = path.clone();
        Reloading::load(vec![path], move || match std::fs::read_to_string(&read) {
            Ok(text) if text != "broken" => Ok(text),
            Ok(_) => Err("broken".into()),
            Err(e) => Err(e.to_string()),
        })
        .unwrap()
    }

    #[test]
    fn a_change_of_contents_is_a_new_generation_and_a_rewrite_of_the_same_contents_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cert.pem");
        std::fs::write(&path, "one").unwrap();
        let reloading = text_of(path.clone());
        assert_eq!(reloading.current(), ("one".to_string(), 0));
        assert_eq!(reloading.reload_if_changed(), Reload::Unchanged);
        std::fs::write(&path, "one").unwrap();
        assert_eq!(reloading.reload_if_changed(), Reload::Unchanged, "the same contents written again");
        std::fs::write(&path, "two").unwrap();
        assert_eq!(reloading.reload_if_changed(), Reload::Reloaded { generation: 1 });
        assert_eq!(reloading.current(), ("two".to_string(), 1));
    }

    #[test]
    fn a_change_that_does_not_load_keeps_the_previous_value_until_the_files_change_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cert.pem");
        std::fs::write(&path, "one").unwrap();
        let reloading = text_of(path.clone());
        std::fs::write(&path, "broken").unwrap();
        assert_eq!(reloading.reload_if_changed(), Reload::Failed("broken".into()));
        assert_eq!(reloading.current(), ("one".to_string(), 0));
        assert_eq!(reloading.reload_if_changed(), Reload::Unchanged, "reported once");
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(reloading.reload_if_changed(), Reload::Failed(_)), "a missing file is a change");
        std::fs::write(&path, "three").unwrap();
        assert_eq!(reloading.reload_if_changed(), Reload::Reloaded { generation: 1 });
    }

    #[test]
    fn a_check_on_use_is_due_once_per_interval() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cert.pem");
        std::fs::write(&path, "one").unwrap();
        let reloading = text_of(path.clone());
        std::fs::write(&path, "two").unwrap();
        assert_eq!(reloading.reload_if_due(), Reload::Unchanged, "not due yet");
        *reloading.checked_at.lock().unwrap() -= RELOAD_INTERVAL;
        assert_eq!(reloading.reload_if_due(), Reload::Reloaded { generation: 1 });
    }
}
