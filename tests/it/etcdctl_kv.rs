//! etcdctl KV commands: keyward must print exactly what etcd 3.4 prints.
//!
//! Every test is one scenario: a fresh etcd and a fresh keyward receive the same
//! etcdctl invocations; after each one, exit success, normalized stdout and
//! normalized stderr must agree (see `common::normalize`). Set
//! `KEYWARD_HARNESS_SELFTEST=1` to run both sides on etcd.

use crate::common::{same_output, step, step_stdin};

/// put / get basics, value from stdin, ranges, --rev=-1, output formats of get and put,
/// and the "key is not provided" errors.
#[test]
fn put_get_basics() {
    same_output(&[
        step(&["get", "a"]), // missing key: empty output
        step(&["put", "a", "1"]),
        step(&["get", "a"]),
        step(&["put", "a", "2"]),
        step(&["get", "a"]),
        step(&["put", "spaced key", "a value with spaces"]),
        step(&["get", "spaced key"]),
        step_stdin(&["put", "from-stdin"], "hello\nworld\n"), // value read from stdin, newline kept
        step(&["get", "from-stdin"]),
        step(&["put", "b", ""]), // empty value
        step(&["get", "b"]),
        step(&["put", "c", "3"]),
        step(&["get", "a", "c"]), // explicit range [a, c)
        step(&["get", "a", "c", "-w", "json"]),
        step(&["get", "a", "--rev=-1"]), // negative revision means "latest"
        step(&["get", "a", "--print-value-only"]),
        step(&["get", "a", "--keys-only"]),
        step(&["get", "a", "--hex"]),
        step(&["get", "a", "-w", "json"]),
        step(&["get", "a", "-w", "fields"]),
        step(&["get", "nope", "-w", "json"]), // no kvs, count 0
        step(&["get", "nope", "-w", "fields"]),
        step(&["put", "d", "4", "-w", "json"]),
        step(&["put", "d", "5", "-w", "fields"]),
        step(&["get", "a", "-w", "table"]),  // client-side error: table not supported
        step(&["get", "a", "--count-only"]), // etcdctl 3.4 has no --count-only: usage error on both
        step(&["put", "", "v"]),             // error: key is not provided
        step(&["get", ""]),
        step(&["del", ""]),
        step(&["get", "", "--from-key", "-w", "json"]),
    ]);
}

/// --prefix, --from-key, --limit (with "more"), and their combinations.
#[test]
fn get_prefix_from_key_limit() {
    same_output(&[
        step(&["put", "foo", "0"]),
        step(&["put", "foo/a", "1"]),
        step(&["put", "foo/b", "2"]),
        step(&["put", "foo/c", "3"]),
        step(&["put", "fop", "4"]),
        step(&["put", "zeta", "5"]),
        step(&["put", "\u{00e9}t\u{00e9}", "6"]), // non-ASCII key sorts after ASCII
        step(&["get", "foo", "--prefix"]),
        step(&["get", "foo/", "--prefix"]),
        step(&["get", "foo/", "--prefix", "--keys-only"]),
        step(&["get", "foo/", "--prefix", "--print-value-only"]),
        step(&["get", "foo/", "--prefix", "-w", "json"]),
        step(&["get", "foo/", "--prefix", "-w", "fields"]),
        step(&["get", "nothing", "--prefix"]),
        step(&["get", "foo/b", "--from-key"]),
        step(&["get", "", "--from-key"]), // "" with --from-key = all keys
        step(&["get", "", "--from-key", "--keys-only"]),
        step(&["get", "zz", "--from-key"]),
        step(&["get", "foo", "--prefix", "--limit", "2"]),
        step(&["get", "foo", "--prefix", "--limit", "2", "-w", "json"]), // more: true, count: 4
        step(&["get", "foo", "--prefix", "--limit", "2", "-w", "fields"]),
        step(&["get", "foo", "--prefix", "--limit", "4", "-w", "json"]), // exactly all: more false
        step(&["get", "foo", "--prefix", "--limit", "0"]),               // 0 = no limit
        step(&["get", "f", "--from-key", "--limit", "3", "--keys-only"]),
        step(&["get", "", "--from-key", "--limit", "1", "-w", "fields"]),
        step(&["get", "foo/a", "foo/c", "--limit", "1", "-w", "json"]),
    ]);
}

