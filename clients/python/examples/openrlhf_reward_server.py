"""A remote reward model for OpenRLHF, backed by a Tangram reward service.

OpenRLHF's ``--remote_rm_url`` posts ``{"query": [texts], "prompts": [...], "labels":
[...]}`` (prompts and labels optional) and reads ``rewards`` from the JSON answer, one per
query. This server turns each request into reward actions, ``--inputs-per-action`` queries
in each, submits them together as a batch and answers when all are scored:

    python openrlhf_reward_server.py --service judge --job openrlhf \
        --creds .tangram/creds/rollout.nk --port 5000
    # then: openrlhf.cli.train_ppo_ray ... --remote_rm_url http://127.0.0.1:5000/get_reward

The answer carries the same list under ``rewards`` and ``scores`` (later OpenRLHF versions
read the latter). When labels are sent, each action's options carry its queries' labels as
a JSON array under ``labels``, for engines that judge against a reference. A request any of
whose actions failed gets HTTP 502 with the failures named; OpenRLHF retries it. Only the
standard library and the Tangram client are needed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tangram_client import Action, SyncClient, TangramError


def reward_actions(client: SyncClient, service: str, queries: Sequence[str], labels: Optional[Sequence[Any]],
                   per_action: int, timeout_s: float) -> List[Action]:
    """The queries in groups of ``per_action``, one reward action per group, in order."""
    actions = []
    for start in range(0, len(queries), per_action):
        group = list(queries[start:start + per_action])
        options = {}
        if labels is not None:
            options["labels"] = json.dumps(list(labels[start:start + per_action]), default=str)
        actions.append(client.reward_action(service, group, trajectory="openrlhf", options=options,
                                            timeout_s=timeout_s))
    return actions


def score(client: SyncClient, service: str, body: Dict[str, Any], per_action: int,
          timeout_s: float) -> Tuple[int, Dict[str, Any]]:
    """The HTTP status and JSON answer for one request body."""
    queries = body.get("query")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        return 400, {"error": "'query' must be a list of strings"}
    labels = body.get("labels")
    if labels is not None and (not isinstance(labels, list) or len(labels) != len(queries)):
        return 400, {"error": "'labels' must be a list as long as 'query'"}
    if not queries:
        return 200, {"rewards": [], "scores": []}
    actions = reward_actions(client, service, queries, labels, per_action, timeout_s)
    rewards: List[float] = []
    failed: List[Dict[str, Any]] = []
    for action, item in zip(actions, client.run_batch(actions)):
        n = len(action.spec["inputs"])
        if isinstance(item, TangramError):
            failed.append({"error": str(item)})
        elif item.outcome.value != "completed" or len(item.scores or []) != n:
            failed.append({"action": item.id, "outcome": item.outcome.value, "code": item.code,
                           "reason": item.reason})
        else:
            rewards.extend(float(s) for s in item.scores or [])
    if failed:
        return 502, {"error": f"{len(failed)} of {len(actions)} reward actions failed", "failed": failed}
    return 200, {"rewards": rewards, "scores": rewards}


def make_server(client: SyncClient, service: str, host: str, port: int, per_action: int,
                timeout_s: float) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the http.server interface
            try:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"null")
            except ValueError:
                return self.reply(400, {"error": "the body is not JSON"})
            if not isinstance(body, dict):
                return self.reply(400, {"error": "the body must be a JSON object"})
            self.reply(*score(client, service, body, per_action, timeout_s))

        def reply(self, status: int, answer: Dict[str, Any]) -> None:
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, fmt: str, *args: Any) -> None:
            sys.stderr.write("openrlhf-reward: " + fmt % args + "\n")

    return ThreadingHTTPServer((host, port), Handler)


def main() -> None:
    ap = argparse.ArgumentParser(description="OpenRLHF remote reward model backed by Tangram")
    ap.add_argument("--url", default=os.environ.get("TANGRAM_NATS_URL", "nats://127.0.0.1:4222"))
    ap.add_argument("--creds", default=os.environ.get("TANGRAM_NKEY_FILE"), help="nkey seed file")
    ap.add_argument("--job", default=os.environ.get("TANGRAM_JOB", "openrlhf"))
    ap.add_argument("--service", default=os.environ.get("TANGRAM_REWARD_SERVICE"))
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5000, help="0 picks a free port")
    ap.add_argument("--inputs-per-action", type=int, default=16, help="queries scored by one action")
    ap.add_argument("--timeout-s", type=float, default=60.0, help="each action's limit")
    args = ap.parse_args()
    if not args.service:
        ap.error("--service (or TANGRAM_REWARD_SERVICE) is required")
    if args.inputs_per_action < 1:
        ap.error("--inputs-per-action must be at least 1")
    # A stop request (SIGTERM) ends the server like Ctrl-C, so the client closes cleanly.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with SyncClient.connect(args.url, args.job, nkeys_seed=args.creds) as client:
        server = make_server(client, args.service, args.host, args.port, args.inputs_per_action, args.timeout_s)
        port = server.server_address[1]
        # The first line of output, read by whoever started us to learn the port.
        print(f"listening on http://{args.host}:{port}", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()


if __name__ == "__main__":
    main()
