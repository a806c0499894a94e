"""The async client: one connection and one result feed per RL job."""

from __future__ import annotations

import asyncio
import json
import math
import logging
from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, Union, overload

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.js.errors import APIError, NotFoundError

from ._connect import open_connection
from ._feed import ResultFeed
from ._retry import Backoff, is_transient
from ._wire import (RESULTS_STREAM, STREAM_FULL, action_subject, check_id, decode, encode_action, new_id,
                    result_subject)
from .errors import (ActionFailed, InvalidAction, TangramBackpressure, TangramConnectError, TangramError,
                     TangramTimeout, TangramUnavailable)
from .results import HttpReply, Outcome, Result

log = logging.getLogger("tangram_client")


@dataclass(frozen=True)
class Action:
    """One action of a batch: the kind-specific ``spec`` (with ``kind`` set), the
    trajectory it belongs to, its execution limit, and optionally its id."""

    trajectory: str
    spec: Mapping[str, Any]
    timeout_s: float = 60.0
    action_id: Optional[str] = None


BatchItem = Union[Result, TangramError]
"""What a batch returns in each position: the action's result, or the error that kept it
from having one (it was refused before sending, could not be published, or timed out)."""


@dataclass
class _Waiter:
    future: "asyncio.Future[Dict[str, Any]]"
    # True when this client published the id as new after its feed started: the feed is
    # then certain to see the result, and no lookup is needed.
    fresh: bool = False
    lookup: Optional["asyncio.Task[None]"] = field(default=None, repr=False)


