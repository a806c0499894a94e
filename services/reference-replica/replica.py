#!/usr/bin/env python3
"""Tangram's reference model replica.

A small HTTP server that speaks the same sleep/wake contract as vLLM's sleep mode
(POST /sleep?level=1, POST /wake_up, GET /is_sleeping) plus a scoring endpoint, backed by a
real (small) scoring model: hashed word and character n-gram features, an embedding table and
a two-layer head, with weights drawn from a seed derived from the service name, so that every
service scores differently and every replica of one service scores identically.

The weights always live in host memory (one packed float32 buffer). Waking builds the working
copy from it: with torch and CUDA present, the weights move onto the GPU; otherwise the
working copy is rebuilt in host memory. Sleeping drops the working copy (and frees GPU
memory). Only the Python standard library is needed; torch is used when importable.

    python3 replica.py --service judge --port 8100 [--vocab 65536] [--dim 32] [--awake]

Endpoints:
    GET  /health       {"status": "ok", "service": ..., "sleeping": bool, "device": ...}
    GET  /is_sleeping  {"is_sleeping": bool}
    POST /sleep        drop the working copy (query level=1 accepted, as vLLM)
    POST /wake_up      rebuild the working copy from the host copy
    POST /score        {"inputs": ["text", ...]} -> {"scores": [float, ...], "device": ...}
                       409 while asleep
"""

import argparse
import array
import json
import math
import os
import random
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

try:  # optional: GPU residency
    import torch  # type: ignore

    HAVE_CUDA = torch.cuda.is_available()
except Exception:  # noqa: BLE001 - any import failure means CPU only
    torch = None
    HAVE_CUDA = False


class Model:
    """Hashed n-gram embedding bag -> tanh layer -> linear score."""

    def __init__(self, service: str, vocab: int, dim: int):
        self.vocab, self.dim = vocab, dim
        seed = zlib.crc32(service.encode())
        n = vocab * dim + dim * dim + dim
        scale_h = 1.0 / math.sqrt(dim)
        if HAVE_CUDA:
            # The host copy is a pinned tensor, so that a restore is one DMA transfer.
            g = torch.Generator().manual_seed(seed)
            host = torch.randn(n, generator=g, dtype=torch.float32)
            host[vocab * dim :] *= scale_h
            self.host = host.pin_memory()
            self.host_mb = n * 4 / 2**20
        else:
            rng = random.Random(seed)
            host = array.array("f", (rng.gauss(0.0, 1.0) for _ in range(vocab * dim)))
            host.extend(rng.gauss(0.0, scale_h) for _ in range(dim * dim + dim))
            assert len(host) == n
            self.host = host.tobytes()  # the host-memory copy; never dropped
            self.host_mb = len(self.host) / 2**20
        self.work = None  # the working copy: array('f') on CPU, tensors on CUDA
        self.device = "none"
        self.lock = threading.Lock()

    @property
    def sleeping(self) -> bool:
        return self.work is None

    def wake(self) -> float:
        t0 = time.monotonic()
        with self.lock:
            if self.work is None:
                if HAVE_CUDA:
                    flat = self.host.to("cuda", non_blocking=True)
                    v, d = self.vocab, self.dim
                    self.work = (
                        flat[: v * d].view(v, d),
                        flat[v * d : v * d + d * d].view(d, d),
                        flat[v * d + d * d :],
                    )
                    torch.cuda.synchronize()
                    self.device = "cuda:%d" % torch.cuda.current_device()
                else:
                    self.work = array.array("f")
                    self.work.frombytes(self.host)
                    self.device = "cpu"
        return time.monotonic() - t0

    def sleep(self) -> float:
        t0 = time.monotonic()
        with self.lock:
            self.work = None
            self.device = "none"
            if HAVE_CUDA:
                torch.cuda.empty_cache()
        return time.monotonic() - t0

    def features(self, text: str):
        words = text.lower().split()
        feats = [zlib.crc32(b"w:" + w.encode()) for w in words]
        feats += [zlib.crc32(("b:%s %s" % p).encode()) for p in zip(words, words[1:])]
        s = text.lower()
        feats += [zlib.crc32(b"c:" + s[i : i + 3].encode()) for i in range(max(0, len(s) - 2))]
        return [f % self.vocab for f in feats] or [0]

    def score(self, inputs):
        work = self.work
        if work is None:
            raise RuntimeError("asleep")
        d = self.dim
        if HAVE_CUDA and not isinstance(work, array.array):
            emb, w1, w2 = work
            out = []
            for text in inputs:
                idx = torch.tensor(self.features(text), device=emb.device)
                x = emb.index_select(0, idx).mean(0)
                h = torch.tanh(w1 @ x)
                out.append(float(w2 @ h))
            return out
        v = self.vocab
        w1_off, w2_off = v * d, v * d + d * d
        out = []
        for text in inputs:
            feats = self.features(text)
            x = [0.0] * d
            for f in feats:
                base = f * d
                for j in range(d):
                    x[j] += work[base + j]
            inv = 1.0 / len(feats)
            x = [xi * inv for xi in x]
            total = 0.0
            for i in range(d):
                row = w1_off + i * d
                acc = 0.0
                for j in range(d):
                    acc += work[row + j] * x[j]
                total += work[w2_off + i] * math.tanh(acc)
            out.append(total)
        return out


