#!/usr/bin/env python3
"""What happened around each long client wait: for every probe wait of at least --over ms (from
`keyward-bench -w json probe`), grouped when they overlap, the window from when the request was due
to when it was answered, with what `io-sampler.py` saw meanwhile (differences of its counters over
the window, the largest gauges) and the server's log lines timestamped in it (keyward's
`keyward::slow` lines: WAL syncs, applied batches, gate waits, compaction steps; snapshots).

Usage: benches/lib/stall-attribution.py --probe PROBE.json --samples SAMPLES --log LOG [--over 100]
"""

import argparse
import datetime
import json
import re

ANSI = re.compile(r"\x1b\[[0-9;]*m")
STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)Z")
ETCD_STAMP = re.compile(r'"ts":"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)Z"')


def stamp(line):
    m = STAMP.match(line) or ETCD_STAMP.search(line)
    if not m:
        return None
    return datetime.datetime.fromisoformat(m.group(1)).replace(tzinfo=datetime.timezone.utc).timestamp()


def waits(probe, over):
    started = probe["started_unix_s"]
    out = []
    for op in ("get", "put"):
        slow = list(probe[op]["slow"])
        # The longest is always known, even where a probe listed only its first slow waits.
        worst = {"due_s": probe[op]["worst_due_s"], "wait_ms": probe[op]["max_ms"]}
        if not any(abs(w["due_s"] - worst["due_s"]) < 1e-6 for w in slow):
            slow.append(worst)
        for w in slow:
            if w["wait_ms"] >= over:
                due = started + w["due_s"]
                out.append((due, due + w["wait_ms"] / 1000, op, w["wait_ms"], w["due_s"]))
    out.sort()
    groups = []
    for w in out:
        if groups and w[0] <= groups[-1][-1][1]:
            groups[-1].append(w)
        else:
            groups.append([w])
    return groups


def load_samples(path):
    with open(path) as f:
        head = f.readline().split()
        rows = [dict(zip(head, (float(x) for x in line.split()))) for line in f if line.strip()]
    return rows


def verdict(rows, begin, end, builds):
    """The window's likely cause, from the samples: what a reader checks first."""
    inside = [r for r in rows if begin <= r["unix"] <= end]
    before = [r for r in rows if r["unix"] < begin]
    causes = []
    if any(b0 <= end and begin <= b1 for b0, b1 in builds):
        causes.append("snapshot build")
    if not inside or not before:
        return causes or ["no samples"]
    a, z = before[-1], inside[-1]
    span = (z["unix"] - a["unix"]) * 1e3
    # The server's own threads waiting in the run queue (not the machine's PSI, which some process
    # always adds to on a busy machine): as long as the window in all, the request's path was queued.
    waited = sum(z.get(k, 0) - a.get(k, 0) for k in z if k.endswith("_wait")) / 1e6
    if waited >= span:
        causes.append(f"cpu starved (server threads waited {waited:.0f} ms for a CPU in {span:.0f} ms)")
    if max(r["wb_kb"] for r in inside) >= 10240:
        own = max(r["kv_wb"] + r["kv_dirty"] for r in inside) * 4 / 1024
        causes.append(f"write-back of {max(r['wb_kb'] for r in inside) / 1024:.0f} MB (kv file: {own:.1f} MB)")
    return causes or ["none of these"]


def summary(rows, begin, end):
    inside = [r for r in rows if begin <= r["unix"] <= end]
    before = [r for r in rows if r["unix"] < begin]
    if not inside or not before:
        return "  (no samples)"
    a, z = before[-1], inside[-1]

    def d(k, scale=1.0):
        return (z.get(k, 0) - a.get(k, 0)) * scale

    threads = " ".join(
        f"{g} run {d(g + '_run', 1e-6):.0f}/wait {d(g + '_wait', 1e-6):.0f} ms"
        for g in ("raft", "raft-blocking", "raft-log-writer", "kv-writeback", "other"))
    return (
        f"  machine: sampler lag max {max(r['lag_ms'] for r in inside):.0f} ms; Dirty {min(r['dirty_kb'] for r in inside) / 1024:.0f}"
        f"-{max(r['dirty_kb'] for r in inside) / 1024:.0f} MB, Writeback max {max(r['wb_kb'] for r in inside) / 1024:.0f} MB;"
        f" disk written {d('wsect', 512 / 1e6):.1f} MB, write ticks {d('wticks'):.0f} ms, in flight max"
        f" {max(r['inflight'] for r in inside):.0f}, flushes {d('flushes'):.0f}; PSI cpu {d('psi_cpu', 1e-3):.0f} ms,"
        f" io {d('psi_io', 1e-3):.0f} ms (full {d('psi_io_full', 1e-3):.0f})\n"
        f"  server files: kv dirty max {max(r['kv_dirty'] for r in inside):.0f} pages, under write-back max"
        f" {max(r['kv_wb'] for r in inside):.0f}; log dirty max {max(r['log_dirty'] for r in inside):.0f}, under write-back max"
        f" {max(r['log_wb'] for r in inside):.0f}\n"
        f"  server threads (ns on CPU / waiting for one, as ms): {threads}"
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", required=True)
    ap.add_argument("--samples", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--over", type=float, default=100)
    a = ap.parse_args()
    with open(a.probe) as f:
        probe = json.load(f)
    rows = load_samples(a.samples)
    with open(a.log, errors="replace") as f:
        lines = [(stamp(ANSI.sub("", line)), ANSI.sub("", line).rstrip()) for line in f]
    lines = [(t, line) for t, line in lines if t is not None]
    groups = waits(probe, a.over)
    # keyward's "snapshot built" lines end a build of total_ms: the window it ran in.
    builds = []
    for t, line in lines:
        m = re.search(r"snapshot built .*total_ms=(\d+)", line)
        if m:
            builds.append((t - int(m.group(1)) / 1e3, t))
    print(f"{len(groups)} windows with a wait >= {a.over:.0f} ms; {len(builds)} snapshot builds")
    tally = {}
    for g in groups:
        begin, end = g[0][0], max(w[1] for w in g)
        said = ", ".join(f"{op} {ms:.0f} ms due {due_s:.2f} s" for _, _, op, ms, due_s in g)
        print(f"window {datetime.datetime.fromtimestamp(begin, datetime.timezone.utc):%H:%M:%S.%f}"[:-3]
              + f" +{(end - begin) * 1000:.0f} ms: {said}")
        causes = verdict(rows, begin, end, builds)
        for c in causes:
            key = c.split(" of ")[0].split(" (")[0]
            tally[key] = tally.get(key, 0) + 1
        print("  likely: " + "; ".join(causes))
        print(summary(rows, begin, end))
        for t, line in lines:
            if begin - 0.05 <= t <= end + 0.02:
                print("  log: " + line[:230])
    print("windows by likely cause (one window may count under several): "
          + ", ".join(f"{k} {v}" for k, v in sorted(tally.items())))


if __name__ == "__main__":
    main()
