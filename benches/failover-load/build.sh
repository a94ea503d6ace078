#!/usr/bin/env bash
# Builds the Go failover load client (benches/failover-load) into target/failover-load (or $1).
# No Go modules can be downloaded here: it builds in GOPATH mode against Debian's packaged etcd 3.4
# sources (clientv3 and its dependencies) under /usr/share/gocode.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-$root/target/failover-load}"
gopath=/usr/share/gocode
install="apt-get install -y golang-go golang-etcd-server-dev"

command -v go > /dev/null || { echo "failover-load: go is not installed ($install)" >&2; exit 1; }
[ -d "$gopath/src/go.etcd.io/etcd/clientv3" ] \
    || { echo "failover-load: no etcd 3.4 clientv3 source at $gopath/src/go.etcd.io/etcd/clientv3 ($install)" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
# GOFLAGS is cleared so that a user's -mod=... cannot break a GOPATH build.
cd "$root/benches/failover-load"
GOPATH="$gopath" GO111MODULE=off GOFLAGS= go build -o "$out" . \
    || { echo "failover-load: go build failed" >&2; exit 1; }
