#!/usr/bin/env bash
# The longest client stall while a member snapshots a loaded store, and the space its file holds
# beyond what is in use: keyward beside etcd 3.4.23 in the same run, one after the other, same flags.
#
# For each server: one member started with --snapshot-count $SNAPSHOT_COUNT (so that it snapshots
# several times during the load) and an 8 GiB quota; `keyward-bench probe` issues a get and a put
# every 100 ms (each wait counted from when it was due) while keyward-bench puts $TOTAL keys (16-byte
# keys, 100-byte values, 100 clients over 10 connections, sequential keys); `endpoint status` is
# sampled every second (dbSize, dbSizeInUse). Prints one line per figure, and each server's slow
# probes (>= 100 ms) with their due times.
#
# Usage: benches/snapshot-stall.sh
# Environment: TOTAL (default 1000000), SNAPSHOT_COUNT (default 200000), KW (keyward binary, default
#   target/release/keyward), KWB (keyward-bench, default target/release/keyward-bench), ETCD, ETCDCTL,
#   KINDS (default "keyward etcd"), RANDOM_KEYS=1 (keys drawn at random from the key space instead of in
#   order: more pages freed by every write), KEEP_TMP=1, TRACE=DIR (keeps in DIR each server's log,
#   probe JSON and `benches/lib/io-sampler.py` samples every 50 ms, keyward with
#   `KEYWARD_LOG=info,keyward::slow=debug`; then prints what happened around each wait >= 100 ms,
#   `benches/lib/stall-attribution.py`).
# For keyward it also prints each "snapshot built" log line (how long the dump's read transaction
# lasted, how many pages writes took past the file's last page meanwhile) and, from a copy of
# data.mdb after the load (`mdb_stat`, lmdb-utils), the pages LMDB has handed out and how many of
# them are free.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
TOTAL="${TOTAL:-1000000}"
SNAPSHOT_COUNT="${SNAPSHOT_COUNT:-200000}"
KW="${KW:-$root/target/release/keyward}"
KWB="${KWB:-$root/target/release/keyward-bench}"
ETCD="${ETCD:-/usr/bin/etcd}"
ETCDCTL="${ETCDCTL:-/usr/bin/etcdctl}"
KINDS="${KINDS:-keyward etcd}"

die() { echo "snapshot-stall: $*" >&2; exit 1; }
for bin in "$KW" "$KWB" "$ETCD" "$ETCDCTL"; do [ -x "$bin" ] || die "no executable $bin"; done

# shellcheck source=benches/lib/servers.sh
. "$root/benches/lib/servers.sh"
bench_tmp snapstall

# status ENDPOINT: "dbSize dbSizeInUse" of the member at ENDPOINT
status() {
    "$ETCDCTL" --endpoints "$1" --command-timeout 5s endpoint status -w json 2> /dev/null \
        | python3 -c 'import json,sys; s=json.load(sys.stdin)[0]["Status"]; print(s["dbSize"], s.get("dbSizeInUse", 0))'
}

