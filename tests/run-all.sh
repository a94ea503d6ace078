#!/usr/bin/env bash
# Installs what keyward's tests need on a Debian machine, then runs every test.
#   etcd-client  -> etcdctl 3.4, the real client the end-to-end tests drive
#   etcd-server  -> the real etcd 3.4, which the differential tests compare keyward against
#   protobuf-compiler -> protoc, needed by the etcd-client crate's build script (keyward itself needs none)
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v etcdctl >/dev/null || need+=(etcd-client)
command -v etcd >/dev/null || need+=(etcd-server)
command -v protoc >/dev/null || need+=(protobuf-compiler)
if [ ${#need[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
fi

cargo test --all-targets -- --test-threads="${KEYWARD_TEST_THREADS:-4}"
