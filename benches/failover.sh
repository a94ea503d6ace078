#!/usr/bin/env bash
# Failover and leader stability, keyward beside etcd 3.4.23 (issue 33): 3-member clusters on loopback
# with the same flags (--heartbeat-interval $HB, --election-timeout $ET).
#
# failover (default): per round and per server (keyward, etcd, interleaved), a fresh cluster gets a
# steady write load (benches/failover-load: one etcd clientv3 client per follower endpoint, a put of a
# fresh key every 20 ms whether the previous one was answered or not, each with a 7 s deadline); after
# $WARM s the leader is killed with kill -9. One line per surviving endpoint: the time from the kill to
# the first write sent after the kill and accepted there, the errors meanwhile (and their messages),
# the longest write held across the kill (sent before it, accepted after); then the survivors' leader
# changes and the load's check that no acknowledged write is missing and none applied twice.
#
# stability: both clusters at once under a steady write load (keyward-bench, 4 clients over all
# members) while $BURNERS CPU burners (`yes > /dev/null`, nice 0) keep the cores busy, for $STABLE s;
# then each member's leader changes (etcd_server_leader_changes_seen_total: 1 is the first election).
#
# Usage: benches/failover.sh [failover|stability]
# Environment: ROUNDS (5), HB (100), ET (1000), WARM (3), AFTER (10: load seconds after the kill, more
#   than a put's 7 s deadline), STABLE (300), BURNERS (2), KW (target/release/keyward), KWB
#   (keyward-bench), ETCD (/usr/bin/etcd),
#   LOADER (target/failover-load, built by benches/lib/go-build.sh when missing), KEEP_TMP=1,
#   KEYWARD_LOG (e.g. warn,openraft::core=info for the election's timeline in the kept logs).
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
MODE="${1:-failover}"
ROUNDS="${ROUNDS:-5}"
HB="${HB:-100}"
ET="${ET:-1000}"
WARM="${WARM:-3}"
AFTER="${AFTER:-10}"
STABLE="${STABLE:-300}"
BURNERS="${BURNERS:-2}"
KW="${KW:-$root/target/release/keyward}"
KWB="${KWB:-$root/target/release/keyward-bench}"
[ -x "$KWB" ] || KWB=/work/main/target/release/keyward-bench
ETCD="${ETCD:-/usr/bin/etcd}"
LOADER="${LOADER:-$root/target/failover-load}"

die() { echo "failover: $*" >&2; exit 1; }
[ -x "$KW" ] || die "no keyward binary at $KW (cargo build --release --bins)"
[ -x "$ETCD" ] || die "no etcd at $ETCD (apt-get install etcd-server)"
[ -x "$LOADER" ] || bash "$root/benches/lib/go-build.sh" failover-load "$LOADER" || die "cannot build $LOADER"
# shellcheck source=benches/lib/servers.sh
. "$root/benches/lib/servers.sh"
bench_tmp failover

# cluster KIND TAG: starts 3 members; sets client[1..3] (their client ports), mpid[1..3] and endpoints.
cluster() {
    local kind="$1" tag="$2" i
    declare -ga client=() mpid=()
    plan_cluster 3
    endpoints="$CLUSTER_ENDPOINTS"
    for i in 1 2 3; do
        client[i]="${CLUSTER_CLIENT[i]}"
        launch_member "$kind" "$i" "$tmp/$tag-m$i" "$tag" --heartbeat-interval "$HB" --election-timeout "$ET"
        mpid[i]=$LAUNCHED
    done
    for _ in $(seq 150); do
        [ -n "$(leader_of)" ] && return 0
        sleep 0.2
    done
    die "$kind: no leader after 30 s (logs in $tmp)"
}

metric() { # metric PORT NAME: the value of an unlabelled metric, or nothing
    curl -s --max-time 2 "http://127.0.0.1:$1/metrics" | awk -v n="$2" '$1 == n { print $2; exit }'
}

leader_of() { # the index (1..3) of the member that says it leads
    local i
    for i in 1 2 3; do
        [ "$(metric "${client[$i]}" etcd_server_is_leader)" = 1 ] && { echo "$i"; return; }
    done
}

stop_cluster() {
    local i
    for i in 1 2 3; do kill -9 "${mpid[$i]}" 2>/dev/null; wait "${mpid[$i]}" 2>/dev/null; done
}

