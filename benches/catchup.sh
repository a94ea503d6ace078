#!/usr/bin/env bash
# A member that fell behind a large store comes back (issue 30, part C): keyward beside the real etcd
# (Debian's etcd-server, /usr/bin/etcd) in one run, the same flags for both.
#
# For each server: 3 members on loopback; VALUES_MB of values of VAL bytes (the store the snapshot
# carries); one follower stopped (SIGTERM) while BEHIND small puts go in (past etcd's 5,000 entries kept
# for slow followers and past several snapshots: both leaders must send a snapshot); then restarted.
# Printed, one line per figure: the time from its launch until its raftAppliedIndex reaches the
# leader's, the snapshots the leader sent (etcd_network_snapshot_send_success), the bytes the follower
# received, the leader's dbSize before and at most during the catch-up, whether `endpoint hashkv` is
# equal on all members after; for keyward also the phases from its logs (the leader's build, the
# transfer, the check, the fsync, the load, the commit). Each server's data dirs are removed before the
# next one starts (the run holds about 3 × 2.5 × VALUES_MB on disk at its peak).
#
# Usage: benches/catchup.sh (environment: VALUES_MB (1024), VAL (524288), BEHIND (7000),
#   SNAPSHOT_COUNT (1000), KINDS ("keyward etcd"), KW (target/release/keyward), KWB (keyward-bench:
#   target/release, else /work/main's), ETCD (/usr/bin/etcd), KEEP_TMP=1 keeps the logs)
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
VALUES_MB="${VALUES_MB:-1024}"
VAL="${VAL:-524288}"
BEHIND="${BEHIND:-7000}"
SNAPSHOT_COUNT="${SNAPSHOT_COUNT:-1000}"
KINDS="${KINDS:-keyward etcd}"
KW="${KW:-$root/target/release/keyward}"
KWB="${KWB:-$root/target/release/keyward-bench}"
ETCD="${ETCD:-/usr/bin/etcd}"
export ETCDCTL_API=3
# keyward's own info lines (the phases); openraft's at warn
export KEYWARD_LOG="${KEYWARD_LOG:-warn,keyward=info}"

die() { echo "catchup.sh: $*" >&2; exit 1; }
for tool in jq python3 etcdctl curl; do command -v "$tool" >/dev/null || die "$tool is needed"; done
[ -x "$KW" ] && [ -x "$KWB" ] || die "build first: cargo build --release --bins (needs $KW and $KWB)"
[ -x "$ETCD" ] || die "no etcd at $ETCD"

# shellcheck source=benches/lib/servers.sh
. "$root/benches/lib/servers.sh"
bench_tmp catchup

now_ns() { date +%s%N; }
seconds_since() { awk -v a="$1" -v b="$(now_ns)" 'BEGIN { printf "%.2f", (b - a) / 1e9 }'; }
status_field() { etcdctl --endpoints "$1" --command-timeout 30s endpoint status -w json 2>/dev/null | jq -r ".[0].Status.$2"; }
metric() {
    curl -sf --max-time 10 "$1/metrics" | awk -v m="$2" '$1 == m || index($1, m "{") == 1 { s += $2; n++ } END { if (n) printf "%d", s; else print 0 }'
}
say() { echo "$1: $2" | tee -a "$tmp/results.txt"; }

