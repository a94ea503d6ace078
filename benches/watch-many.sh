#!/usr/bin/env bash
# Many watchers as kube-apiserver holds them (issue 31): WATCHERS (default 10,000) single-key
# watchers created one at a time with etcd 3.4's clientv3 (benches/watch-many), on one gRPC stream
# and on a stream each; then RATE puts/s for DURATION (paced) and one put per key at once (burst),
# each event's latency from its put's send time. keyward and etcd are started in this run with the
# same flags on free loopback ports and measured alternately (keyward, etcd; one stream, then a stream
# each). Prints one JSON line per run (see benches/watch-many/main.go).
#
# Usage: benches/watch-many.sh (after `cargo build --release --bin keyward`)
# Environment: WATCHERS, RATE (default 200), DURATION (default 10s), MODES (default "one each"),
#   ETCD (etcd binary), KEEP_TMP=1.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
WATCHERS="${WATCHERS:-10000}"
RATE="${RATE:-200}"
DURATION="${DURATION:-10s}"
MODES="${MODES:-one each}"
ETCD="${ETCD:-/usr/bin/etcd}"
KW="$root/target/release/keyward"

die() { echo "watch-many.sh: $*" >&2; exit 1; }
[ -x "$ETCD" ] || die "no etcd at $ETCD"
[ -x "$KW" ] || die "build first: cargo build --release --bin keyward"

# shellcheck source=benches/lib/servers.sh
. "$root/benches/lib/servers.sh"
bench_tmp watch-many
bash "$root/benches/lib/go-build.sh" watch-many "$tmp/watch-many" || die "could not build the load generator"

declare -A EP
for kind in keyward etcd; do
    port="$(free_port)"
    peer="$(free_port)"
    launch "$kind" bench "$tmp/$kind" http "$port" "$peer" "bench=http://127.0.0.1:$peer"
    EP[$kind]="127.0.0.1:$port"
done
for kind in keyward etcd; do
    for _ in $(seq 100); do
        ETCDCTL_API=3 etcdctl --endpoints "${EP[$kind]}" endpoint health >/dev/null 2>&1 && break
        sleep 0.1
    done
done
for mode in $MODES; do
    for kind in keyward etcd; do
        "$tmp/watch-many" --endpoints "${EP[$kind]}" --watchers "$WATCHERS" --streams "$mode" \
            --rate "$RATE" --duration "$DURATION" --label "$kind" || echo "{\"label\":\"$kind\",\"failed\":true}"
    done
done
