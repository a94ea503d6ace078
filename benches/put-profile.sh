#!/usr/bin/env bash
# Where a 3-member put's time goes: one client (Go clientv3, benches/clientv3-load) puts to the leader of a
# 3-member keyward and of a 3-member etcd, started in this run on loopback, one cluster after the other,
# ROUNDS times in turn (ABAB). Each member's /metrics is read before and after each run; the report gives,
# per put, the client's total and the mean of each stage the members measure:
#   keyward: the leader's Put handling (grpc_server_handling_seconds), its WAL sync, the AppendEntries
#            round trip it sees (keyward_peer_append_entries_round_trip_seconds{kind="entries"}), the
#            followers' handling of it, their WAL sync, and the apply's commit on the leader;
#   etcd:    its WAL sync on the leader and the followers and its backend commit (etcd 3.4 measures no
#            per-request stage at the default --metrics=basic).
# Usage: benches/put-profile.sh   Environment: PUTS (per run, default 3000), ROUNDS (default 2),
#   BIN_DIR (keyward from there, default target/release), ETCD, KEEP_TMP=1.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
PUTS="${PUTS:-3000}"
ROUNDS="${ROUNDS:-2}"
BIN_DIR="${BIN_DIR:-$root/target/release}"
KW="$BIN_DIR/keyward"
ETCD="${ETCD:-/usr/bin/etcd}"
GOLOAD="$root/target/clientv3-load"
die() { echo "put-profile.sh: $*" >&2; exit 1; }
for tool in jq python3 etcdctl; do command -v "$tool" > /dev/null || die "$tool is needed"; done
[ -x "$KW" ] || die "no keyward at $KW"
[ -x "$GOLOAD" ] || bash "$root/benches/lib/go-build.sh" clientv3-load "$GOLOAD" || die "clientv3-load did not build"

# shellcheck source=benches/lib/servers.sh
. "$root/benches/lib/servers.sh"
bench_tmp put-profile

declare -A EP CPIDS
# start_cluster KIND: three members, EP[KIND] their client URLs
start_cluster() {
    local kind="$1" i
    plan_cluster 3
    CPIDS[$kind]=""
    for i in 1 2 3; do
        launch_member "$kind" "$i" "$tmp/m$i-$kind" "profile-$kind"
        CPIDS[$kind]+="$LAUNCHED "
    done
    EP[$kind]="$CLUSTER_ENDPOINTS"
    for _ in $(seq 100); do
        ETCDCTL_API=3 etcdctl --endpoints "${EP[$kind]}" --dial-timeout 1s endpoint health > /dev/null 2>&1 && return 0
        sleep 0.2
    done
    die "the $kind cluster did not become healthy"
}

# leader KIND: the leader's client URL
leader() {
    ETCDCTL_API=3 etcdctl --endpoints "${EP[$1]}" --dial-timeout 2s endpoint status -w json 2> /dev/null |
        jq -r '[.[] | select(.Status.header.member_id == .Status.leader) | .Endpoint][0] // empty'
}

# scrape KIND FILE: every member's /metrics, each line prefixed with its URL
scrape() {
    local url
    : > "$2"
    for url in ${EP[$1]//,/ }; do
        curl -s "$url/metrics" | grep -v '^#' | sed "s|^|$url |" >> "$2"
    done
}

for kind in keyward etcd; do start_cluster "$kind"; done
echo "load average at start: $(cat /proc/loadavg)" >&2
runs="$tmp/runs.tsv" # kind round leader puts throughput mean_us p99_us load before after
: > "$runs"
for round in $(seq "$ROUNDS"); do
    for kind in keyward etcd; do
        lead="$(leader "$kind")"
        [ -n "$lead" ] || die "no leader in the $kind cluster"
        scrape "$kind" "$tmp/$kind-$round-before.txt"
        load="$(cut -d' ' -f1 /proc/loadavg)"
        "$GOLOAD" --endpoints "$lead" --clients 1 --conns 1 --total "$PUTS" --prefix profile/ --key-size 16 \
            --val-size 256 --key-space 10000 -w json put > "$tmp/$kind-$round.json" 2> "$tmp/$kind-$round.err" \
            || die "the load on $kind failed: $(tail -1 "$tmp/$kind-$round.err")"
        scrape "$kind" "$tmp/$kind-$round-after.txt"
        echo -e "$kind\t$round\t$lead\t$(jq -r '[.ok, .throughput, .latency_us.mean // 0, .latency_us.p99] | @tsv' "$tmp/$kind-$round.json")\t$load\t$tmp/$kind-$round-before.txt\t$tmp/$kind-$round-after.txt" >> "$runs"
        echo "  $kind round $round: $(jq -r '"\(.throughput | floor)/s p50 \(.latency_us.p50)us p99 \(.latency_us.p99)us"' "$tmp/$kind-$round.json") (load $load)" >&2
    done
done

python3 - "$runs" <<'EOF'
import sys
from collections import defaultdict

def parse(path):
    """(url, metric name, labels text) -> value"""
    m = defaultdict(float)
    for line in open(path):
        parts = line.split()
        if len(parts) < 3:
            continue
        url, series, value = parts[0], parts[1], parts[-1]
        name, _, labels = series.partition("{")
        try:
            m[(url, name, labels)] += float(value)
        except ValueError:
            pass
    return m

def total(before, after, urls, name, wanted):
    """the series of `name` on `urls` whose labels hold every string in `wanted`, after minus before"""
    return sum(v - before.get(k, 0.0) for k, v in after.items()
               if k[0] in urls and k[1] == name and all(w in k[2] for w in wanted))

rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
put = ['grpc_method="Put"']
entries = ['kind="entries"']
stages = [
    ("leader: Put handled (request in to answer)", "leader", "grpc_server_handling_seconds", put),
    ("leader: WAL write + fdatasync", "leader", "etcd_disk_wal_fsync_duration_seconds", []),
    ("leader: AppendEntries round trip (send to answer)", "leader", "keyward_peer_append_entries_round_trip_seconds", entries),
    ("followers: AppendEntries handling (receive to answer)", "followers", "keyward_peer_append_entries_handling_seconds", entries),
    ("followers: WAL write + fdatasync", "followers", "etcd_disk_wal_fsync_duration_seconds", []),
    ("leader: apply's backend commit", "leader", "etcd_disk_backend_commit_duration_seconds", []),
]
print("| server | round | load 1m | puts | req/s | client mean ms | client p99 ms | "
      + " | ".join(s[0] + ", mean ms (count)" for s in stages) + " |")
print("| --- " * (7 + len(stages)) + "|")
for kind, rnd, lead, ok, thr, mean, p99, load, b, a in rows:
    before, after = parse(b), parse(a)
    urls = {k[0] for k in after}
    cells = []
    for _, who, name, wanted in stages:
        sel = {lead} if who == "leader" else urls - {lead}
        n = total(before, after, sel, name + "_count", wanted)
        s = total(before, after, sel, name + "_sum", wanted)
        cells.append("%.3f (%d)" % (s / n * 1000.0, n) if n else "n/a")
    print("| %s | %s | %s | %s | %.0f | %.3f | %.3f | %s |"
          % (kind, rnd, load, ok, float(thr), float(mean) / 1000, float(p99) / 1000, " | ".join(cells)))
EOF
