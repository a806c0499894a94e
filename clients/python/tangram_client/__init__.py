"""Async Python client for Tangram (protocol v1).

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

Actions are published to JetStream with their id as ``Nats-Msg-Id`` (retried with the same
id, so a retry never runs an action twice); results are read from the persisted result
subject, so a reconnect loses nothing. Every call returns an outcome or raises
:class:`TangramTimeout`; nothing hangs.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import msgpack
import nats
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import APIError, NotFoundError

__all__ = [
    "Tangram",
    "Sandbox",
    "Result",
    "Outcome",
    "Timing",
    "Placement",
    "HttpReply",
    "TangramError",
    "TangramTimeout",
    "TangramBackpressure",
    "ActionFailed",
]

RESULTS_STREAM = "TANGRAM_RESULTS"


def inbox_prefix_for(seed_path: str) -> str:
    """The reply inbox prefix of the role a credentials file names (``rollout.nk``,
    ``rollout-<job>.nk``, ``operator.nk``...), as the server's permissions expect."""
    role = os.path.basename(seed_path)
    if role.endswith(".nk"):
        role = role[: -len(".nk")]
    if role == "operator":
        return "_INBOX"
    if role == "rollout":
        return "_R_rollout"
    if role.startswith("rollout-"):
        return "_R_rollout." + role[len("rollout-"):]
    return "_R_" + role


class Outcome(str, enum.Enum):
    """How an action ended."""

    COMPLETED = "completed"
    TIMED_OUT = "timed_out"
    OUT_OF_MEMORY = "out_of_memory"
    REJECTED = "rejected"
    INFRA_ERROR = "infra_error"


class TangramError(Exception):
    """Base class of this client's errors."""


class TangramTimeout(TangramError):
    """No result arrived in time. The action may still run; its result will be on its result
    subject, and submitting the same id again returns it instead of running it twice."""


class TangramBackpressure(TangramError):
    """The cluster refused the action because its action stream is full: work is arriving
    faster than it is processed. Nothing was stored; slow down (see ``tangram status``, the
    queue's estimated wait) and submit the same id again later.

    ``reason`` is the server's description (``maximum bytes exceeded`` or
    ``maximum messages exceeded``)."""

    def __init__(self, action_id: str, reason: str):
        super().__init__(f"action {action_id} refused, the action stream is full ({reason}): "
                         "the cluster is not keeping up; slow down and resubmit it later")
        self.action_id = action_id
        self.reason = reason


# JetStream's error code for a publish refused by a full stream that discards new messages.
_STREAM_FULL = 10077


class ActionFailed(TangramError):
    """A call that needs a completed action (open_sandbox, reward, api) got another outcome."""

    def __init__(self, result: "Result"):
        self.result = result
        super().__init__(
            f"{result.kind or 'action'} {result.id} {result.outcome.value}"
            + (f" ({result.code}): {result.reason}" if result.reason else "")
        )


@dataclass(frozen=True)
class Timing:
    """Where the time went, seconds: act_s = queued_s + overhead_s + exec_s."""

    queued_s: float
    overhead_s: float
    exec_s: float
    act_s: float


@dataclass(frozen=True)
class Placement:
    worker: str
    cores: int
    cpuset: str


@dataclass(frozen=True)
class HttpReply:
    status: int
    headers: Dict[str, str]
    body: str
    truncated: bool


