#!/usr/bin/env python3
"""Measures the reference replica: wake (restore) and sleep (evict) times and scoring
throughput, over HTTP exactly as the worker drives it. Starts its own replica process.

    python3 bench.py [--vocab N] [--dim D] [--cycles 10] [--batch 64] [--batches 20]

Prints one JSON object, then a readable table. On a machine with torch and CUDA the replica
moves its weights to the GPU at wake; otherwise it rebuilds its working copy in host memory.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))


def call(port, method, path, body=None, timeout=600):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"{}")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round((len(xs) - 1) * q)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=1 << 20)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--cycles", type=int, default=10)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--batches", type=int, default=20)
    args = ap.parse_args()
    port = free_port()
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "replica.py"), "--service", "bench",
                             "--port", str(port), "--vocab", str(args.vocab), "--dim", str(args.dim)],
                            stdout=subprocess.PIPE, text=True)
    try:
        ready = json.loads(proc.stdout.readline())
        start_s = time.monotonic() - t0
        wakes, sleeps = [], []
        device = "none"
        for _ in range(args.cycles):
            w0 = time.monotonic()
            r = call(port, "POST", "/wake_up", {})
            wakes.append(time.monotonic() - w0)
            device = r.get("device", device)
            s0 = time.monotonic()
            call(port, "POST", "/sleep?level=1", {})
            sleeps.append(time.monotonic() - s0)
        call(port, "POST", "/wake_up", {})
        text = "def solve(xs):\n    return sorted(set(xs))[:3]  # a candidate solution to score"
        batch = [text + (" #%d" % i) for i in range(args.batch)]
        call(port, "POST", "/score", {"inputs": batch})  # warm-up
        b0 = time.monotonic()
        for _ in range(args.batches):
            r = call(port, "POST", "/score", {"inputs": batch})
            assert len(r["scores"]) == args.batch
        score_s = time.monotonic() - b0
        out = {
            "device": device,
            "cuda": ready.get("cuda"),
            "weights_mb": ready.get("weights_mb"),
            "start_s": start_s,
            "wake_ms": {"p50": 1e3 * statistics.median(wakes), "p99": 1e3 * pct(wakes, 0.99), "mean": 1e3 * statistics.mean(wakes)},
            "sleep_ms": {"p50": 1e3 * statistics.median(sleeps), "p99": 1e3 * pct(sleeps, 0.99), "mean": 1e3 * statistics.mean(sleeps)},
            "scores_per_s": args.batch * args.batches / score_s,
            "cycles": args.cycles,
            "batch": args.batch,
        }
        print(json.dumps(out))
        print("%-10s %10s %12s %12s %14s" % ("device", "weights", "wake p50", "sleep p50", "scores/s"))
        print("%-10s %8.0fMB %10.1fms %10.1fms %14.0f" % (device, out["weights_mb"], out["wake_ms"]["p50"],
                                                       out["sleep_ms"]["p50"], out["scores_per_s"]))
    finally:
        proc.kill()


if __name__ == "__main__":
    main()
