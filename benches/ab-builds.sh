#!/usr/bin/env bash
# Two keyward builds side by side: a cluster of each runs at once (same flags, loopback, free ports),
# and the same load runs against one, then the other, PAIRS times (ABAB). Both clusters see the same
# machine at nearly the same moment, so a small difference between builds shows through the noise
# that separate runs of benches/compare.sh (minutes apart) put on it.
#
# Usage: benches/ab-builds.sh BIN_DIR_A BIN_DIR_B
#   (each a directory holding a `keyward` binary, e.g. a copy of target/release from each commit)
# Environment: MEMBERS (per cluster, default 3), PAIRS (default 5), TARGET (leader: every run goes to
#   the cluster's leader, as compare.sh's put at 1 client; spread: to all members; default leader),
#   LOAD (clientv3-load's arguments, default "--clients 1 --total 3000 put"), KEEP_TMP=1.
# Needs clientv3-load (benches/lib/go-build.sh: golang-go, golang-etcd-server-dev), etcdctl, jq.
# Prints one line per run (build, req/s, mean and p99 latency) and each build's mean over its runs.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
die() { echo "ab-builds.sh: $*" >&2; exit 1; }
[ $# -eq 2 ] || die "usage: benches/ab-builds.sh BIN_DIR_A BIN_DIR_B"
MEMBERS="${MEMBERS:-3}"
PAIRS="${PAIRS:-5}"
TARGET="${TARGET:-leader}"
read -r -a LOAD <<< "${LOAD:---clients 1 --total 3000 put}"
GOLOAD="$root/target/clientv3-load"
for tool in jq etcdctl; do command -v "$tool" > /dev/null || die "$tool is needed"; done
for dir in "$1" "$2"; do [ -x "$dir/keyward" ] || die "no keyward binary in $dir"; done
bash "$root/benches/lib/go-build.sh" clientv3-load "$GOLOAD" || die "building clientv3-load failed"

# shellcheck source=benches/lib/servers.sh
. "$root/benches/lib/servers.sh"
bench_tmp ab-builds

declare -A BIN EP
BIN[A]="$1" BIN[B]="$2"
for build in A B; do
    KW="${BIN[$build]}/keyward"
    plan_cluster "$MEMBERS"
    for ((i = 1; i <= MEMBERS; i++)); do
        launch_member keyward "$i" "$tmp/$build-m$i" "ab-$build"
    done
    EP[$build]="$CLUSTER_ENDPOINTS"
done

# target BUILD: the endpoints a run of BUILD's cluster goes to
target() {
    local status
    [ "$TARGET" = spread ] && { echo "${EP[$1]}"; return; }
    for _ in $(seq 100); do
        status="$(ETCDCTL_API=3 etcdctl --endpoints "${EP[$1]}" --dial-timeout 1s endpoint status -w json 2> /dev/null)"
        jq -er '[.[] | select(.Status.header.member_id == .Status.leader) | .Endpoint][0] // empty' <<< "$status" 2> /dev/null && return
        sleep 0.2
    done
    die "build $1: no leader"
}

declare -A TO
for build in A B; do TO[$build]="$(target "$build")"; done
echo "A = ${BIN[A]}, B = ${BIN[B]}; $MEMBERS members each; load: ${LOAD[*]} to $TARGET"
for ((pair = 1; pair <= PAIRS; pair++)); do
    for build in A B; do
        out="$("$GOLOAD" --endpoints "${TO[$build]}" "${LOAD[@]}" 2>&1)" || die "build $build: $out"
        rate="$(grep -oE 'throughput: +[0-9.]+' <<< "$out" | grep -oE '[0-9.]+$')"
        mean="$(grep -oE 'mean [0-9.]+' <<< "$out" | grep -oE '[0-9.]+$')"
        p99="$(grep -oE 'p99 [0-9.]+' <<< "$out" | grep -oE '[0-9.]+$')"
        echo "$build $pair $rate $mean $p99" >> "$tmp/runs"
        printf '%s  run %d: %8s req/s  mean %s ms  p99 %s ms\n' "$build" "$pair" "$rate" "$mean" "$p99"
    done
done
awk '{ n[$1]++; r[$1] += $3; m[$1] += $4 }
     END { for (b in n) printf "%s: mean of %d runs: %.1f req/s, %.3f ms\n", b, n[b], r[b] / n[b], m[b] / n[b] }' \
    "$tmp/runs" | sort
