#!/usr/bin/env bash
# Compares keyward with the real etcd (Debian's etcd-server, /usr/bin/etcd) under the same load.
#
# Both servers (or both clusters) are started in this run with the same flags on free loopback ports, data dirs in one
# temp dir, and killed by PID at the end. The load generator runs the same matrix against each, keyward
# first and then etcd for every cell: by default the put, range and txn-put cells run
# `target/clientv3-load` (benches/clientv3-load: etcd 3.4's own Go clientv3, as the performance issue
# measures), everything else (seeding, auth setup, bcrypt, Authenticate, watch, PROFILE's load) runs
# `keyward-bench` (the Rust client; it speaks etcd's v3 API):
#   (a) no auth                              (b/f) auth, simple token, a user with one permission
#   (c) auth, JWT RS256                      (e)   auth, simple token, a user with 10,000 permissions
#   (d) TLS, client-cert-auth, CN user       (g)   Authenticate throughput (bcrypt cost 10)
#   (h) a 3-member cluster of each (keyward against a real 3-member etcd), auth with JWT RS256; the
#       clients' connections are spread over the three members, so followers forward to the leader,
#       except put at 1 client, which goes to the leader (found with `endpoint status`) in both
#   (j) as (h) without auth
#   (i) keyward only: TLS with client-cert-auth directly vs through `keyward grpc-proxy` forwarding the
#       client's certificate (the proxy's overhead; its own table, proxy/direct ratios)
# cells: put and linearizable range at 1 client (1 conn) and at 100 clients over 10 conns, txn-put at
# 100 clients (and a watch cell in (a); (h) runs put at 1 and 100 clients and range at 100). It prints a Markdown report (also written to $OUT): every
# cell's absolute numbers, keyward/etcd ratios, peak RSS (VmHWM) of each server, the local bcrypt
# rate, and the targets of the performance issue, each met or not.
#
# Usage: benches/compare.sh
# Environment: DURATION (per cell, in seconds: default 5s), AUTH_DURATION (per Authenticate cell, default
#   15s), PERMS (grants of the (e) user, default 10000),
#   OUT (report path, default target/compare.md), ETCD (etcd binary), KEEP_TMP=1 (keep the temp dir),
#   BIN_DIR (keyward and keyward-bench from this directory, not built: e.g. a baseline's release build),
#   CONFIGS (which configurations run, default "a b c d h": (b) includes (e) and (g); the report's
#   targets cover what ran),
#   PROFILE=1 (also record a perf profile of keyward's put path at 100 clients, if perf works; builds and
#   measures the `profiling` profile: release code with debug info),
#   LOAD=go|rust (the load generator of the put/range/txn-put cells: go is clientv3-load, built by
#   benches/lib/go-build.sh clientv3-load, which needs `apt-get install -y golang-go golang-etcd-server-dev`;
#   rust is keyward-bench for every cell. Unset: go if it builds, else rust with a warning).
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
DURATION="${DURATION:-5s}"
AUTH_DURATION="${AUTH_DURATION:-15s}"
PERMS="${PERMS:-10000}"
OUT="${OUT:-$root/target/compare.md}"
ETCD="${ETCD:-/usr/bin/etcd}"
# PROFILE=1 needs symbols and line tables: the profiling build (release + debug info), not the
# stripped release binary.
PROFILE_DIR=release
[ "${PROFILE:-0}" = 1 ] && PROFILE_DIR=profiling
BIN_DIR="${BIN_DIR:-}"
KW="${BIN_DIR:-$root/target/$PROFILE_DIR}/keyward"
KWB="${BIN_DIR:-$root/target/$PROFILE_DIR}/keyward-bench"
GOLOAD="$root/target/clientv3-load"
LOAD="${LOAD:-}"
PREFIX="bench/"
CONFIGS="${CONFIGS:-a b c d h i j}"
# want X: configuration X is in $CONFIGS
want() { [[ " $CONFIGS " == *" $1 "* ]]; }
# The servers each cell runs on, in order: keyward then etcd, except in (i).
KINDS=(keyward etcd)
SHAPE=(--prefix "$PREFIX" --key-size 16 --val-size 256)
SIZES=("${SHAPE[@]}" --key-space 10000)

die() { echo "compare.sh: $*" >&2; exit 1; }
for tool in openssl jq python3; do command -v "$tool" >/dev/null || die "$tool is needed"; done
[ -x "$ETCD" ] || die "no etcd at $ETCD (apt-get install etcd-server)"

case "$LOAD" in go | rust | "") ;; *) die "LOAD=$LOAD: go or rust" ;; esac

if [ -z "$BIN_DIR" ]; then
    echo "building keyward ($PROFILE_DIR)..." >&2
    (cd "$root" && cargo build --profile "$PROFILE_DIR" --quiet) || die "cargo build --profile $PROFILE_DIR failed"