@dataclass(frozen=True)
class Result:
    """One action's result."""

    id: str
    job: str
    trajectory: Optional[str]
    kind: Optional[str]
    outcome: Outcome
    exit_code: Optional[int]
    code: Optional[str]
    reason: Optional[str]
    stdout: str
    stderr: str
    truncated: bool
    placement: Optional[Placement]
    timing: Timing
    attempt: int
    scores: Optional[List[float]] = None
    http: Optional[HttpReply] = None
    service: Optional[Dict[str, Any]] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        """Completed with exit code 0."""
        return self.outcome is Outcome.COMPLETED and (self.exit_code or 0) == 0

    @staticmethod
    def from_wire(d: Mapping[str, Any]) -> "Result":
        o = d.get("outcome") or {}
        t = d.get("timing") or {}
        p = d.get("placement")
        h = d.get("http")
        return Result(
            id=d["id"],
            job=d["job"],
            trajectory=d.get("trajectory"),
            kind=d.get("kind"),
            outcome=Outcome(o.get("status", "infra_error")),
            exit_code=o.get("exit_code"),
            code=o.get("code"),
            reason=o.get("reason"),
            stdout=d.get("stdout", ""),
            stderr=d.get("stderr", ""),
            truncated=bool(d.get("truncated", False)),
            placement=Placement(p["worker"], p.get("cores", 0), p.get("cpuset", "")) if p else None,
            timing=Timing(
                t.get("queued_us", 0) / 1e6,
                t.get("overhead_us", 0) / 1e6,
                t.get("exec_us", 0) / 1e6,
                t.get("act_us", 0) / 1e6,
            ),
            attempt=d.get("attempt", 0),
            scores=d.get("scores"),
            http=HttpReply(h["status"], dict(h.get("headers") or {}), h.get("body", ""), bool(h.get("truncated")))
            if h
            else None,
            service=d.get("service"),
            raw=dict(d),
        )


_counter = itertools.count()


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}-{next(_counter)}"