/// --sort-by for every target with --order ASCEND and DESCEND, plus defaults and
/// sort + limit (the server sorts the whole range before limiting).
#[test]
fn get_sort_orders() {
    let mut steps = vec![
        // create order differs from key order, mod order differs from both,
        // versions and values are all different
        step(&["put", "s/c", "v3"]),
        step(&["put", "s/a", "v9"]),
        step(&["put", "s/d", "v1"]),
        step(&["put", "s/b", "v5"]),
        step(&["put", "s/c", "v7"]),
        step(&["put", "s/c", "v2"]),
        step(&["put", "s/a", "v8"]),
        step(&["put", "s/e", "v0"]),
        step(&["put", "s/d", "v4"]),
        step(&["put", "s/d", "v6"]),
        step(&["put", "s/d", "v10"]),
    ];
    for target in ["KEY", "CREATE", "MODIFY", "VALUE", "VERSION"] {
        for order in ["ASCEND", "DESCEND"] {
            let sort = format!("--sort-by={target}");
            let ord = format!("--order={order}");
            steps.push(step(&["get", "s/", "--prefix", &sort, &ord]));
            steps.push(step(&["get", "s/", "--prefix", &sort, &ord, "--limit", "2", "-w", "json"]));
        }
    }
    steps.extend([
        step(&["get", "s/", "--prefix", "--sort-by=MODIFY"]), // order defaults to ascend
        step(&["get", "s/", "--prefix", "--order=DESCEND"]),  // target defaults to key
        step(&["get", "s/", "--prefix", "--order=DESCEND", "--keys-only", "--limit", "3"]),
        step(&["get", "", "--from-key", "--sort-by=VERSION", "--order=DESCEND", "-w", "fields"]),
        step(&["get", "s/", "--prefix", "--sort-by=BOGUS"]), // client-side error
        step(&["get", "s/", "--prefix", "--order=SIDEWAYS"]), // client-side error
    ]);
    same_output(&steps);
}

/// Historical reads with --rev, including deleted keys, ranges at a revision, and
/// a future revision (error).
#[test]
fn historical_revisions() {
    same_output(&[
        step(&["put", "h", "one"]),     // rev 2
        step(&["put", "h", "two"]),     // rev 3
        step(&["put", "h2", "x"]),      // rev 4
        step(&["put", "h", "three"]),   // rev 5
        step(&["del", "h2"]),           // rev 6
        step(&["get", "h", "--rev=1"]), // before it existed
        step(&["get", "h", "--rev=2"]),
        step(&["get", "h", "--rev=3", "-w", "json"]),
        step(&["get", "h", "--rev=4", "-w", "fields"]),
        step(&["get", "h", "--rev=5"]),
        step(&["get", "h2", "--rev=5"]), // still there at 5
        step(&["get", "h2", "--rev=6"]), // deleted at 6
        step(&["get", "h", "--prefix", "--rev=4", "-w", "json"]),
        step(&["get", "h", "--prefix", "--rev=4", "--sort-by=VALUE", "--order=DESCEND"]),
        step(&["get", "", "--from-key", "--rev=3", "--keys-only"]),
        step(&["get", "h", "--rev=6"]), // current revision
        step(&["get", "h", "--rev=7"]), // error: future revision
        step(&["get", "h", "--rev=1000", "-w", "json"]),
        step(&["put", "h", "four"]), // rev 7: now it is valid
        step(&["get", "h", "--rev=7", "-w", "json"]),
    ]);
}

