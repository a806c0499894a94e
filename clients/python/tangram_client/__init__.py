"""Python client for Tangram (protocol v1), async and sync.

    from tangram_client import Tangram
    client = await Tangram.connect("nats://127.0.0.1:4222", job="my-job")
    sandbox = await client.open_sandbox(trajectory="t1", memory_mb=512)
    result = await sandbox.exec(["python3", "main.py"], cpus=(1, 4), timeout_s=10,
                                files={"main.py": "print(1)"})
    print(result.outcome, result.exit_code, result.stdout, result.timing.act_s)
    await sandbox.close()
    scores = await client.reward(service="judge", inputs=["..."])
    reply = await client.api(provider="search", method="GET", path="/search", query={"q": "..."})
    await client.close()

:class:`SyncClient` offers the same calls without ``await``, for code that has no event
loop (a verl reward function, a plain script). Actions are published to JetStream with
their id as ``Nats-Msg-Id`` (retried with the same id, so a retry never runs an action
twice); results come from one ordered consumer over the job's persisted result subjects,
so a reconnect loses nothing. Every call returns an outcome or raises a
:class:`TangramError` (never a library's own exception); nothing hangs. ``connect`` fails
within seconds with :class:`TangramConnectError` saying what to fix; transient failures
(no responders, a stream electing a leader, a reconnect) are retried with jittered backoff
before :class:`TangramUnavailable` is raised. The reference is docs/PYTHON.md.
"""

from ._wire import inbox_prefix_for
from .client import Action, BatchItem, Sandbox, Tangram
from .errors import (ActionFailed, InvalidAction, TangramBackpressure, TangramConnectError, TangramError,
                     TangramTimeout, TangramUnavailable)
from .results import HttpReply, Outcome, Placement, Result, Timing
from .sync import SyncClient, SyncSandbox

__all__ = [
    "Tangram",
    "Sandbox",
    "SyncClient",
    "SyncSandbox",
    "Action",
    "BatchItem",
    "Result",
    "Outcome",
    "Timing",
    "Placement",
    "HttpReply",
    "TangramError",
    "InvalidAction",
    "TangramTimeout",
    "TangramBackpressure",
    "TangramConnectError",
    "TangramUnavailable",
    "ActionFailed",
    "inbox_prefix_for",
]