def make_handler(model: Model, service: str, request_log=None, exit_after_scores=None):
    scored = [0]  # requests scored so far, for --exit-after-scores

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Keep-alive clients must not wait on Nagle's algorithm: a response written as headers
        # then body sat ~40 ms behind the client's delayed ACK. Each response leaves in one write
        # (buffered, flushed once the handler returns), and TCP_NODELAY covers larger bodies.
        disable_nagle_algorithm = True
        wbufsize = 1 << 16

        def log_message(self, fmt, *args):  # quiet; the worker logs what matters
            pass

        def reply(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def body(self):
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            return json.loads(raw) if raw else {}

        def do_GET(self):
            path = urlparse(self.path).path
            if path == "/health":
                self.reply(200, {"status": "ok", "service": service, "sleeping": model.sleeping, "device": model.device})
            elif path == "/is_sleeping":
                self.reply(200, {"is_sleeping": model.sleeping})
            else:
                self.reply(404, {"error": "no such endpoint %s" % path})

        def do_POST(self):
            path = urlparse(self.path).path
            try:
                if path == "/sleep":
                    self.body()
                    self.reply(200, {"slept_s": model.sleep()})
                elif path == "/wake_up":
                    self.body()
                    self.reply(200, {"woke_s": model.wake(), "device": model.device})
                elif path == "/score":
                    req = self.body()
                    inputs = req.get("inputs")
                    if not isinstance(inputs, list) or not all(isinstance(i, str) for i in inputs):
                        self.reply(400, {"error": "inputs must be a list of strings"})
                        return
                    if model.sleeping:
                        self.reply(409, {"error": "replica is asleep; POST /wake_up first"})
                        return
                    t0 = time.monotonic()
                    scores = model.score(inputs)
                    if request_log:
                        # One line per scored input, appended before the answer leaves: the
                        # fault suite counts these as the reward's effects.
                        with open(request_log, "a") as f:
                            f.write("".join(i.replace("\n", " ") + "\n" for i in inputs))
                    scored[0] += 1
                    if exit_after_scores is not None and scored[0] >= exit_after_scores:
                        # Tests: die after the effect and before the answer, as a replica
                        # killed mid-request does.
                        os._exit(3)
                    self.reply(200, {"scores": scores, "device": model.device, "exec_s": time.monotonic() - t0})
                else:
                    self.reply(404, {"error": "no such endpoint %s" % path})
            except RuntimeError as e:
                self.reply(409, {"error": str(e)})
            except (ValueError, json.JSONDecodeError) as e:
                self.reply(400, {"error": "bad request: %s" % e})

    return Handler


def watch_parent():
    """Exit when the worker that started us goes away (no orphaned replicas)."""
    parent = os.getppid()
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--service", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--vocab", type=int, default=1 << 16)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--awake", action="store_true", help="start resident instead of asleep")
    ap.add_argument("--no-parent-watch", action="store_true")
    ap.add_argument("--request-log", help="append every scored input to this file (tests)")
    ap.add_argument("--exit-after-scores", type=int,
                    help="exit, unanswered, right after scoring this many requests (tests)")
    args = ap.parse_args()
    model = Model(args.service, args.vocab, args.dim)
    if args.awake:
        model.wake()
    if not args.no_parent_watch:
        threading.Thread(target=watch_parent, daemon=True).start()
    server = ThreadingHTTPServer((args.host, args.port), make_handler(model, args.service, args.request_log,
                                                                   args.exit_after_scores))
    server.daemon_threads = True
    print(json.dumps({"event": "ready", "service": args.service, "port": server.server_address[1],
                      "cuda": HAVE_CUDA, "weights_mb": model.host_mb}), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
