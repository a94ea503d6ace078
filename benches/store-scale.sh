#!/usr/bin/env bash
# A store of millions of keys (issue 30), keyward beside the real etcd (Debian's etcd-server,
# /usr/bin/etcd) in one run: the space a store takes, what compacting it, deleting it, restarting it
# and snapshotting it cost the clients, and a loaded 3-member cluster, including a member that fell
# behind coming back.
#
# Every step runs on keyward, then on etcd, with the same flags (--quota-backend-bytes QUOTA,
# --snapshot-count SNAPSHOT_COUNT), on free loopback ports, data dirs in one temp dir, every process
# killed by PID at the end. The load is `keyward-bench put` (CLIENTS clients over CONNS connections,
# each key written once per pass, in order); stalls are measured by `keyward-bench probe`: one
# linearizable get and one put every 100 ms on their own connections, the wait of each counted from
# when it was due, so a request stuck 3 s reads as 3 s.
#
#   1. KEYS keys of VAL bytes on one member: dbSizeInUse, dbSize, the data dir on disk; then 2×KEYS
#   4. that member restarted with 2×KEYS: time from launch to the first successful linearizable get,
#      anonymous memory (RssAnon) then
#   3. `del --prefix` of those 2×KEYS keys: time, longest probe wait, peak memory (VmHWM, since the
#      restart) and RssAnon after
#   7. a new member, KEYS keys written 3 times: longest probe wait during the second pass (the store
#      holds KEYS keys; at least one snapshot falls in it when SNAPSHOT_COUNT <= KEYS)
#   2. dbSizeInUse before / after `compact` of every older revision; the compact's time to return,
#      the time until the removal is done (the server's compaction-duration histogram counts it) and
#      dbSizeInUse stops dropping (the physical removal), the longest probe wait from the compact to
#      then; then a 4th pass and `compact --physical` of it: time and longest wait
#   5. 3 members, KEYS keys of CLUSTER_VAL bytes at CLIENTS clients spread over the members: errors,
#      p99, max latency, leader changes during the load, then per member dbSizeInUse / dbSize / dir
#   6. a follower stopped while BEHIND more puts go in, restarted: time from its launch until its
#      raftAppliedIndex reaches the leader's, snapshots the leader sent meanwhile
#      (etcd_network_snapshot_send_success, which both servers have)
#
# Usage: benches/store-scale.sh [--keys N] [--val N] ... (each option sets the variable of the same
#   name in capitals; the environment works too)
# Sizes: KEYS (default 1000000), VAL (100), CLUSTER_VAL (1024), KEY_SIZE (16), CLIENTS (100),
#   CONNS (10), QUOTA (bytes, or with a KiB/MiB/GiB suffix: default 8GiB), BEHIND (250000),
#   SNAPSHOT_COUNT (default 100000, etcd 3.4's, or KEYS/4 when smaller, so a snapshot falls in a pass),
#   SETTLE (seconds without a drop of dbSizeInUse that end the compaction's window: default 3),
#   CATCHUP_TIMEOUT (seconds a rejoining member is watched: default 1800).
# Output: OUT (default target/store-scale.md; the values also in OUT with .tsv), KEEP_TMP=1 keeps the
#   temp dir (logs, each tool's JSON), ETCD (etcd binary), STEPS (default "single compact cluster"),
#   KINDS (default "keyward etcd": which servers run, in that order),
#   TRACE=DIR (step 7/2: keyward logs `keyward::slow` lines, `benches/lib/io-sampler.py` samples the
#   server every 50 ms, and what happened around each probe wait >= 100 ms is printed and kept in DIR
#   with the logs, samples and probes' JSON, `benches/lib/stall-attribution.py`).
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"

