#!/usr/bin/env bash
# Runs Kubernetes' own storage tests (k8s.io/apiserver's pkg/storage/etcd3, pinned below) against
# keyward and against etcd 3.4.23, each as Kubernetes deploys it: client mTLS, auth enabled, the
# client the certificate user kube-apiserver with readwrite on the tests' keys only.
#
#   bash tests/kubernetes/run.sh            # every test, on each configuration in CONFIGS
#   bash tests/kubernetes/run.sh --small    # the set tests/run-all.sh runs (SMALL_SET below)
#
# CONFIGS (default "etcd:1 keyward:1 keyward:3 etcd:3") is a list of server:members; the first is the
# reference: the script fails if another configuration fails a test the reference passed (given one
# configuration only, or --small, if any configuration fails any test).
# KEYWARD_BIN (default target/debug/keyward, built if missing) and ETCD_BIN (default /usr/bin/etcd)
# name the binaries. Results land in target/kubernetes/results-<server>-<members>.json.
#
# How the upstream tests reach this module: the module k8s.io/apiserver is downloaded by `go mod
# download` (checked against the checksum pinned here), copied to target/kubernetes/apiserver, and
# its pkg/storage/etcd3/testserver package replaced by ./testserver; go.mod's replace directive
# points at that copy. The copy is checked to be byte-for-byte the module except that package.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work="$root/target/kubernetes"

APISERVER=k8s.io/apiserver
APISERVER_VERSION=v0.37.2
APISERVER_SUM="h1:9Jq73PeHAA0RThpW7ou6lBcO2+SxLcPrAgleONSMUNQ="
TESTSERVER=pkg/storage/etcd3/testserver

# The small set: tests of each area the issue names (store, watch, compaction, leases, lease
# manager, health check, paginated and compacted lists), about a minute per configuration on 2 busy
# cores. TestWatch's RangeStream=true half repeats its other half through etcd 3.7's RangeStream,
# which neither server has (both fall back to paginated ranges).
SMALL_SET='^(TestCreate|TestCreateWithTTL|TestGet|TestGuaranteedUpdate|TestConditionalDelete|TestListContinuation|TestListInconsistentContinuation|TestConsistentList|TestCompact|TestCompactConflict|TestLeaseMaxObjectCount|TestGetReuseDurationSeconds|TestEtcdHealthCheck|TestLinearizedReadRevisionInvariant|TestWatch)$'
SMALL_SKIP='^TestWatch$/^RangeStream=true$'

run_pattern='.'
skip_pattern='^$'
strict=""
if [ "${1:-}" = "--small" ]; then
    run_pattern="$SMALL_SET"
    skip_pattern="$SMALL_SKIP"
    # etcd 3.4.23 passes the whole small set: every configuration must, with or without etcd beside it.
    strict="-strict"
fi
CONFIGS="${CONFIGS:-etcd:1 keyward:1 keyward:3 etcd:3}"
export ETCD_BIN="${ETCD_BIN:-/usr/bin/etcd}"
if [ -z "${KEYWARD_BIN:-}" ]; then
    KEYWARD_BIN="$root/target/debug/keyward"
    [ -x "$KEYWARD_BIN" ] || (cd "$root" && cargo build --bin keyward)
fi
export KEYWARD_BIN

mkdir -p "$work"
cd "$here"

# 1. The pinned module, verified: go checks the download against go.sum's checksum database entry;
#    this checks it is the version whose checksum is pinned here.
download=$(go mod download -json "$APISERVER@$APISERVER_VERSION")
module_dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' <<<"$download")
module_sum=$(sed -n 's/^[[:space:]]*"Sum": "\(.*\)",$/\1/p' <<<"$download")
if [ "$module_sum" != "$APISERVER_SUM" ]; then
    echo "run.sh: $APISERVER@$APISERVER_VERSION has checksum '$module_sum', pinned '$APISERVER_SUM'" >&2
    exit 1
fi

# 2. The copy, with only the test server swapped.
copy="$work/apiserver"
rm -rf "$copy"
cp -r "$module_dir" "$copy"
chmod -R u+w "$copy"
rm -f "$copy/$TESTSERVER"/*.go
cp testserver/*.go "$copy/$TESTSERVER/"
rm -f "$copy/$TESTSERVER"/*_test.go
# The package swapped must still be the one file this swap replaces, and nothing else may differ
# (`--exclude` names the module's only directory called testserver).
if [ "$(ls "$module_dir/$TESTSERVER")" != "test_server.go" ] \
    || ! diff -r -q --exclude=testserver "$module_dir" "$copy"; then
    echo "run.sh: the copy of $APISERVER differs from the module beyond $TESTSERVER" >&2
    exit 1
fi

# 3. One test binary for every configuration (go fetches any missing module first).
go mod download
go test -c -o "$work/etcd3.test" "$APISERVER/pkg/storage/etcd3"
go build -o "$work/tally" ./tally
go test -count=1 ./testserver ./tally   # the harness's own tests

# 4. Each configuration, run from the package's directory as `go test` would.
results=()
for config in $CONFIGS; do
    server=${config%%:*}
    members=${config##*:}
    out="$work/results-$server-$members.json"
    echo "== $APISERVER $APISERVER_VERSION pkg/storage/etcd3 against $server, $members member(s)"
    start=$(date +%s)
    (cd "$copy/pkg/storage/etcd3" && SERVER=$server MEMBERS=$members \
        go tool test2json -t "$work/etcd3.test" -test.v=test2json -test.run "$run_pattern" -test.skip "$skip_pattern" -test.timeout 90m \
        >"$out" 2>&1) || true
    echo "   $(( $(date +%s) - start )) s"
    results+=("$server:$members=$out")
done
"$work/tally" $strict "${results[@]}"
