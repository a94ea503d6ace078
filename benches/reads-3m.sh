#!/usr/bin/env bash
# Linearizable reads on 3 members (issue 33, "Linearizable reads"): range-l at 100 clients over 10
# connections spread over all members, etcd 3.4.23 beside keyward, without auth and with JWT RS256.
#
# Every cluster of a configuration runs at once (idle but for heartbeats), and the cells go round
# them REPS times (ABAB...), so load from elsewhere on the machine falls on all of them alike:
#   etcd         the real etcd, 3 members (logins get 60 s: bcrypt at nice 19 starves on a loaded machine)
#   base         keyward at $BASE (e.g. the build before this change; skipped when unset)
#   quorum       keyward at $KW, a heartbeat round per read index (the default)
#   lease        keyward at $KW with --leader-lease-reads
# For each keyward cell it reads the members' /metrics before and after and prints the read index
# rounds: per second, reads per round and mean time per round, for the members' rounds (`member`:
# a follower's asks the leader) and the leader's (`leader`), and how the leader's were confirmed
# (lease or quorum). The load generator is benches/clientv3-load (etcd's Go clientv3).
#
# Usage: benches/reads-3m.sh   Environment: KW (default target/release/keyward), BASE, ETCD,
#   GOLOAD (default target/clientv3-load), DURATION (per cell, default 8s), REPS (default 2),
#   AUTHS (default "none jwt"), OUT (the TSV of every cell, default target/reads-3m.tsv).
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
KW="${KW:-$root/target/release/keyward}"
KWB="${KWB:-$(dirname "$KW")/keyward-bench}"
BASE="${BASE:-}"
ETCD="${ETCD:-/usr/bin/etcd}"
GOLOAD="${GOLOAD:-$root/target/clientv3-load}"
DURATION="${DURATION:-8s}"
REPS="${REPS:-2}"
AUTHS="${AUTHS:-none jwt}"
OUT="${OUT:-$root/target/reads-3m.tsv}"
PREFIX="bench/"
SIZES=(--prefix "$PREFIX" --key-size 16 --val-size 256 --key-space 10000)

die() { echo "reads-3m.sh: $*" >&2; exit 1; }
for tool in jq curl openssl python3; do command -v "$tool" > /dev/null || die "$tool is needed"; done
for bin in "$KW" "$KWB" "$ETCD" "$GOLOAD"; do [ -x "$bin" ] || die "no $bin"; done

# shellcheck source=benches/lib/servers.sh
. "$root/benches/lib/servers.sh"
bench_tmp reads-3m

declare -A EP MEP
# cluster NAME KIND BINARY AUTH FLAGS... : three members; EP[NAME] their client URLs, MEP[NAME] the same
cluster() {
    local name="$1" kind="$2" bin="$3"
    shift 3
    local i
    plan_cluster 3
    for i in 1 2 3; do
        KW="$bin" launch_member "$kind" "$i" "$tmp/$name-m$i" "reads-$name" --bcrypt-cost 10 "$@"
    done
    EP[$name]="$CLUSTER_ENDPOINTS"
    MEP[$name]="$CLUSTER_ENDPOINTS"
}

ready() {
    local name="$1"
    for _ in $(seq 150); do
        "$KWB" --endpoints "${EP[$name]}" --dial-timeout 1s range --total 1 > /dev/null 2>&1 && return 0
        sleep 0.2
    done
    die "$name did not become ready"
}

# scrape NAME : the read index counters summed over the members, one "name value" a line
scrape() {
    local url
    for url in ${MEP[$1]//,/ }; do curl -s "$url/metrics"; done \
        | awk '/^keyward_read_index_(rounds|reads|confirmations)_total|^keyward_read_index_round_duration_seconds_(sum|count)/ {
              s[$1] += $2 } END { for (k in s) print k, s[k] }' | sort
}

openssl genrsa -out "$tmp/priv.pem" 2048 2> /dev/null
openssl rsa -in "$tmp/priv.pem" -pubout -out "$tmp/pub.pem" 2> /dev/null
jwt="jwt,pub-key=$tmp/pub.pem,priv-key=$tmp/priv.pem,sign-method=RS256"

