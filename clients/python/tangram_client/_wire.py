"""Subjects, ids and decoding: the one place this package spells the protocol's names."""

from __future__ import annotations

import itertools
import json
import os
import re
import uuid
from typing import Any, Dict, Mapping, Optional, cast

import msgpack

from .errors import InvalidAction

RESULTS_STREAM = "TANGRAM_RESULTS"
# Stream names in the documented order (docs/PROTOCOL.md, "Streams").
STREAMS = (
    "TANGRAM_ACTIONS",
    "TANGRAM_RESULTS",
    "TANGRAM_DISPATCH",
    "TANGRAM_DEADLETTER",
    "TANGRAM_HISTORY",
)
# JetStream's error code for a publish refused by a full stream that discards new messages.
STREAM_FULL = 10077

_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


def check_id(what: str, value: str) -> str:
    """``value`` if it may stand in a subject (1 to 128 of ``[A-Za-z0-9_-]``)."""
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise InvalidAction(f"{what} {value!r} must be 1 to 128 letters, digits, '-' or '_'")
    return value


def action_subject(job: str, kind: str) -> str:
    return f"tangram.v1.action.{job}.{kind}"


def result_subject(job: str, action_id: str) -> str:
    return f"tangram.v1.result.{job}.{action_id}"


def results_of(job: str) -> str:
    """The wildcard over every result of a job."""
    return f"tangram.v1.result.{job}.>"


_counter = itertools.count()


def new_id(prefix: str) -> str:
    """A fresh action id: random, so unique across jobs and processes."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}-{next(_counter)}"


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


def decode(data: bytes, headers: Optional[Mapping[str, str]]) -> Dict[str, Any]:
    """A message body in the encoding its ``Content-Type`` names (msgpack when absent)."""
    ctype = (headers or {}).get("Content-Type", "application/msgpack")
    if "json" in ctype:
        return cast(Dict[str, Any], json.loads(data))
    return cast(Dict[str, Any], msgpack.unpackb(data, raw=False))


def encode_action(action: Mapping[str, Any]) -> bytes:
    return msgpack.packb(dict(action), use_bin_type=True)
