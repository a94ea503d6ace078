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
