#!/usr/bin/env bash
# Builds the Go clientv3 watch load generator (benches/watch-many) into target/watch-many (or $1).
# No Go modules can be downloaded here: it builds in GOPATH mode against Debian's packaged etcd 3.4
# sources (clientv3 and its dependencies) under /usr/share/gocode.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-$root/target/watch-many}"
gopath=/usr/share/gocode
install="apt-get install -y golang-go golang-etcd-server-dev"

command -v go > /dev/null || { echo "watch-many: go is not installed ($install)" >&2; exit 1; }
[ -d "$gopath/src/go.etcd.io/etcd/clientv3" ] \
    || { echo "watch-many: no etcd 3.4 clientv3 source at $gopath/src/go.etcd.io/etcd/clientv3 ($install)" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
# GOFLAGS is cleared so that a user's -mod=... cannot break a GOPATH build.
cd "$root/benches/watch-many"
GOPATH="$gopath" GO111MODULE=off GOFLAGS= go build -o "$out" . \
    || { echo "watch-many: go build failed" >&2; exit 1; }
