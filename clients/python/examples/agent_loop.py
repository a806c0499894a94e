"""An agent loop shaped like a verl / OpenRLHF rollout worker: for each trajectory in the
batch, generate (here: pick a candidate solution), run the unit tests in the trajectory's
sandbox, look something up through the search provider, and score with the reward service;
the trajectories run concurrently and share the cluster's pools.

    tangram up
    python clients/python/examples/agent_loop.py --trajectories 8
"""

import argparse
import asyncio
import random
import time

from tangram_client import Outcome, Tangram

CANDIDATES = {
    "good": "def add(a, b):\n    return a + b\n",
    "buggy": "def add(a, b):\n    return a - b\n",
}
TESTS = (
    "import unittest\nfrom solution import add\n"
    "class T(unittest.TestCase):\n"
    "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
    "unittest.main()\n"
)


async def trajectory(client: Tangram, i: int, turns: int) -> dict:
    rng = random.Random(i)
    stats = {"passed": 0, "turns": 0, "reward": 0.0}
    sandbox = await client.open_sandbox(trajectory=f"traj-{i}", memory_mb=256)
    try:
        for turn in range(turns):
            await asyncio.sleep(rng.uniform(0.2, 0.8))  # the policy model generating
            code = CANDIDATES["good" if rng.random() < 0.6 else "buggy"]
            r = await sandbox.exec(["python3", "test_solution.py"], cpus=(1, 2), timeout_s=30,
                                   files={"solution.py": code, "test_solution.py": TESTS})
            passed = r.outcome is Outcome.COMPLETED and r.exit_code == 0
            hint = await client.api(provider="search", path="/search", query={"q": "python add numbers"},
                                    trajectory=f"traj-{i}")
            [score] = await client.reward(service="judge", inputs=[code], trajectory=f"traj-{i}")
            stats["turns"] += 1
            stats["passed"] += passed
            stats["reward"] += (1.0 if passed else 0.0) + 0.01 * score
            print(f"traj-{i} turn {turn}: tests {'pass' if passed else 'FAIL'}, act {r.timing.act_s:.3f}s, "
                  f"search {hint.status}, judge {score:+.3f}")
    finally:
        await sandbox.close()
    return stats


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="nats://127.0.0.1:4222")
    ap.add_argument("--creds", default=".tangram/creds/rollout.nk", help="nkey seed file ('' without users)")
    ap.add_argument("--trajectories", type=int, default=8)
    ap.add_argument("--turns", type=int, default=3)
    args = ap.parse_args()
    t0 = time.monotonic()
    async with await Tangram.connect(args.url, job="agent-loop", nkeys_seed=args.creds or None) as client:
        results = await asyncio.gather(*(trajectory(client, i, args.turns) for i in range(args.trajectories)))
    turns = sum(r["turns"] for r in results)
    print(f"{len(results)} trajectories, {turns} turns, pass rate {sum(r['passed'] for r in results) / turns:.0%}, "
          f"mean reward {sum(r['reward'] for r in results) / len(results):.2f}, {time.monotonic() - t0:.1f}s")


if __name__ == "__main__":
    asyncio.run(main())