while [ $# -gt 0 ]; do
    option="$1"
    case "$1" in
        --*=*) name="${1%%=*}"; value="${1#*=}"; shift ;;
        --*) [ $# -ge 2 ] || { echo "store-scale.sh: $1 needs a value" >&2; exit 2; }; name="$1"; value="$2"; shift 2 ;;
        *) echo "store-scale.sh: unexpected argument $1 (options are --keys N, --val N, ...)" >&2; exit 2 ;;
    esac
    name="${name#--}"; name="${name//-/_}"; name="${name^^}"
    case "$name" in
        KEYS | VAL | CLUSTER_VAL | KEY_SIZE | CLIENTS | CONNS | QUOTA | BEHIND | SNAPSHOT_COUNT | SETTLE | CATCHUP_TIMEOUT | OUT | STEPS | ETCD)
            printf -v "$name" '%s' "$value" ;;
        *) echo "store-scale.sh: unknown option $option" >&2; exit 2 ;;
    esac
done

# keyward's slow-moment lines for the trace (etcd ignores the variable).
[ -n "${TRACE:-}" ] && export KEYWARD_LOG="${KEYWARD_LOG:-info,keyward::slow=debug}"
KEYS="${KEYS:-1000000}"
VAL="${VAL:-100}"
CLUSTER_VAL="${CLUSTER_VAL:-1024}"
KEY_SIZE="${KEY_SIZE:-16}"
CLIENTS="${CLIENTS:-100}"
CONNS="${CONNS:-10}"
QUOTA="${QUOTA:-8GiB}"
BEHIND="${BEHIND:-250000}"
SNAPSHOT_COUNT="${SNAPSHOT_COUNT:-$(( KEYS / 4 < 100000 ? KEYS / 4 : 100000 ))}"
SETTLE="${SETTLE:-3}"
CATCHUP_TIMEOUT="${CATCHUP_TIMEOUT:-1800}"
OUT="${OUT:-$root/target/store-scale.md}"
ETCD="${ETCD:-/usr/bin/etcd}"
STEPS="${STEPS:-single compact cluster}"
KW="$root/target/release/keyward"
KWB="$root/target/release/keyward-bench"
read -r -a KINDS <<< "${KINDS:-keyward etcd}"

die() { echo "store-scale.sh: $*" >&2; exit 1; }
step() { [[ " $STEPS " == *" $1 "* ]]; }
for tool in jq python3 etcdctl curl; do command -v "$tool" >/dev/null || die "$tool is needed"; done
[ -x "$ETCD" ] || die "no etcd at $ETCD (apt-get install etcd-server)"
for n in KEYS VAL CLUSTER_VAL KEY_SIZE CLIENTS CONNS BEHIND SNAPSHOT_COUNT SETTLE CATCHUP_TIMEOUT; do
    [[ "${!n}" =~ ^[0-9]+$ ]] && [ "${!n}" -gt 0 ] || die "$n=${!n}: a positive whole number"
done
[[ "$QUOTA" =~ ^[0-9]+([KMG]iB)?$ ]] || die "QUOTA=$QUOTA: bytes, or a number with KiB, MiB or GiB"
case "$QUOTA" in
    *GiB) QUOTA_BYTES=$(( ${QUOTA%GiB} << 30 )) ;;
    *MiB) QUOTA_BYTES=$(( ${QUOTA%MiB} << 20 )) ;;
    *KiB) QUOTA_BYTES=$(( ${QUOTA%KiB} << 10 )) ;;
    *) QUOTA_BYTES="$QUOTA" ;;
esac
[ -x "$KW" ] && [ -x "$KWB" ] || die "build first: cargo build --release --bins (needs $KW and $KWB)"

# shellcheck source=benches/lib/servers.sh
. "$root/benches/lib/servers.sh"
bench_tmp store-scale
SERVER_FLAGS=(--quota-backend-bytes "$QUOTA_BYTES" --snapshot-count "$SNAPSHOT_COUNT")
export ETCDCTL_API=3

# --- measuring ------------------------------------------------------------------------------------

