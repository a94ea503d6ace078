# Sourced by the scripts in benches/: one temp dir for the run, servers (keyward or the real etcd) on
# free loopback ports, every process started recorded by PID and killed at exit.
#
# The caller sets KW (the keyward binary) and ETCD (the etcd binary) before calling launch.

# bench_tmp NAME: makes the run's temp dir ($tmp) and removes it at exit (KEEP_TMP=1 keeps it), after
# killing every PID in $pids; INT and TERM exit through the same path.
bench_tmp() {
    tmp="$(mktemp -d "${TMPDIR:-/tmp}/keyward-$1.XXXXXX")"
    pids=()
    trap bench_cleanup EXIT
    trap 'exit 130' INT TERM
}

bench_cleanup() {
    local pid
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    done
    if [ "${KEEP_TMP:-0}" = 1 ]; then echo "kept $tmp" >&2; else rm -rf "$tmp"; fi
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# launch KIND NAME DIR SCHEME CLIENT_PORT PEER_PORT INITIAL_CLUSTER EXTRA_FLAGS... : starts one member
# (keyward serve or etcd, the same flags for both) in the background on 127.0.0.1, its output in
# DIR.log (appended: a restarted member keeps its first log); its PID is $LAUNCHED and joins $pids.
launch() {
    local kind="$1" name="$2" dir="$3" scheme="$4" client="$5" peer="$6" initial="$7"
    shift 7
    local flags=(--name "$name" --data-dir "$dir"
        --listen-client-urls "$scheme://127.0.0.1:$client" --advertise-client-urls "$scheme://127.0.0.1:$client"
        --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer"
        --initial-cluster "$initial" --log-level warn "$@")
    case "$kind" in
        keyward) "$KW" serve "${flags[@]}" >> "$dir.log" 2>&1 & ;;
        etcd) "$ETCD" "${flags[@]}" >> "$dir.log" 2>&1 & ;;
        *) echo "launch: unknown kind $kind" >&2; return 1 ;;
    esac
    LAUNCHED=$!
    pids+=("$LAUNCHED")
}

# plan_cluster [N]: free loopback ports for a new cluster of N members m1..mN (default 3):
# CLUSTER_CLIENT[i] and CLUSTER_PEER[i], CLUSTER_INITIAL (the --initial-cluster value) and
# CLUSTER_ENDPOINTS (the client URLs, comma-separated).
plan_cluster() {
    local i n="${1:-3}"
    CLUSTER_CLIENT=() CLUSTER_PEER=() CLUSTER_INITIAL="" CLUSTER_ENDPOINTS=""
    for ((i = 1; i <= n; i++)); do
        CLUSTER_CLIENT[i]="$(free_port)"
        CLUSTER_PEER[i]="$(free_port)"
        CLUSTER_INITIAL+="${CLUSTER_INITIAL:+,}m$i=http://127.0.0.1:${CLUSTER_PEER[i]}"
        CLUSTER_ENDPOINTS+="${CLUSTER_ENDPOINTS:+,}http://127.0.0.1:${CLUSTER_CLIENT[i]}"
    done
}

# launch_member KIND I DIR TOKEN EXTRA_FLAGS... : member mI of the cluster plan_cluster planned
# (started, or started again, as a member of a new cluster with --initial-cluster-token TOKEN).
launch_member() {
    local kind="$1" i="$2" dir="$3" token="$4"
    shift 4
    launch "$kind" "m$i" "$dir" http "${CLUSTER_CLIENT[i]}" "${CLUSTER_PEER[i]}" "$CLUSTER_INITIAL" \
        --initial-cluster-state new --initial-cluster-token "$token" "$@"
}
