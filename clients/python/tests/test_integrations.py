"""The verl reward function and the OpenRLHF remote reward server, against the cluster's
`judge` service. The framework itself is not needed: the function's shape and the HTTP
request's shape are the contract."""

import importlib.util
import json
import os
import subprocess
import unittest
import urllib.error
import urllib.request
from unittest import mock

from support import EXAMPLES, JOB, PYTHON, SEED, SERVICE, URL
from tangram_client import ActionFailed, SyncClient, TangramError
from tangram_client.integrations import verl


def verl_env(**extra):
    env = {"TANGRAM_NATS_URL": URL, "TANGRAM_JOB": JOB, "TANGRAM_REWARD_SERVICE": SERVICE, **extra}
    if SEED:
        env["TANGRAM_NKEY_FILE"] = SEED
    return mock.patch.dict(os.environ, env)


class VerlTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.client = SyncClient.connect(URL, job=JOB, nkeys_seed=SEED)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()

    def tearDown(self):
        verl.close()  # the next test reads its own environment

    def expected(self, texts):
        return self.client.reward(SERVICE, texts)

    def test_compute_score_scores_the_solution_with_the_service(self):
        with verl_env():
            score = verl.compute_score("gsm8k", "The answer is 4", "4")
            self.assertIsInstance(score, float)
            self.assertEqual([score], self.expected(["The answer is 4"]))
            # A different solution is a different input, so (with this model) another score.
            self.assertNotEqual(verl.compute_score("gsm8k", "The answer is 5", "4"), score)

    def test_the_template_decides_what_is_scored(self):
        template = "{data_source}|{solution_str}|{ground_truth}|{extra_info[question]}"
        with verl_env(TANGRAM_REWARD_TEMPLATE=template, TANGRAM_REWARD_OPTIONS='{"rubric": "strict"}'):
            score = verl.compute_score("math", "x=2", ["2", "two"], {"question": "solve x+1=3"}, max_len=512)
            self.assertEqual([score], self.expected(['math|x=2|[\'2\', \'two\']|solve x+1=3']))
            config = verl.RewardConfig.from_env()
            self.assertEqual(config.sample_options("math", ["2"], {"max_len": 512}),
                             {"rubric": "strict", "max_len": "512", "data_source": "math", "ground_truth": '["2"]'})

    def test_the_batch_form_keeps_order(self):
        with verl_env():
            sols = [f"candidate {i}" for i in range(6)]
            scores = verl.compute_score_batch(["ds"] * 6, sols, ["gt"] * 6, [None] * 6)
            self.assertEqual(scores, self.expected(sols))
            with self.assertRaises(ValueError):
                verl.compute_score_batch(["ds"], sols, ["gt"] * 6)

    def test_failures_raise_instead_of_scoring(self):
        with verl_env(TANGRAM_REWARD_SERVICE="no-such-service"):
            with self.assertRaises(ActionFailed) as e:
                verl.compute_score("ds", "s", "g")
            self.assertEqual(e.exception.result.code, "unknown_service")
        verl.close()
        with verl_env(TANGRAM_REWARD_SERVICE=""):
            with self.assertRaises(TangramError) as e:
                verl.compute_score("ds", "s", "g")
            self.assertIn("TANGRAM_REWARD_SERVICE", str(e.exception))


def verl_loader():
    """verl's own loader for ``custom_reward_function.path``: ``load_extern_object`` of
    ``verl/utils/import_utils.py`` (what ``verl.trainer.ppo.reward.get_custom_reward_fn``
    calls), from verl as installed (`deploy/install-tools.sh` pins it, with --no-deps).
    Importing it as ``verl.utils.import_utils`` would run ``verl/__init__.py``, which
    imports ray and torch; so its file is loaded on its own (it needs the standard library
    only) and verl's function itself does the loading."""
    spec = importlib.util.find_spec("verl")  # finds the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("verl is not installed: run deploy/install-tools.sh "
                           "(it installs the pinned verl into tools/venv with --no-deps)")
    path = os.path.join(spec.submodule_search_locations[0], "utils", "import_utils.py")
    utils_spec = importlib.util.spec_from_file_location("verl_import_utils_under_test", path)
    module = importlib.util.module_from_spec(utils_spec)
    utils_spec.loader.exec_module(module)
    return module.load_extern_object


