"""Admission: a command not started within its ``queue_timeout_s`` is rejected
``queue_timeout`` and nothing of it ran, against a real cluster (run by
`tests/tests/python_sdk.rs`, whose one CPU worker has two cores)."""

import unittest
import uuid

from support import JOB, SEED, URL, run
from tangram_client import Outcome, Tangram


class Admission(unittest.TestCase):
    def test_a_command_not_started_within_its_queue_timeout_is_rejected_and_did_not_run(self):
        async def go():
            async with await Tangram.connect(URL, job=JOB, nkeys_seed=SEED, lease_s=None) as c:
                busy, late = (f"qt-{uuid.uuid4().hex[:8]}" for _ in range(2))
                a = await c.open_sandbox(busy)
                b = await c.open_sandbox(late)
                try:
                    # Both of the worker's cores, for 6 s.
                    hog = await c.submit(busy, a.exec_spec(["sleep", "6"], cpus=2), timeout_s=30)
                    r = await b.exec(["touch", "/work/ran"], queue_timeout_s=1.5)
                    self.assertIs(r.outcome, Outcome.REJECTED, r)
                    self.assertEqual(r.code, "queue_timeout", r)
                    self.assertIn("nothing ran", r.reason)
                    done = await c.result(hog, 60)
                    self.assertIs(done.outcome, Outcome.COMPLETED, done)
                    # Nothing of the late command ran.
                    check = await b.exec(["test", "-e", "/work/ran"])
                    self.assertEqual(check.exit_code, 1, check)
                finally:
                    await a.close()
                    await b.close()
        run(go())

    def test_a_queue_timeout_that_is_not_a_positive_number_is_refused_before_sending(self):
        async def go():
            async with await Tangram.connect(URL, job=JOB, nkeys_seed=SEED, lease_s=None) as c:
                from tangram_client.errors import InvalidAction
                with self.assertRaises(InvalidAction):
                    await c.submit("t", {"kind": "sandbox_exec", "argv": ["true"]}, queue_timeout_s=0)
        run(go())


if __name__ == "__main__":
    unittest.main()