values="$tmp/values.tsv"   # id kind unit label value, one line per figure and server
: > "$values"
# record ID KIND UNIT LABEL VALUE : UNIT is bytes, s, ms, count or text
record() { printf '%s\t%s\t%s\t%s\t%s\n' "$@" >> "$values"; echo "  $2: $4 = $5 $3" >&2; }

now_ns() { date +%s%N; }
# seconds_since START_NS
seconds_since() { awk -v a="$1" -v b="$(now_ns)" 'BEGIN { printf "%.3f", (b - a) / 1e9 }'; }

# status EP: etcdctl's endpoint status of one endpoint, as JSON (the Status object)
status() { etcdctl --endpoints "$1" --command-timeout 30s endpoint status -w json 2>/dev/null | jq -c '.[0].Status'; }
status_field() { status "$1" | jq -r ".$2"; }

# disk bytes the data dir takes (allocated blocks: a sparse file counts what it holds)
dir_bytes() { du -sB1 "$1" | cut -f1; }

# proc KB_FIELD PID: a /proc/PID/status field (VmHWM, RssAnon) in bytes
proc_bytes() { awk -v f="$1:" '$1 == f { print $2 * 1024 }' "/proc/$2/status"; }

# ready EP PID [TRIES]: a linearizable get succeeds; the member must stay alive meanwhile
ready() {
    local ep="$1" pid="$2" tries="${3:-600}"
    for _ in $(seq "$tries"); do
        "$KWB" --endpoints "$ep" --dial-timeout 1s range --total 1 > /dev/null 2>&1 && return 0
        kill -0 "$pid" 2>/dev/null || die "the member at $ep exited (logs in $tmp, KEEP_TMP=1 keeps them)"
        sleep 0.05
    done
    die "the member at $ep did not answer"
}

# load EPS PREFIX N VAL_SIZE NAME : N puts of distinct keys PREFIX0..N-1 (in order) at CLIENTS over
# CONNS; the JSON summary in $tmp/NAME.json
load() {
    local eps="$1" prefix="$2" n="$3" val="$4" name="$5"
    "$KWB" --endpoints "$eps" --clients "$CLIENTS" --conns "$CONNS" --prefix "$prefix" --key-size "$KEY_SIZE" \
        --val-size "$val" --key-space "$n" --sequential-keys --total "$n" -w json put \
        > "$tmp/$name.json" 2> "$tmp/$name.err" || echo "  load $name: FAILED: $(tail -1 "$tmp/$name.err")" >&2
    [ -s "$tmp/$name.json" ] && jq -r '"  \(.workload) '"$name"': \(.ok) ok, \(.errors) errors, \(.throughput | floor)/s, p99 \(.latency_us.p99 / 1000) ms"' "$tmp/$name.json" >&2
}

# probe_start EP NAME / probe_stop NAME : the prober runs between the two; its JSON in $tmp/NAME.probe.json
probe_start() {
    rm -f "$tmp/$2.stop"
    "$KWB" --endpoints "$1" -w json probe --every 100ms --until-file "$tmp/$2.stop" --probe-key "probe/$2" \
        > "$tmp/$2.probe.json" 2> "$tmp/$2.probe.err" &
    PROBE_PID=$!
    pids+=("$PROBE_PID")
    sleep 0.5 # connected and ticking before the operation starts
}
probe_stop() {
    touch "$tmp/$1.stop"
    wait "$PROBE_PID" || echo "  probe $1: FAILED: $(tail -1 "$tmp/$1.probe.err")" >&2
}
# probe_max NAME get|put : the longest wait in seconds
probe_max() { jq -r ".$2.max_ms / 1000" "$tmp/$1.probe.json" 2>/dev/null || echo "n/a"; }

