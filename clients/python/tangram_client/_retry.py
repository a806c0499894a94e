"""What is worth trying again, and how long to wait before the next try.

A failure is *transient* when the same request can succeed a moment later without anyone
changing anything: no reply in time, nobody serving the subject while a stream elects a
leader or a server is replaced, the connection reconnecting. Everything else (a refusal,
a closed client, a malformed request) is final. The decision is made on the exception's
type alone, never on its message.

Every retry loop of the client waits with :class:`Backoff`: exponential, capped, and
jittered, so many clients cut off by the same fault do not all come back in the same
instant.
"""

from __future__ import annotations

import asyncio
import random
from typing import Optional, Tuple, Type

import nats.errors
import nats.js.errors

from ._wire import STREAM_FULL

TRANSIENT: Tuple[Type[BaseException], ...] = (
    # No reply in time: a lost acknowledgement, a stream electing a leader, a slow server.
    # nats-py's TimeoutError (and FlushTimeoutError) derive from asyncio's.
    asyncio.TimeoutError,
    # Nobody listens on the subject right now.
    nats.errors.NoRespondersError,
    # A JetStream publish that no stream answered: its server died, or it has no leader yet.
    nats.js.errors.NoStreamResponseError,
    # JetStream answered 503: temporarily unavailable.
    nats.js.errors.ServiceUnavailableError,
    # The connection is being re-established (and its outgoing buffer is full).
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.StaleConnectionError,
    # The socket itself failed.
    OSError,
)


def is_transient(e: BaseException) -> bool:
    """True when ``e`` is worth retrying as it is (see :data:`TRANSIENT`). A full stream
    answers 503 too (error code 10077), but it stays full until work drains: that is
    backpressure for the caller, not a failure to retry at once."""
    if isinstance(e, nats.js.errors.APIError) and e.err_code == STREAM_FULL:
        return False
    return isinstance(e, TRANSIENT)


class Backoff:
    """Waits that double from ``first_s`` up to ``max_s``, each drawn uniformly from the
    upper half of its step ("equal jitter"): the n-th wait lies in
    ``[c/2, c]`` with ``c = min(first_s * 2**n, max_s)``."""

    def __init__(self, first_s: float = 0.1, max_s: float = 2.0, rng: Optional[random.Random] = None) -> None:
        if not 0 < first_s <= max_s:
            raise ValueError("need 0 < first_s <= max_s")
        self.first_s = first_s
        self.max_s = max_s
        self._rng = rng if rng is not None else random.Random()
        self._step = first_s

    def next_s(self) -> float:
        """The next wait, in seconds; the step after it is twice as long (up to the cap)."""
        step = self._step
        self._step = min(step * 2, self.max_s)
        return self._rng.uniform(step / 2, step)

    def reset(self) -> None:
        """Back to the first step, after a success."""
        self._step = self.first_s

    async def sleep(self) -> None:
        await asyncio.sleep(self.next_s())
