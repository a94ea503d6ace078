#!/usr/bin/env bash
# Where a 3-member cluster's CPU goes per request, member by member: keyward against the real etcd.
#
# On a 2-core machine a 3-member cluster under 100 clients is bound by CPU, so the throughput ratio
# of two clusters is about the inverse ratio of the CPU each spends per request (the load generator's
# share included). This script starts a 3-member keyward and a 3-member etcd 3.4 (same flags, loopback,
# free ports; both kept running, one loaded at a time) and runs each cell on each in turn:
#   put-spread     put at 100 clients over 10 connections spread over the three members
#   put-leader     the same, every connection to the leader (no follower forwards a write)
#   range-spread   linearizable range at 100 clients spread over the three members
# For every cell it prints the CPU time (user + system, all threads) each member spent per request,
# the leader's apart from the followers', and the load generator's; with PERF=1 it also records
# keyward's put-spread cell (or PERF_CELL) with perf, one recording per member, and prints each
# member's threads and top symbols.
#
# Usage: benches/cluster-cpu.sh
# Environment: DURATION (per cell, default 5s), ROUNDS (times the whole matrix runs, default 1),
#   CELLS (default "put-spread put-leader range-spread"), BIN_DIR (keyward from this directory, not
#   built), ETCD (etcd binary), PERF=1 (needs the profiling build: release with debug info),
#   PERF_CELL (the cell PERF=1 records, default put-spread), KEEP_TMP=1. Needs clientv3-load
#   (benches/lib/go-build.sh: golang-go, golang-etcd-server-dev), etcdctl, jq, perf for PERF=1.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
DURATION="${DURATION:-5s}"
ROUNDS="${ROUNDS:-1}"
CELLS="${CELLS:-put-spread put-leader range-spread}"
PERF_CELL="${PERF_CELL:-put-spread}"
ETCD="${ETCD:-/usr/bin/etcd}"
PROFILE_DIR=release
[ "${PERF:-0}" = 1 ] && PROFILE_DIR=profiling
BIN_DIR="${BIN_DIR:-}"
KW="${BIN_DIR:-$root/target/$PROFILE_DIR}/keyward"
KWB="${BIN_DIR:-$root/target/$PROFILE_DIR}/keyward-bench"
GOLOAD="$root/target/clientv3-load"

die() { echo "cluster-cpu.sh: $*" >&2; exit 1; }
for tool in jq etcdctl; do command -v "$tool" > /dev/null || die "$tool is needed"; done
if [ -z "$BIN_DIR" ]; then
    (cd "$root" && cargo build --profile "$PROFILE_DIR" --quiet) || die "cargo build --profile $PROFILE_DIR failed"
fi
bash "$root/benches/lib/go-build.sh" clientv3-load "$GOLOAD" || die "building clientv3-load failed"

# shellcheck source=benches/lib/servers.sh
. "$root/benches/lib/servers.sh"
bench_tmp cluster-cpu
TICKS="$(getconf CLK_TCK)"

# cpu_of PID: user + system clock ticks the process has used so far (all its threads)
cpu_of() { sed 's/^.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'; }

declare -A MEMBERS ENDPOINTS LEADER
for kind in keyward etcd; do
    plan_cluster 3
    MEMBERS[$kind]=""
    for i in 1 2 3; do
        launch_member "$kind" "$i" "$tmp/m$i-$kind" "cpu-$kind"
        MEMBERS[$kind]+="$LAUNCHED=http://127.0.0.1:${CLUSTER_CLIENT[i]} "
    done
    ENDPOINTS[$kind]="$CLUSTER_ENDPOINTS"
done

# leader_of KIND: the client URL of the member that leads (waits for one, as a client would)
leader_of() {
    local kind="$1" url
    for _ in $(seq 100); do
        url="$(ETCDCTL_API=3 etcdctl --endpoints "${ENDPOINTS[$1]}" --dial-timeout 2s endpoint status -w json 2> /dev/null \
            | jq -r '[.[] | select(.Status.header.member_id == .Status.leader) | .Endpoint][0] // empty')"
        [ -n "$url" ] && { echo "$url"; return; }
        sleep 0.2
    done
    die "no leader in the $kind cluster"
}
for kind in keyward etcd; do
    LEADER[$kind]="$(leader_of "$kind")"
    "$KWB" --endpoints "${LEADER[$kind]}" --prefix bench/ --key-size 16 --val-size 256 --key-space 1 put --total 1 > /dev/null \
        || die "seeding $kind failed"
    echo "$kind: leader ${LEADER[$kind]}" >&2
done

rows="$tmp/rows.tsv" # round cell kind requests leader_s followers_s client_s
: > "$rows"

