"""Results as Python values: the wire's result message (docs/PROTOCOL.md, "Result") with
microseconds turned into seconds and the outcome into an enum."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional


class Outcome(str, enum.Enum):
    """How an action ended."""

    COMPLETED = "completed"
    TIMED_OUT = "timed_out"
    OUT_OF_MEMORY = "out_of_memory"
    REJECTED = "rejected"
    INFRA_ERROR = "infra_error"


@dataclass(frozen=True)
class Timing:
    """Where the time went, seconds: act_s = queued_s + overhead_s + exec_s."""

    queued_s: float
    overhead_s: float
    exec_s: float
    act_s: float


@dataclass(frozen=True)
class Placement:
    """Where an action ran: the worker, how many cores, which host CPUs (``"0-1"``)."""

    worker: str
    cores: int
    cpuset: str


@dataclass(frozen=True)
class HttpReply:
    """The provider's answer to an ``api`` action."""

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
        """Builds a result from a decoded result message."""
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