# record_probe ID KIND NAME WHAT : the longest get and put waits of a probe
record_probe() {
    record "$1-get" "$2" s "$4: longest probe get wait" "$(probe_max "$3" get)"
    record "$1-put" "$2" s "$4: longest probe put wait" "$(probe_max "$3" put)"
    local errors
    errors=$(jq -r '.get.errors + .put.errors' "$tmp/$3.probe.json" 2>/dev/null || echo "n/a")
    record "$1-errors" "$2" count "$4: probe errors" "$errors"
}

# timed ID KIND LABEL NAME COMMAND... : records how long COMMAND took to return (its output in
# $tmp/NAME.out); a failure is recorded as text with its message, so no failed operation reads as a time
timed() {
    local id="$1" kind="$2" label="$3" name="$4" t0 took
    shift 4
    t0=$(now_ns)
    if "$@" > "$tmp/$name.out" 2>&1; then
        record "$id" "$kind" s "$label" "$(seconds_since "$t0")"
    else
        took="$(seconds_since "$t0")"
        record "$id" "$kind" text "$label" "failed after $took s: $(tail -1 "$tmp/$name.out")"
    fi
}

# record_space ID KIND EP DIR WHAT
record_space() {
    local st
    st="$(status "$3")"
    record "$1-inuse" "$2" bytes "$5: dbSizeInUse" "$(jq -r .dbSizeInUse <<< "$st")"
    record "$1-file" "$2" bytes "$5: dbSize (file)" "$(jq -r .dbSize <<< "$st")"
    record "$1-dir" "$2" bytes "$5: data dir on disk" "$(dir_bytes "$4")"
}

# metric EP NAME : the sum of a Prometheus metric's samples at EP/metrics, or n/a when absent
metric() {
    curl -sf --max-time 10 "$1/metrics" | awk -v m="$2" '$1 == m || index($1, m "{") == 1 { s += $2; n++ } END { if (n) printf "%d", s; else print "n/a" }'
}

# minus A B : A - B, or n/a when either is n/a
minus() { if [ "$1" = n/a ] || [ "$2" = n/a ]; then echo n/a; else echo $(( $1 - $2 )); fi; }

# --- 1, 4, 3: KEYS and 2×KEYS on one member, restart, delete ------------------------------------------

single() {
    local kind="$1" port peer dir ep pid t0
    port="$(free_port)"; peer="$(free_port)"; dir="$tmp/single-$kind"; ep="http://127.0.0.1:$port"
    start_single() { launch "$kind" one "$dir" http "$port" "$peer" "one=http://127.0.0.1:$peer" "${SERVER_FLAGS[@]}"; pid=$LAUNCHED; }
    start_single
    ready "$ep" "$pid"
    load "$ep" s/a/ "$KEYS" "$VAL" "single-a-$kind"
    record_space f1-keys "$kind" "$ep" "$dir" "KEYS keys loaded"
    load "$ep" s/b/ "$KEYS" "$VAL" "single-b-$kind"
    record_space f1-2keys "$kind" "$ep" "$dir" "2×KEYS keys loaded"

    kill "$pid"; wait "$pid" 2>/dev/null
    t0=$(now_ns)
    start_single
    ready "$ep" "$pid" 36000
    record f4-ready "$kind" s "restart with 2×KEYS: launch to the first linearizable get" "$(seconds_since "$t0")"
    record f4-anon "$kind" bytes "restart with 2×KEYS: RssAnon when ready" "$(proc_bytes RssAnon "$pid")"

    probe_start "$ep" "del-$kind"
    timed f3-time "$kind" "del --prefix of 2×KEYS: time to return" "del-$kind" \
        etcdctl --endpoints "$ep" --command-timeout 1h del --prefix s/
    record f3-count "$kind" count "del --prefix of 2×KEYS: keys deleted" "$(head -1 "$tmp/del-$kind.out")"
    probe_stop "del-$kind"
    record_probe f3 "$kind" "del-$kind" "del --prefix of 2×KEYS"
    record f3-hwm "$kind" bytes "del --prefix of 2×KEYS: peak memory since the restart (VmHWM)" "$(proc_bytes VmHWM "$pid")"
    record f3-anon "$kind" bytes "del --prefix of 2×KEYS: RssAnon after" "$(proc_bytes RssAnon "$pid")"
    kill "$pid"; wait "$pid" 2>/dev/null
}

