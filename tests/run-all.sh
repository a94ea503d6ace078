#!/usr/bin/env bash
# Installs what keyward's tests need on a Debian machine, then runs every test.
#   etcd-client  -> etcdctl 3.4, the real client the end-to-end tests drive
#   etcd-server  -> the real etcd 3.4, which the differential tests compare keyward against
#   protobuf-compiler -> protoc, needed by the etcd-client crate's build script (keyward itself needs none)
#   openssl      -> the JWT tests generate RSA key pairs with the openssl CLI (rcgen with ring cannot)
#   curl         -> the TLS tests read /metrics over https with a client certificate
#   systemd      -> systemd-analyze verify for deploy/systemd (tests/deploy.rs; no running systemd needed)
#   docker-compose -> `docker-compose config` validates deploy/docker-compose.yml (no Docker engine needed)
#   python3-venv -> a venv in target/tools-venv with pip's kubernetes-validate (the Kubernetes JSON
#                   schemas, bundled) for deploy/kubernetes
#   fuse3        -> only when not root: fusermount3, through which the power-loss test (tests/durability.rs)
#                   mounts its FUSE file system; root mounts it itself (no libfuse either way)
# `--no-fail-fast`: every test target runs even when an earlier one fails, so one failure never hides
# another; cargo still exits non-zero if any failed.
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
[ "$(id -u)" -eq 0 ] || command -v fusermount3 >/dev/null || need+=(fuse3)
if [ ${#need[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
fi

if [ ! -x target/tools-venv/bin/kubernetes-validate ]; then
    python3 -m venv target/tools-venv
    target/tools-venv/bin/pip install -q kubernetes-validate
fi

# A fresh build needs ~3 GB under target/ (no incremental cache: a CI build is built once) and the
# servers the tests start need a few hundred MB under $TMPDIR. The free space is printed first, so a
# run that fails for want of disk says so instead of failing as "database space exceeded".
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
df -h target "${TMPDIR:-/tmp}" || true
cargo test --all-targets --no-fail-fast -- --test-threads="${KEYWARD_TEST_THREADS:-4}"
