#!/usr/bin/env bash
# What idle watchers cost other clients: put latency at --clients on keys nobody watches, with no
# watcher open and with IDLE (default 30,000) single-key watchers open and idle (`keyward-bench
# --idle-watchers`, one user, keys `idle-watch/NNNNNN` that nobody writes), keyward beside etcd.
#
# Both servers are started in this run with the same flags on free loopback ports (data dirs in one
# temp dir, killed by PID at the end). Each round runs, in this order: keyward without watchers, etcd
# without, keyward with, etcd with (interleaved, so that a busy moment of the shared machine hits both).
# Prints every run's numbers and, per server, the with/without ratios of mean, p50 and p99 latency
# (the goal: keyward's within 1.5x).
#
# Usage: benches/idle-watchers.sh (after `cargo build --release`)
# Environment: IDLE (watchers, default 30000), STREAMS (their streams, default 30), ROUNDS (default 3),
#   DURATION (per run, default 5s), CLIENTS (default 1), ETCD (etcd binary), KEEP_TMP=1.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
IDLE="${IDLE:-30000}"
STREAMS="${STREAMS:-30}"
ROUNDS="${ROUNDS:-3}"
DURATION="${DURATION:-5s}"
CLIENTS="${CLIENTS:-1}"
ETCD="${ETCD:-/usr/bin/etcd}"
KW="$root/target/release/keyward"
KWB="$root/target/release/keyward-bench"

die() { echo "idle-watchers.sh: $*" >&2; exit 1; }
for tool in jq python3; do command -v "$tool" >/dev/null || die "$tool is needed"; done
[ -x "$ETCD" ] || die "no etcd at $ETCD"
[ -x "$KW" ] && [ -x "$KWB" ] || die "build first: cargo build --release"

# shellcheck source=benches/lib/servers.sh
. "$root/benches/lib/servers.sh"
bench_tmp idle

declare -A EP
for kind in keyward etcd; do
    port="$(free_port)"
    peer="$(free_port)"
    launch "$kind" bench "$tmp/$kind" http "$port" "$peer" "bench=http://127.0.0.1:$peer"
    EP[$kind]="http://127.0.0.1:$port"
done
for kind in keyward etcd; do
    for _ in $(seq 100); do
        "$KWB" --endpoints "${EP[$kind]}" --dial-timeout 1s range --total 1 > /dev/null 2>&1 && break
        sleep 0.2
    done
done

results="$tmp/results.tsv" # round server watchers throughput mean p50 p99 max errors
: > "$results"
run() {
    local round="$1" kind="$2" idle="$3" json="$tmp/run.json"
    if ! "$KWB" --endpoints "${EP[$kind]}" --clients "$CLIENTS" --conns 1 --duration "$DURATION" \
        --prefix bench/ --key-size 16 --val-size 256 --key-space 10000 \
        --idle-watchers "$idle" --idle-watch-streams "$STREAMS" -w json put > "$json" 2> "$json.err"; then
        echo "  round $round $kind $idle watchers: FAILED: $(tail -1 "$json.err")" >&2
        return
    fi
    jq -r --arg r "$round" --arg k "$kind" --arg w "$idle" \
        '[$r, $k, $w, .throughput, .latency_us.mean, .latency_us.p50, .latency_us.p99, .latency_us.max, .errors] | @tsv' \
        "$json" | tee -a "$results" >&2
}

echo "round server watchers puts/s mean_us p50_us p99_us max_us errors" >&2
for round in $(seq "$ROUNDS"); do
    for idle in 0 "$IDLE"; do
        for kind in keyward etcd; do run "$round" "$kind" "$idle"; done
    done
done

python3 - "$results" "$IDLE" <<'PY'
import sys, statistics
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
idle = sys.argv[2]
print(f"| server | watchers | puts/s | mean µs | p50 µs | p99 µs | max µs | (median of {len(rows)//4} rounds) |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
med = {}
for kind in ("keyward", "etcd"):
    for w in ("0", idle):
        sel = [r for r in rows if r[1] == kind and r[2] == w]
        if not sel:
            continue
        cols = [statistics.median(float(r[i]) for r in sel) for i in range(3, 8)]
        med[(kind, w)] = cols
        print(f"| {kind} | {w} | {cols[0]:.0f} | {cols[1]:.0f} | {cols[2]:.0f} | {cols[3]:.0f} | {cols[4]:.0f} | |")
print()
for kind in ("keyward", "etcd"):
    if (kind, "0") in med and (kind, idle) in med:
        a, b = med[(kind, "0")], med[(kind, idle)]
        print(f"{kind}: with {idle} idle watchers / without: mean {b[1]/a[1]:.2f}x, p50 {b[2]/a[2]:.2f}x, p99 {b[3]/a[3]:.2f}x, puts/s {b[0]/a[0]:.2f}x")
PY
