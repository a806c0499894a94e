"""The client's one subscription to its job's results.

An ordered pull consumer on ``TANGRAM_RESULTS``, filtered to ``tangram.v1.result.<job>.>``,
owned by one task that hands every result to a callback. Ordered means: the task keeps the
stream sequence of the last result it saw and the consumer sequence it expects next; when
the consumer goes away (deleted, the server restarted, idle past its inactivity limit while
the client was cut off), when a pull goes silent past three heartbeats, or when a consumer
sequence is skipped, it drops the consumer and makes a new one that starts right after the
last result seen. Nothing the stream holds is skipped, and nothing is delivered twice.

It starts at the stream's end as of :meth:`ResultFeed.start`: results published earlier are
the caller's to look up (the client does, once, when it waits on an id it did not just
publish).

Why pull and not push: a job's credentials may create consumers whose filter names the job
and pull from them; a push consumer with flow control would need its acknowledgements
published on subjects those credentials do not grant.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any, Callable, Dict, Optional

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from ._retry import Backoff
from ._wire import RESULTS_STREAM, decode, results_of

log = logging.getLogger("tangram_client.feed")


class _Reset(Exception):
    """The consumer can no longer be trusted to continue where it was; make a new one."""


class ResultFeed:
    """Delivers each result of ``job`` once, in stream order, to ``on_result``."""

    def __init__(self, nc: NatsClient, js: JetStreamContext, job: str,
                 on_result: Callable[[Dict[str, Any]], None], *, batch: int = 64,
                 heartbeat_s: float = 1.0, expires_s: float = 10.0, inactive_s: float = 120.0,
                 request_timeout_s: float = 5.0) -> None:
        self._nc = nc
        self._js = js
        self._filter = results_of(job)
        self._on_result = on_result
        self._batch = batch
        self._heartbeat_s = heartbeat_s
        self._expires_s = expires_s
        self._inactive_s = inactive_s
        self._request_timeout_s = request_timeout_s
        self._next_seq = 0
        self._expected_cseq = 1
        self._name: Optional[str] = None
        self._sub: Optional[Subscription] = None
        self._task: Optional["asyncio.Task[None]"] = None
        self._stopping = False
        self.resets = 0
        """How many times the consumer was replaced (for tests and logs)."""

    @property
    def consumer(self) -> Optional[str]:
        """The current consumer's name."""
        return self._name

    async def start(self) -> None:
        """Creates the consumer at the stream's end and starts the task that reads it."""
        # At the end: a consumer of what is new, whose answer says where the stream ended.
        # Not the stream's info: a job's credentials may not read it (its subject counts
        # name every job's actions).
        await self._create(at_end=True)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="tangram-result-feed")

    async def stop(self) -> None:
        """Stops the task and removes the consumer (the server would after ``inactive_s``)."""
        # The flag as well as the cancel: nats-py waits for messages with asyncio.wait_for,
        # which before Python 3.12 can lose a cancel that lands as a message arrives.
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])  # unlike awaiting the task, keeps a cancel of stop() itself
            if not task.cancelled() and task.exception() is not None:
                log.warning("result feed ended with %r", task.exception())
        await self._drop()

    async def _create(self, at_end: bool = False) -> None:
        self._name = "tgc-" + uuid.uuid4().hex[:20]
        self._expected_cseq = 1
        self._sub = await self._nc.subscribe(
            self._nc.new_inbox(), pending_msgs_limit=4 * self._batch,
            pending_bytes_limit=(self._batch + 8) * 1024 * 1024)
        config = ConsumerConfig(
            name=self._name,
            filter_subject=self._filter,
            deliver_policy=DeliverPolicy.NEW if at_end else DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=None if at_end else self._next_seq,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=self._inactive_s,
            mem_storage=True,
            num_replicas=1,
        )
        info = await self._js.add_consumer(RESULTS_STREAM, config=config,
                                           timeout=self._request_timeout_s)
        if at_end:
            # A new consumer's delivered stream sequence is where the stream ended.
            if info.delivered is None or info.delivered.stream_seq is None:
                raise RuntimeError("the server's answer to a new consumer said nothing of "
                                   "where the stream ends")
            self._next_seq = info.delivered.stream_seq + 1

    async def _drop(self) -> None:
        name, sub = self._name, self._sub
        self._name, self._sub = None, None
        if sub is not None:
            try:
                await sub.unsubscribe()
            except Exception:  # noqa: BLE001 - a closed connection has no subscription left
                pass
        if name is not None and self._nc.is_connected:
            try:
                await self._js.delete_consumer(RESULTS_STREAM, name)
            except Exception:  # noqa: BLE001 - already gone, or the server is away: it expires
                pass

    async def _run(self) -> None:
        backoff = Backoff()
        while not self._stopping:
            try:
                if self._name is None:
                    await self._create()
                await self._pull()
                backoff.reset()
            except asyncio.CancelledError:
                raise
            except _Reset as why:
                log.info("result consumer %s replaced: %s", self._name, why)
                self.resets += 1
                await self._drop()
            except Exception as e:  # noqa: BLE001 - the feed outlives any failure: try again
                # Transient or not (a refused consumer may be allowed after an operator's
                # fix), the one reader of the job's results keeps trying, jittered.
                wait_s = backoff.next_s()
                log.info("result consumer %s: %r; retrying in %.1fs", self._name, e, wait_s)
                await self._drop()
                await asyncio.sleep(wait_s)

    async def _pull(self) -> None:
        """One pull request, read to its end: ``batch`` results, or the server saying it
        expired. Raises :class:`_Reset` when the consumer must be replaced."""
        assert self._sub is not None and self._name is not None
        request = {
            "batch": self._batch,
            "expires": int(self._expires_s * 1e9),
            "idle_heartbeat": int(self._heartbeat_s * 1e9),
        }
        await self._nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{RESULTS_STREAM}.{self._name}",
                               json.dumps(request).encode(), reply=self._sub.subject)
        got = 0
        while got < self._batch and not self._stopping:
            try:
                msg = await self._sub.next_msg(timeout=3 * self._heartbeat_s)
            except Exception as e:  # nats' TimeoutError: neither a result nor a heartbeat
                raise _Reset("the pull went silent") from e
            status = (msg.headers or {}).get("Status")
            if status is None:
                self._deliver(msg)
                got += 1
            elif status == "100":
                continue  # idle heartbeat: the consumer is there, nothing new
            elif status in ("404", "408"):
                return  # nothing more for this request: pull again
            else:
                # 409: consumer deleted, leadership change, too many waiting pulls...
                raise _Reset(f"status {status} {(msg.headers or {}).get('Description', '')}")

    def _deliver(self, msg: Msg) -> None:
        meta = msg.metadata
        if meta.sequence.consumer != self._expected_cseq:
            raise _Reset(f"consumer sequence {meta.sequence.consumer}, expected {self._expected_cseq}")
        self._expected_cseq += 1
        self._next_seq = meta.sequence.stream + 1
        try:
            d = decode(msg.data, msg.headers)
        except Exception:  # noqa: BLE001 - a malformed result must not stop the others
            log.warning("undecodable message on %s", msg.subject)
            return
        self._on_result(d)
