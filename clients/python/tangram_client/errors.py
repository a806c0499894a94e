"""The client's errors. Every failure a caller can act on has its own type; none is told
apart by its message."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from .results import Result


class TangramError(Exception):
    """Base class of this client's errors."""


class InvalidAction(TangramError, ValueError):
    """The action was refused before it was sent: an id, job or kind that the protocol does
    not allow in a subject. Nothing was published."""


class TangramConnectError(TangramError):
    """:meth:`Tangram.connect` could not connect, or could not follow the job's results.
    The message says what to fix; ``servers`` are the URLs tried. Raised within a few
    seconds: only a connection that once succeeded is retried for ever."""

    def __init__(self, message: str, servers: "Sequence[str]" = ()) -> None:
        super().__init__(message)
        self.servers = list(servers)


class TangramUnavailable(TangramError):
    """The cluster did not answer a request after every retry: a server down and not yet
    replaced, a stream still electing a leader, the connection still reconnecting. An
    action's publish may or may not have been stored; submitting the same id again is safe
    (the stream keeps one copy). The library's last error is ``__cause__``."""


class TangramTimeout(TangramError):
    """No result arrived in time. The action may still run; its result will be on its result
    subject, and submitting the same id again returns it instead of running it twice."""


class TangramBackpressure(TangramError):
    """The cluster refused the action because its action stream is full: work is arriving
    faster than it is processed. Nothing was stored; slow down (see ``tangram status``, the
    queue's estimated wait) and submit the same id again later.

    ``reason`` is the server's description (``maximum bytes exceeded`` or
    ``maximum messages exceeded``)."""

    def __init__(self, action_id: str, reason: str) -> None:
        super().__init__(f"action {action_id} refused, the action stream is full ({reason}): "
                         "the cluster is not keeping up; slow down and resubmit it later")
        self.action_id = action_id
        self.reason = reason


class ActionFailed(TangramError):
    """A call that needs a completed action (open_sandbox, reward, api) got another outcome.
    ``result`` is the whole result, with its outcome, code and reason."""

    def __init__(self, result: "Result") -> None:
        self.result = result
        super().__init__(
            f"{result.kind or 'action'} {result.id} {result.outcome.value}"
            + (f" ({result.code}): {result.reason}" if result.reason else "")
        )
