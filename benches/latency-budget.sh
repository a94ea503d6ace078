#!/usr/bin/env bash
# Where the time of one put goes, for keyward and for the real etcd in the same run.
#
# One client puts for DURATION seconds (keyward-bench, one connection, no auth) against a fresh single
# member of each. Both expose the same histograms (etcd with --metrics extensive), scraped before and
# after; a stage's mean is the difference of its _sum over the difference of its _count:
#   client        keyward-bench's mean latency (request sent -> response read; its "mean" line)
#   server        grpc_server_handling_seconds{grpc_method="Put"}: the handler, from the request's
#                 headers to its response (decode, identity, propose, raft, apply, reply)
#   log flush     etcd_disk_wal_fsync_duration_seconds: one durable write of the raft log
#   apply commit  etcd_disk_backend_commit_duration_seconds: the state machine's commit
# and the rest by difference: "in server, not flushing" = server - log flush - apply commit per put
# (the flushes are per batch; at one client a batch is one put), "transport" = client - server.
#
# Usage: benches/latency-budget.sh   (builds the release binaries)
# Environment: DURATION (seconds, default 10), ETCD (etcd binary, default /usr/bin/etcd), KEEP_TMP=1.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION="${DURATION:-10}"
ETCD="${ETCD:-/usr/bin/etcd}"
cargo build --release --quiet --bin keyward --bin keyward-bench
KW=target/release/keyward
KWB=target/release/keyward-bench
tmp="$(mktemp -d)"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; done
    if [ "${KEEP_TMP:-0}" = 1 ]; then echo "kept $tmp" >&2; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# scrape URL: "name sum count" for the four histograms
scrape() {
    curl -fsS "$1/metrics" | python3 -c '
import sys
want = {
    "grpc_server_handling_seconds": "server",
    "etcd_disk_wal_fsync_duration_seconds": "log",
    "etcd_disk_backend_commit_duration_seconds": "commit",
}
vals = {}
for line in sys.stdin:
    if line.startswith("#"):
        continue
    name, _, value = line.rpartition(" ")
    base, _, labels = name.partition("{")
    for metric, short in want.items():
        for suffix in ("_sum", "_count"):
            if base == metric + suffix and (short != "server" or "grpc_method=\"Put\"" in labels):
                vals[short + suffix] = vals.get(short + suffix, 0.0) + float(value)
for short in want.values():
    print(short, vals.get(short + "_sum", 0.0), vals.get(short + "_count", 0.0))
'
}

run() {
    local kind="$1" port peer dir ep before after out
    port="$(free_port)"; peer="$(free_port)"; dir="$tmp/$kind"; ep="http://127.0.0.1:$port"
    local flags=(--name b --data-dir "$dir" --listen-client-urls "$ep" --advertise-client-urls "$ep"
        --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer"
        --initial-cluster "b=http://127.0.0.1:$peer" --log-level warn)
    if [ "$kind" = keyward ]; then "$KW" serve "${flags[@]}" > "$dir.log" 2>&1 &
    else "$ETCD" "${flags[@]}" --metrics extensive > "$dir.log" 2>&1 &
    fi
    pids+=("$!")
    for _ in $(seq 100); do curl -fsS "$ep/health" > /dev/null 2>&1 && break; sleep 0.2; done
    "$KWB" --endpoints "$ep" --clients 1 --conns 1 put --duration 2s > /dev/null # warm up
    before="$(scrape "$ep")"
    out="$("$KWB" --endpoints "$ep" --clients 1 --conns 1 put --duration "${DURATION}s")"
    after="$(scrape "$ep")"
    python3 - "$kind" "$before" "$after" "$out" <<'EOF'
import re, sys
kind, before, after, out = sys.argv[1:]
def parse(text):
    return {l.split()[0]: (float(l.split()[1]), float(l.split()[2])) for l in text.splitlines()}
b, a = parse(before), parse(after)
mean = {k: (a[k][0] - b[k][0]) / max(a[k][1] - b[k][1], 1) * 1000 for k in a}
puts = a["server"][1] - b["server"][1]
per_put = {k: (a[k][0] - b[k][0]) / max(puts, 1) * 1000 for k in a}
m = re.search(r"mean ([0-9.]+) ms", out)
client = float(m.group(1)) if m else float("nan")
rest = mean["server"] - per_put["log"] - per_put["commit"]
print(f"| {kind} | {client:.3f} | {mean['server']:.3f} | {per_put['log']:.3f} ({mean['log']:.3f} per flush) "
      f"| {per_put['commit']:.3f} | {rest:.3f} | {client - mean['server']:.3f} | {puts:.0f} |")
EOF
}

echo "one client, ${DURATION}s of puts; milliseconds per put (means)"
echo
echo "| server | client | server | log flush | apply commit | in server, not flushing | transport | puts |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
run keyward
run etcd