class Tangram:
    """A connection for one RL job. Create with :meth:`connect`."""

    def __init__(self, nc: NatsClient, job: str, publish_retries: int, publish_timeout_s: float) -> None:
        self._nc = nc
        self._js = nc.jetstream()
        self.job = job
        self._waiters: Dict[str, _Waiter] = {}
        self._feed = ResultFeed(nc, self._js, job, self._on_result, request_timeout_s=publish_timeout_s)
        self._publish_retries = publish_retries
        self._publish_timeout_s = publish_timeout_s
        self._closed = False
        self._lease: Optional["asyncio.Task[None]"] = None

    @classmethod
    async def connect(
        cls,
        url: Union[str, Sequence[str]] = "nats://127.0.0.1:4222",
        job: str = "default",
        *,
        publish_retries: int = 10,
        publish_timeout_s: float = 5.0,
        nkeys_seed: Optional[str] = None,
        lease_s: Optional[float] = 300.0,
        **nats_options: Any,
    ) -> "Tangram":
        """Connects to the cluster's NATS servers and starts the job's result feed.

        ``url`` is one server URL, several separated by commas, or a list of them.
        ``job`` names the RL job (letters, digits, ``-`` and ``_``); it is part of every
        subject this client uses. ``nkeys_seed`` is a credentials file ``tangram up`` wrote
        (``<state-dir>/creds/rollout.nk`` for every job, ``rollout-<job>.nk`` for one); the
        reply inbox prefix of its role is set to match, as the server's permissions expect.
        TLS and any other nats-py option pass through (``tls=ssl_context``, ...).

        Raises :class:`TangramConnectError` within a few seconds when no server can be
        reached, none answers, the credentials are missing or refused, or the job's results
        cannot be followed; its message names the likely fix. Once connected, a lost
        connection is re-established for ever (``max_reconnect_attempts`` to change it).

        ``lease_s`` keeps a lease on the job while this client lives: it is renewed in the
        background (every third of it, at most every 20 s), and when every process of the
        job has stopped renewing it for ``lease_s`` (a crash, a killed trainer), the
        scheduler closes the job's sandboxes. ``None`` takes no lease (sandboxes then wait
        for their idle timeout). :meth:`close` stops renewing it."""
        try:
            check_id("job", job)
        except TangramError as e:
            raise ValueError(str(e)) from None
        if lease_s is not None and not (math.isfinite(lease_s) and 1 <= lease_s <= 3600):
            raise ValueError(f"lease_s is {lease_s}; it must be between 1 and 3600 (or None for no lease)")
        nc = await open_connection(url, nkeys_seed, nats_options)
        self = cls(nc, job, publish_retries, publish_timeout_s)
        try:
            await self._feed.start()
        except BaseException as e:
            await nc.close()
            if isinstance(e, Exception):
                raise TangramConnectError(
                    f"connected, but could not follow job {job}'s results ({e!r}): do these credentials "
                    "belong to this job (rollout-<job>.nk is for that job only), and is this a Tangram "
                    "cluster (`tangram up` creates the streams)?", [u.geturl() for u in nc.servers]) from e
            raise
        if lease_s is not None:
            self._lease = asyncio.get_running_loop().create_task(self._keep_lease(lease_s))
        return self

    async def close(self) -> None:
        """Stops the result feed and closes the connection. Calls still waiting raise
        :class:`TangramError`."""
        if self._closed:
            return
        self._closed = True
        if self._lease is not None:
            self._lease.cancel()
        for w in self._waiters.values():
            if w.lookup is not None:
                w.lookup.cancel()
            if not w.future.done():
                w.future.set_exception(TangramError("client closed"))
                w.future.exception()  # raised in whoever awaits it; nobody else needs telling
        self._waiters.clear()
        await self._feed.stop()
        try:
            await self._nc.drain()
        except nats.errors.Error as e:
            # Already closed, or reconnecting: nothing left to flush that could arrive.
            log.debug("drain: %r", e)
            await self._nc.close()

    async def _keep_lease(self, lease_s: float) -> None:
        """Renews the job's lease until cancelled (a renewal that fails is logged; the next
        one is a third of the lease later at most)."""
        subject = f"tangram.v1.lease.{self.job}"
        body = json.dumps({"ttl_ms": int(lease_s * 1000)}).encode()
        every = min(lease_s / 3, 20.0)
        while True:
            try:
                await self._nc.publish(subject, body)
            except Exception as e:  # the connection is re-established by nats-py
                log.warning("renewing job %s's lease: %r", self.job, e)
            await asyncio.sleep(every)

    async def close_job(self, timeout_s: float = 10.0) -> int:
        """Closes every sandbox of this client's job, in every process of the job (the end of
        a run, or a clean-up after a crash): returns how many the scheduler is closing. Each
        close's result reaches the job's results with ``reason: job_closed``; a command sent
        to a closed sandbox is rejected (``no_sandbox``). Raises :class:`TangramError` when no
        scheduler answers within ``timeout_s``."""
        try:
            msg = await self._nc.request(f"tangram.v1.close.{self.job}", b"", timeout=timeout_s)
        except Exception as e:
            raise TangramError(f"no scheduler answered the request to close job {self.job}'s sandboxes "
                               f"within {timeout_s} s ({e!r}): is one leading, and may these credentials "
                               "close this job's?") from e
        reply = json.loads(msg.data)
        if "closing" not in reply:
            raise TangramError(f"the scheduler refused to close job {self.job}'s sandboxes: {reply}")
        return int(reply["closing"])

    @property
    def results_consumer(self) -> Optional[str]:
        """The name of this client's consumer on ``TANGRAM_RESULTS`` (it changes when the
        consumer is replaced), to find it in ``nats_debug.py consumers``."""
        return self._feed.consumer

    async def __aenter__(self) -> "Tangram":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- results --------------------------------------------------------------------------

    def _on_result(self, d: Dict[str, Any]) -> None:
        w = self._waiters.get(d.get("id", ""))
        if w is not None and not w.future.done():
            w.future.set_result(d)

    def _waiter(self, action_id: str) -> _Waiter:
        w = self._waiters.get(action_id)
        if w is None:
            if self._closed:
                raise TangramError("client closed")
            w = _Waiter(asyncio.get_running_loop().create_future())
            self._waiters[action_id] = w
        return w

    async def _look_up(self, action_id: str, w: _Waiter) -> None:
        """One read of the stored result, for an id whose result may predate the feed.
        Repeated only when the read itself failed for a transient reason (disconnected, no
        leader yet), never to wait; the caller's ``wait_s`` bounds it."""
        backoff = Backoff()
        while not w.future.done():
            try:
                # Direct get: the subject is in the request subject, which one job's
                # credentials allow (a plain message get names it in the body).
                m = await self._js.get_last_msg(RESULTS_STREAM, result_subject(self.job, action_id), direct=True)
            except NotFoundError:
                return  # not published yet: the feed will see it
            except Exception as e:  # noqa: BLE001 - classified just below
                if not is_transient(e):
                    log.info("looking up %s: %r; the feed alone will deliver it", action_id, e)
                    return
                await backoff.sleep()
                continue
            if not w.future.done():
                w.future.set_result(decode(m.data or b"", m.headers))
            return

    async def result(self, action_id: str, wait_s: float = 300.0) -> Result:
        """Waits for an action's result, whether this client submitted it or not, and
        whether it was published before or after the call. Raises
        :class:`TangramTimeout` after ``wait_s``."""
        w = self._waiter(action_id)
        if not w.fresh and not w.future.done() and w.lookup is None:
            w.lookup = asyncio.get_running_loop().create_task(self._look_up(action_id, w))
        try:
            d = await asyncio.wait_for(asyncio.shield(w.future), timeout=wait_s)
        except asyncio.TimeoutError:
            raise TangramTimeout(f"no result for {action_id} within {wait_s:.0f} s") from None
        finally:
            if self._waiters.get(action_id) is w:
                del self._waiters[action_id]
            if w.lookup is not None:
                w.lookup.cancel()
        return Result.from_wire(d)

    # ---- submitting -----------------------------------------------------------------------

    async def submit(self, trajectory: str, spec: Mapping[str, Any], *, timeout_s: float = 60.0,
                     action_id: Optional[str] = None, queue_timeout_s: Optional[float] = None) -> str:
        """Publishes one action and returns its id without waiting for the result; collect
        it with :meth:`result`. ``spec`` is the kind-specific part, with ``kind`` set.
        ``queue_timeout_s``: if the scheduler has not started it that long after it arrived,
        it is rejected ``queue_timeout`` (nothing ran). Raises :class:`InvalidAction`
        (nothing sent), :class:`TangramBackpressure` or :class:`TangramError`."""
        kind = check_id("kind", spec.get("kind", ""))
        check_id("trajectory", trajectory)
        generated = action_id is None
        action_id = check_id("action id", new_id(kind) if action_id is None else action_id)
        action = {"id": action_id, "job": self.job, "trajectory": trajectory,
                  "timeout_ms": int(timeout_s * 1000), "spec": dict(spec)}
        if queue_timeout_s is not None:
            if not (0 < queue_timeout_s <= 86_400 * 365):
                raise InvalidAction(f"queue_timeout_s must be a positive number of seconds, not {queue_timeout_s!r}")
            action["queue_timeout_ms"] = max(1, int(queue_timeout_s * 1000))
        payload = encode_action(action)
        headers = {"Nats-Msg-Id": action_id, "Content-Type": "application/msgpack"}
        # Registered before publishing, so the feed cannot deliver the result unclaimed.
        w = self._waiter(action_id)
        backoff = Backoff()
        for attempt in range(self._publish_retries + 1):
            try:
                ack = await self._js.publish(action_subject(self.job, kind), payload, headers=headers,
                                             timeout=self._publish_timeout_s)
            except Exception as e:  # noqa: BLE001 - classified just below, by type
                if is_transient(e):
                    if attempt < self._publish_retries:
                        log.debug("publishing %s, try %d: %r", action_id, attempt + 1, e)
                        await backoff.sleep()
                        continue
                    self._forget(action_id, w)
                    raise TangramUnavailable(
                        f"could not publish {action_id} after {attempt + 1} tries ({e!r}): the cluster "
                        "did not answer; submitting the same id again is safe") from e
                self._forget(action_id, w)
                if isinstance(e, APIError):
                    # Stored nothing, and retrying at once would not help: say so, typed.
                    if e.err_code == STREAM_FULL:
                        raise TangramBackpressure(action_id, e.description or "stream full") from e
                    raise TangramError(f"the server refused {action_id}: {e.description or e}") from e
                if isinstance(e, nats.errors.Error):
                    # Closed or draining client, payload over the server's limit...
                    raise TangramError(f"could not publish {action_id}: {e!r}") from e
                raise
            # A new random id that the stream took as new cannot have an older result. A
            # duplicate, a retried publish or a caller's own id may: look it up.
            w.fresh = generated and attempt == 0 and not ack.duplicate
            return action_id
        raise AssertionError("unreachable")

    def _forget(self, action_id: str, w: _Waiter) -> None:
        if self._waiters.get(action_id) is w and not w.future.done():
            del self._waiters[action_id]

    async def run(self, trajectory: str, spec: Mapping[str, Any], *, timeout_s: float = 60.0,
                  wait_s: Optional[float] = None, action_id: Optional[str] = None,
                  queue_timeout_s: Optional[float] = None) -> Result:
        """Submits and waits. ``wait_s`` defaults to the timeout plus 10 minutes of queueing."""
        action_id = await self.submit(trajectory, spec, timeout_s=timeout_s, action_id=action_id,
                                      queue_timeout_s=queue_timeout_s)
        return await self.result(action_id, wait_s if wait_s is not None else timeout_s + 600.0)

    async def submit_batch(self, actions: Sequence[Action], *,
                           max_in_flight: int = 256) -> List[Union[str, TangramError]]:
        """Publishes every action, at most ``max_in_flight`` publishes awaiting their
        acknowledgement at once. Returns, in the order given, each action's id or the
        error that kept it from being stored."""
        gate = asyncio.Semaphore(max_in_flight)

        async def one(a: Action) -> Union[str, TangramError]:
            async with gate:
                try:
                    return await self.submit(a.trajectory, a.spec, timeout_s=a.timeout_s, action_id=a.action_id)
                except TangramError as e:
                    return e

        return list(await asyncio.gather(*(one(a) for a in actions)))

    async def run_batch(self, actions: Sequence[Action], *, wait_s: Optional[float] = None,
                        max_in_flight: int = 256) -> List[BatchItem]:
        """Submits every action and waits for all their results. Returns, in the order
        given, each action's :class:`Result` (any outcome) or the :class:`TangramError`
        that kept it from having one; one action's error costs the others nothing.
        ``wait_s`` is each action's wait, by default its timeout plus 10 minutes."""
        ids = await self.submit_batch(actions, max_in_flight=max_in_flight)

        async def one(a: Action, id_or_err: Union[str, TangramError]) -> BatchItem:
            if isinstance(id_or_err, TangramError):
                return id_or_err
            try:
                return await self.result(id_or_err, wait_s if wait_s is not None else a.timeout_s + 600.0)
            except TangramError as e:
                return e

        return list(await asyncio.gather(*(one(a, i) for a, i in zip(actions, ids))))

    # ---- the surface ----------------------------------------------------------------------

    async def open_sandbox(self, trajectory: str, image: Optional[str] = None, memory_mb: int = 512,
                           workdir_mb: int = 64, env: Optional[Mapping[str, str]] = None,
                           timeout_s: float = 120.0, idle_timeout_s: Optional[float] = None) -> "Sandbox":
        """Opens the trajectory's sandbox. Raises :class:`ActionFailed` if it could not.

        ``idle_timeout_s``: the scheduler closes the sandbox once no action has used it this
        long (default: the fleet's, 30 minutes unless the operator set another)."""
        spec: Dict[str, Any] = {"kind": "sandbox_open", "image": image, "memory_mb": memory_mb,
                                "workdir_mb": workdir_mb, "env": dict(env or {})}
        if idle_timeout_s is not None:
            spec["idle_timeout_ms"] = int(idle_timeout_s * 1000)
        r = await self.run(trajectory, spec, timeout_s=timeout_s)
        if r.outcome is not Outcome.COMPLETED:
            raise ActionFailed(r)
        return Sandbox(self, trajectory, r)

    @staticmethod
    def reward_action(service: str, inputs: Sequence[str], *, trajectory: str = "reward",
                      options: Optional[Mapping[str, str]] = None, timeout_s: float = 60.0) -> Action:
        """The :class:`Action` that :meth:`reward` sends, for batches."""
        return Action(trajectory, {"kind": "reward", "service": service, "inputs": list(inputs),
                                   "options": dict(options or {})}, timeout_s)

    @overload
    async def reward(self, service: str, inputs: Sequence[str], *, trajectory: str = ...,
                     options: Optional[Mapping[str, str]] = ..., timeout_s: float = ...,
                     result: Literal[False] = ...) -> List[float]: ...

    @overload
    async def reward(self, service: str, inputs: Sequence[str], *, trajectory: str = ...,
                     options: Optional[Mapping[str, str]] = ..., timeout_s: float = ...,
                     result: Literal[True]) -> Result: ...

    async def reward(self, service: str, inputs: Sequence[str], *, trajectory: str = "reward",
                     options: Optional[Mapping[str, str]] = None, timeout_s: float = 60.0,
                     result: bool = False) -> Union[List[float], Result]:
        """Scores ``inputs`` with a reward service; returns one score per input (or the whole
        :class:`Result` with ``result=True``). Raises :class:`ActionFailed` otherwise."""
        a = self.reward_action(service, inputs, trajectory=trajectory, options=options, timeout_s=timeout_s)
        r = await self.run(a.trajectory, a.spec, timeout_s=timeout_s)
        if r.outcome is not Outcome.COMPLETED:
            raise ActionFailed(r)
        return r if result else list(r.scores or [])

    async def reward_batch(self, service: str, batches: Sequence[Sequence[str]], *, trajectory: str = "reward",
                           options: Optional[Mapping[str, str]] = None, timeout_s: float = 60.0,
                           ) -> List[Union[List[float], TangramError]]:
        """One reward action per entry of ``batches``, all in flight together. Returns, in
        order, each entry's scores or its error (:class:`ActionFailed` with the result
        when the action did not complete)."""
        items = await self.run_batch([self.reward_action(service, b, trajectory=trajectory, options=options,
                                                         timeout_s=timeout_s) for b in batches])
        return [_scores_or_error(i) for i in items]

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