# run_cell ROUND CELL KIND
run_cell() {
    local round="$1" cell="$2" kind="$3" endpoints args=() m before=() after=() json="$tmp/$2-$3-$1.json"
    case "$cell" in
        put-spread) endpoints="${ENDPOINTS[$kind]}" args=(put) ;;
        put-leader) endpoints="${LEADER[$kind]}" args=(put) ;;
        range-spread) endpoints="${ENDPOINTS[$kind]}" args=(range --consistency l) ;;
        *) die "unknown cell $cell" ;;
    esac
    local perf_pids=()
    if [ "${PERF:-0}" = 1 ] && [ "$kind" = keyward ] && [ "$cell" = "$PERF_CELL" ] && [ "$round" = 1 ]; then
        # One recording per member: perf report's --pid and --tid filters of one system-wide recording
        # kept only some of a member's threads.
        for m in ${MEMBERS[$kind]}; do
            perf record -e cpu-clock -F 499 -p "${m%%=*}" --call-graph dwarf,8192 -o "$tmp/perf-${m%%=*}.data" \
                -- sleep "${DURATION%s}" > /dev/null 2>&1 &
            perf_pids+=($!)
        done
    fi
    for m in ${MEMBERS[$kind]}; do before+=("$(cpu_of "${m%%=*}")"); done
    times > "$tmp/times0"
    "$GOLOAD" --endpoints "$endpoints" --clients 100 --conns 10 --duration "$DURATION" --prefix bench/ \
        --key-size 16 --val-size 256 --key-space 10000 -w json "${args[@]}" > "$json" 2> "$json.err" \
        || echo "  $kind $cell: FAILED: $(tail -1 "$json.err")" >&2
    times > "$tmp/times1"
    for m in ${MEMBERS[$kind]}; do after+=("$(cpu_of "${m%%=*}")"); done
    [ ${#perf_pids[@]} -gt 0 ] && wait "${perf_pids[@]}"
    local i=0 leader_t=0 followers_t=0
    for m in ${MEMBERS[$kind]}; do
        if [ "${m#*=}" = "${LEADER[$kind]}" ]; then
            leader_t=$((after[i] - before[i]))
        else
            followers_t=$((followers_t + after[i] - before[i]))
        fi
        i=$((i + 1))
    done
    local client_t
    client_t="$(cat "$tmp/times0" "$tmp/times1" | awk 'NR == 2 || NR == 4 { t = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); t += a[1] * 60 + a[2] }; v[NR] = t }
        END { printf "%.2f", v[4] - v[2] }')"
    echo -e "$round\t$cell\t$kind\t$(jq -r '.ok' "$json")\t$(awk -v t="$leader_t" -v hz="$TICKS" 'BEGIN { printf "%.2f", t / hz }')\t$(awk -v t="$followers_t" -v hz="$TICKS" 'BEGIN { printf "%.2f", t / hz }')\t$client_t\t$(jq -r '.throughput | floor' "$json")" >> "$rows"
    echo "  round $round $cell $kind: $(jq -r '.throughput | floor' "$json")/s" >&2
}

for round in $(seq "$ROUNDS"); do
    for cell in $CELLS; do
        for kind in keyward etcd; do run_cell "$round" "$cell" "$kind"; done
    done
done

echo "CPU per request, µs (user + system over the cell; followers: the two together), $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| round | cell | server | req/s | leader | followers | cluster | client | cluster keyward/etcd |"
echo "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
awk -F'\t' '{ n = $4 > 0 ? $4 : 1; l = $5 * 1e6 / n; f = $6 * 1e6 / n; c = $7 * 1e6 / n
              cl[$1, $2, $3] = l + f
              printf "| %s | %s | %s | %s | %.0f | %.0f | %.0f | %.0f |", $1, $2, $3, $8, l, f, l + f, c
              if ($3 == "etcd" && cl[$1, $2, "etcd"] > 0) printf " %.2f |\n", cl[$1, $2, "keyward"] / cl[$1, $2, "etcd"]; else printf " |\n" }' "$rows"

# member_report PID PERF_REPORT_ARGS...: perf's report of one member's recording
member_report() {
    local pid="$1"
    shift
    perf report -i "$tmp/perf-$pid.data" --stdio -g none "$@" 2> /dev/null \
        | grep -E '^ +[0-9.]+%' | sed 's/ *$//' | cut -c1-170
}
if [ "${PERF:-0}" = 1 ]; then
    for m in ${MEMBERS[keyward]}; do
        [ -f "$tmp/perf-${m%%=*}.data" ] || continue
        role=follower
        [ "${m#*=}" = "${LEADER[keyward]}" ] && role=leader
        echo
        echo "keyward $role (pid ${m%%=*}), $PERF_CELL: the member's threads, then its top symbols by self and by"
        echo "inclusive time (percent of the member's samples)"
        echo
        echo '```'
        member_report "${m%%=*}" --no-children --sort comm
        echo
        member_report "${m%%=*}" --no-children --sort dso,symbol --percent-limit 0.8 | head -40
        echo
        member_report "${m%%=*}" --children --sort symbol --percent-limit 4 | grep -E 'keyward::|tonic|h2::|hyper|mdb_|heed|openraft|tokio::runtime::task::raw::poll|sys_' | head -50
        echo '```'
    done
fi
