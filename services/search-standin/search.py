#!/usr/bin/env python3
"""A local stand-in for a web search API, for the local cluster and its demo workload.

It searches a small built-in corpus (notes on Python's standard library and testing) by
term overlap and answers JSON, under its own rate limit (a token bucket: 429 beyond it) and
with a bearer token check, the way a hosted search provider would.

    python3 search.py --port 8300 [--rate 50] [--burst 10] [--token SECRET] [--request-log F]

    GET /search?q=reverse+a+string&k=3  ->  {"query": ..., "hits": [{"title", "snippet", "score"}]}
    GET /health
"""

import argparse
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

CORPUS = [
    ("str slicing", "s[::-1] returns the string reversed; slicing never mutates the original string."),
    ("str.join", "''.join(parts) concatenates an iterable of strings efficiently; use it instead of += in loops."),
    ("collections.Counter", "Counter(iterable) counts hashable items; most_common(n) returns the n most frequent."),
    ("sorted", "sorted(iterable, key=None, reverse=False) returns a new sorted list; the sort is stable."),
    ("set", "set(iterable) removes duplicates; order is not preserved, use dict.fromkeys to keep order."),
    ("dict.fromkeys", "list(dict.fromkeys(xs)) removes duplicates while keeping first-seen order."),
    ("fibonacci", "Iterative Fibonacci: a, b = 0, 1; repeat n times: a, b = b, a + b; return a."),
    ("recursion limit", "Deep recursion raises RecursionError; prefer loops for long sequences."),
    ("str.isalnum", "c.isalnum() is True for letters and digits; filter with it to ignore punctuation."),
    ("palindrome", "A palindrome reads the same backwards: compare a cleaned lower-case string with its reverse."),
    ("str.lower", "s.lower() returns a lower-case copy; casefold() is stronger for caseless matching."),
    ("unittest", "unittest.TestCase methods named test_* run under python -m unittest; assertEqual compares values."),
    ("assertEqual", "self.assertEqual(first, second) fails with a diff when the values differ."),
    ("prime numbers", "Trial division up to the square root: n is prime if no d in 2..isqrt(n) divides it."),
    ("math.isqrt", "math.isqrt(n) returns the integer square root, exact for large integers."),
    ("word frequency", "Split text with str.split() or re.findall(r'\\w+'), lower-case, then count with Counter."),
    ("re.findall", "re.findall(pattern, s) returns all non-overlapping matches as a list of strings."),
    ("list comprehension", "[f(x) for x in xs if cond(x)] builds a list; it is usually faster than a for-append loop."),
    ("enumerate", "enumerate(xs, start=0) yields (index, item) pairs."),
    ("zip", "zip(a, b) pairs items; it stops at the shorter input unless strict=True is given."),
]

WORD = re.compile(r"[a-z0-9]+")


def terms(s):
    return set(WORD.findall(s.lower()))


INDEX = [(t, snip, terms(t + " " + snip)) for t, snip in CORPUS]


class Bucket:
    def __init__(self, rate, burst):
        self.rate, self.burst, self.tokens, self.at = rate, burst, burst, time.monotonic()
        self.lock = threading.Lock()

    def take(self):
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
            self.at = now
            if self.tokens >= 1:
                self.tokens -= 1
                return True
            return False


def make_handler(bucket, token, stats, request_log=None):
    log_lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Keep-alive clients must not wait on Nagle's algorithm: a response written as headers
        # then body sat ~40 ms behind the client's delayed ACK. Each response leaves in one write
        # (buffered, flushed once the handler returns), and TCP_NODELAY covers larger bodies.
        disable_nagle_algorithm = True
        wbufsize = 1 << 16

        def log_message(self, fmt, *args):
            pass

        def reply(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if code == 429:
                self.send_header("Retry-After", "1")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            url = urlparse(self.path)
            if url.path == "/health":
                self.reply(200, {"status": "ok", **stats})
                return
            if url.path != "/search":
                self.reply(404, {"error": "no such endpoint"})
                return
            if token and self.headers.get("Authorization") != "Bearer " + token:
                stats["unauthorized"] += 1
                self.reply(401, {"error": "missing or wrong API key"})
                return
            if not bucket.take():
                stats["rate_limited"] += 1
                self.reply(429, {"error": "rate limit exceeded"})
                return
            q = parse_qs(url.query)
            query = (q.get("q") or [""])[0]
            k = max(1, min(10, int((q.get("k") or ["3"])[0])))
            want = terms(query)
            scored = sorted(((len(want & ts) / (len(ts) ** 0.5), t, s) for t, s, ts in INDEX), reverse=True)
            hits = [{"title": t, "snippet": s, "score": round(sc, 4)} for sc, t, s in scored[:k] if sc > 0]
            stats["served"] += 1
            if request_log:
                # One line per served request (its target): the fault suite counts effects.
                with log_lock, open(request_log, "a") as f:
                    f.write(self.path + "\n")
            self.reply(200, {"query": query, "hits": hits})

    return Handler


def main():
    ap = argparse.ArgumentParser(description="local search API stand-in")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--burst", type=float, default=10.0)
    ap.add_argument("--token", default="")
    ap.add_argument("--token-file", help="read the bearer token from this file instead")
    ap.add_argument("--request-log", help="append every served request's target to this file (tests)")
    args = ap.parse_args()
    stats = {"served": 0, "rate_limited": 0, "unauthorized": 0}
    token = args.token
    if args.token_file:
        with open(args.token_file) as f:
            token = f.read().strip()
    handler = make_handler(Bucket(args.rate, args.burst), token, stats, args.request_log)
    server = ThreadingHTTPServer((args.host, args.port), handler)
    server.daemon_threads = True
    print(json.dumps({"event": "ready", "port": server.server_address[1]}), flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
