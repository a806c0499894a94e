"""Batches, and the one result consumer each client reads every result from."""

import unittest
import uuid

from support import JOB, SEED, SERVICE, URL, operator, run
from tangram_client import Action, ActionFailed, InvalidAction, Outcome, Sandbox, Tangram

RESULTS = "TANGRAM_RESULTS"


async def job_consumers(nc):
    """Names of the consumers on the results stream that follow this job."""
    infos = await nc.jetstream().consumers_info(RESULTS)
    return {c.name for c in infos if c.config.filter_subject == f"tangram.v1.result.{JOB}.>"}


class BatchTest(unittest.TestCase):
    def test_a_batch_keeps_order_and_one_bad_action_costs_the_others_nothing(self):
        async def go():
            async with await Tangram.connect(URL, job=JOB, nkeys_seed=SEED) as client:
                texts = [f"sample number {i} " + "x" * i for i in range(12)]
                # One action scoring all texts: the reference each batch position must match.
                reference = await client.reward(SERVICE, texts)
                actions = [client.reward_action(SERVICE, [t]) for t in texts]
                actions.insert(5, Action("t", {"kind": "reward", "service": SERVICE, "inputs": ["z"]},
                                         action_id="not a valid id"))
                actions.insert(9, Action("t-none-" + uuid.uuid4().hex[:6],
                                         Sandbox.exec_spec(["true"])))
                items = await client.run_batch(actions)
                self.assertEqual(len(items), len(actions))
                self.assertIsInstance(items[5], InvalidAction)
                self.assertEqual((items[9].outcome, items[9].code), (Outcome.REJECTED, "no_sandbox"))
                scores = [i.scores[0] for n, i in enumerate(items) if n not in (5, 9)]
                self.assertEqual(scores, reference)
                self.assertEqual(len({i.id for n, i in enumerate(items) if n != 5}), len(items) - 1)

                per_entry = await client.reward_batch(SERVICE, [texts[:1], texts[1:3], []])
                self.assertEqual(per_entry[0], reference[:1])
                self.assertEqual(per_entry[1], reference[1:3])
                # No inputs is refused by the scheduler: an error in its place, not a lost batch.
                self.assertIsInstance(per_entry[2], ActionFailed)
                self.assertEqual(per_entry[2].result.code, "invalid_field")
        run(go())

    def test_submit_batch_returns_ids_in_order(self):
        async def go():
            async with await Tangram.connect(URL, job=JOB, nkeys_seed=SEED) as client:
                mine = "mine-" + uuid.uuid4().hex[:8]
                ids = await client.submit_batch([client.reward_action(SERVICE, ["a"]),
                                                 Action("reward", {"kind": "reward", "service": SERVICE,
                                                                   "inputs": ["b"]}, action_id=mine)])
                self.assertEqual(ids[1], mine)
                results = [await client.result(i, wait_s=60) for i in ids]
                self.assertEqual([r.id for r in results], ids)
                self.assertTrue(all(r.outcome is Outcome.COMPLETED for r in results))
        run(go())


class ResultFeedTest(unittest.TestCase):
    def test_each_client_has_one_consumer_however_many_actions_wait(self):
        async def go():
            op = await operator()
            try:
                before = await job_consumers(op)
                client = await Tangram.connect(URL, job=JOB, nkeys_seed=SEED)
                try:
                    self.assertEqual(await job_consumers(op) - before, {client.results_consumer})
                    ids = await client.submit_batch([client.reward_action(SERVICE, [f"w{i}"]) for i in range(20)])
                    # Twenty waiters at once, and still the one consumer.
                    self.assertEqual(await job_consumers(op) - before, {client.results_consumer})
                    for i in ids:
                        self.assertEqual((await client.result(i, wait_s=60)).outcome, Outcome.COMPLETED)
                finally:
                    await client.close()
                self.assertEqual(await job_consumers(op) - before, set(), "close removes the consumer")
            finally:
                await op.close()
        run(go())

    def test_a_result_published_before_anyone_waits_for_it_is_found(self):
        async def go():
            async with await Tangram.connect(URL, job=JOB, nkeys_seed=SEED) as watcher, \
                    await Tangram.connect(URL, job=JOB, nkeys_seed=SEED) as submitter:
                aid = await submitter.submit("t", {"kind": "reward", "service": SERVICE, "inputs": ["early"]})
                first = await submitter.result(aid, wait_s=60)
                # The watcher's consumer saw that result go by with nobody waiting for it.
                again = await watcher.result(aid, wait_s=10)
                self.assertEqual(again.raw, first.raw)
        run(go())

    def test_the_feed_replaces_a_consumer_deleted_under_it(self):
        async def go():
            op = await operator()
            try:
                async with await Tangram.connect(URL, job=JOB, nkeys_seed=SEED) as client:
                    self.assertEqual(len(await client.reward(SERVICE, ["before"])), 1)
                    lost = client.results_consumer
                    await op.jetstream().delete_consumer(RESULTS, lost)
                    # A fresh id needs the feed: the client does not look it up.
                    r = await client.run("t", {"kind": "reward", "service": SERVICE, "inputs": ["after"]},
                                         wait_s=30)
                    self.assertEqual(r.outcome, Outcome.COMPLETED)
                    self.assertNotEqual(client.results_consumer, lost)
                    self.assertIn(client.results_consumer, await job_consumers(op))
            finally:
                await op.close()
        run(go())


if __name__ == "__main__":
    unittest.main()
