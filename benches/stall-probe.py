#!/usr/bin/env python3
"""Longest client stall: a linearizable get and a put, each every 100 ms on its own kept-alive
connection (etcd's JSON gateway, `/v3/kv/range` and `/v3/kv/put`, which keyward and etcd 3.4 both
serve on the client port), until SIGTERM/SIGINT or --duration. Prints, per operation, the number of
probes, errors, the longest latency and when it started (seconds since the probe started, and
UNIX time), and every probe slower than --report-over as it happens.

Usage: benches/stall-probe.py --endpoint 127.0.0.1:2379 [--interval 0.1] [--duration 60]
       [--report-over 0.2] [--key stall-probe]
"""

import argparse
import base64
import http.client
import json
import signal
import sys
import threading
import time


def b64(s):
    return base64.b64encode(s.encode()).decode()


class Probe:
    def __init__(self, name, endpoint, path, body, interval, report_over, start):
        self.name, self.endpoint, self.path, self.body = name, endpoint, path, body
        self.interval, self.report_over, self.start = interval, report_over, start
        self.count = self.errors = 0
        self.longest = (0.0, 0.0)  # (latency, when it started: seconds since the probe started)
        self.conn = None

    def once(self):
        if self.conn is None:
            host, port = self.endpoint.rsplit(":", 1)
            self.conn = http.client.HTTPConnection(host, int(port), timeout=30)
        self.conn.request("POST", self.path, body=self.body, headers={"Content-Type": "application/json"})
        resp = self.conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {data[:200]!r}")

    def run(self, stop):
        next_at = time.monotonic()
        while not stop.is_set():
            began = time.monotonic()
            try:
                self.once()
            except Exception as e:  # noqa: BLE001 - any failure counts, the connection is redone
                self.errors += 1
                print(f"{self.name}: error at {began - self.start:.2f}s: {e}", file=sys.stderr, flush=True)
                self.conn = None
            took = time.monotonic() - began
            self.count += 1
            if took > self.longest[0]:
                self.longest = (took, began - self.start)
            if took > self.report_over:
                print(f"{self.name}: {took * 1000:.0f} ms at {began - self.start:.2f}s (unix {time.time() - took:.2f})",
                      flush=True)
            next_at += self.interval
            pause = next_at - time.monotonic()
            if pause > 0:
                stop.wait(pause)
            else:
                next_at = time.monotonic()  # a stalled probe does not fire a burst after it


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", default="127.0.0.1:2379")
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--duration", type=float, default=0)
    parser.add_argument("--report-over", type=float, default=0.2)
    parser.add_argument("--key", default="stall-probe")
    args = parser.parse_args()

    start = time.monotonic()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    get = Probe("get", args.endpoint, "/v3/kv/range", json.dumps({"key": b64(args.key)}), args.interval,
                args.report_over, start)
    put = Probe("put", args.endpoint, "/v3/kv/put", json.dumps({"key": b64(args.key), "value": b64("x" * 100)}),
                args.interval, args.report_over, start)
    threads = [threading.Thread(target=p.run, args=(stop,), daemon=True) for p in (get, put)]
    for t in threads:
        t.start()
    if args.duration > 0:
        stop.wait(args.duration)
        stop.set()
    while not stop.is_set():
        stop.wait(0.5)
    for t in threads:
        t.join(timeout=35)
    for p in (get, put):
        print(f"{p.name}: {p.count} probes, {p.errors} errors, longest {p.longest[0] * 1000:.0f} ms "
              f"at {p.longest[1]:.2f}s", flush=True)


if __name__ == "__main__":
    main()