for kind in $KINDS; do
    port="$(free_port)"
    peer="$(free_port)"
    dir="$tmp/$kind"
    ep="127.0.0.1:$port"
    flags=(--name bench --data-dir "$dir"
        --listen-client-urls "http://$ep" --advertise-client-urls "http://$ep"
        --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer"
        --initial-cluster "bench=http://127.0.0.1:$peer" --snapshot-count "$SNAPSHOT_COUNT"
        --quota-backend-bytes 8589934592)
    if [ "$kind" = keyward ] && [ -n "${TRACE:-}" ]; then
        KEYWARD_LOG=info,keyward::slow=debug "$KW" serve "${flags[@]}" > "$dir.log" 2>&1 &
    elif [ "$kind" = keyward ]; then
        "$KW" serve "${flags[@]}" > "$dir.log" 2>&1 &
    else
        "$ETCD" "${flags[@]}" > "$dir.log" 2>&1 &
    fi
    server=$!
    pids+=("$server")
    for _ in $(seq 100); do
        "$KWB" --endpoints "$ep" --dial-timeout 1s range --total 1 > /dev/null 2>&1 && break
        kill -0 "$server" 2> /dev/null || { tail -20 "$dir.log" >&2; die "$kind exited"; }
        sleep 0.2
    done

    if [ -n "${TRACE:-}" ]; then
        python3 "$root/benches/lib/io-sampler.py" --pid "$server" --data-dir "$dir" > "$tmp/$kind.samples" &
        pids+=($!)
    fi
    "$KWB" --endpoints "$ep" -w json probe --every 100ms --until-file "$tmp/$kind.stop" \
        > "$tmp/$kind.probe" 2> "$tmp/$kind.probe.err" &
    probe=$!
    pids+=("$probe")
    (
        started=$(date +%s.%N)
        while kill -0 "$server" 2> /dev/null; do
            echo "$(python3 -c "import time; print('%.1f' % (time.time() - $started))") $(status "$ep")"
            sleep 1
        done
    ) > "$tmp/$kind.sizes" &
    sampler=$!
    pids+=("$sampler")

    began=$(date +%s.%N)
    order=(--sequential-keys)
    [ "${RANDOM_KEYS:-0}" = 1 ] && order=()
    "$KWB" --endpoints "$ep" --conns 10 --clients 100 put --total "$TOTAL" --key-space "$TOTAL" \
        "${order[@]}" --key-size 16 --val-size 100 > "$tmp/$kind.load" 2>&1
    ended=$(date +%s.%N)
    sleep 2 # the last snapshot's aftermath
    touch "$tmp/$kind.stop"
    wait "$probe" || echo "  $kind probe FAILED: $(tail -1 "$tmp/$kind.probe.err")" >&2
    read -r size in_use < <(status "$ep")
    kill "$sampler" 2> /dev/null
    wait "$sampler" 2> /dev/null

    echo "== $kind: load of $TOTAL puts, --snapshot-count $SNAPSHOT_COUNT, $(python3 -c "print('%.1f' % ($ended - $began))") s"
    grep -E "^ *(Requests/sec|Total|Slowest|99%)|[Ee]rror" "$tmp/$kind.load" | head -8 | sed 's/^/  load: /'
    jq -r '"get longest wait \(.get.max_ms) ms (due at \(.get.worst_due_s) s), put \(.put.max_ms) ms (due at \(.put.worst_due_s) s), errors \(.get.errors + .put.errors)"' \
        "$tmp/$kind.probe" | sed "s/^/  $kind probe: /"
    echo "  $kind after the load: dbSize $size, dbSizeInUse $in_use, ratio $(python3 -c "print('%.2f' % ($size / max($in_use, 1)))"), data dir $(du -sb "$dir" | cut -f1)"
    if [ "$kind" = keyward ]; then
        grep "snapshot built" "$dir.log" | sed 's/^.*snapshot built/    snapshot built/' | cut -c1-200
        if command -v mdb_stat > /dev/null; then
            mkdir -p "$tmp/copy" && cp "$dir/member/kv/data.mdb" "$tmp/copy/data.mdb"
            mdb_stat -n -e -f "$tmp/copy/data.mdb" | grep -E "Number of pages used|Free pages" | sed 's/^ */    mdb_stat: /'
            rm -rf "$tmp/copy"
        fi
    fi
    echo "  $kind slow probes (>= 100 ms; due, in s since the probe started, and wait):"
    jq -r '(.get.slow[] | "get \(.due_s) \(.wait_ms)"), (.put.slow[] | "put \(.due_s) \(.wait_ms)")' "$tmp/$kind.probe" \
        | awk '$3 >= 100' | sort -k2 -n | head -40 | sed 's/^/    /'
    echo "  $kind sizes (s since start, dbSize, dbSizeInUse), every 5th sample:"
    awk 'NR % 5 == 1' "$tmp/$kind.sizes" | head -60 | sed 's/^/    /'
    kill "$server"
    wait "$server" 2> /dev/null
    if [ -n "${TRACE:-}" ]; then
        mkdir -p "$TRACE"
        cp "$dir.log" "$TRACE/$kind.log"
        cp "$tmp/$kind.probe" "$TRACE/$kind.probe.json"
        cp "$tmp/$kind.samples" "$TRACE/$kind.samples"
        python3 "$root/benches/lib/stall-attribution.py" --probe "$TRACE/$kind.probe.json" \
            --samples "$TRACE/$kind.samples" --log "$TRACE/$kind.log" --over 100 | sed "s/^/  $kind /"
    fi
done
