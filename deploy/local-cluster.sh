#!/usr/bin/env bash
# A local keyward cluster on 127.0.0.1 with the dev PKI (certs/gen.sh): N members with client and peer
# TLS and client-certificate auth, plus a grpc-proxy in front of them. Peers trust only the peer CA
# (peer-ca.pem), so no client's or the proxy's certificate is ever taken for a member.
#
#   deploy/local-cluster.sh [start] [--members N] [--base-port P] [--dir DIR] [--bin KEYWARD] [--no-proxy] [--detach]
#   deploy/local-cluster.sh stop [--dir DIR]
#
# `start` (the default) runs in the foreground and stops everything on Ctrl-C; with --detach it returns
# once the cluster is ready and `stop` ends it. Member I (1-based) listens for clients on
# P + 10*(I-1) and for peers on the port after it; the proxy on P + 10*N. Defaults: 3 members,
# P = 22379, DIR = ${TMPDIR:-/tmp}/keyward-local-cluster, KEYWARD = target/release/keyward or
# target/debug/keyward. DIR holds the PKI (pki/), data dirs, logs and the PIDs; it is wiped on start.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
command="start"
members=3
base_port=22379
dir="${TMPDIR:-/tmp}/keyward-local-cluster"
bin="${KEYWARD_BIN:-}"
proxy=1
detach=0

die() { echo "local-cluster: $*" >&2; exit 1; }

case "${1:-}" in
    start | stop) command="$1"; shift ;;
esac
while [ $# -gt 0 ]; do
    case "$1" in
        --members) members="$2"; shift 2 ;;
        --base-port) base_port="$2"; shift 2 ;;
        --dir) dir="$2"; shift 2 ;;
        --bin) bin="$2"; shift 2 ;;
        --no-proxy) proxy=0; shift ;;
        --detach) detach=1; shift ;;
        -h | --help) sed -n '2,13p' "$0"; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done
[[ "$members" =~ ^[1-9][0-9]*$ ]] || die "--members needs a positive number"
[[ "$base_port" =~ ^[0-9]+$ ]] || die "--base-port needs a port number"

# Whether PID is still a process this cluster started (its command line names DIR), so a PID the
# system reused meanwhile is never signalled.
ours() {
    [ -r "/proc/$1/cmdline" ] && tr '\0' ' ' < "/proc/$1/cmdline" | grep -qF -- "$dir/"
}

# Ends every process listed in DIR/pids (TERM, then KILL after 5 s), then forgets them.
stop_all() {
    [ -f "$dir/pids" ] || return 0
    local pid _name alive
    while read -r pid _name; do
        if ours "$pid"; then kill -TERM "$pid" 2>/dev/null || true; fi
    done < "$dir/pids"
    for _ in $(seq 50); do
        alive=0
        while read -r pid _name; do
            if ours "$pid"; then alive=1; fi
        done < "$dir/pids"
        [ "$alive" -eq 0 ] && break
        sleep 0.1
    done
    while read -r pid _name; do
        if ours "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
    done < "$dir/pids"
    rm -f "$dir/pids"
}

if [ "$command" = "stop" ]; then
    stop_all
    echo "local-cluster: stopped ($dir)"
    exit 0
fi

if [ -z "$bin" ]; then
    for candidate in "$root/target/release/keyward" "$root/target/debug/keyward"; do
        if [ -x "$candidate" ]; then bin="$candidate"; break; fi
    done
fi
[ -n "$bin" ] && [ -x "$bin" ] || die "no keyward binary: build it (cargo build --release) or pass --bin"

stop_all
rm -rf "$dir"
mkdir -p "$dir"
KEYWARD_DEV_MEMBERS="$members" bash "$root/certs/gen.sh" "$dir/pki" > /dev/null || die "certs/gen.sh failed"
pki="$dir/pki"

client_port() { echo $((base_port + 10 * ($1 - 1))); }
peer_port() { echo $(($(client_port "$1") + 1)); }
proxy_port=$((base_port + 10 * members))

initial_cluster=""
for i in $(seq 1 "$members"); do
    initial_cluster+="${initial_cluster:+,}member$i=https://127.0.0.1:$(peer_port "$i")"
