#!/usr/bin/env bash
# benches/lib/go-build.sh TOOL [OUT]: builds the Go etcd client tool benches/TOOL (clientv3-load,
# failover-load, watch-many) into target/TOOL (or OUT).
# No Go modules can be downloaded for these: they build in GOPATH mode against Debian's packaged
# etcd 3.4 sources (clientv3 and its dependencies) under /usr/share/gocode.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
tool="${1:?usage: go-build.sh TOOL [OUT]}"
out="${2:-$root/target/$tool}"
gopath=/usr/share/gocode
install="apt-get install -y golang-go golang-etcd-server-dev"

[ -f "$root/benches/$tool/main.go" ] || { echo "go-build: no Go tool at benches/$tool" >&2; exit 1; }
command -v go > /dev/null || { echo "$tool: go is not installed ($install)" >&2; exit 1; }
[ -d "$gopath/src/go.etcd.io/etcd/clientv3" ] \
    || { echo "$tool: no etcd 3.4 clientv3 source at $gopath/src/go.etcd.io/etcd/clientv3 ($install)" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
# GOFLAGS is cleared so that a user's -mod=... cannot break a GOPATH build.
cd "$root/benches/$tool"
GOPATH="$gopath" GO111MODULE=off GOFLAGS= go build -o "$out" . \
    || { echo "$tool: go build failed" >&2; exit 1; }