class VerlLoadingTest(unittest.TestCase):
    """verl loads the reward function the two ways its config allows."""

    @classmethod
    def setUpClass(cls):
        cls.load = staticmethod(verl_loader())
        cls.client = SyncClient.connect(URL, job=JOB, nkeys_seed=SEED)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()

    def check_scores(self, compute_score, close):
        try:
            with verl_env():
                self.assertEqual([compute_score("gsm8k", "loaded by verl", "4")],
                                 self.client.reward(SERVICE, ["loaded by verl"]))
        finally:
            close()

    def test_by_file_path(self):
        # A module loaded from its file has no package: relative imports in it would fail.
        compute_score = self.load(module_path=verl.__file__, object_name="compute_score")
        self.assertIsNot(compute_score, verl.compute_score, "a copy, loaded from the file")
        close = self.load(module_path=verl.__file__, object_name="close")
        self.check_scores(compute_score, close)
        self.assertTrue(callable(self.load(module_path="file://" + verl.__file__, object_name="compute_score_batch")))

    def test_by_package_path(self):
        compute_score = self.load(module_path="pkg://tangram_client.integrations.verl", object_name="compute_score")
        self.assertIs(compute_score, verl.compute_score)
        self.check_scores(compute_score, verl.close)

    def test_it_imports_without_verl(self):
        # A process where `import verl` fails loads the module both ways.
        code = ("import sys, importlib, importlib.util\n"
                "sys.modules['verl'] = None\n"
                "spec = importlib.util.spec_from_file_location('by_path', sys.argv[1])\n"
                "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
                "assert callable(m.compute_score)\n"
                "assert callable(importlib.import_module('tangram_client.integrations.verl').compute_score_batch)\n"
                "try:\n    import verl\nexcept ImportError:\n    print('ok')\n")
        out = subprocess.run([PYTHON, "-c", code, verl.__file__], capture_output=True, text=True, timeout=60)
        self.assertEqual((out.returncode, out.stdout), (0, "ok\n"), out.stderr)


class OpenRlhfServerTest(unittest.TestCase):
    def start(self, service):
        args = [PYTHON, str(EXAMPLES / "openrlhf_reward_server.py"), "--url", URL, "--job", JOB,
                "--service", service, "--port", "0", "--inputs-per-action", "2"]
        if SEED:
            args += ["--creds", SEED]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()  # blocks until the server says where it listens
        if not line.startswith("listening on "):
            self.proc.kill()
            self.fail("the server did not start: " + line + self.proc.communicate()[1])
        self.url = line.split()[-1] + "/get_reward"
        self.addCleanup(self.stop)

    def stop(self):
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=30)
        self.assertEqual(self.proc.returncode, 0, "a stopped server exits cleanly:\n" + err)

    def post(self, body):
        req = urllib.request.Request(self.url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def test_queries_in_rewards_out_in_order(self):
        self.start(SERVICE)
        queries = [f"prompt {i} and its response" for i in range(5)]
        status, answer = self.post({"query": queries, "prompts": ["p"] * 5, "labels": ["l"] * 5})
        self.assertEqual(status, 200, answer)
        with SyncClient.connect(URL, job=JOB, nkeys_seed=SEED) as client:
            expected = client.reward(SERVICE, queries)
        self.assertEqual(answer["rewards"], expected)
        self.assertEqual(answer["scores"], expected)
        self.assertEqual(self.post({"query": []}), (200, {"rewards": [], "scores": []}))

    def test_bad_requests_are_told_so(self):
        self.start(SERVICE)
        status, answer = self.post({"queries": ["wrong key"]})
        self.assertEqual(status, 400)
        self.assertIn("query", answer["error"])
        status, _ = self.post({"query": ["a", "b"], "labels": ["only one"]})
        self.assertEqual(status, 400)

    def test_a_failed_action_fails_the_request_and_names_it(self):
        self.start("no-such-service")
        status, answer = self.post({"query": ["a", "b", "c"]})
        self.assertEqual(status, 502)
        self.assertEqual(len(answer["failed"]), 2, "three queries, two per action")
        self.assertEqual({f["code"] for f in answer["failed"]}, {"unknown_service"})


if __name__ == "__main__":
    unittest.main()
