"""examples/nats_debug.py, the nats-py stand-in for the `nats` CLI, run as a user would."""

import json
import subprocess
import unittest

from support import EXAMPLES, JOB, OPERATOR_SEED, PYTHON, SEED, SERVICE, URL
from tangram_client import SyncClient

SCRIPT = str(EXAMPLES / "nats_debug.py")


def debug(*args, creds=SEED, timeout_s=60):
    cmd = [PYTHON, SCRIPT, "--url", URL] + (["--creds", creds] if creds else []) + list(args)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    return out.returncode, out.stdout, out.stderr


def lines(stdout):
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


class NatsDebugTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with SyncClient.connect(URL, job=JOB, nkeys_seed=SEED) as client:
            cls.result = client.run("t", {"kind": "reward", "service": SERVICE, "inputs": ["debug me"]})

    def test_a_jobs_credentials_may_not_read_stream_info(self):
        # Its subjects filter would list every job's stored subjects (docs/SECURITY.md).
        rc, out, err = debug("streams", "TANGRAM_RESULTS", timeout_s=120)
        self.assertEqual(rc, 0, err)
        (line,) = lines(out)
        self.assertEqual(line["stream"], "TANGRAM_RESULTS")
        self.assertNotIn("messages", line)
        self.assertIn("error", line)

    def test_streams_show_messages_bytes_and_consumers(self):
        rc, out, err = debug("streams", creds=OPERATOR_SEED)
        self.assertEqual(rc, 0, err)
        by_name = {s["stream"]: s for s in lines(out)}
        self.assertEqual(set(by_name), {"TANGRAM_ACTIONS", "TANGRAM_RESULTS", "TANGRAM_DISPATCH",
                                        "TANGRAM_DEADLETTER", "TANGRAM_HISTORY"})
        results = by_name["TANGRAM_RESULTS"]
        self.assertGreaterEqual(results["messages"], 1)
        self.assertGreater(results["bytes"], 0)
        self.assertGreaterEqual(results["consumers"], 1, "the scheduler's consumer at least")
        self.assertEqual(by_name["TANGRAM_ACTIONS"]["discard"], "new")

    def test_get_by_subject_and_by_sequence_decode_the_result(self):
        subject = f"tangram.v1.result.{JOB}.{self.result.id}"
        rc, out, err = debug("get", "TANGRAM_RESULTS", "--subject", subject)
        self.assertEqual(rc, 0, err)
        by_subject = json.loads(out)
        self.assertEqual((by_subject["subject"], by_subject["encoding"]), (subject, "msgpack"))
        self.assertEqual(by_subject["data"]["id"], self.result.id)
        self.assertEqual(by_subject["data"]["scores"], self.result.scores)
        # Reading by sequence names no subject a job could be held to: the operator's.
        rc, out, err = debug("get", "TANGRAM_RESULTS", str(by_subject["seq"]), creds=OPERATOR_SEED)
        self.assertEqual(rc, 0, err)
        self.assertEqual(json.loads(out)["data"], by_subject["data"])

    def test_consumers_lists_the_schedulers(self):
        rc, out, err = debug("consumers", "TANGRAM_RESULTS", creds=OPERATOR_SEED)
        self.assertEqual(rc, 0, err)
        names = {c["name"]: c for c in lines(out)}
        self.assertIn("scheduler-results", names)
        self.assertTrue(names["scheduler-results"]["durable"])

    def test_tail_prints_decoded_heartbeats_and_stops_at_the_count(self):
        rc, out, err = debug("tail", "tangram.v1.heartbeat.>", "--count", "2", "--timeout", "30",
                             creds=OPERATOR_SEED)
        self.assertEqual(rc, 0, err)
        beats = lines(out)
        self.assertEqual(len(beats), 2)
        self.assertTrue(all(b["encoding"] == "msgpack" and b["subject"].endswith(b["data"]["worker"])
                            for b in beats))

    def test_tail_says_when_nothing_came(self):
        rc, out, err = debug("tail", f"tangram.v1.result.{JOB}.nothing-here", "--timeout", "0.5")
        self.assertEqual((rc, out), (1, ""))
        self.assertIn("nothing on", err)


if __name__ == "__main__":
    unittest.main()