def _scores_or_error(item: BatchItem) -> Union[List[float], TangramError]:
    if isinstance(item, TangramError):
        return item
    if item.outcome is not Outcome.COMPLETED:
        return ActionFailed(item)
    return list(item.scores or [])


class Sandbox:
    """A trajectory's sandbox: commands run one at a time, with elastic cores."""

    def __init__(self, client: Tangram, trajectory: str, opened: Result) -> None:
        self.client = client
        self.trajectory = trajectory
        self.opened = opened
        self.worker: Optional[str] = opened.placement.worker if opened.placement else None

    @staticmethod
    def exec_spec(argv: Sequence[str], cpus: Union[int, Tuple[int, int]] = 1,
                  files: Optional[Mapping[str, str]] = None, env: Optional[Mapping[str, str]] = None,
                  stdin: Optional[str] = None) -> Dict[str, Any]:
        """The ``sandbox_exec`` spec that :meth:`exec` sends, for batches."""
        lo, hi = (cpus, cpus) if isinstance(cpus, int) else cpus
        return {"kind": "sandbox_exec", "argv": list(argv), "cpus": {"min": int(lo), "max": int(hi)},
                "files": dict(files or {}), "env": dict(env or {}), "stdin": stdin}

    async def exec(self, argv: Sequence[str], cpus: Union[int, Tuple[int, int]] = 1, timeout_s: float = 60.0,
                   files: Optional[Mapping[str, str]] = None, env: Optional[Mapping[str, str]] = None,
                   stdin: Optional[str] = None, wait_s: Optional[float] = None,
                   queue_timeout_s: Optional[float] = None) -> Result:
        """Runs ``argv`` (no shell). ``cpus`` is a count or a (min, max) range; the command
        sees the grant as ``TANGRAM_CPUS`` and every ``{cpus}`` in argv. A non-zero exit is
        ``Outcome.COMPLETED`` with that ``exit_code``. ``queue_timeout_s``: see :meth:`Tangram.submit`."""
        spec = self.exec_spec(argv, cpus, files, env, stdin)
        return await self.client.run(self.trajectory, spec, timeout_s=timeout_s, wait_s=wait_s,
                                     queue_timeout_s=queue_timeout_s)

    async def close(self) -> Result:
        """Removes the sandbox."""
        return await self.client.run(self.trajectory, {"kind": "sandbox_close"}, timeout_s=60.0)

    async def __aenter__(self) -> "Sandbox":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

