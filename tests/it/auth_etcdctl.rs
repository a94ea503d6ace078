//! Differential tests of etcd's RBAC guide (users, roles, permissions, enabling auth, authenticated
//! requests and their errors) through the real `etcdctl` 3.4: every step runs against a real etcd
//! 3.4.23 and against keyward, and the normalized outputs (stdout, stderr, exit status) must match.
//!
//! Each scenario is one function taking the servers' extra flags, run twice: with the default simple
//! tokens and with RS256 JWTs (`--auth-token jwt,...`, a key pair generated with openssl into a temp
//! dir; etcd 3.4 takes the same flag). Both sides run with `--bcrypt-cost 4` to keep them fast.
//!
//! A scenario does not stop at the first differing step: every step runs, and the test fails at the
//! end listing each step whose output differed (so one discrepancy does not hide the next).

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::common::auth::{token_args, TokenKind};
use crate::common::{step, step_stdin, Scenario, Step};

/// `etcdctl --user=root:rootpw ARGS...`
fn root(args: &[&str]) -> Step {
    as_user("root:rootpw", args)
}

/// `etcdctl --user=USER ARGS...` (`USER` is `name` or `name:password`).
fn as_user(user: &str, args: &[&str]) -> Step {
    let mut all = vec![format!("--user={user}")];
    all.extend(args.iter().map(|s| s.to_string()));
    Step { args: all, stdin: None }
}