fi
case "$LOAD" in
    go)
        echo "building clientv3-load..." >&2
        bash "$root/benches/lib/go-build.sh" clientv3-load "$GOLOAD" || die "LOAD=go: building clientv3-load failed"
        ;;
    rust) ;;
    "")
        echo "building clientv3-load..." >&2
        if bash "$root/benches/lib/go-build.sh" clientv3-load "$GOLOAD"; then
            LOAD=go
        else
            echo "compare.sh: WARNING: clientv3-load did not build; every cell runs keyward-bench (LOAD=rust)" >&2
            LOAD=rust
        fi
        ;;
esac

# shellcheck source=benches/lib/servers.sh
. "$root/benches/lib/servers.sh"
bench_tmp compare

# half 5s -> 2.5s (seconds only)
half() { python3 -c 'import sys; print("%gs" % (float(sys.argv[1].rstrip("s")) / 2))' "$1"; }

results="$tmp/results.tsv"   # config cell server throughput p50 p90 p99 max ok errors load
: > "$results"
rss="$tmp/rss.tsv"           # config server VmHWM_kB RssAnon_kB RssFile_kB (the last two at the end)
: > "$rss"
cpu="$tmp/cpu.tsv"           # config cell server server_cpu_s client_cpu_s requests
: > "$cpu"
TICKS="$(getconf CLK_TCK)"
# cpu_seconds PID...: user + system time the processes have used so far (all their threads)
cpu_seconds() {
    local pid
    for pid in "$@"; do cat "/proc/$pid/stat" 2>/dev/null; echo; done \
        | awk -v hz="$TICKS" 'NF { sub(/^.*\) /, ""); t += $12 + $13 } END { printf "%.2f", t / hz }'
}
# cpu_delta BEFORE AFTER: AFTER - BEFORE, two numbers of seconds
cpu_delta() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
# children_cpu FILE: user + system seconds of the finished children, from the output of `times` run in
# this shell (not in a subshell: a forked shell counts its own children only)
children_cpu() {
    awk 'NR == 2 { for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); t += a[1] * 60 + a[2] } } END { printf "%.2f", t }' "$1"
}

# The server of each kind for the current configuration (SPIDS: all its processes, one or three).
declare -A PID EP SPIDS

# start KIND CONFIG SCHEME EXTRA_FLAGS... : same flags for keyward and etcd
start() {
    local kind="$1" config="$2" scheme="$3"
    shift 3
    local port peer
    port="$(free_port)"
    peer="$(free_port)"
    launch "$kind" bench "$tmp/$config-$kind" "$scheme" "$port" "$peer" "bench=http://127.0.0.1:$peer" --bcrypt-cost 10 "$@"
    PID[$kind]=$LAUNCHED
    SPIDS[$kind]=$LAUNCHED
    EP[$kind]="$scheme://127.0.0.1:$port"
}