# --- 7, 2: KEYS written 3 times, a snapshot during a pass, compaction ------------------------------

# compactions_done EP: how many compactions the server has finished removing (etcd's histogram of
# their total duration, observed when a compaction's last batch is done; keyward exports the same)
compactions_done() {
    curl -s --max-time 10 "$1/metrics" \
        | awk '$1 == "etcd_debugging_mvcc_db_compaction_total_duration_milliseconds_count" { print $2 }'
}

# settle EP START_NS [DONE_BEFORE] : waits until the server has finished more compactions than
# DONE_BEFORE (when given: a removal that frees nothing for a while, walking changes nothing older
# supersedes, is not over), then until dbSizeInUse has not dropped for SETTLE seconds (at most 1 h in
# all); prints the seconds from START_NS to its last drop
settle() {
    local ep="$1" t0="$2" before="${3:-}" last inuse last_drop quiet_since done
    if [[ "$before" =~ ^[0-9]+$ ]]; then
        while [ $(( ($(now_ns) - t0) / 1000000000 )) -lt 3600 ]; do
            done="$(compactions_done "$ep")"
            [[ "$done" =~ ^[0-9]+$ ]] && [ "$done" -gt "$before" ] && break
            sleep 0.1
        done
    fi
    last="$(status_field "$ep" dbSizeInUse)"
    last_drop="$(seconds_since "$t0")"
    quiet_since=$(now_ns)
    while [ $(( ($(now_ns) - quiet_since) / 1000000 )) -lt $(( SETTLE * 1000 )) ]; do
        sleep 0.1
        inuse="$(status_field "$ep" dbSizeInUse)"
        if [[ "$inuse" =~ ^[0-9]+$ ]] && [ "$inuse" -lt "$last" ]; then
            last="$inuse"; last_drop="$(seconds_since "$t0")"; quiet_since=$(now_ns)
        fi
        [ $(( ($(now_ns) - t0) / 1000000000 )) -lt 3600 ] || break
    done
    echo "$last_drop"
}