class Tangram:
    """A connection for one RL job. Create with :meth:`connect`."""

    def __init__(self, nc, job: str, publish_retries: int, publish_timeout_s: float):
        self._nc = nc
        self._js = nc.jetstream()
        self.job = job
        self._waiting: Dict[str, asyncio.Future] = {}
        self._sub = None
        self._publish_retries = publish_retries
        self._publish_timeout_s = publish_timeout_s

    @classmethod
    async def connect(
        cls,
        url: str = "nats://127.0.0.1:4222",
        job: str = "default",
        *,
        publish_retries: int = 5,
        publish_timeout_s: float = 5.0,
        nkeys_seed: Optional[str] = None,
        **nats_options: Any,
    ) -> "Tangram":
        """Connects to the cluster's NATS server. ``job`` names the RL job (letters, digits,
        ``-`` and ``_``); it is part of every subject this client uses.

        ``nkeys_seed`` is a credentials file ``tangram up`` wrote (``<state-dir>/creds/
        rollout.nk`` for every job, ``rollout-<job>.nk`` for one); the reply inbox prefix
        of its role is set to match, as the server's permissions expect. TLS and any other
        nats-py option pass through (``tls=ssl_context``, ``tls_hostname=...``)."""
        if not job or any(not (c.isalnum() or c in "-_") for c in job):
            raise ValueError(f"job {job!r} must be letters, digits, '-' or '_'")
        nats_options.setdefault("max_reconnect_attempts", -1)
        if nkeys_seed is not None:
            nats_options["nkeys_seed"] = nkeys_seed
            nats_options.setdefault("inbox_prefix", inbox_prefix_for(nkeys_seed))
        nc = await nats.connect(url, **nats_options)
        self = cls(nc, job, publish_retries, publish_timeout_s)
        self._sub = await nc.subscribe(f"tangram.v1.result.{job}.>", cb=self._on_result)
        return self

    async def close(self) -> None:
        """Closes the connection. Waiting calls raise :class:`TangramTimeout`."""
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(TangramError("client closed"))
        self._waiting.clear()
        await self._nc.drain()

    async def __aenter__(self) -> "Tangram":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # ---- plumbing -------------------------------------------------------------------------

    @staticmethod
    def _decode(msg) -> Dict[str, Any]:
        ctype = (msg.headers or {}).get("Content-Type", "application/msgpack")
        if "json" in ctype:
            import json

            return json.loads(msg.data)
        return msgpack.unpackb(msg.data, raw=False)

    async def _on_result(self, msg) -> None:
        try:
            d = self._decode(msg)
        except Exception:  # noqa: BLE001 - a malformed message must not kill the subscription
            return
        fut = self._waiting.get(d.get("id", ""))
        if fut is not None and not fut.done():
            fut.set_result(d)

    async def _persisted(self, action_id: str) -> Optional[Dict[str, Any]]:
        try:
            # Direct get: the subject is in the request subject, which one job's credentials
            # allow (a plain message get names it in the body, which they may not send).
            m = await self._js.get_last_msg(
                RESULTS_STREAM, f"tangram.v1.result.{self.job}.{action_id}", direct=True
            )
        except NotFoundError:
            return None
        except Exception:  # noqa: BLE001 - disconnected: the next round retries
            return None
        return self._decode(m)

    async def submit(self, trajectory: str, spec: Mapping[str, Any], *, timeout_s: float = 60.0,
                     action_id: Optional[str] = None) -> str:
        """Publishes one action and returns its id (no waiting). ``spec`` is the
        kind-specific part, with ``kind`` set."""
        action_id = action_id or _new_id(spec["kind"])
        action = {
            "id": action_id,
            "job": self.job,
            "trajectory": trajectory,
            "timeout_ms": int(timeout_s * 1000),
            "spec": dict(spec),
        }
        payload = msgpack.packb(action, use_bin_type=True)
        subject = f"tangram.v1.action.{self.job}.{spec['kind']}"
        headers = {"Nats-Msg-Id": action_id, "Content-Type": "application/msgpack"}
        self._waiting.setdefault(action_id, asyncio.get_running_loop().create_future())
        delay = 0.1
        for attempt in range(self._publish_retries + 1):
            try:
                await self._js.publish(subject, payload, headers=headers, timeout=self._publish_timeout_s)
                return action_id
            except APIError as e:
                # Stored nothing, and retrying at once would not help: say so, typed.
                self._waiting.pop(action_id, None)
                if e.err_code == _STREAM_FULL:
                    raise TangramBackpressure(action_id, e.description or "stream full") from e
                raise TangramError(f"the server refused {action_id}: {e.description or e}") from e
            except (NatsTimeoutError, nats.errors.ConnectionClosedError, nats.errors.NoRespondersError,
                    asyncio.TimeoutError, OSError):
                # The same Nats-Msg-Id: if the first publish was stored, this one is dropped.
                if attempt == self._publish_retries:
                    self._waiting.pop(action_id, None)
                    raise TangramError(f"could not publish {action_id} after {attempt + 1} tries")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
        return action_id

    async def result(self, action_id: str, wait_s: float = 300.0) -> Result:
        """Waits for an action's result. Raises :class:`TangramTimeout` after ``wait_s``."""
        fut = self._waiting.setdefault(action_id, asyncio.get_running_loop().create_future())
        deadline = time.monotonic() + wait_s
        try:
            # Already there (a resubmitted id, or a result published before we listened)?
            d = await self._persisted(action_id)
            while d is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TangramTimeout(f"no result for {action_id} within {wait_s:.0f} s")
                try:
                    d = await asyncio.wait_for(asyncio.shield(fut), timeout=min(left, 2.0))
                except asyncio.TimeoutError:
                    # Missed while reconnecting? The result stream has it.
                    d = await self._persisted(action_id)
            return Result.from_wire(d)
        finally:
            self._waiting.pop(action_id, None)

    async def run(self, trajectory: str, spec: Mapping[str, Any], *, timeout_s: float = 60.0,
                  wait_s: Optional[float] = None, action_id: Optional[str] = None) -> Result:
        """Submits and waits. ``wait_s`` defaults to the timeout plus 10 minutes of queueing."""
        action_id = await self.submit(trajectory, spec, timeout_s=timeout_s, action_id=action_id)
        return await self.result(action_id, wait_s if wait_s is not None else timeout_s + 600.0)

    # ---- the surface ----------------------------------------------------------------------

    async def open_sandbox(self, trajectory: str, image: Optional[str] = None, memory_mb: int = 512,
                           workdir_mb: int = 64, env: Optional[Mapping[str, str]] = None,
                           timeout_s: float = 120.0) -> "Sandbox":
        """Opens the trajectory's sandbox. Raises :class:`ActionFailed` if it could not."""
        r = await self.run(trajectory, {"kind": "sandbox_open", "image": image, "memory_mb": memory_mb,
                                        "workdir_mb": workdir_mb, "env": dict(env or {})}, timeout_s=timeout_s)
        if r.outcome is not Outcome.COMPLETED:
            raise ActionFailed(r)
        return Sandbox(self, trajectory, r)

    async def reward(self, service: str, inputs: Sequence[str], *, trajectory: str = "reward",
                     options: Optional[Mapping[str, str]] = None, timeout_s: float = 60.0,
                     result: bool = False) -> Union[List[float], Result]:
        """Scores ``inputs`` with a reward service; returns one score per input (or the whole
        :class:`Result` with ``result=True``). Raises :class:`ActionFailed` otherwise."""
        r = await self.run(trajectory, {"kind": "reward", "service": service, "inputs": list(inputs),
                                        "options": dict(options or {})}, timeout_s=timeout_s)
        if r.outcome is not Outcome.COMPLETED:
            raise ActionFailed(r)
        return r if result else list(r.scores or [])

    async def api(self, provider: str, method: str = "GET", path: str = "/", *,
                  query: Optional[Mapping[str, str]] = None, body: Optional[str] = None,
                  headers: Optional[Mapping[str, str]] = None, trajectory: str = "api",
                  timeout_s: float = 30.0) -> HttpReply:
        """Calls an external API through the fleet's quota and credentials. Returns the reply
        (any HTTP status); raises :class:`ActionFailed` when it was refused or never answered."""
        r = await self.run(trajectory, {"kind": "api", "provider": provider, "method": method, "path": path,
                                        "query": {k: str(v) for k, v in (query or {}).items()},
                                        "body": body, "headers": dict(headers or {})}, timeout_s=timeout_s)
        if r.outcome is not Outcome.COMPLETED or r.http is None:
            raise ActionFailed(r)
        return r.http