# wait_ready KIND CLIENT_FLAGS... : a range succeeds (auth is not enabled yet)
wait_ready() {
    local kind="$1"
    shift
    for _ in $(seq 100); do
        if "$KWB" --endpoints "${EP[$kind]}" "$@" --dial-timeout 1s range --total 1 > /dev/null 2>&1; then
            return 0
        fi
        kill -0 "${PID[$kind]}" 2>/dev/null || { tail -20 "$tmp"/*-"$kind".log >&2; die "$kind exited"; }
        sleep 0.2
    done
    die "$kind did not become ready at ${EP[$kind]}"
}

stop_all() {
    local config="$1"
    for kind in "${KINDS[@]}"; do
        local pid="${PID[$kind]}"
        # peak RSS, then what is resident at the end: anonymous (heap) and file-backed (mapped files)
        echo -e "$config\t$kind\t$(awk '/^(VmHWM|RssAnon|RssFile):/ {printf "%s\t", $2}' "/proc/$pid/status")" >> "$rss"
        kill "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
}

# start_cluster KIND CONFIG EXTRA_FLAGS... : three members of KIND (new cluster, all started at once);
# EP[KIND] lists the three client URLs, PID[KIND] is the first member (CPIDS[KIND] all three)
declare -A CPIDS
start_cluster() {
    local kind="$1" config="$2"
    shift 2
    local i
    plan_cluster 3
    CPIDS[$kind]=""
    for i in 1 2 3; do
        launch_member "$kind" "$i" "$tmp/$config-m$i-$kind" "bench-$kind" --bcrypt-cost 10 "$@"
        CPIDS[$kind]+="$LAUNCHED "
    done
    PID[$kind]="${CPIDS[$kind]%% *}"
    SPIDS[$kind]="${CPIDS[$kind]}"
    EP[$kind]="$CLUSTER_ENDPOINTS"
}

# stop_clusters CONFIG: records each cluster's memory (the sum over its members), then stops it
stop_clusters() {
    local config="$1"
    for kind in keyward etcd; do
        local pid sums
        # shellcheck disable=SC2086
        sums="$(for pid in ${CPIDS[$kind]}; do awk '/^(VmHWM|RssAnon|RssFile):/ {printf "%s ", $2}' "/proc/$pid/status"; echo; done \
            | awk '{ h += $1; a += $2; f += $3 } END { printf "%d\t%d\t%d\t", h, a, f }')"
        echo -e "$config\t$kind\t$sums" >> "$rss"
        for pid in ${CPIDS[$kind]}; do kill "$pid" 2>/dev/null; done
        for pid in ${CPIDS[$kind]}; do wait "$pid" 2>/dev/null; done
    done
}

# cell CONFIG CELL CLIENTS CONNS CLIENT_FLAGS... -- WORKLOAD ARGS... : run on keyward, then etcd
cell() {
    local config="$1" name="$2" clients="$3" conns="$4"
    shift 4
    local flags=()
    while [ "$1" != -- ]; do flags+=("$1"); shift; done
    shift
    # clientv3-load runs put, range and txn-put; keyward-bench the rest (watch, authenticate).
    local tool="$KWB" via=keyward-bench
    if [ "$LOAD" = go ] && [[ " put range txn-put " == *" $1 "* ]]; then
        tool="$GOLOAD" via=clientv3-load
    fi
    echo "$via" >> "$tmp/load-tools"
    for kind in "${KINDS[@]}"; do
        local json="$tmp/$config-$name-$kind.json" load server0 server1
        load="$(cut -d' ' -f1 /proc/loadavg)"
        # CPU seconds the servers and the load generator spent in the cell (the generator's from the
        # shell's own `times`, before and after it)
        # shellcheck disable=SC2086
        server0="$(cpu_seconds ${SPIDS[$kind]})"
        times > "$tmp/times0"
        if ! "$tool" --endpoints "${EP[$kind]}" "${flags[@]}" --clients "$clients" --conns "$conns" \
            --duration "$DURATION" "${SIZES[@]}" -w json "$@" > "$json" 2> "$json.err"; then
            echo "  $config $name $kind: FAILED: $(tail -1 "$json.err")" >&2
        fi
        times > "$tmp/times1"
        # shellcheck disable=SC2086
        server1="$(cpu_seconds ${SPIDS[$kind]})"
        echo -e "$config\t$name\t$kind\t$(cpu_delta "$server0" "$server1")\t$(cpu_delta "$(children_cpu "$tmp/times0")" "$(children_cpu "$tmp/times1")")\t$(jq -r '.ok // 0' "$json" 2>/dev/null || echo 0)" >> "$cpu"
        if [ -s "$json" ]; then
            jq -r --arg c "$config" --arg n "$name" --arg k "$kind" --arg l "$load" \
                '[$c, $n, $k, .throughput, .latency_us.p50, .latency_us.p90, .latency_us.p99, .latency_us.max, .ok, .errors, $l] | @tsv' \
                "$json" >> "$results"
            jq -r --arg c "$config" --arg n "$name" --arg k "$kind" \
                --arg v "$via" '"  \($c) \($n) \($k) (\($v)): \(.throughput | floor)/s p99 \(.latency_us.p99)us errors \(.errors) \(.error_kinds | keys | join("; "))"' \
                "$json" >&2
        else
            echo -e "$config\t$name\t$kind\t0\t0\t0\t0\t0\t0\t-1\t$load" >> "$results"
        fi
    done
}

# seed CLIENT_FLAGS... : the key the range cells read (index 0 of the key space) exists on both
seed() {
    for kind in "${KINDS[@]}"; do
        "$KWB" --endpoints "${EP[$kind]}" "$@" "${SHAPE[@]}" --key-space 1 put --total 1 > /dev/null \
            || die "seeding the range key on $kind failed"
    done
}

# standard_cells CONFIG CLIENT_FLAGS...
standard_cells() {
    local config="$1"
    shift
    seed "$@"
    cell "$config" put-c1 1 1 "$@" -- put
    cell "$config" put-c100 100 10 "$@" -- put
    cell "$config" range-l-c1 1 1 "$@" -- range --consistency l
    cell "$config" range-l-c100 100 10 "$@" -- range --consistency l
    cell "$config" txn-put-c100 100 10 "$@" -- txn-put
}

started_at=$(date +%s)

# --- local bcrypt capacity (the ceiling for Authenticate) -------------------------------------------
echo "bcrypt capacity at cost 10..." >&2
"$KWB" bcrypt --cost 10 --clients 1 --duration "$DURATION" -w json > "$tmp/bcrypt-1.json"
"$KWB" bcrypt --cost 10 --clients "$(nproc)" --duration "$DURATION" -w json > "$tmp/bcrypt-n.json"

# --- (a) no auth ----------------------------------------------------------------------------------
if want a; then
echo "(a) no auth" >&2
for kind in keyward etcd; do start "$kind" none http; done
for kind in keyward etcd; do wait_ready "$kind"; done
standard_cells none
cell none watch-c10 10 10 -- watch --streams 10 --watchers-per-stream 10
cell none watch-1000w-c10 10 10 -- watch --streams 10 --watchers-per-stream 100
if [ "${PROFILE:-0}" = 1 ] && perf stat -e task-clock true > /dev/null 2>&1; then
    # System-wide cpu-clock sampling (attaching with -p records nothing in some containers), then
    # only keyward's samples are reported.
    echo "  perf record (system-wide, keyward's samples reported) under put at 100 clients..." >&2
    perf record -e cpu-clock -F 499 -a --call-graph dwarf,16384 -o "$tmp/perf.data" -- sleep 5 > /dev/null 2>&1 &
    perf_pid=$!
    "$KWB" --endpoints "${EP[keyward]}" --clients 100 --conns 10 --duration 5s "${SIZES[@]}" put > "$tmp/perf-put.txt"
    wait "$perf_pid"
    perf report -i "$tmp/perf.data" --pid "${PID[keyward]}" --no-children --stdio --sort dso,symbol \
        --percent-limit 0.7 -g none 2> /dev/null | grep -E '^ +[0-9.]+%' | sed 's/ *$//' | cut -c1-160 | head -40 > "$tmp/perf-top.txt"
    perf report -i "$tmp/perf.data" --pid "${PID[keyward]}" --children --stdio --sort symbol \
        --percent-limit 3 -g none 2> /dev/null | grep -E '^ +[0-9.]+%' | grep -E 'keyward::|heed|mdb_|fdatasync|tonic|h2::|hyper' \
        | sed 's/ *$//' | cut -c1-200 | head -40 > "$tmp/perf-children.txt"
fi
stop_all none
fi

# --- (b/f), (e), (g) simple token -----------------------------------------------------------------
if want b; then
echo "(b/f, e, g) auth, simple token" >&2
for kind in keyward etcd; do start "$kind" simple http --auth-token simple; done
for kind in keyward etcd; do wait_ready "$kind"; done
for kind in keyward etcd; do
    "$KWB" --endpoints "${EP[$kind]}" --clients 20 --conns 2 --prefix "$PREFIX" setup-auth \
        --root-password rootpw --new-user bench1:pw1:0 --new-user "bench10k:pw10k:$PERMS" --enable \
        2> "$tmp/setup-simple-$kind.txt" || { cat "$tmp/setup-simple-$kind.txt" >&2; die "auth setup on $kind failed"; }
    sed "s/^/  $kind: /" "$tmp/setup-simple-$kind.txt" >&2
done
# The one-permission and the 10,000-permission user run the same cells on the same servers in ABBA
# order, each run half a cell long, and each user's two runs are averaged: the store grows and the
# machine drifts with every run, and ABBA cancels a linear drift, which would otherwise be charged to
# whichever user runs second (a plain A-then-B order showed differences of 10-25% either way).
one=(--user bench1 --password pw1)
many=(--user bench10k --password pw10k)
seed "${one[@]}"
paired() {
    local name="$1" clients="$2" conns="$3"
    shift 3
    local full="$DURATION"
    DURATION="$(half "$DURATION")"
    cell simple "$name~1" "$clients" "$conns" "${one[@]}" -- "$@"
    cell perms10k "$name~1" "$clients" "$conns" "${many[@]}" -- "$@"
    cell perms10k "$name~2" "$clients" "$conns" "${many[@]}" -- "$@"
    cell simple "$name~2" "$clients" "$conns" "${one[@]}" -- "$@"
    DURATION="$full"
}
paired put-c1 1 1 put
paired put-c100 100 10 put
paired range-l-c1 1 1 range --consistency l
paired range-l-c100 100 10 range --consistency l
paired txn-put-c100 100 10 txn-put
# bcrypt rates are low (tens per second): longer cells keep the count of completed calls meaningful.
DURATION="$AUTH_DURATION" cell simple authenticate-c1 1 1 "${one[@]}" -- authenticate
DURATION="$AUTH_DURATION" cell simple authenticate-c100 100 10 "${one[@]}" -- authenticate
stop_all simple
fi

# --- (c) JWT RS256 --------------------------------------------------------------------------------
mkdir -p "$tmp/jwt"
openssl genrsa -out "$tmp/jwt/priv.pem" 2048 2> /dev/null
openssl rsa -in "$tmp/jwt/priv.pem" -pubout -out "$tmp/jwt/pub.pem" 2> /dev/null
jwt="jwt,pub-key=$tmp/jwt/pub.pem,priv-key=$tmp/jwt/priv.pem,sign-method=RS256"
if want c; then
echo "(c) auth, JWT RS256" >&2
for kind in keyward etcd; do start "$kind" jwt http --auth-token "$jwt"; done
for kind in keyward etcd; do wait_ready "$kind"; done
for kind in keyward etcd; do
    "$KWB" --endpoints "${EP[$kind]}" --prefix "$PREFIX" setup-auth --root-password rootpw \
        --new-user bench1:pw1:0 --enable 2> /dev/null || die "auth setup on $kind failed"
done
standard_cells jwt --user bench1 --password pw1
stop_all jwt
fi

# --- (d) TLS with client-cert-auth, the CN is the user --------------------------------------------
if want d; then
echo "(d) TLS, client certificate CN" >&2
bash "$root/certs/gen.sh" "$tmp/pki" > /dev/null || die "certs/gen.sh failed"
pki="$tmp/pki"
for kind in keyward etcd; do
    start "$kind" tls https --cert-file "$pki/member1.pem" --key-file "$pki/member1-key.pem" \
        --trusted-ca-file "$pki/ca.pem" --client-cert-auth
done
as_root=(--cacert "$pki/ca.pem" --cert "$pki/root.pem" --key "$pki/root-key.pem")
as_alice=(--cacert "$pki/ca.pem" --cert "$pki/alice.pem" --key "$pki/alice-key.pem")
for kind in keyward etcd; do wait_ready "$kind" "${as_root[@]}"; done
for kind in keyward etcd; do
    "$KWB" --endpoints "${EP[$kind]}" "${as_root[@]}" --prefix "$PREFIX" setup-auth \
        --root-password rootpw --new-user alice:alicepw:0 --enable 2> /dev/null || die "auth setup on $kind failed"
done
standard_cells tls "${as_alice[@]}"
stop_all tls
fi

# leader_endpoint KIND CLIENT_FLAGS...: the client URL of KIND's cluster leader (`endpoint status`: the
# member whose id is the leader it reports), so that a 1-client cell measures the leader's own path, not
# a follower's forward. The flags (--user, --password) are etcdctl's too.
leader_endpoint() {
    local kind="$1" statuses
    shift
    statuses="$(ETCDCTL_API=3 etcdctl --endpoints "${EP[$kind]}" "$@" --dial-timeout 2s endpoint status -w json 2> /dev/null)" \
        || die "endpoint status on the $kind cluster failed"
    jq -r '[.[] | select(.Status.header.member_id == .Status.leader) | .Endpoint][0] // empty' <<< "$statuses"
}

# cluster_cells CONFIG CLIENT_FLAGS... : put at 1 client to the leader, put and linearizable range at 100
# clients spread over the three members
cluster_cells() {
    local config="$1" kind leader
    shift
    declare -A spread
    for kind in "${KINDS[@]}"; do
        spread[$kind]="${EP[$kind]}"
        leader="$(leader_endpoint "$kind" "$@")"
        [ -n "$leader" ] || die "no leader found in the $kind cluster"
        echo "  $config: the $kind leader is $leader" >&2
        EP[$kind]="$leader"
    done
    cell "$config" put-c1 1 1 "$@" -- put
    for kind in "${KINDS[@]}"; do EP[$kind]="${spread[$kind]}"; done
    cell "$config" put-c100 100 10 "$@" -- put
    cell "$config" range-l-c100 100 10 "$@" -- range --consistency l
}

# --- (h) 3-member clusters, auth with JWT RS256 ----------------------------------------------------
if want h; then
echo "(h) 3-member clusters, auth, JWT RS256" >&2
for kind in keyward etcd; do start_cluster "$kind" jwt-3m --auth-token "$jwt"; done
for kind in keyward etcd; do wait_ready "$kind"; done
for kind in keyward etcd; do
    "$KWB" --endpoints "${EP[$kind]}" --prefix "$PREFIX" setup-auth --root-password rootpw \
        --new-user bench1:pw1:0 --enable 2> /dev/null || die "auth setup on the $kind cluster failed"
done
cluster_user=(--user bench1 --password pw1)
seed "${cluster_user[@]}"
cluster_cells jwt-3m "${cluster_user[@]}"
stop_clusters jwt-3m
fi

# --- (j) 3-member clusters, no auth ----------------------------------------------------------------
if want j; then
echo "(j) 3-member clusters, no auth" >&2
for kind in keyward etcd; do start_cluster "$kind" none-3m; done
for kind in keyward etcd; do wait_ready "$kind"; done
seed
cluster_cells none-3m
stop_clusters none-3m
fi

# --- (i) the proxy's overhead: keyward direct vs through keyward grpc-proxy -------------------------
# One TLS member with --client-cert-auth trusting the proxy's certificate (the dev PKI's proxy.pem,
# CN=keyward-proxy, server and client); the proxy listens with it too, verifies alice's and forwards
# it. Each cell runs directly against the member ("keyward"), then through the proxy ("proxy"), as alice.
if want i; then
echo "(i) TLS, client certificate CN, through the proxy" >&2
[ -d "$tmp/pki" ] || bash "$root/certs/gen.sh" "$tmp/pki" > /dev/null || die "certs/gen.sh failed"
pki="$tmp/pki"
KINDS=(keyward)
start keyward proxied https --cert-file "$pki/member1.pem" --key-file "$pki/member1-key.pem" \
    --trusted-ca-file "$pki/ca.pem" --client-cert-auth --trusted-proxy-cn keyward-proxy
as_root=(--cacert "$pki/ca.pem" --cert "$pki/root.pem" --key "$pki/root-key.pem")
as_alice=(--cacert "$pki/ca.pem" --cert "$pki/alice.pem" --key "$pki/alice-key.pem")
wait_ready keyward "${as_root[@]}"
"$KWB" --endpoints "${EP[keyward]}" "${as_root[@]}" --prefix "$PREFIX" setup-auth \
    --root-password rootpw --new-user alice:alicepw:0 --enable 2> /dev/null || die "auth setup on keyward failed"
pport="$(free_port)"
"$KW" grpc-proxy start --endpoints "${EP[keyward]}" --listen-addr "127.0.0.1:$pport" \
    --cacert "$pki/ca.pem" --cert "$pki/proxy.pem" --key "$pki/proxy-key.pem" \
    --cert-file "$pki/proxy.pem" --key-file "$pki/proxy-key.pem" --trusted-ca-file "$pki/ca.pem" \
    --client-cert-auth > "$tmp/proxied-proxy.log" 2>&1 &
PID[proxy]=$!
pids+=("$!")
EP[proxy]="https://127.0.0.1:$pport"
KINDS=(proxy)
wait_ready proxy "${as_root[@]}"
KINDS=(keyward proxy)
seed "${as_alice[@]}"
cell proxied put-c1 1 1 "${as_alice[@]}" -- put
cell proxied put-c100 100 10 "${as_alice[@]}" -- put
cell proxied range-l-c1 1 1 "${as_alice[@]}" -- range --consistency l
cell proxied range-l-c100 100 10 "${as_alice[@]}" -- range --consistency l
stop_all proxied
KINDS=(keyward etcd)
fi

elapsed=$(( $(date +%s) - started_at ))

# The ABBA halves of a cell become one row: the mean of the two runs (throughput, percentiles, counts).
python3 - "$results" <<'PY'
import sys
path = sys.argv[1]
rows, halves, order = [], {}, []
for line in open(path):
    f = line.rstrip("\n").split("\t")
    if "~" in f[1]:
        key = (f[0], f[1].split("~")[0], f[2])
        if key not in halves:
            halves[key] = []
            order.append(key)
        halves[key].append(f)
    else:
        rows.append(f)
for key in order:
    runs = halves[key]
    mean = lambda i: sum(float(r[i]) for r in runs) / len(runs)
    total = lambda i: sum(int(float(r[i])) for r in runs)
    rows.append([*key, *(f"{mean(i):.1f}" for i in range(3, 8)), str(total(8)), str(total(9)), runs[0][10]])
with open(path, "w") as out:
    for r in rows:
        out.write("\t".join(r) + "\n")
PY

# --- report ---------------------------------------------------------------------------------------
{
    get() { awk -F'\t' -v c="$1" -v n="$2" -v k="$3" -v f="$4" '$1 == c && $2 == n && $3 == k { print $f }' "$results"; }
    # ran CONFIG CELL: the cell has numbers for both servers
    ran() { [ -n "$(get "$1" "$2" keyward 4)" ] && [ -n "$(get "$1" "$2" etcd 4)" ]; }
    echo "Produced by \`benches/compare.sh\` (DURATION=$DURATION per cell, PERMS=$PERMS) on $(date -u +%Y-%m-%d) in ${elapsed} s."
    echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'),"
    echo "$(awk '/MemTotal/ {printf "%.0f GiB RAM", $2/1048576}' /proc/meminfo); $("$ETCD" --version | head -1); keyward $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?') (+ working tree)."
    echo "Both servers and the client share the same cores; each cell runs on one server at a time (keyward first)."
    if [ "$LOAD" = go ] && grep -qx clientv3-load "$tmp/load-tools" 2>/dev/null; then
        echo "Load generator (LOAD=go): the put, range and txn-put cells ran \`clientv3-load\` (benches/clientv3-load: etcd 3.4's Go clientv3, $(go version | cut -d' ' -f3), one clientv3.Client per connection);"
        echo "the other cells (watch, Authenticate), seeding and auth setup ran \`keyward-bench\` (Rust, tonic)."
    else
        echo "Load generator (LOAD=rust): \`keyward-bench\` (Rust, tonic) for every cell."
    fi
    echo
    if want i; then
    echo "The proxy's overhead (i): the same keyward member directly and through \`keyward grpc-proxy\` forwarding alice's certificate (TLS on both hops)."
    echo
    echo "| cell | direct req/s | proxy req/s | proxy/direct | direct p50 / p99 ms | proxy p50 / p99 ms | p99 proxy/direct | errors direct / proxy |"
    echo "| --- | ---: | ---: | ---: | --- | --- | ---: | --- |"
    awk -F'\t' '
        function ms(us) { return sprintf("%.2f", us / 1000) }
        $1 != "proxied" { next }
        $3 == "keyward" { d[$2] = $0; order[++n] = $2 }
        $3 == "proxy" { p[$2] = $0 }
        END {
            for (i = 1; i <= n; i++) {
                split(d[order[i]], a, "\t"); split(p[order[i]], b, "\t")
                ratio = (a[4] > 0) ? sprintf("%.2f", b[4] / a[4]) : "n/a"
                p99 = (a[7] > 0) ? sprintf("%.2f", b[7] / a[7]) : "n/a"
                printf "| %s | %.0f | %.0f | %s | %s / %s | %s / %s | %s | %s / %s |\n",
                    order[i], a[4], b[4], ratio, ms(a[5]), ms(a[7]), ms(b[5]), ms(b[7]), p99, a[10], b[10]
            }
        }' "$results"
    awk -F'\t' '$1 == "proxied" && $2 == "proxy" { printf "\nProxy peak RSS (VmHWM): %.1f MiB; anon / file at the end %.1f / %.1f MiB.\n", $3 / 1024, $4 / 1024, $5 / 1024 }' "$rss"
    echo
    fi
    echo "| config | cell | keyward req/s | etcd req/s | ratio | keyward p50 / p90 / p99 / max ms | etcd p50 / p90 / p99 / max ms | p99 ratio | errors kw / etcd | load 1m kw / etcd |"
    echo "| --- | --- | ---: | ---: | ---: | --- | --- | ---: | --- | --- |"
    awk -F'\t' '
        function ms(us) { return sprintf("%.2f", us / 1000) }
        $1 == "proxied" { next }
        $3 == "keyward" { k[$1 SUBSEP $2] = $0; order[++n] = $1 SUBSEP $2 }
        $3 == "etcd" { e[$1 SUBSEP $2] = $0 }
        END {
            for (i = 1; i <= n; i++) {
                split(k[order[i]], a, "\t"); split(e[order[i]], b, "\t")
                ratio = (b[4] > 0) ? sprintf("%.2f", a[4] / b[4]) : "n/a"
                p99 = (b[7] > 0) ? sprintf("%.2f", a[7] / b[7]) : "n/a"
                printf "| %s | %s | %.0f | %.0f | %s | %s / %s / %s / %s | %s / %s / %s / %s | %s | %s / %s | %s / %s |\n",
                    a[1], a[2], a[4], b[4], ratio, ms(a[5]), ms(a[6]), ms(a[7]), ms(a[8]),
                    ms(b[5]), ms(b[6]), ms(b[7]), ms(b[8]), p99, a[10], b[10], a[11], b[11]
            }
        }' "$results"
    ran none watch-c10 && echo
    ran none watch-c10 && echo "The watch cells count events delivered (10 streams x 10 watchers, or x 100 = 1,000 watchers, on the prefix, while 10 clients put); their latency is put-send to event-receipt."
    echo
    echo "Peak RSS (VmHWM at the end of each configuration), and what was resident at that point: anonymous"
    echo "memory (heap) and file-backed pages (the memory-mapped database files: LMDB for keyward, bbolt for etcd)."
    echo "A 3-member configuration (-3m) counts its three members together."
    echo
    echo "| config | keyward peak MiB | etcd peak MiB | ratio | keyward anon / file MiB | etcd anon / file MiB | anon ratio |"
    echo "| --- | ---: | ---: | ---: | --- | --- | ---: |"
    awk -F'\t' '$1 == "proxied" { next }
        $2 == "keyward" { k[$1] = $3; ka[$1] = $4; kf[$1] = $5; order[++n] = $1 }
        $2 == "etcd" { e[$1] = $3; ea[$1] = $4; ef[$1] = $5 }
        END { for (i = 1; i <= n; i++) { c = order[i]; printf "| %s | %.1f | %.1f | %.2f | %.1f / %.1f | %.1f / %.1f | %.2f |\n",
            c, k[c] / 1024, e[c] / 1024, k[c] / e[c], ka[c] / 1024, kf[c] / 1024, ea[c] / 1024, ef[c] / 1024, ka[c] / ea[c] } }' "$rss"
    echo
    b1=$(jq .throughput "$tmp/bcrypt-1.json"); bn=$(jq .throughput "$tmp/bcrypt-n.json")
    echo "bcrypt cost 10 on this machine (\`keyward bench bcrypt\`, the bcrypt crate keyward uses): $b1 hashes/s on 1 thread, $bn hashes/s on $(nproc) threads; 1 thread x $(nproc) cores = $(echo "$b1 * $(nproc)" | bc -l | xargs printf '%.2f') hashes/s."
    echo
    echo "Targets:"
    echo
    verdict() { if [ "$(echo "$1" | bc -l)" = 1 ]; then echo met; else echo "NOT met"; fi; }
    for config in none-3m jwt-3m; do
        ran "$config" put-c1 || continue
        r=$(echo "$(get "$config" put-c1 keyward 4) / $(get "$config" put-c1 etcd 4)" | bc -l)
        p=$(echo "$(get "$config" put-c1 keyward 7) / $(get "$config" put-c1 etcd 7)" | bc -l)
        printf -- "- put, 1 client to the leader, %s: %.2fx (target >= 1.0: %s), p99 %.2fx (target <= 1.0: %s)\n" \
            "$config" "$r" "$(verdict "$r >= 1.0")" "$p" "$(verdict "$p <= 1.0")"
    done
    for config in jwt tls jwt-3m; do
        ran "$config" put-c100 || continue
        kt=$(get "$config" put-c100 keyward 4); et=$(get "$config" put-c100 etcd 4)
        kp=$(get "$config" put-c100 keyward 7); ep=$(get "$config" put-c100 etcd 7)
        r=$(echo "$kt / $et" | bc -l); p=$(echo "$kp / $ep" | bc -l)
        printf -- "- put, 100 clients, %s: throughput %.2fx (target >= 2.0: %s), p99 %.2fx (target <= 0.5: %s)\n" \
            "$config" "$r" "$(verdict "$r >= 2.0")" "$p" "$(verdict "$p <= 0.5")"
    done
    if ran none-3m put-c100; then
        r=$(echo "$(get none-3m put-c100 keyward 4) / $(get none-3m put-c100 etcd 4)" | bc -l)
        p=$(echo "$(get none-3m put-c100 keyward 7) / $(get none-3m put-c100 etcd 7)" | bc -l)
        printf -- "- put, 100 clients, none-3m: %.2fx (target >= 1.5: %s), p99 %.2fx (target <= 1.0: %s)\n" \
            "$r" "$(verdict "$r >= 1.5")" "$p" "$(verdict "$p <= 1.0")"
    fi
    for config in simple jwt tls none-3m jwt-3m; do
        ran "$config" range-l-c100 || continue
        r=$(echo "$(get "$config" range-l-c100 keyward 4) / $(get "$config" range-l-c100 etcd 4)" | bc -l)
        printf -- "- linearizable range, 100 clients, %s: %.2fx (target >= 1.5: %s)\n" "$config" "$r" "$(verdict "$r >= 1.5")"
    done
    for c in put-c1 put-c100 range-l-c1 range-l-c100 txn-put-c100; do
        [ -n "$(get perms10k "$c" keyward 4)" ] || continue
        r=$(echo "$(get perms10k "$c" keyward 4) / $(get simple "$c" keyward 4)" | bc -l)
        printf -- "- keyward %s, 10,000-permission user / one-permission user: %.3f (target >= 0.95: %s)\n" "$c" "$r" "$(verdict "$r >= 0.95")"
    done
    if ran simple authenticate-c100; then
        a=$(get simple authenticate-c100 keyward 4)
        r=$(echo "$a / $bn" | bc -l)
        r1=$(echo "$a / ($b1 * $(nproc))" | bc -l)
        printf -- "- Authenticate, 100 clients: keyward %.2f/s = %.3f of bcrypt on all %s cores measured in-process (target >= 0.95: %s); %.3f of 1-thread bcrypt x %s; etcd %.2f/s\n" \
            "$a" "$r" "$(nproc)" "$(verdict "$r >= 0.95")" "$r1" "$(nproc)" "$(get simple authenticate-c100 etcd 4)"
    fi
    worst=$(awk -F'\t' '$1 == "proxied" { next } $2 == "keyward" { k[$1] = $3 } $2 == "etcd" { e[$1] = $3 } END { m = 0; for (c in k) if (k[c] / e[c] > m) m = k[c] / e[c]; print m }' "$rss")
    printf -- "- peak RSS: worst keyward/etcd ratio over the configurations %.2f (target <= 0.5: %s)\n" "$worst" "$(verdict "$worst <= 0.5")"
    if [ -s "$cpu" ]; then
        echo
        echo "CPU per request (user + system time over the cell, all the servers' processes and threads; the"
        echo "client is the load generator; halves of an ABBA cell are listed apart):"
        echo
        echo "| configuration | cell | keyward server µs/req | etcd server µs/req | keyward/etcd | keyward client µs/req | etcd client µs/req |"
        echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
        awk -F'\t' '{ key = $1 "\t" $2; if (!(key in seen)) { seen[key] = 1; order[n++] = key }
                      if ($6 > 0) { s[key, $3] = $4 * 1e6 / $6; c[key, $3] = $5 * 1e6 / $6 } }
            END { for (i = 0; i < n; i++) { k = order[i]; split(k, f, "\t")
                      if (!((k, "keyward") in s) || !((k, "etcd") in s)) continue
                      printf "| %s | %s | %.0f | %.0f | %.2f | %.0f | %.0f |\n", f[1], f[2], s[k, "keyward"], s[k, "etcd"],
                          s[k, "keyward"] / s[k, "etcd"], c[k, "keyward"], c[k, "etcd"] } }' "$cpu"
    fi
    if [ -s "$tmp/perf-top.txt" ]; then
        echo
        echo "perf profile of keyward under put at 100 clients (self time, top symbols):"
        echo
        echo '```'
        cat "$tmp/perf-top.txt"
        echo '```'
        echo
        echo "Inclusive (children) time, top entries:"
        echo
        echo '```'
        cat "$tmp/perf-children.txt"
        echo '```'
    fi
} > "$tmp/report.md"
mkdir -p "$(dirname "$OUT")"
cp "$tmp/report.md" "$OUT"
cp "$results" "${OUT%.md}.tsv"
cat "$tmp/report.md"
echo "report written to $OUT" >&2