run() {
    local kind="$1" i t0
    plan_cluster 3
    local -a mpid
    local eps="$CLUSTER_ENDPOINTS"
    start_member() {
        launch_member "$kind" "$1" "$tmp/$kind-m$1" "catchup-$kind" --snapshot-count "$SNAPSHOT_COUNT" \
            --quota-backend-bytes $((8 << 30))
        mpid[$1]=$LAUNCHED
    }
    for i in 1 2 3; do start_member "$i"; done
    for i in 1 2 3; do
        until "$KWB" --endpoints "http://127.0.0.1:${CLUSTER_CLIENT[$i]}" --dial-timeout 1s range --total 1 >/dev/null 2>&1; do
            kill -0 "${mpid[$i]}" 2>/dev/null || die "$kind m$i exited"
            sleep 0.1
        done
    done
    local n=$(( (VALUES_MB << 20) / VAL ))
    t0=$(now_ns)
    "$KWB" --endpoints "$eps" --clients 8 --conns 3 --prefix value/ --key-size 16 --val-size "$VAL" \
        --key-space "$n" --sequential-keys --total "$n" -w json put > "$tmp/$kind-load.json" 2>&1
    say "$kind" "loaded $n values of $VAL B in $(seconds_since "$t0") s ($(jq -r .errors "$tmp/$kind-load.json") errors)"

    local leader_id leader=0 follower=0 id others=""
    leader_id="$(status_field "http://127.0.0.1:${CLUSTER_CLIENT[1]}" leader)"
    for i in 1 2 3; do
        id="$(status_field "http://127.0.0.1:${CLUSTER_CLIENT[$i]}" header.member_id)"
        if [ "$id" = "$leader_id" ]; then leader=$i; elif [ "$follower" = 0 ]; then follower=$i; fi
    done
    [ "$leader" != 0 ] && [ "$follower" != 0 ] || die "$kind: no leader and follower found"
    for i in 1 2 3; do [ "$i" = "$follower" ] || others+="${others:+,}http://127.0.0.1:${CLUSTER_CLIENT[$i]}"; done
    local lep="http://127.0.0.1:${CLUSTER_CLIENT[$leader]}" fep="http://127.0.0.1:${CLUSTER_CLIENT[$follower]}"
    kill "${mpid[$follower]}"; wait "${mpid[$follower]}" 2>/dev/null
    "$KWB" --endpoints "$others" --clients 8 --conns 2 --prefix behind/ --key-size 16 --val-size 100 \
        --key-space "$BEHIND" --sequential-keys --total "$BEHIND" -w json put > "$tmp/$kind-behind.json" 2>&1
    local target sent_before db_before db_max applied=0 last_sample=0 db
    target="$(status_field "$lep" raftAppliedIndex)"
    sent_before="$(metric "$lep" etcd_network_snapshot_send_success)"
    db_before="$(status_field "$lep" dbSize)"; db_max="$db_before"
    say "$kind" "$BEHIND puts while the follower was down; leader applied index $target, leader dbSize $db_before"
    t0=$(now_ns)
    start_member "$follower"
    while [ $(( ($(now_ns) - t0) / 1000000000 )) -lt 1800 ]; do
        kill -0 "${mpid[$follower]}" 2>/dev/null || break
        applied="$(status_field "$fep" raftAppliedIndex)"
        [[ "$applied" =~ ^[0-9]+$ ]] && [ "$applied" -ge "$target" ] && break
        if [ $(( $(now_ns) - last_sample )) -gt 1000000000 ]; then
            db="$(status_field "$lep" dbSize)"
            [[ "$db" =~ ^[0-9]+$ ]] && [ "$db" -gt "$db_max" ] && db_max="$db"
            last_sample=$(now_ns)
        fi
        sleep 0.1
    done
    if [[ "$applied" =~ ^[0-9]+$ ]] && [ "$applied" -ge "$target" ]; then
        say "$kind" "catch-up: $(seconds_since "$t0") s from the follower's launch to applied index = leader's"
    else
        say "$kind" "catch-up: NOT after $(seconds_since "$t0") s (applied $applied of $target)"
    fi
    say "$kind" "snapshots sent: $(( $(metric "$lep" etcd_network_snapshot_send_success) - sent_before )); leader dbSize before $db_before, max during catch-up $db_max"
    say "$kind" "follower received bytes (keyward's counter): $(metric "$fep" keyward_network_snapshot_received_bytes_total)"
    local hashes=""
    for i in 1 2 3; do
        hashes+=" $(etcdctl --endpoints "http://127.0.0.1:${CLUSTER_CLIENT[$i]}" endpoint hashkv -w json 2>/dev/null | jq -r '.[0].HashKV.hash')"
    done
    say "$kind" "hashkv per member:$hashes"
    if [ "$kind" = keyward ]; then
        grep -h "snapshot built\|sending a snapshot\|snapshot sent and installed" "$tmp/$kind-m$leader.log" | tail -3 | sed 's/^/  leader: /' | tee -a "$tmp/results.txt"
        grep -h "snapshot" "$tmp/$kind-m$follower.log" | tail -8 | sed 's/^/  follower: /' | tee -a "$tmp/results.txt"
    fi
    du -sh "$tmp/$kind-m$follower" | sed "s/^/  $kind follower data dir: /" | tee -a "$tmp/results.txt"
    # where it goes: each file or directory two levels down (the store, the log, the snapshots)
    (cd "$tmp/$kind-m$follower" && du -s --block-size=1M -- */* 2>/dev/null) | sed "s/^/    MiB /" | tee -a "$tmp/results.txt"
    # and once the work that follows a catch-up has settled (a snapshot the entries after the one
    # received made due, purges): 20 s later
    sleep 20
    du -sh "$tmp/$kind-m$follower" | sed "s/^/  $kind follower data dir 20 s later: /" | tee -a "$tmp/results.txt"
    (cd "$tmp/$kind-m$follower" && du -s --block-size=1M -- */* 2>/dev/null) | sed "s/^/    MiB /" | tee -a "$tmp/results.txt"
    for i in 1 2 3; do kill "${mpid[$i]}" 2>/dev/null; done
    for i in 1 2 3; do wait "${mpid[$i]}" 2>/dev/null; done
    rm -rf "$tmp/$kind-m1" "$tmp/$kind-m2" "$tmp/$kind-m3"
}

echo "catchup.sh: VALUES_MB=$VALUES_MB VAL=$VAL BEHIND=$BEHIND SNAPSHOT_COUNT=$SNAPSHOT_COUNT, load $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$tmp/results.txt"
for kind in $KINDS; do run "$kind"; done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$tmp/results.txt"
