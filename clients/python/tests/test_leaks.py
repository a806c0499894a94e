"""Sandboxes nobody closes: ``close_job()`` and the lease the client keeps, against a real
cluster (run by `tests/tests/python_sdk.rs`)."""

import asyncio
import time
import unittest
import uuid

from support import JOB, OPERATOR_SEED, SEED, URL, run
from tangram_client import Outcome, Tangram


async def closed_because(client: Tangram, trajectory: str, wait_s: float) -> str:
    """Sends commands to the trajectory's sandbox until one is rejected ``no_sandbox`` (within
    ``wait_s``); returns the rejection's reason."""
    deadline = time.monotonic() + wait_s
    while True:
        r = await client.run(trajectory, {"kind": "sandbox_exec", "argv": ["true"]})
        if r.outcome is Outcome.REJECTED:
            assert r.code == "no_sandbox", r
            return r.reason
        assert r.outcome is Outcome.COMPLETED, r
        if time.monotonic() > deadline:
            raise AssertionError(f"the sandbox of {trajectory} was still open after {wait_s} s")
        await asyncio.sleep(0.5)


class Leaks(unittest.TestCase):
    def test_close_job_closes_every_sandbox_of_the_job(self):
        async def go():
            async with await Tangram.connect(URL, job=JOB, nkeys_seed=SEED, lease_s=None) as c:
                trajs = [f"cj-{uuid.uuid4().hex[:8]}" for _ in range(2)]
                for t in trajs:
                    await c.open_sandbox(t)
                self.assertGreaterEqual(await c.close_job(), 2)
                for t in trajs:
                    self.assertIn("job_closed", await closed_because(c, t, 30))
        run(go())

    def test_a_job_whose_clients_stop_renewing_the_lease_loses_its_sandboxes(self):
        async def go():
            # A job of its own (the lease is the job's: the other tests' clients renewed
            # py-sdk's for 300 s), with the operator's credentials.
            job, t = f"py-lease-{uuid.uuid4().hex[:6]}", "t1"
            crashed = await Tangram.connect(URL, job=job, nkeys_seed=OPERATOR_SEED, lease_s=2)
            await crashed.open_sandbox(t)
            # Still renewed after twice the lease: the sandbox is there.
            await asyncio.sleep(4)
            r = await crashed.run(t, {"kind": "sandbox_exec", "argv": ["true"]})
            self.assertIs(r.outcome, Outcome.COMPLETED, r)
            await crashed.close()  # renews no more, as a crashed rollout would
            async with await Tangram.connect(URL, job=job, nkeys_seed=OPERATOR_SEED, lease_s=None) as c:
                self.assertIn("lease_expired", await closed_because(c, t, 30))
        run(go())


if __name__ == "__main__":
    unittest.main()