done

# Started processes: "PID NAME" per line, so `stop` (or Ctrl-C) ends exactly these.
started() { echo "$1 $2" >> "$dir/pids"; }

for i in $(seq 1 "$members"); do
    client="https://127.0.0.1:$(client_port "$i")"
    peer="https://127.0.0.1:$(peer_port "$i")"
    "$bin" serve \
        --name "member$i" --data-dir "$dir/member$i" \
        --listen-client-urls "$client" --advertise-client-urls "$client" \
        --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
        --initial-cluster "$initial_cluster" --initial-cluster-state new \
        --initial-cluster-token keyward-local-cluster \
        --cert-file "$pki/member$i.pem" --key-file "$pki/member$i-key.pem" \
        --trusted-ca-file "$pki/ca.pem" --client-cert-auth --trusted-proxy-cn keyward-proxy \
        --peer-cert-file "$pki/peer$i.pem" --peer-key-file "$pki/peer$i-key.pem" \
        --peer-trusted-ca-file "$pki/peer-ca.pem" --peer-client-cert-auth \
        > "$dir/member$i.log" 2>&1 &
    started $! "member$i"
done

endpoints=""
for i in $(seq 1 "$members"); do
    endpoints+="${endpoints:+,}https://127.0.0.1:$(client_port "$i")"
done

proxy_endpoint=""
proxy_note="none (--no-proxy)"
if [ "$proxy" -eq 1 ]; then
    proxy_endpoint="https://127.0.0.1:$proxy_port"
    "$bin" grpc-proxy start \
        --endpoints "$endpoints" --listen-addr "127.0.0.1:$proxy_port" \
        --cert "$pki/proxy.pem" --key "$pki/proxy-key.pem" --cacert "$pki/ca.pem" \
        --cert-file "$pki/proxy.pem" --key-file "$pki/proxy-key.pem" \
        --trusted-ca-file "$pki/ca.pem" --client-cert-auth \
        > "$dir/proxy.log" 2>&1 &
    started $! proxy
fi

trap 'stop_all; echo "local-cluster: stopped"; exit 0' INT TERM

# Ready when every member's /health (and the proxy's) answers true over TLS with a client certificate.
healthy() {
    curl -sf --max-time 2 --cacert "$pki/ca.pem" --cert "$pki/root.pem" --key "$pki/root-key.pem" \
        "$1/health" 2> /dev/null | grep -q '"health":"true"'
}
deadline=$((SECONDS + 60))
for url in ${endpoints//,/ } $proxy_endpoint; do
    until healthy "$url"; do
        while read -r pid name; do
            if ! kill -0 "$pid" 2>/dev/null; then
                echo "local-cluster: $name exited; last lines of $dir/$name.log:" >&2
                tail -n 20 "$dir/$name.log" >&2 || true
                stop_all
                exit 1
            fi
        done < "$dir/pids"
        if [ "$SECONDS" -ge "$deadline" ]; then
            stop_all
            die "$url not healthy after 60 s (logs in $dir)"
        fi
        sleep 0.2
    done
done

cat <<EOF
local-cluster: ready
members:  $endpoints
proxy:    ${proxy_endpoint:-$proxy_note}
pki:      $pki (ca.pem; client certificates root, alice, bob)
logs:     $dir/*.log
try:      etcdctl --endpoints=${proxy_endpoint:-$endpoints} --cacert $pki/ca.pem --cert $pki/root.pem --key $pki/root-key.pem put foo bar
          curl --cacert $pki/ca.pem --cert $pki/root.pem --key $pki/root-key.pem ${endpoints%%,*}/v3/kv/range -d '{"key":"Zm9v"}'
EOF

if [ "$detach" -eq 1 ]; then
    echo "stop:     $0 stop --dir $dir"
    exit 0
fi
echo "Ctrl-C stops the cluster."
# Wait for a signal (or for a process to end on its own, which stops the rest).
wait -n || true
stop_all
echo "local-cluster: a process ended; stopped the cluster (logs in $dir)" >&2
exit 1
