#!/usr/bin/env bash
# Installs what keyward's tests need on a Debian machine, then runs every test.
#   etcd-client  -> etcdctl 3.4, the real client the end-to-end tests drive
#   etcd-server  -> the real etcd 3.4, which the differential tests compare keyward against
#   protobuf-compiler -> protoc, needed by the etcd-client crate's build script (keyward itself needs none)
#   openssl      -> the JWT tests generate RSA key pairs with the openssl CLI (rcgen with ring cannot)
#   curl         -> the TLS tests read /metrics over https with a client certificate
#   systemd      -> systemd-analyze verify for deploy/systemd (tests/it/deploy.rs; no running systemd needed)
#   docker-compose -> `docker-compose config` validates deploy/docker-compose.yml (no Docker engine needed)
#   python3-venv -> a venv in target/tools-venv with pip's kubernetes-validate (the Kubernetes JSON
#                   schemas, bundled) for deploy/kubernetes
#   golang-go    -> Go, for Kubernetes' storage tests (tests/kubernetes; go.mod's toolchain line makes
#                   go fetch a newer toolchain itself, and `go mod download` the modules)
#   fuse3        -> only when not root: fusermount3, through which the power-loss test (tests/it/durability.rs)
#                   mounts its FUSE file system; root mounts it itself (no libfuse either way)
# `--no-fail-fast`: every test target runs even when an earlier one fails, so one failure never hides
# another; cargo still exits non-zero if any failed. Before the tests: the h2 patch still applies,
# `cargo fmt --check`, `cargo clippy --all-targets -- -D warnings` (a failure there is reported after
# the tests, which still run).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v etcdctl >/dev/null || need+=(etcd-client)
command -v etcd >/dev/null || need+=(etcd-server)
command -v protoc >/dev/null || need+=(protobuf-compiler)
command -v openssl >/dev/null || need+=(openssl)
command -v curl >/dev/null || need+=(curl)
command -v systemd-analyze >/dev/null || need+=(systemd)
command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1 || need+=(docker-compose)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
command -v go >/dev/null || need+=(golang-go)
[ "$(id -u)" -eq 0 ] || command -v fusermount3 >/dev/null || need+=(fuse3)
if [ ${#need[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
fi

# rustup's minimal profile has neither: the checks below need both.
cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt
cargo clippy --version >/dev/null 2>&1 || rustup component add clippy

if [ ! -x target/tools-venv/bin/kubernetes-validate ]; then
    python3 -m venv target/tools-venv
    target/tools-venv/bin/pip install -q kubernetes-validate
fi

# A fresh build needs ~3 GB under target/ (no incremental cache: a CI build is built once) and the
# servers the tests start need a few hundred MB under $TMPDIR. The free space is printed first, so a
# run that fails for want of disk says so instead of failing as "database space exceeded".
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
df -h target "${TMPDIR:-/tmp}" || true

# Checks that run beside the tests; each failure is reported, none hides the tests' results.
failed=()
# The vendored h2 (vendor/h2/PATCH.md: etcdctl 3.4's malformed :authority) must be the h2 every crate
# links: if tonic or hyper moved to an h2 the patch does not match, cargo would silently use the
# registry's and etcdctl 3.4 would break.
h2_builds=$(cargo tree -e normal,build,dev --prefix none --format '{p}' | grep -E '^h2 v' | sort -u)
if [ -z "$h2_builds" ] || grep -qv '/vendor/h2)' <<<"$h2_builds"; then
    echo "h2 does not resolve to vendor/h2 (the patch in Cargo.toml no longer applies):" >&2
    echo "$h2_builds" >&2
    failed+=("h2 patch")
fi
# The same for openraft (vendor/openraft/PATCH.md: a leader writes its own log while it replicates it):
# a registry openraft would silently drop the patch.
raft_builds=$(cargo tree -e normal,build,dev --prefix none --format '{p}' | grep -E '^openraft v' | sort -u)
if [ -z "$raft_builds" ] || grep -qv '/vendor/openraft)' <<<"$raft_builds"; then
    echo "openraft does not resolve to vendor/openraft (the patch in Cargo.toml no longer applies):" >&2
    echo "$raft_builds" >&2
    failed+=("openraft patch")
fi
cargo fmt --all -- --check || failed+=("cargo fmt --check")
cargo clippy --all-targets -- -D warnings || failed+=("cargo clippy")

cargo test --all-targets --no-fail-fast -- --test-threads="${KEYWARD_TEST_THREADS:-4}" || failed+=("cargo test")
# Kubernetes' own storage tests, the small set, against the keyward cargo just built (target/debug),
# 1 and 3 members; each must pass every test of the set, as etcd 3.4.23 does (`run.sh --small`).
# `bash tests/kubernetes/run.sh` runs all of them beside etcd (tests/kubernetes/README.md).
CONFIGS="keyward:1 keyward:3" bash tests/kubernetes/run.sh --small || failed+=("kubernetes storage tests")
if [ ${#failed[@]} -gt 0 ]; then
    echo "FAILED: ${failed[*]}" >&2
    exit 1
fi
