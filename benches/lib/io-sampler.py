#!/usr/bin/env python3
"""What the machine and one server process were doing, every --every (default 50 ms), to match a
client's stall with its cause by time: one tab-separated line per sample, counters as they are
(cumulative; take differences between lines), the header first.

Columns: unix time; lag_ms (how late this sample was taken: the sampler itself got no turn, so the
whole machine was short of CPU); /proc/meminfo Dirty and Writeback (kB); /sys/block/DEV/stat sectors
written, write ticks (ms), requests in flight, flush requests; PSI totals (µs) of cpu some, io some,
io full; pages of the server's kv file (`member/kv/data.mdb`) and of its raft log (every file under
`member/wal`, or etcd's `member/wal` and `member/snap/db`) dirty and under write-back (`cachestat`,
Linux 6.5+, -1 without); and per thread group of the process (`raft`, `raft-blocking` (apply and
snapshot builds), `raft-log-writer`, `kv-writeback`, everything else as `other`) the ns run on a CPU and the ns waited for one
(`/proc/PID/task/*/schedstat`).

Usage: benches/lib/io-sampler.py --pid PID --data-dir DIR [--every 0.05] [--device vda]
Runs until the process exits or SIGTERM.
"""

import argparse
import ctypes
import os
import signal
import struct
import sys
import time

SYS_CACHESTAT = 451
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
GROUPS = ("raft", "raft-blocking", "raft-log-writer", "kv-writeback", "other")


def cachestat(path):
    """(dirty, writeback) pages of the file at `path`, or (-1, -1)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return (-1, -1)
    try:
        rng = ctypes.create_string_buffer(struct.pack("QQ", 0, 0))
        out = ctypes.create_string_buffer(40)
        if libc.syscall(SYS_CACHESTAT, fd, rng, out, 0) != 0:
            return (-1, -1)
        _cache, dirty, writeback, _ev, _rev = struct.unpack("QQQQQ", out.raw)
        return (dirty, writeback)
    finally:
        os.close(fd)


def files(data_dir):
    """(kv file, log files) of a keyward or etcd data dir."""
    member = os.path.join(data_dir, "member")
    kv = os.path.join(member, "kv", "data.mdb")
    if not os.path.exists(kv):
        kv = os.path.join(member, "snap", "db")  # etcd's bbolt file
    wal = os.path.join(member, "wal")
    logs = [os.path.join(wal, f) for f in sorted(os.listdir(wal))] if os.path.isdir(wal) else []
    return kv, logs


def meminfo():
    got = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            if k in ("Dirty", "Writeback"):
                got[k] = int(v.split()[0])
    return got.get("Dirty", -1), got.get("Writeback", -1)


def disk(device):
    with open(f"/sys/block/{device}/stat") as f:
        s = [int(x) for x in f.read().split()]
    # fields: 4 write I/Os, 5 merges, 6 sectors, 7 ticks; 8 in flight; 14 flush I/Os
    return s[6], s[7], s[8], (s[15] if len(s) > 15 else -1)


def psi(kind):
    try:
        with open(f"/proc/pressure/{kind}") as f:
            lines = f.read().split("\n")
    except OSError:
        return -1, -1
    tot = [int(line.rsplit("total=", 1)[1]) for line in lines if "total=" in line]
    return tot[0], (tot[1] if len(tot) > 1 else -1)


def threads(pid):
    run = dict.fromkeys(GROUPS, 0)
    wait = dict.fromkeys(GROUPS, 0)
    base = f"/proc/{pid}/task"
    for tid in os.listdir(base):
        try:
            with open(f"{base}/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"{base}/{tid}/schedstat") as f:
                r, w, _ = (int(x) for x in f.read().split())
        except OSError:
            continue
        g = name if name in GROUPS else "other"
        run[g] += r
        wait[g] += w
    return run, wait


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--every", type=float, default=0.05)
    ap.add_argument("--device", default="vda")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    cols = ["unix", "lag_ms", "dirty_kb", "wb_kb", "wsect", "wticks", "inflight", "flushes",
            "psi_cpu", "psi_io", "psi_io_full", "kv_dirty", "kv_wb", "log_dirty", "log_wb"]
    cols += [f"{g}_{k}" for g in GROUPS for k in ("run", "wait")]
    print("\t".join(cols), flush=True)
    due = time.monotonic()
    while os.path.exists(f"/proc/{a.pid}"):
        lag = (time.monotonic() - due) * 1000
        kv, logs = files(a.data_dir)
        kvd = cachestat(kv)
        logd = [cachestat(p) for p in logs]
        ld = sum(x[0] for x in logd if x[0] >= 0) if logd else -1
        lw = sum(x[1] for x in logd if x[1] >= 0) if logd else -1
        try:
            run, wait = threads(a.pid)
        except OSError:
            break
        row = [f"{time.time():.3f}", f"{lag:.0f}", *meminfo(), *disk(a.device), *psi("cpu")[:1], *psi("io"),
               *kvd, ld, lw]
        row += [v for g in GROUPS for v in (run[g], wait[g])]
        print("\t".join(str(x) for x in row), flush=True)
        due += a.every
        time.sleep(max(0.0, due - time.monotonic()))


if __name__ == "__main__":
    main()