compact() {
    local kind="$1" port peer dir ep pid t0 rev done_before
    port="$(free_port)"; peer="$(free_port)"; dir="$tmp/compact-$kind"; ep="http://127.0.0.1:$port"
    launch "$kind" one "$dir" http "$port" "$peer" "one=http://127.0.0.1:$peer" "${SERVER_FLAGS[@]}"
    pid=$LAUNCHED
    ready "$ep" "$pid"
    if [ -n "${TRACE:-}" ]; then
        python3 "$root/benches/lib/io-sampler.py" --pid "$pid" --data-dir "$dir" > "$tmp/compact-$kind.samples" &
        pids+=($!)
    fi
    load "$ep" s/c/ "$KEYS" "$VAL" "pass1-$kind"
    probe_start "$ep" "pass2-$kind"
    load "$ep" s/c/ "$KEYS" "$VAL" "pass2-$kind"
    probe_stop "pass2-$kind"
    record_probe f7 "$kind" "pass2-$kind" "2nd write of KEYS keys (snapshot-count $SNAPSHOT_COUNT)"
    record f7-p99 "$kind" s "2nd write of KEYS keys: the load's p99" "$(jq -r '.latency_us.p99 / 1e6' "$tmp/pass2-$kind.json")"
    load "$ep" s/c/ "$KEYS" "$VAL" "pass3-$kind"

    record f2-before "$kind" bytes "KEYS keys written 3 times: dbSizeInUse before compact" "$(status_field "$ep" dbSizeInUse)"
    rev="$(status_field "$ep" header.revision)"
    done_before="$(compactions_done "$ep")"
    probe_start "$ep" "compact-$kind"
    t0=$(now_ns)
    timed f2-return "$kind" "compact of all older revisions: time to return" "compact-$kind" \
        etcdctl --endpoints "$ep" --command-timeout 1h compact "$rev"
    record f2-settled "$kind" s "compact: until removal is done and dbSizeInUse stops dropping (no drop for ${SETTLE} s)" \
        "$(settle "$ep" "$t0" "$done_before")"
    probe_stop "compact-$kind"
    record_probe f2 "$kind" "compact-$kind" "compact, until removal is done and dbSizeInUse stops dropping"
    record f2-after "$kind" bytes "compact: dbSizeInUse after" "$(status_field "$ep" dbSizeInUse)"
    record f2-file "$kind" bytes "compact: dbSize (file) after" "$(status_field "$ep" dbSize)"

    load "$ep" s/c/ "$KEYS" "$VAL" "pass4-$kind"
    rev="$(status_field "$ep" header.revision)"
    probe_start "$ep" "physical-$kind"
    timed f2p-return "$kind" "4th write, compact --physical of it: time to return" "physical-$kind" \
        etcdctl --endpoints "$ep" --command-timeout 1h compact --physical "$rev"
    probe_stop "physical-$kind"
    record_probe f2p "$kind" "physical-$kind" "compact --physical"
    kill "$pid"; wait "$pid" 2>/dev/null
    [ -n "${TRACE:-}" ] && trace_stalls "$kind" "$dir.log" "$tmp/compact-$kind.samples" pass2 compact physical
}

# trace_stalls KIND LOG SAMPLES PROBE... : with TRACE=DIR, keeps the server's log, its samples and
# each probe's JSON in DIR and prints what happened around each of the probes' waits >= 100 ms
trace_stalls() {
    local kind="$1" log="$2" samples="$3" probe
    shift 3
    mkdir -p "$TRACE"
    cp "$log" "$TRACE/compact-$kind.log"; cp "$samples" "$TRACE/compact-$kind.samples"
    for probe in "$@"; do
        cp "$tmp/$probe-$kind.probe.json" "$TRACE/$probe-$kind.probe.json"
        echo "  trace of $probe-$kind:" >&2
        python3 "$root/benches/lib/stall-attribution.py" --probe "$TRACE/$probe-$kind.probe.json" \
            --samples "$samples" --log "$log" --over 100 | sed 's/^/    /' >&2
    done
}

# --- 5, 6: three members ----------------------------------------------------------------------------

