"""Tests of the Python client against a real cluster.

Run by the Rust test `tests/tests/python_sdk.rs`, which starts NATS, the scheduler, a CPU
worker, a GPU worker (service `judge`) and an API worker (provider `search`) and sets
TANGRAM_NATS_URL. By hand: `tangram up`, then
`TANGRAM_NATS_URL=nats://127.0.0.1:4222 python -m unittest discover -s clients/python/tests`.
"""

import asyncio
import unittest
import uuid

import nats

from support import PROVIDER, SEED, SERVICE, URL, run
from tangram_client import ActionFailed, InvalidAction, Outcome, Tangram, TangramError, TangramTimeout


class ClientTest(unittest.TestCase):
    def test_sandbox_exec_files_stdin_and_exit_codes(self):
        async def go():
            async with await Tangram.connect(URL, job="py-sdk", nkeys_seed=SEED) as client:
                traj = "t-" + uuid.uuid4().hex[:8]
                async with await client.open_sandbox(trajectory=traj, memory_mb=256) as sandbox:
                    r = await sandbox.exec(["python3", "main.py"], cpus=(1, 2), timeout_s=20,
                                           files={"main.py": "import os\nprint(int(os.environ['TANGRAM_CPUS']) >= 1)\n"})
                    self.assertEqual(r.outcome, Outcome.COMPLETED)
                    self.assertEqual((r.exit_code, r.stdout), (0, "True\n"))
                    self.assertTrue(r.ok)
                    self.assertGreaterEqual(r.timing.act_s, r.timing.exec_s)
                    self.assertIsNotNone(r.placement)
                    r = await sandbox.exec(["python3", "-c", "import sys; print(sys.stdin.read().upper()); sys.exit(3)"],
                                           stdin="hello")
                    self.assertEqual((r.outcome, r.exit_code, r.stdout), (Outcome.COMPLETED, 3, "HELLO\n"))
                    r = await sandbox.exec(["sleep", "30"], timeout_s=1)
                    self.assertEqual(r.outcome, Outcome.TIMED_OUT)
        run(go())

    def test_reward_and_api(self):
        async def go():
            async with await Tangram.connect(URL, job="py-sdk", nkeys_seed=SEED) as client:
                scores = await client.reward(service=SERVICE, inputs=["def f(x): return x", "print(1)"])
                self.assertEqual(len(scores), 2)
                self.assertTrue(all(isinstance(s, float) for s in scores))
                again = await client.reward(service=SERVICE, inputs=["def f(x): return x"])
                self.assertEqual(again[0], scores[0], "the same model scores the same input the same way")
                reply = await client.api(provider=PROVIDER, method="GET", path="/search", query={"q": "python"})
                self.assertEqual(reply.status, 200)
                with self.assertRaises(ActionFailed) as e:
                    await client.reward(service="no-such-service", inputs=["x"])
                self.assertEqual(e.exception.result.outcome, Outcome.REJECTED)
                self.assertEqual(e.exception.result.code, "unknown_service")
                with self.assertRaises(ActionFailed) as e:
                    await client.api(provider=PROVIDER, path="/admin")
                self.assertEqual(e.exception.result.code, "not_allowed")
        run(go())

    def test_rejections_are_outcomes_not_hangs(self):
        async def go():
            async with await Tangram.connect(URL, job="py-sdk", nkeys_seed=SEED) as client:
                r = await client.run("t-none-" + uuid.uuid4().hex[:6], {"kind": "sandbox_exec", "argv": ["true"],
                                                                      "cpus": {"min": 1, "max": 1}})
                self.assertEqual(r.outcome, Outcome.REJECTED)
                self.assertEqual(r.code, "no_sandbox")
                r = await client.run("t", {"kind": "sandbox_exec", "argv": [], "cpus": {"min": 1, "max": 1}})
                self.assertEqual((r.outcome, r.code), (Outcome.REJECTED, "invalid_field"))
                # What cannot stand in a subject is refused here, before anything is sent.
                with self.assertRaises(InvalidAction):
                    await client.submit("t", {"kind": "sandbox_exec"}, action_id="has.a.dot")
                with self.assertRaises(InvalidAction):
                    await client.submit("t", {"kind": "tele port"})
        run(go())

    def test_same_id_twice_runs_once_and_returns_the_same_result(self):
        async def go():
            async with await Tangram.connect(URL, job="py-sdk", nkeys_seed=SEED) as client:
                aid = "dup-" + uuid.uuid4().hex[:8]
                spec = {"kind": "reward", "service": SERVICE, "inputs": ["x"], "options": {}}
                first = await client.run("t", spec, action_id=aid)
                second = await client.run("t", spec, action_id=aid)
                self.assertEqual(first.raw, second.raw)
        run(go())

    def test_a_result_that_never_comes_raises_a_clear_timeout(self):
        async def go():
            async with await Tangram.connect(URL, job="py-sdk", nkeys_seed=SEED) as client:
                with self.assertRaises(TangramTimeout) as e:
                    await client.result("never-submitted-" + uuid.uuid4().hex[:6], wait_s=1.0)
                self.assertIn("no result", str(e.exception))
        run(go())

    def test_results_survive_a_reconnect(self):
        async def go():
            client = await Tangram.connect(URL, job="py-sdk", nkeys_seed=SEED)
            aid = await client.submit("t", {"kind": "reward", "service": SERVICE, "inputs": ["y"], "options": {}})
            await client.close()
            # A new connection (a restarted trainer) still gets it from the result stream.
            async with await Tangram.connect(URL, job="py-sdk", nkeys_seed=SEED) as again:
                r = await again.result(aid, wait_s=60)
                self.assertEqual(r.outcome, Outcome.COMPLETED)
        run(go())

    @unittest.skipUnless(SEED, "the server has no users (TANGRAM_NKEY_FILE unset)")
    def test_one_jobs_credentials_cannot_act_for_another_job(self):
        async def go():
            # The client cannot even follow another job's results...
            with self.assertRaises(TangramError) as e:
                await Tangram.connect(URL, job="someone-else", nkeys_seed=SEED, publish_timeout_s=1.0)
            self.assertIn("someone-else", str(e.exception))
            # ...nor, with nats-py alone, submit for it: the publish is refused, so no ack.
            nc = await nats.connect(URL, nkeys_seed=SEED, inbox_prefix="_R_rollout.py-sdk")
            try:
                with self.assertRaises(nats.errors.TimeoutError):
                    await nc.jetstream().publish("tangram.v1.action.someone-else.sandbox_open", b"{}",
                                                 headers={"Nats-Msg-Id": "x-" + uuid.uuid4().hex[:8]},
                                                 timeout=1.0)
            finally:
                await nc.close()
        run(go())


if __name__ == "__main__":
    unittest.main()
