//! Tests that change or measure what belongs to the whole process run in a child process of this
//! test binary, alone: in one binary every other test shares the process with them. Today these are
//! `fuzz_config` (it sets `ETCD_*` variables, which a server or etcdctl another test spawns meanwhile
//! would inherit), `snapshot_memory` and `long_key_memory` (they count the heap of the whole process).

use std::process::Command;

/// Set in the child process to the name of the one test it runs.
const CHILD: &str = "KEYWARD_IT_ALONE";

/// In the test binary: runs the test `name` (its path in this binary, e.g.
/// `fuzz_config::valid_configs_round_trip`) in a child process of this binary with nothing beside
/// it, prints what it printed, fails if it failed, and returns true: the caller returns. In that
/// child: returns false, and the caller runs the test's body.
pub(crate) fn elsewhere(name: &str) -> bool {
    if std::env::var_os(CHILD).is_some_and(|running| running == name) {
        return false;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    // `--include-ignored`: an ignored test is only called when the run asked for it.
    let out = Command::new(exe)
        .args([name, "--exact", "--include-ignored", "--test-threads=1", "--nocapture"])
        .env(CHILD, name)
        .output()
        .unwrap_or_else(|e| panic!("running {name} in a process of its own: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{name} failed in its own process ({})", out.status);
    // A misspelt name would run no test at all, and pass.
    assert!(stdout.contains("test result: ok. 1 passed"), "{name} did not run in its own process");
    true
}
