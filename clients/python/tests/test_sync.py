"""The blocking client, called from threads that have no event loop."""

import threading
import unittest
import uuid
from concurrent.futures import ThreadPoolExecutor

from support import JOB, SEED, SERVICE, URL
from tangram_client import Action, ActionFailed, InvalidAction, Outcome, SyncClient, TangramError


class SyncClientTest(unittest.TestCase):
    def test_the_same_calls_block_and_return_or_raise(self):
        client = SyncClient.connect(URL, job=JOB, nkeys_seed=SEED)
        thread = client.thread
        with client:
            self.assertNotEqual(thread, threading.current_thread())
            [score] = client.reward(SERVICE, ["sync input"])
            self.assertIsInstance(score, float)
            with client.open_sandbox("t-" + uuid.uuid4().hex[:8], memory_mb=256) as sandbox:
                r = sandbox.exec(["python3", "-c", "print(6 * 7)"], timeout_s=20)
                self.assertEqual((r.outcome, r.exit_code, r.stdout), (Outcome.COMPLETED, 0, "42\n"))
            with self.assertRaises(ActionFailed) as e:
                client.reward("no-such-service", ["x"])
            self.assertEqual(e.exception.result.code, "unknown_service")
            items = client.run_batch([client.reward_action(SERVICE, ["sync input"]),
                                      Action("t", {"kind": "reward"}, action_id="bad id")])
            self.assertEqual(items[0].scores, [score])
            self.assertIsInstance(items[1], InvalidAction)
            aid = client.submit("t", {"kind": "reward", "service": SERVICE, "inputs": ["later"]})
            self.assertEqual(client.result(aid, wait_s=60).id, aid)
        self.assertFalse(thread.is_alive(), "close ends the client's thread")
        with self.assertRaises(TangramError):
            client.reward(SERVICE, ["after close"])

    def test_threads_share_one_client(self):
        with SyncClient.connect(URL, job=JOB, nkeys_seed=SEED) as client:
            texts = [f"thread text {i}" for i in range(16)]
            reference = client.reward(SERVICE, texts)
            with ThreadPoolExecutor(8) as pool:
                scores = list(pool.map(lambda t: client.reward(SERVICE, [t])[0], texts))
            self.assertEqual(scores, reference)


if __name__ == "__main__":
    unittest.main()