cluster() {
    local kind="$1" i initial="" eps="" t0
    local -a port peer mpid
    for i in 1 2 3; do
        port[$i]="$(free_port)"; peer[$i]="$(free_port)"
        initial+="${initial:+,}m$i=http://127.0.0.1:${peer[$i]}"
        eps+="${eps:+,}http://127.0.0.1:${port[$i]}"
    done
    start_member() {
        launch "$kind" "m$1" "$tmp/cluster-m$1-$kind" http "${port[$1]}" "${peer[$1]}" "$initial" \
            --initial-cluster-state new --initial-cluster-token "scale-$kind" "${SERVER_FLAGS[@]}"
        mpid[$1]=$LAUNCHED
    }
    for i in 1 2 3; do start_member "$i"; done
    for i in 1 2 3; do ready "http://127.0.0.1:${port[$i]}" "${mpid[$i]}"; done
    # leader changes: the most any member saw (etcd_server_leader_changes_seen_total), or else the
    # raft term's growth
    leader_view() {
        local i m best=n/a
        for i in 1 2 3; do
            m="$(metric "http://127.0.0.1:${port[$i]}" etcd_server_leader_changes_seen_total)"
            [ "$m" = n/a ] && { status_field "http://127.0.0.1:${port[1]}" raftTerm; return; }
            if [ "$best" = n/a ] || [ "$m" -gt "$best" ]; then best="$m"; fi
        done
        echo "$best"
    }
    local before after
    before="$(leader_view)"
    load "$eps" s/l/ "$KEYS" "$CLUSTER_VAL" "cluster-$kind"
    after="$(leader_view)"
    local json="$tmp/cluster-$kind.json"
    record f5-errors "$kind" count "3 members, KEYS keys of CLUSTER_VAL B at CLIENTS clients: errors" "$(jq -r .errors "$json" 2>/dev/null || echo n/a)"
    record f5-kinds "$kind" text "3 members, load: the errors' messages" "$(jq -r '.error_kinds | keys | join("; ") | if . == "" then "none" else . end' "$json" 2>/dev/null || echo n/a)"
    record f5-p99 "$kind" s "3 members, load: p99 latency" "$(jq -r '.latency_us.p99 / 1e6' "$json" 2>/dev/null || echo n/a)"
    record f5-max "$kind" s "3 members, load: max latency" "$(jq -r '.latency_us.max / 1e6' "$json" 2>/dev/null || echo n/a)"
    record f5-rate "$kind" count "3 members, load: puts per second" "$(jq -r '.throughput | floor' "$json" 2>/dev/null || echo n/a)"
    record f5-leaders "$kind" count "3 members, load: leader changes during it" "$(minus "$after" "$before")"
    for i in 1 2 3; do
        record_space "f5-m$i" "$kind" "http://127.0.0.1:${port[$i]}" "$tmp/cluster-m$i-$kind" "3 members after the load, member $i"
    done

    # 6: a follower stopped while BEHIND puts go in, then restarted
    local leader_id leader=0 follower=0 id others="" sent_before sent_after applied target
    leader_id="$(status_field "http://127.0.0.1:${port[1]}" leader)"
    for i in 1 2 3; do
        id="$(status_field "http://127.0.0.1:${port[$i]}" header.member_id)"
        if [ "$id" = "$leader_id" ]; then leader=$i; elif [ "$follower" = 0 ]; then follower=$i; fi
    done
    [ "$leader" != 0 ] && [ "$follower" != 0 ] || die "$kind: no leader and follower found (leader $leader_id)"
    for i in 1 2 3; do [ "$i" = "$follower" ] || others+="${others:+,}http://127.0.0.1:${port[$i]}"; done
    local lep="http://127.0.0.1:${port[$leader]}" fep="http://127.0.0.1:${port[$follower]}"
    sent_before="$(metric "$lep" etcd_network_snapshot_send_success)"
    kill "${mpid[$follower]}"; wait "${mpid[$follower]}" 2>/dev/null
    load "$others" s/behind/ "$BEHIND" "$CLUSTER_VAL" "behind-$kind"
    target="$(status_field "$lep" raftAppliedIndex)"
    t0=$(now_ns)
    start_member "$follower"
    applied=0
    while [ $(( ($(now_ns) - t0) / 1000000000 )) -lt "$CATCHUP_TIMEOUT" ]; do
        kill -0 "${mpid[$follower]}" 2>/dev/null || break
        applied="$(status_field "$fep" raftAppliedIndex)"
        [[ "$applied" =~ ^[0-9]+$ ]] && [ "$applied" -ge "$target" ] && break
        sleep 0.1
    done
    if [[ "$applied" =~ ^[0-9]+$ ]] && [ "$applied" -ge "$target" ]; then
        record f6-catchup "$kind" s "a follower stopped during BEHIND puts: launch to applied index = leader's" "$(seconds_since "$t0")"
    else
        record f6-catchup "$kind" text "a follower stopped during BEHIND puts: launch to applied index = leader's" "not after $(seconds_since "$t0") s (applied $applied of $target)"
    fi
    sent_after="$(metric "$lep" etcd_network_snapshot_send_success)"
    # A labelled counter shows no sample before its first increment, and both servers have this one:
    # absent is a 0.
    [ "$sent_before" = n/a ] && sent_before=0
    [ "$sent_after" = n/a ] && sent_after=0
    record f6-snapshots "$kind" count "the rejoin: snapshots the leader sent (etcd_network_snapshot_send_success)" "$(minus "$sent_after" "$sent_before")"
    record f6-dir "$kind" bytes "the rejoin: the rejoined member's data dir on disk" "$(dir_bytes "$tmp/cluster-m$follower-$kind")"
    for i in 1 2 3; do kill "${mpid[$i]}" 2>/dev/null; done
    for i in 1 2 3; do wait "${mpid[$i]}" 2>/dev/null; done
}