/// Runs every step on both servers; fails at the end if any step's output differed.
fn run_all(token: TokenKind, name: &str, steps: &[Step]) {
    let (args, _keys) = token_args(token);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut sc = Scenario::start_with(&args);
    let mut failures = Vec::new();
    for (i, st) in steps.iter().enumerate() {
        let result = catch_unwind(AssertUnwindSafe(|| {
            sc.step(st);
        }));
        if let Err(panic) = result {
            let text = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "<non-string panic>".into());
            failures.push(format!("#{i} {}\n{text}", st.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "{name} ({token:?} tokens): {} of {} steps differ between etcd and keyward:\n\n{}",
        failures.len(),
        steps.len(),
        failures.join("\n----------------------------------------\n")
    );
}

// ---------------------------------------------------------------------------
// scenario 1: users, roles and permissions (auth not enabled yet)
// ---------------------------------------------------------------------------

fn users_and_roles_steps() -> Vec<Step> {
    vec![
        step(&["user", "list"]),
        step(&["role", "list"]),
        // three ways to give a new user its password
        step(&["user", "add", "root:rootpw"]),
        step(&["user", "add", "alice", "--new-user-password=alicepw"]),
        step_stdin(&["user", "add", "bob", "--interactive=false"], "bobpw\n"),
        step(&["user", "add", "alice:other"]),
        step(&["user", "add", "carol", "--new-user-password=carolpw", "--no-password"]),
        step(&["user", "list"]),
        step(&["user", "list", "-w", "json"]),
        step(&["user", "get", "alice"]),
        step(&["user", "get", "alice", "--detail"]),
        step(&["user", "get", "nobody"]),
        step(&["user", "get", "nobody", "--detail"]),
        // roles
        step(&["role", "add", "myrolename"]),
        step(&["role", "add", "writer"]),
        step(&["role", "add", "myrolename"]),
        step(&["role", "list"]),
        step(&["role", "get", "myrolename"]),
        step(&["role", "get", "nosuchrole"]),
        // the guide's grants: read, write, readwrite; single key, prefix, [key1, key5), from-key
        step(&["role", "grant-permission", "myrolename", "read", "/foo"]),
        step(&["role", "grant-permission", "myrolename", "--prefix=true", "read", "/foo/"]),
        step(&["role", "grant-permission", "myrolename", "write", "/foo/bar"]),
        step(&["role", "grant-permission", "myrolename", "readwrite", "key1", "key5"]),
        step(&["role", "grant-permission", "myrolename", "--prefix=true", "readwrite", "/pub/"]),
        step(&["role", "grant-permission", "myrolename", "--from-key", "read", "zzz"]),
        step(&["role", "grant-permission", "writer", "write", "w1"]),
        step(&["role", "grant-permission", "writer", "readwrite", "w1"]),
        step(&["role", "grant-permission", "nosuchrole", "read", "x"]),
        step(&["role", "grant-permission", "myrolename", "bogus", "x"]),
        step(&["role", "get", "myrolename"]),
        step(&["role", "get", "writer"]),
        step(&["role", "get", "myrolename", "-w", "json"]),
        // users and roles
        step(&["user", "grant-role", "alice", "myrolename"]),
        step(&["user", "grant-role", "alice", "writer"]),
        step(&["user", "grant-role", "alice", "nosuchrole"]),
        step(&["user", "grant-role", "nobody", "writer"]),
        step(&["user", "get", "alice"]),
        step(&["user", "get", "alice", "--detail"]),
        step(&["user", "get", "alice", "-w", "json"]),
        step(&["user", "revoke-role", "alice", "writer"]),
        step(&["user", "revoke-role", "alice", "writer"]),
        step(&["user", "revoke-role", "nobody", "writer"]),
        step(&["user", "get", "alice"]),
        // revoking permissions: single key, range, prefix, from-key; and ones never granted
        step(&["role", "revoke-permission", "myrolename", "/foo/bar"]),
        step(&["role", "revoke-permission", "myrolename", "/foo/bar"]),
        step(&["role", "revoke-permission", "myrolename", "key1", "key5"]),
        step(&["role", "revoke-permission", "myrolename", "key1"]),
        step(&["role", "revoke-permission", "myrolename", "--prefix=true", "/pub/"]),
        step(&["role", "revoke-permission", "myrolename", "--from-key", "zzz"]),
        step(&["role", "revoke-permission", "myrolename", "--prefix=true", "/foo"]),
        step(&["role", "revoke-permission", "myrolename", "/foo/"]),
        step(&["role", "revoke-permission", "nosuchrole", "/foo"]),
        step(&["role", "get", "myrolename"]),
        // passwords and deletions
        step_stdin(&["user", "passwd", "alice", "--interactive=false"], "alicepw2\n"),
        step_stdin(&["user", "passwd", "nobody", "--interactive=false"], "x\n"),
        step(&["user", "delete", "bob"]),
        step(&["user", "delete", "bob"]),
        step(&["role", "delete", "writer"]),
        step(&["role", "delete", "writer"]),
        step(&["user", "list"]),
        step(&["role", "list"]),
        step(&["user", "get", "alice", "--detail"]),
        // granting twice is accepted; the root role can be granted before it exists as a role
        step(&["user", "grant-role", "alice", "myrolename"]),
        step(&["user", "add", "dave:davepw"]),
        step(&["user", "grant-role", "dave", "root"]),
        step(&["user", "get", "dave"]),
        step(&["role", "list"]),
        step(&["user", "revoke-role", "dave", "root"]),
        step(&["user", "delete", "dave", "-w", "json"]),
        // json output of changes (headers carry the kv revision)
        step(&["role", "add", "jsonrole", "-w", "json"]),
        step(&["role", "grant-permission", "jsonrole", "read", "j", "-w", "json"]),
        step(&["user", "grant-role", "alice", "jsonrole", "-w", "json"]),
        step(&["user", "revoke-role", "alice", "jsonrole", "-w", "json"]),
        step(&["role", "revoke-permission", "jsonrole", "j", "-w", "json"]),
        step(&["role", "delete", "jsonrole", "-w", "json"]),
        // root exists here: etcdctl's `auth enable` creates the root role and grants it to root
        step(&["auth", "enable"]),
        step(&["role", "list"]),
        step(&["--user=root:rootpw", "role", "list"]),
        step(&["--user=root:rootpw", "user", "get", "root", "--detail"]),
        step(&["--user=alice:alicepw2", "get", "/foo"]),
        step(&["--user=alice:alicepw", "get", "/foo"]),
        step(&["--user=root:rootpw", "auth", "disable"]),
        step(&["user", "get", "root"]),
    ]
}

#[test]
fn users_and_roles_simple() {
    run_all(TokenKind::Simple, "users_and_roles", &users_and_roles_steps());
}

#[test]
fn users_and_roles_jwt() {
    run_all(TokenKind::Jwt, "users_and_roles", &users_and_roles_steps());
}

// ---------------------------------------------------------------------------
// scenario 2: enabling auth, authenticating, and what auth refuses
// ---------------------------------------------------------------------------

const TXN_PUT_FOO: &str = "\nput foo fromtxn\n\n";
const TXN_COMPARE_SECRET: &str = "value(\"secret\") = \"s\"\n\nput /pub/t 1\n\nget /pub/t\n\n";
const TXN_FAILURE_BRANCH: &str = "value(\"/pub/x\") = \"1\"\n\nput /pub/y 1\n\nput secret hacked\n\n";

fn enable_and_enforce_steps() -> Vec<Step> {
    vec![
        // enabling needs a root user; etcdctl then creates the root role itself
        step(&["auth", "enable"]),
        step(&["user", "add", "root:rootpw"]),
        step(&["role", "list"]),
        step(&["auth", "enable"]),
        step(&["auth", "enable"]),
        // without credentials / with bad ones
        step(&["put", "foo", "bar"]),
        step(&["get", "foo"]),
        step(&["role", "list"]),
        step(&["user", "list"]),
        step(&["--user=root:wrongpw", "put", "foo", "bar"]),
        step(&["--user=nobody:x", "get", "foo"]),
        // the three ways etcdctl takes a password
        root(&["put", "foo", "bar"]),
        step(&["--user", "root", "--password", "rootpw", "get", "foo"]),
        step_stdin(&["--user", "root", "get", "foo"], "rootpw\n"),
        step(&["--user", "root:rootpw", "--password", "rootpw", "get", "foo"]),
        root(&["role", "list"]),
        root(&["user", "get", "root"]),
        root(&["user", "get", "root", "--detail"]),
        // an ordinary user with the guide's permissions
        root(&["put", "secret", "s"]),
        root(&["put", "/pub/x", "1"]),
        root(&["user", "add", "alice:alicepw"]),
        root(&["role", "add", "myrolename"]),
        root(&["role", "grant-permission", "myrolename", "read", "foo"]),
        root(&["role", "grant-permission", "myrolename", "--prefix=true", "readwrite", "/pub/"]),
        root(&["role", "grant-permission", "myrolename", "write", "wonly"]),
        root(&["role", "grant-permission", "myrolename", "readwrite", "key1", "key5"]),
        root(&["user", "grant-role", "alice", "myrolename"]),
        root(&["user", "get", "alice", "--detail"]),
        as_user("alice:alicepw", &["get", "foo"]),
        as_user("alice:alicepw", &["put", "foo", "x"]),
        as_user("alice:alicepw", &["del", "foo"]),
        as_user("alice:alicepw", &["get", "secret"]),
        as_user("alice:alicepw", &["get", "foo", "--consistency=s"]),
        as_user("alice:alicepw", &["put", "wonly", "w"]),
        as_user("alice:alicepw", &["get", "wonly"]),
        as_user("alice:alicepw", &["put", "wonly", "w2", "--prev-kv"]),
        as_user("alice:alicepw", &["del", "wonly", "--prev-kv"]),
        as_user("alice:alicepw", &["del", "wonly"]),
        as_user("alice:alicepw", &["put", "/pub/a", "1"]),
        as_user("alice:alicepw", &["get", "/pub/", "--prefix"]),
        as_user("alice:alicepw", &["get", "/pub/", "--from-key"]),
        as_user("alice:alicepw", &["get", "/pu", "--prefix"]),
        as_user("alice:alicepw", &["put", "key3", "3"]),
        as_user("alice:alicepw", &["get", "key1", "key5"]),
        as_user("alice:alicepw", &["get", "key1", "key6"]),
        as_user("alice:alicepw", &["del", "key1", "key5"]),
        as_user("alice:alicepw", &["del", "key", "--prefix"]),
        step_stdin(&["--user=alice:alicepw", "txn"], TXN_PUT_FOO),
        step_stdin(&["--user=alice:alicepw", "txn"], TXN_COMPARE_SECRET),
        step_stdin(&["--user=alice:alicepw", "txn"], TXN_FAILURE_BRANCH),
        as_user("alice:alicepw", &["get", "/pub/y"]),
        // a watch alice may not read is refused at creation
        as_user("alice:alicepw", &["watch", "secret"]),
        root(&["get", "secret"]),
        // auth management is root's
        as_user("alice:alicepw", &["user", "add", "mallory:x"]),
        as_user("alice:alicepw", &["role", "add", "r2"]),
        as_user("alice:alicepw", &["role", "grant-permission", "myrolename", "readwrite", "secret"]),
        as_user("alice:alicepw", &["user", "grant-role", "alice", "root"]),
        as_user("alice:alicepw", &["user", "list"]),
        as_user("alice:alicepw", &["role", "list"]),
        as_user("alice:alicepw", &["auth", "disable"]),
        // ...except reading one's own record and roles
        as_user("alice:alicepw", &["user", "get", "alice"]),
        as_user("alice:alicepw", &["user", "get", "root"]),
        as_user("alice:alicepw", &["role", "get", "myrolename"]),
        as_user("alice:alicepw", &["role", "get", "root"]),
        // a password change takes effect at once
        step_stdin(&["--user=root:rootpw", "user", "passwd", "alice", "--interactive=false"], "alicepw2\n"),
        as_user("alice:alicepw", &["get", "foo"]),
        as_user("alice:alicepw2", &["get", "foo"]),
        // a user without a password cannot authenticate with one
        root(&["user", "add", "carol", "--no-password"]),
        root(&["user", "grant-role", "carol", "myrolename"]),
        as_user("carol:x", &["get", "foo"]),
        as_user("carol:", &["get", "foo"]),
        root(&["user", "get", "carol", "--detail"]),
        // what even root may not do while auth is on
        root(&["user", "delete", "root"]),
        root(&["user", "revoke-role", "root", "root"]),
        root(&["role", "delete", "root"]),
        root(&["user", "revoke-role", "alice", "root"]),
        root(&["role", "revoke-permission", "myrolename", "secret"]),
        root(&["user", "get", "nobody"]),
        root(&["role", "get", "nosuchrole"]),
        root(&["user", "add", "alice:again"]),
        root(&["role", "add", "myrolename"]),
        // revoking a role takes effect at once
        root(&["user", "revoke-role", "alice", "myrolename"]),
        as_user("alice:alicepw2", &["get", "foo"]),
        root(&["user", "grant-role", "alice", "myrolename"]),
        root(&["role", "revoke-permission", "myrolename", "foo"]),
        as_user("alice:alicepw2", &["get", "foo"]),
        root(&["role", "delete", "myrolename"]),
        as_user("alice:alicepw2", &["get", "/pub/x"]),
        root(&["user", "get", "alice"]),
        root(&["user", "delete", "alice"]),
        as_user("alice:alicepw2", &["get", "foo"]),
        // compaction is root's
        root(&["compaction", "1"]),
        // disabling
        as_user("alice:alicepw2", &["auth", "disable"]),
        root(&["auth", "disable"]),
        root(&["auth", "disable"]),
        step(&["put", "foo", "open"]),
        step(&["get", "foo"]),
        step(&["--user=root:rootpw", "get", "foo"]),
        step(&["user", "delete", "root"]),
        step(&["auth", "enable"]),
        step(&["user", "list"]),
    ]
}

// ---------------------------------------------------------------------------
// scenario 3: enabling auth, edge cases
// ---------------------------------------------------------------------------

fn enable_edge_cases_steps() -> Vec<Step> {
    vec![
        // a root role that exists but is not granted to root: etcdctl's role add fails
        step(&["role", "add", "root"]),
        step(&["user", "add", "root:rootpw"]),
        step(&["auth", "enable"]),
        step(&["user", "grant-role", "root", "root"]),
        step(&["auth", "enable"]),
        // a second administrator, through the root role
        root(&["user", "add", "alice:alicepw"]),
        root(&["user", "grant-role", "alice", "root"]),
        as_user("alice:alicepw", &["user", "list"]),
        as_user("alice:alicepw", &["put", "anything", "x"]),
        as_user("alice:alicepw", &["get", "anything"]),
        as_user("alice:alicepw", &["user", "delete", "root"]),
        as_user("alice:alicepw", &["user", "revoke-role", "root", "root"]),
        as_user("alice:alicepw", &["role", "delete", "root"]),
        // revoking alice's root role works; then she is an ordinary user without permissions
        root(&["user", "revoke-role", "alice", "root"]),
        as_user("alice:alicepw", &["get", "anything"]),
        as_user("alice:alicepw", &["user", "list"]),
        // a user may not change its own password, only root may
        step_stdin(&["--user=alice:alicepw", "user", "passwd", "alice", "--interactive=false"], "x\n"),
        as_user("alice:alicepw", &["user", "get", "alice"]),
        // an empty password is a password
        root(&["user", "add", "empty:"]),
        as_user("empty:", &["get", "anything"]),
        as_user("empty:x", &["get", "anything"]),
        root(&["user", "get", "root", "-w", "json"]),
        root(&["role", "get", "root"]),
        root(&["auth", "disable", "-w", "json"]),
        step(&["auth", "enable", "-w", "json"]),
        root(&["user", "list", "-w", "table"]),
    ]
}

#[test]
fn enable_edge_cases_simple() {
    run_all(TokenKind::Simple, "enable_edge_cases", &enable_edge_cases_steps());
}

#[test]
fn enable_edge_cases_jwt() {
    run_all(TokenKind::Jwt, "enable_edge_cases", &enable_edge_cases_steps());
}

// ---------------------------------------------------------------------------
// scenario 4: names that are empty
// ---------------------------------------------------------------------------

fn empty_names_steps() -> Vec<Step> {
    vec![
        step(&["user", "add", "alice:alicepw"]),
        step(&["role", "add", "r"]),
        step(&["role", "add", ""]),
        step(&["user", "add", ":pw"]),
        step(&["user", "get", ""]),
        step(&["role", "get", ""]),
        step(&["user", "grant-role", "alice", ""]),
        step(&["put", "after", "1"]),
        step(&["user", "grant-role", "", "r"]),
        step(&["user", "revoke-role", "alice", ""]),
        step(&["user", "delete", ""]),
        step(&["role", "delete", ""]),
        step(&["role", "grant-permission", "", "read", "k"]),
        step(&["role", "revoke-permission", "", "k"]),
        step_stdin(&["user", "passwd", "", "--interactive=false"], "x\n"),
        step(&["get", "after"]),
        step(&["user", "list"]),
    ]
}

#[test]
fn empty_names_simple() {
    run_all(TokenKind::Simple, "empty_names", &empty_names_steps());
}

#[test]
fn empty_names_jwt() {
    run_all(TokenKind::Jwt, "empty_names", &empty_names_steps());
}

#[test]
fn enable_and_enforce_simple() {
    run_all(TokenKind::Simple, "enable_and_enforce", &enable_and_enforce_steps());
}

#[test]
fn enable_and_enforce_jwt() {
    run_all(TokenKind::Jwt, "enable_and_enforce", &enable_and_enforce_steps());
}