class Sandbox:
    """A trajectory's sandbox: commands run one at a time, with elastic cores."""

    def __init__(self, client: Tangram, trajectory: str, opened: Result):
        self.client = client
        self.trajectory = trajectory
        self.opened = opened
        self.worker = opened.placement.worker if opened.placement else None

    async def exec(self, argv: Sequence[str], cpus: Union[int, Tuple[int, int]] = 1, timeout_s: float = 60.0,
                   files: Optional[Mapping[str, str]] = None, env: Optional[Mapping[str, str]] = None,
                   stdin: Optional[str] = None, wait_s: Optional[float] = None) -> Result:
        """Runs ``argv`` (no shell). ``cpus`` is a count or a (min, max) range; the command
        sees the grant as ``TANGRAM_CPUS`` and every ``{cpus}`` in argv. A non-zero exit is
        ``Outcome.COMPLETED`` with that ``exit_code``."""
        lo, hi = (cpus, cpus) if isinstance(cpus, int) else cpus
        spec = {"kind": "sandbox_exec", "argv": list(argv), "cpus": {"min": int(lo), "max": int(hi)},
                "files": dict(files or {}), "env": dict(env or {}), "stdin": stdin}
        return await self.client.run(self.trajectory, spec, timeout_s=timeout_s, wait_s=wait_s)

    async def close(self) -> Result:
        """Removes the sandbox."""
        return await self.client.run(self.trajectory, {"kind": "sandbox_close"}, timeout_s=60.0)

    async def __aenter__(self) -> "Sandbox":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