: > "$OUT"
echo -e "auth\tcluster\trep\treq_per_s\tp50_us\tp99_us\terrors\tload1\tmember_rounds_per_s\treads_per_member_round\tms_per_member_round\tleader_rounds_per_s\treads_per_leader_round\tms_per_leader_round\tlease\tquorum" >> "$OUT"
for auth in $AUTHS; do
    names=(etcd quorum lease)
    [ -n "$BASE" ] && names=(etcd base quorum lease)
    flags=()
    [ "$auth" = jwt ] && flags=(--auth-token "$jwt")
    cluster "$auth-etcd" etcd "$KW" "${flags[@]}"
    [ -n "$BASE" ] && cluster "$auth-base" keyward "$BASE" "${flags[@]}"
    cluster "$auth-quorum" keyward "$KW" "${flags[@]}"
    cluster "$auth-lease" keyward "$KW" "${flags[@]}" --leader-lease-reads
    user=()
    for n in "${names[@]}"; do
        ready "$auth-$n"
        if [ "$auth" = jwt ]; then
            "$KWB" --endpoints "${EP[$auth-$n]}" --prefix "$PREFIX" setup-auth --root-password rootpw \
                --new-user bench1:pw1:0 --enable 2> /dev/null || die "auth setup on $auth-$n failed"
            user=(--user bench1 --password pw1)
        fi
        "$KWB" --endpoints "${EP[$auth-$n]}" "${user[@]}" --prefix "$PREFIX" --key-size 16 --val-size 256 \
            --key-space 1 put --total 1 > /dev/null || die "seeding $auth-$n failed"
    done
    for rep in $(seq "$REPS"); do
        for n in "${names[@]}"; do
            before="$tmp/before" after="$tmp/after" json="$tmp/$auth-$n-$rep.json"
            [ "$n" != etcd ] && scrape "$auth-$n" > "$before"
            load="$(cut -d' ' -f1 /proc/loadavg)"
            "$GOLOAD" --endpoints "${EP[$auth-$n]}" "${user[@]}" --clients 100 --conns 10 --duration "$DURATION" --dial-timeout 60s \
                "${SIZES[@]}" -w json range --consistency l > "$json" 2> "$json.err" || echo "  $auth-$n: FAILED $(tail -1 "$json.err")" >&2
            rounds="-\t-\t-\t-\t-\t-\t-\t-"
            if [ "$n" != etcd ]; then
                scrape "$auth-$n" > "$after"
                secs="$(python3 -c 'import sys; print(float(sys.argv[1].rstrip("s")))' "$DURATION")"
                rounds="$(python3 - "$before" "$after" "$secs" << 'EOF'
import sys
def load(p):
    d = {}
    for line in open(p):
        k, v = line.split()
        d[k] = float(v)
    return d
b, a, secs = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
def diff(k): return a.get(k, 0) - b.get(k, 0)
out = []
for kind in ("member", "leader"):
    r = diff('keyward_read_index_rounds_total{kind="%s"}' % kind)
    reads = diff('keyward_read_index_reads_total{kind="%s"}' % kind)
    t = diff('keyward_read_index_round_duration_seconds_sum{kind="%s"}' % kind)
    out += ["%.0f" % (r / secs), "%.1f" % (reads / r if r else 0), "%.2f" % (1000 * t / r if r else 0)]
out += ["%.0f" % diff('keyward_read_index_confirmations_total{by="lease"}'),
        "%.0f" % diff('keyward_read_index_confirmations_total{by="quorum"}')]
print("\t".join(out))
EOF
)"
            fi
            row="$(jq -r '[.throughput, .latency_us.p50, .latency_us.p99, .errors] | @tsv' "$json" 2> /dev/null || echo -e "0\t0\t0\t-1")"
            echo -e "$auth\t$n\t$rep\t$row\t$load\t$rounds" | tee -a "$OUT" >&2
        done
    done
    for pid in "${pids[@]}"; do kill "$pid" 2> /dev/null && wait "$pid" 2> /dev/null; done
    pids=()
done
echo "written: $OUT" >&2