/// put --prev-kv in every output format, and the server-side put errors reachable
/// from etcdctl (--ignore-value / --ignore-lease on a missing key, unknown lease).
#[test]
fn put_prev_kv_and_errors() {
    same_output(&[
        step(&["put", "p", "first", "--prev-kv"]), // no previous value: just OK
        step(&["put", "p", "second", "--prev-kv"]),
        step(&["put", "p", "third", "--prev-kv", "-w", "json"]),
        step(&["put", "p", "fourth", "--prev-kv", "-w", "fields"]),
        step(&["put", "q", "new", "--prev-kv", "-w", "json"]),
        step(&["put", "p", "--ignore-value"]), // keeps "fourth", bumps version
        step(&["get", "p", "-w", "json"]),
        step(&["put", "p", "--ignore-value", "--prev-kv", "-w", "fields"]),
        step(&["put", "p", "fifth", "--ignore-lease"]),
        step(&["get", "p", "-w", "fields"]),
        step(&["put", "missing", "--ignore-value"]), // error: key not found
        step(&["put", "missing", "v", "--ignore-lease"]), // error: key not found
        step(&["put", "l", "v", "--lease=1234"]),    // error: requested lease not found
        step(&["put", "l", "v", "--lease=zz"]),      // client-side error: bad lease id
        step(&["put", "onlykey"]).with_stdin(""),    // empty stdin: empty value
        step(&["get", "onlykey", "-w", "json"]),
        step(&["get", "", "--from-key", "-w", "json"]),
    ]);
}

/// del: single key, range, --prefix, --from-key, with and without --prev-kv, in every
/// output format.
#[test]
fn delete_variants() {
    let mut steps = Vec::new();
    for k in ["d/a", "d/b", "d/c", "d/d", "e/a", "e/b", "f", "g", "h", "i"] {
        steps.push(step(&["put", k, &format!("val-{k}")]));
    }
    steps.extend([
        step(&["del", "nope"]), // 0
        step(&["del", "nope", "-w", "json"]),
        step(&["del", "d/a"]),              // 1
        step(&["del", "d/a", "--prev-kv"]), // already gone: 0
        step(&["del", "d/b", "--prev-kv"]),
        step(&["del", "d/", "--prefix", "--prev-kv"]),
        step(&["get", "", "--from-key", "--keys-only"]),
        step(&["del", "e/a", "--prev-kv", "-w", "json"]),
        step(&["del", "e/", "--prefix", "--prev-kv", "-w", "fields"]),
        step(&["del", "f", "h"]), // range [f, h): f and g
        step(&["get", "", "--from-key", "--keys-only"]),
        step(&["put", "j", "x"]),
        step(&["del", "h", "--from-key", "--prev-kv"]),
        step(&["get", "", "--from-key", "-w", "json"]),
        step(&["put", "k", "y"]),
        step(&["del", "", "--from-key", "-w", "json"]), // everything
        step(&["del", "", "--prefix"]),                 // etcdctl: "" --prefix = all keys; none left
        step(&["get", "k", "--rev=20", "-w", "json"]),  // still readable in history
    ]);
    same_output(&steps);
}

/// `txn -i` (interactive prompts on stdout) and plain `txn`, both fed on stdin:
/// each compare kind, success and failure branches, gets/dels inside a txn, output
/// formats, and the errors (duplicate key, malformed input).
#[test]
fn txn_interactive_and_plain() {
    same_output(&[
        step(&["put", "t1", "v1"]), // rev 2
        step(&["put", "t2", "v2"]), // rev 3
        step(&["put", "t1", "v1b"]), // rev 4
        // interactive: value compare true -> success branch
        step_stdin(&["txn", "-i"], "value(\"t1\") = \"v1b\"\n\nput t3 v3\nget t1\n\ndel t2\n\n"),
        // interactive: false -> failure branch
        step_stdin(&["txn", "-i"], "value(\"t1\") = \"nope\"\n\nput t4 v4\n\nget t2\nget t3 --prefix\n\n"),
        // several compares, all must hold
        step_stdin(
            &["txn", "-i"],
            "version(\"t1\") = \"2\"\ncreate(\"t1\") = \"2\"\nmod(\"t1\") > \"3\"\nvalue(\"t3\") != \"x\"\n\nput t5 v5\n\nput t6 v6\n\n",
        ),
        step_stdin(&["txn", "-i"], "create(\"absent\") = \"0\"\n\nput absent now\n\n\n"),
        step_stdin(&["txn", "-i"], "version(\"t1\") < \"2\"\n\n\nput t7 v7\n\n"),
        step_stdin(&["txn", "-i", "-w", "json"], "mod(\"t1\") = \"4\"\n\nget t1\nput t8 v8\n\n\n"),
        step_stdin(&["txn", "-i", "-w", "fields"], "mod(\"t1\") = \"5\"\n\nget t1\n\nget t2\nput t9 v9\n\n"),
        // plain txn (no prompts)
        step_stdin(&["txn"], "value(\"t1\") = \"v1b\"\n\nget t --prefix\ndel t5 --prev-kv\nput t10 v10 --prev-kv\n\nput never x\n\n"),
        step_stdin(&["txn"], "value(\"t1\") > \"zzz\"\n\nput never x\n\nget t --prefix --keys-only\nget t1 --rev=2\n\n"),
        step_stdin(&["txn", "-w", "json"], "value(\"t1\") = \"v1b\"\nvalue(\"missing\") = \"1\"\n\nput y 1\n\nget t1\n\n"),
        step_stdin(&["txn", "-w", "fields"], "create(\"kx\") = \"0\"\n\nput t11 a\nput t12 b\n\n\n"),
        step_stdin(&["txn"], "\n\n\n"), // empty txn: succeeds, no ops
        step_stdin(&["txn", "-w", "json"], "\n\n\n"),
        step_stdin(&["txn"], "\nput dup 1\nput dup 2\n\n\n"), // error: duplicate key
        step_stdin(&["txn"], "\nput r1 1\ndel r1\n\n\n"),    // error: put + del of the same key
        step_stdin(&["txn"], "bogus\n\n\n"),                 // client-side: malformed comparison
        step(&["get", "", "--from-key", "-w", "json"]),
    ]);
}

