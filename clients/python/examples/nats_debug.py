"""Look inside a Tangram cluster's NATS with nothing but nats-py: the recipes the ``nats``
CLI would serve, for a machine that only has the Python client.

    python nats_debug.py [--url URL] [--creds FILE] streams [STREAM ...]
    python nats_debug.py get STREAM SEQ
    python nats_debug.py get STREAM --subject SUBJECT
    python nats_debug.py tail SUBJECT [--count N] [--timeout S]
    python nats_debug.py consumers STREAM

Every command prints JSON, one object per line (``get`` indented); message bodies are
decoded from msgpack or JSON as their ``Content-Type`` says, and shown as text or hex when
they are neither. ``--creds`` is an nkey seed file (``<state-dir>/creds/<role>.nk``), as
the client takes it. What a role may read is the server's to say: a job's rollout
credentials read the job's own results by subject; stream info, listing consumers, reading
by sequence and tailing other subjects take the operator's (a stream's info can list every
job's stored subjects).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
from typing import Any, Dict, List, Mapping, Optional

import msgpack
import nats
from nats.aio.client import Client as NatsClient

from tangram_client import inbox_prefix_for

# The streams a Tangram cluster makes (docs/PROTOCOL.md), shown when none is named: listing
# every stream needs a permission that a rollout's credentials do not have.
TANGRAM_STREAMS = [
    "TANGRAM_ACTIONS",
    "TANGRAM_RESULTS",
    "TANGRAM_DISPATCH",
    "TANGRAM_DEADLETTER",
    "TANGRAM_HISTORY",
]


def decode_body(data: bytes, headers: Optional[Mapping[str, str]]) -> Dict[str, Any]:
    """The body as the most readable thing it is: the encoding its Content-Type names,
    then msgpack, JSON and UTF-8 text in turn, and hex when it is none of them."""
    ctype = (headers or {}).get("Content-Type", "")
    order = ["json", "msgpack"] if "json" in ctype else ["msgpack", "json"]
    for enc in order:
        try:
            if enc == "msgpack":
                value = msgpack.unpackb(data, raw=False)
                # A lone integer or string is more likely text that happens to parse.
                if isinstance(value, (dict, list)):
                    return {"encoding": "msgpack", "data": _plain(value)}
            else:
                return {"encoding": "json", "data": json.loads(data)}
        except Exception:  # noqa: BLE001 - not this encoding: try the next
            continue
    try:
        return {"encoding": "text", "data": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"encoding": "hex", "data": data.hex()}


def _plain(value: Any) -> Any:
    """msgpack values JSON can print (bytes become base64)."""
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode()}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _headers(headers: Optional[Mapping[str, Any]]) -> Dict[str, str]:
    return {str(k): str(v) for k, v in (headers or {}).items()}


async def streams(nc: NatsClient, names: List[str]) -> None:
    js = nc.jetstream()
    for name in names or TANGRAM_STREAMS:
        try:
            info = await js.stream_info(name)
        except Exception as e:  # noqa: BLE001 - say which and go on to the next
            print(json.dumps({"stream": name, "error": repr(e)}))
            continue
        s = info.state
        print(json.dumps({
            "stream": name, "subjects": info.config.subjects, "messages": s.messages, "bytes": s.bytes,
            "first_seq": s.first_seq, "last_seq": s.last_seq, "consumers": s.consumer_count,
            "max_age_s": info.config.max_age, "max_bytes": info.config.max_bytes,
            "discard": getattr(info.config.discard, "value", info.config.discard),
        }))


async def get(nc: NatsClient, stream: str, seq: Optional[int], subject: Optional[str]) -> None:
    js = nc.jetstream()
    if (seq is None) == (subject is None):
        raise SystemExit("get: give a sequence number or --subject, not both")
    if subject is not None:
        # Direct get names the subject in the request subject, which a job's credentials
        # are granted for its own results; the stream must allow direct gets (results do).
        msg = await js.get_last_msg(stream, subject, direct=True)
    else:
        msg = await js.get_msg(stream, seq=seq)
    print(json.dumps({"stream": stream, "seq": msg.seq, "subject": msg.subject,
                      "headers": _headers(msg.headers), **decode_body(msg.data or b"", msg.headers)},
                     indent=2))


async def tail(nc: NatsClient, subject: str, count: int, timeout_s: float) -> int:
    """Prints what arrives on ``subject`` until ``count`` messages or ``timeout_s``;
    returns how many arrived."""
    sub = await nc.subscribe(subject)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    seen = 0
    try:
        while seen < count:
            left = deadline - loop.time()
            if left <= 0:
                break
            try:
                msg = await sub.next_msg(timeout=left)
            except nats.errors.TimeoutError:
                break
            seen += 1
            print(json.dumps({"subject": msg.subject, "headers": _headers(msg.headers),
                              **decode_body(msg.data, msg.headers)}), flush=True)
    finally:
        await sub.unsubscribe()
    return seen


async def consumers(nc: NatsClient, stream: str) -> None:
    js = nc.jetstream()
    for c in await js.consumers_info(stream):
        cfg = c.config
        print(json.dumps({
            "stream": stream, "name": c.name, "durable": cfg.durable_name is not None,
            "filter": cfg.filter_subject or cfg.filter_subjects,
            "ack_policy": getattr(cfg.ack_policy, "value", cfg.ack_policy),
            "delivered_stream_seq": c.delivered.stream_seq if c.delivered else None,
            "ack_floor_stream_seq": c.ack_floor.stream_seq if c.ack_floor else None,
            "pending": c.num_pending, "ack_pending": c.num_ack_pending, "waiting": c.num_waiting,
            "redelivered": c.num_redelivered,
        }))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="nats://127.0.0.1:4222")
    ap.add_argument("--creds", help="nkey seed file (<state-dir>/creds/<role>.nk)")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("streams", help="messages, bytes and consumers of each stream")
    p.add_argument("names", nargs="*", help="streams to show (default: Tangram's four)")
    p = sub.add_parser("get", help="one stored message, decoded")
    p.add_argument("stream")
    p.add_argument("seq", nargs="?", type=int, help="stream sequence number")
    p.add_argument("--subject", help="the last message stored on this subject instead")
    p = sub.add_parser("tail", help="print what arrives on a subject")
    p.add_argument("subject")
    p.add_argument("--count", type=int, default=10, help="stop after this many messages (10)")
    p.add_argument("--timeout", type=float, default=10.0, help="stop after this many seconds (10)")
    p = sub.add_parser("consumers", help="the consumers of a stream and their progress")
    p.add_argument("stream")
    return ap


async def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
    options: Dict[str, Any] = {"connect_timeout": 5, "max_reconnect_attempts": 0}
    if args.creds:
        options.update(nkeys_seed=args.creds, inbox_prefix=inbox_prefix_for(args.creds))
    nc = await nats.connect(args.url, **options)
    try:
        if args.command == "streams":
            await streams(nc, args.names)
        elif args.command == "get":
            await get(nc, args.stream, args.seq, args.subject)
        elif args.command == "tail":
            if await tail(nc, args.subject, args.count, args.timeout) == 0:
                print(f"nothing on {args.subject} within {args.timeout:g} s", file=sys.stderr)
                return 1
        elif args.command == "consumers":
            await consumers(nc, args.stream)
    finally:
        await nc.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