failover_round() {
    local kind="$1" round="$2" tag="$1-$2" i lead survivors="" killed_ns changes=""
    cluster "$kind" "$tag"
    lead="$(leader_of)"
    for i in 1 2 3; do [ "$i" = "$lead" ] || survivors+="${survivors:+,}127.0.0.1:${client[$i]}"; done
    "$LOADER" -endpoints "$survivors" -duration "$((WARM + AFTER))s" > "$tmp/$tag.load" 2> "$tmp/$tag.load.err" &
    local loader=$!
    pids+=("$loader")
    sleep "$WARM"
    killed_ns="$(date +%s%N)"
    kill -9 "${mpid[$lead]}"
    wait "$loader"
    for i in 1 2 3; do
        [ "$i" = "$lead" ] && continue
        changes+=" $(metric "${client[$i]}" etcd_server_leader_changes_seen_total)"
    done
    awk -v kind="$kind" -v round="$round" -v k="$killed_ns" '
        $1 == "req" {
            ep = $2; s = $3; e = $4; st = $5
            eps[ep] = 1
            if (st == "ok" && s < k && e > k && e - k > held[ep]) held[ep] = e - k
            if (s >= k && !(ep in first)) {
                if (st == "ok") first[ep] = e - k
                else { errs[ep]++; msg = $6; for (i = 7; i <= NF; i++) msg = msg " " $i; msgs[ep, msg]++ }
            }
        }
        $1 == "verify" { verify = $0 }
        END {
            for (ep in eps) {
                m = ""
                for (km in msgs) { split(km, p, SUBSEP); if (p[1] == ep) m = m sprintf("%s%s x%d", m == "" ? "" : "; ", p[2], msgs[km]) }
                printf "failover %-7s round=%s endpoint=%s first_write_after_kill_ms=%s errors=%d held_across_kill_ms=%.0f%s\n",
                    kind, round, ep, (ep in first) ? sprintf("%.0f", first[ep] / 1e6) : "none", errs[ep], held[ep] / 1e6,
                    m == "" ? "" : " (" m ")"
            }
            printf "failover %-7s round=%s %s\n", kind, round, verify == "" ? "verify missing" : verify
        }' "$tmp/$tag.load"
    echo "failover $(printf '%-7s' "$kind") round=$round survivors_leader_changes_seen_total:$changes (2 each = the first election + the failover)"
    stop_cluster
    [ "${KEEP_TMP:-0}" = 1 ] || rm -rf "$tmp/$tag"-m?
}

stability() {
    local kind ports=() burn=() i
    declare -A eps
    for kind in keyward etcd; do
        cluster "$kind" "stable-$kind"
        eps[$kind]="$endpoints"
        ports+=("$kind:${client[1]}:${client[2]}:${client[3]}")
    done
    echo "stability: load $(cut -d' ' -f1-3 /proc/loadavg) before the burners"
    for i in $(seq "$BURNERS"); do
        yes > /dev/null &
        burn+=("$!")
        pids+=("$!")
    done
    for kind in keyward etcd; do
        "$KWB" --endpoints "${eps[$kind]}" --conns 3 --clients 4 --duration "${STABLE}s" put --key-space 1000 \
            > "$tmp/stable-$kind.bench" 2>&1 &
        pids+=("$!")
    done
    wait "${pids[@]: -2}"
    echo "stability: load $(cut -d' ' -f1-3 /proc/loadavg) at the end, $BURNERS burners, ${STABLE} s"
    for i in "${burn[@]}"; do kill "$i"; wait "$i" 2>/dev/null; done
    for entry in "${ports[@]}"; do
        IFS=: read -r kind p1 p2 p3 <<< "$entry"
        local line="stability $(printf '%-7s' "$kind") leader_changes_seen_total:"
        for p in $p1 $p2 $p3; do line+=" $(metric "$p" etcd_server_leader_changes_seen_total)"; done
        local bench="$tmp/stable-$kind.bench"
        echo "$line (1 each = the first election only);$(grep -m1 'requests:' "$bench" | tr -s ' ');$(grep -m1 'throughput:' "$bench" | tr -s ' ')"
    done
}

case "$MODE" in
    failover)
        echo "failover: load $(cut -d' ' -f1-3 /proc/loadavg), $ROUNDS rounds, --heartbeat-interval $HB --election-timeout $ET"
        for round in $(seq "$ROUNDS"); do
            failover_round keyward "$round"
            failover_round etcd "$round"
        done
        echo "failover: load $(cut -d' ' -f1-3 /proc/loadavg) at the end"
        ;;
    stability) stability ;;
    *) die "unknown mode $MODE (failover or stability)" ;;
esac