/// compaction: historical reads below the compacted revision fail with the same
/// error, at or above it they work; compacting again / into the future fails.
#[test]
fn compaction() {
    same_output(&[
        step(&["compaction", "0"]), // fresh server: accepted ("compacted revision 0")
        step(&["put", "c", "1"]),   // rev 2
        step(&["put", "c", "2"]),   // rev 3
        step(&["put", "c", "3"]),   // rev 4
        step(&["put", "o", "x"]),   // rev 5
        step(&["put", "c", "4"]),   // rev 6
        step(&["compaction", "4"]),
        step(&["get", "c", "--rev=3"]), // error: compacted
        step(&["get", "c", "--rev=3", "-w", "json"]),
        step(&["get", "c", "--rev=4"]), // the compacted revision itself is readable
        step(&["get", "c", "--rev=5", "-w", "json"]),
        step(&["get", "", "--from-key", "--rev=4", "--keys-only"]),
        step(&["compaction", "4"]), // error: already compacted
        step(&["compaction", "2"]), // error: already compacted
        step(&["compaction", "7"]), // error: future revision
        step(&["compaction", "--physical", "5"]),
        step(&["get", "c", "--rev=4"]), // now compacted too
        step(&["get", "c", "--rev=5"]),
        step(&["get", "c"]),
        step(&["get", "c", "-w", "json"]),
        step_stdin(&["txn"], "\nget c --rev=3\n\n\n"), // compacted read inside a txn (success branch)
        step(&["put", "c", "5"]),
        step(&["compaction", "7", "-w", "json"]),
        step(&["get", "c", "--rev=6"]),
        step(&["get", "c", "--rev=7", "-w", "fields"]),
    ]);
}

/// endpoint status and endpoint health in every output format; the header revision
/// follows the writes.
#[test]
fn endpoint_status_and_health() {
    same_output(&[
        step(&["endpoint", "health"]),
        step(&["endpoint", "health", "-w", "json"]),
        step(&["endpoint", "health", "-w", "table"]),
        step(&["endpoint", "health", "-w", "fields"]),
        step(&["endpoint", "status"]),
        step(&["endpoint", "status", "-w", "table"]),
        step(&["endpoint", "status", "-w", "json"]),
        step(&["endpoint", "status", "-w", "fields"]),
        step(&["put", "x", "1"]),
        step(&["put", "y", "2"]),
        step(&["endpoint", "status", "-w", "json"]), // header revision 3
        step(&["endpoint", "status", "-w", "fields"]),
        step(&["del", "x"]),
        step(&["endpoint", "status", "-w", "table"]),
        step(&["endpoint", "health"]),
    ]);
}
