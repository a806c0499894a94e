"""What every test file needs: where the cluster is, whose credentials to use, and a way to
run a coroutine with a bound on it.

Set by `tests/tests/python_sdk.rs`; by hand, against `tangram up --rollout-jobs py-sdk`:
TANGRAM_NATS_URL, TANGRAM_NKEY_FILE (creds/rollout-py-sdk.nk) and
TANGRAM_OPERATOR_NKEY_FILE (creds/operator.nk); leave both files unset with --no-auth.
"""

import asyncio
import os
import sys
from pathlib import Path

import nats

URL = os.environ.get("TANGRAM_NATS_URL", "nats://127.0.0.1:4222")
SERVICE = os.environ.get("TANGRAM_TEST_SERVICE", "judge")
PROVIDER = os.environ.get("TANGRAM_TEST_PROVIDER", "search")
JOB = "py-sdk"
# Credentials of the `py-sdk` job; none for an open server.
SEED = os.environ.get("TANGRAM_NKEY_FILE")
# The operator's, for what a job may not see (other consumers, other subjects).
OPERATOR_SEED = os.environ.get("TANGRAM_OPERATOR_NKEY_FILE")
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PYTHON = sys.executable


def run(coro, bound_s: float = 120):
    return asyncio.run(asyncio.wait_for(coro, bound_s))


async def operator():
    """A NATS connection with the operator's rights."""
    if SEED and not OPERATOR_SEED:
        raise RuntimeError("TANGRAM_OPERATOR_NKEY_FILE is unset on a server with users")
    if OPERATOR_SEED:
        return await nats.connect(URL, nkeys_seed=OPERATOR_SEED)
    return await nats.connect(URL)
