#!/usr/bin/env bash
# Do three members that snapshot at the same applied count lose an election to it? One 3-member
# cluster (keyward or etcd, KIND), --snapshot-count $SNAPSHOT_COUNT, loaded by keyward-bench at 100
# clients over 10 connections spread over the members ($TOTAL puts of $VAL_SIZE-byte values, random
# keys), with `benches/stall-probe.py` on the first member. Prints the load's errors and latency, the
# longest probe, each member's leader changes (etcd_server_leader_changes_seen_total, 1 is the first
# election), dbSize and dbSizeInUse.
#
# Usage: KIND=keyward|etcd benches/snapshot-stall-cluster.sh
# Environment: TOTAL (default 500000), VAL_SIZE (default 1024), SNAPSHOT_COUNT (default 100000), KW,
#   KWB, ETCD, ETCDCTL (as snapshot-stall.sh), KEEP_TMP=1.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
KIND="${KIND:-keyward}"
TOTAL="${TOTAL:-500000}"
VAL_SIZE="${VAL_SIZE:-1024}"
SNAPSHOT_COUNT="${SNAPSHOT_COUNT:-100000}"
KW="${KW:-$root/target/release/keyward}"
KWB="${KWB:-$root/target/release/keyward-bench}"
ETCD="${ETCD:-/usr/bin/etcd}"
ETCDCTL="${ETCDCTL:-/usr/bin/etcdctl}"

die() { echo "snapshot-stall-cluster: $*" >&2; exit 1; }
# shellcheck source=benches/lib/servers.sh
. "$root/benches/lib/servers.sh"
bench_tmp snapstall3

declare -a client peer
initial=""
for i in 1 2 3; do
    client[$i]="$(free_port)"
    peer[$i]="$(free_port)"
    initial+="${initial:+,}m$i=http://127.0.0.1:${peer[$i]}"
done
endpoints=""
for i in 1 2 3; do
    flags=(--name "m$i" --data-dir "$tmp/m$i"
        --listen-client-urls "http://127.0.0.1:${client[$i]}" --advertise-client-urls "http://127.0.0.1:${client[$i]}"
        --listen-peer-urls "http://127.0.0.1:${peer[$i]}" --initial-advertise-peer-urls "http://127.0.0.1:${peer[$i]}"
        --initial-cluster "$initial" --initial-cluster-state new --snapshot-count "$SNAPSHOT_COUNT"
        --quota-backend-bytes 8589934592)
    if [ "$KIND" = keyward ]; then
        "$KW" serve "${flags[@]}" > "$tmp/m$i.log" 2>&1 &
    else
        "$ETCD" "${flags[@]}" > "$tmp/m$i.log" 2>&1 &
    fi
    pids+=("$!")
    endpoints+="${endpoints:+,}127.0.0.1:${client[$i]}"
done
for _ in $(seq 150); do
    "$KWB" --endpoints "127.0.0.1:${client[1]}" --dial-timeout 1s range --total 1 > /dev/null 2>&1 && break
    sleep 0.2
done

python3 "$root/benches/stall-probe.py" --endpoint "127.0.0.1:${client[1]}" > "$tmp/probe" 2>&1 &
probe=$!
pids+=("$probe")
began=$(date +%s.%N)
"$KWB" --endpoints "$endpoints" --conns 10 --clients 100 put --total "$TOTAL" --key-space "$TOTAL" \
    --key-size 16 --val-size "$VAL_SIZE" > "$tmp/load" 2>&1
ended=$(date +%s.%N)
sleep 2
kill -TERM "$probe"
wait "$probe"

echo "== $KIND, 3 members: $TOTAL puts of $VAL_SIZE bytes, --snapshot-count $SNAPSHOT_COUNT, $(python3 -c "print('%.1f' % ($ended - $began))") s"
grep -E "requests:|99%|Slowest|[Ee]rror" "$tmp/load" | head -8 | sed 's/^/  load: /'
grep -E "probes" "$tmp/probe" | sed 's/^/  probe /'
grep -E "ms at .*unix" "$tmp/probe" | head -20 | sed 's/^/    slow /'
for i in 1 2 3; do
    changes=$(curl -s "http://127.0.0.1:${client[$i]}/metrics" | awk '/^etcd_server_leader_changes_seen_total/ {print $2}')
    sizes=$("$ETCDCTL" --endpoints "127.0.0.1:${client[$i]}" endpoint status -w json 2> /dev/null \
        | python3 -c 'import json,sys; s=json.load(sys.stdin)[0]["Status"]; print("dbSize", s["dbSize"], "dbSizeInUse", s.get("dbSizeInUse", 0), "ratio %.2f" % (s["dbSize"] / max(s.get("dbSizeInUse", 1), 1)))')
    echo "  m$i: leader changes seen $changes; $sizes; data dir $(du -sb "$tmp/m$i" | cut -f1)"
    if [ "$KIND" = keyward ]; then
        grep "snapshot built" "$tmp/m$i.log" | sed 's/^\(\S*\).*snapshot built/    \1 snapshot built/' | cut -c1-200
    fi
done