# --- the run ----------------------------------------------------------------------------------------

started_at=$(date +%s)
for s in single compact cluster; do
    step "$s" || continue
    for kind in "${KINDS[@]}"; do
        echo "$s: $kind" >&2
        "$s" "$kind"
    done
done
elapsed=$(( $(date +%s) - started_at ))

# --- report -----------------------------------------------------------------------------------------

{
    echo "Produced by \`benches/store-scale.sh\` on $(date -u +%Y-%m-%d) in ${elapsed} s: KEYS=$KEYS, VAL=$VAL, CLUSTER_VAL=$CLUSTER_VAL,"
    echo "KEY_SIZE=$KEY_SIZE, CLIENTS=$CLIENTS over CONNS=$CONNS, QUOTA=$QUOTA, BEHIND=$BEHIND, --snapshot-count $SNAPSHOT_COUNT on every member."
    echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'),"
    echo "$(awk '/MemTotal/ {printf "%.0f GiB RAM", $2/1048576}' /proc/meminfo); $("$ETCD" --version | head -1); keyward $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?') (+ working tree)."
    echo "Sizes in MB (10^6 bytes); ratio: keyward / etcd. Probe waits: a get and a put every 100 ms, counted from when due."
    echo
    echo "| figure | keyward | etcd | ratio |"
    echo "| --- | ---: | ---: | ---: |"
    awk -F'\t' -v keys="$KEYS" -v val="$VAL" -v cval="$CLUSTER_VAL" -v clients="$CLIENTS" -v behind="$BEHIND" '
        function num(v) { return v ~ /^-?[0-9]+(\.[0-9]+)?$/ }
        function show(v, unit) {
            if (!num(v)) return v
            if (unit == "bytes") return sprintf("%.1f MB", v / 1e6)
            if (unit == "s") return (v < 1 ? sprintf("%.0f ms", v * 1000) : sprintf("%.2f s", v))
            return v
        }
        function big(n) { return n >= 1000000 && n % 1000000 == 0 ? n / 1000000 "M" : (n >= 1000 && n % 1000 == 0 ? n / 1000 "k" : n) }
        {
            if (!($1 in label)) { order[++n] = $1; label[$1] = $4; unit[$1] = $3 }
            v[$1, $2] = $5
        }
        END {
            for (i = 1; i <= n; i++) {
                id = order[i]; k = v[id, "keyward"]; e = v[id, "etcd"]
                r = (num(k) && num(e) && e > 0) ? sprintf("%.2f", k / e) : "n/a"
                l = label[id]
                gsub(/2×KEYS/, big(2 * keys), l); gsub(/KEYS/, big(keys), l); gsub(/CLUSTER_VAL B/, cval " B", l)
                gsub(/CLIENTS/, clients, l); gsub(/BEHIND/, big(behind), l)
                printf "| %s | %s | %s | %s |\n", l, show(k, unit[id]), show(e, unit[id]), r
            }
        }' "$values"
} > "$tmp/report.md"
mkdir -p "$(dirname "$OUT")"
cp "$tmp/report.md" "$OUT"
cp "$values" "${OUT%.md}.tsv"
cat "$tmp/report.md"
echo "report written to $OUT" >&2
