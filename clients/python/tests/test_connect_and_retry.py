"""Connecting fails fast and says why; what is transient is retried (same id, jittered
backoff) and only then surfaced as a TangramError, never as a library's own exception."""

import asyncio
import os
import random
import socket
import tempfile
import threading
import time
import unittest
import uuid

import nats.errors
import nats.js.errors

from support import SEED, SERVICE, URL, run
from tangram_client import (Outcome, SyncClient, Tangram, TangramConnectError, TangramError,
                            TangramUnavailable)
from tangram_client._retry import Backoff, is_transient

# "Within a few seconds": nats-py's own connect waits up to 2 s for a silent server, twice
# (about 4.5 s in all); the margin is for a loaded two-core CI machine.
FAST_S = 12.0
# Bounds the whole attempt, so a connect that would retry for ever fails the test instead of hanging it.
HANG_S = 30.0


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ConnectFailsFastTest(unittest.TestCase):
    def connect_error(self, url, **options) -> TangramConnectError:
        """The TangramConnectError that connecting raises, checked to come within FAST_S."""
        async def go():
            start = time.monotonic()
            with self.assertRaises(TangramConnectError) as e:
                await Tangram.connect(url, job="py-sdk", **options)
            self.assertLess(time.monotonic() - start, FAST_S, "connect must give up within a few seconds")
            return e.exception
        return run(go(), HANG_S)

    @unittest.skipUnless(SEED, "the server has no users (TANGRAM_NKEY_FILE unset)")
    def test_no_credentials_names_the_credentials_file_and_no_auth(self):
        e = self.connect_error(URL)
        self.assertIn("nkeys_seed=", str(e))
        self.assertIn("creds/rollout.nk", str(e))
        self.assertIn("--no-auth", str(e))
        self.assertIsInstance(e, TangramError)
        # The blocking client raises the same, and leaves no thread behind.
        threads = set(threading.enumerate())
        with self.assertRaises(TangramConnectError):
            SyncClient.connect(URL, job="py-sdk")
        left = [t for t in threading.enumerate() if t not in threads and t.is_alive()]
        self.assertEqual(left, [])

    @unittest.skipUnless(SEED, "the server has no users (TANGRAM_NKEY_FILE unset)")
    def test_wrong_credentials_name_the_file_and_where_the_right_one_is(self):
        import nkeys  # a well-formed user seed that is no user of this cluster
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "rollout.nk")
            with open(path, "wb") as f:
                f.write(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))
            e = self.connect_error(URL, nkeys_seed=path)
            self.assertIn(path, str(e))
            self.assertIn("creds/rollout-<job>.nk", str(e))
            e = self.connect_error(URL, nkeys_seed=os.path.join(d, "missing.nk"))
            self.assertIn("not found", str(e))

    def test_a_wrong_url_says_to_check_the_url(self):
        # Something listens there, but it is not a NATS server: it never says a word.
        with socket.socket() as silent:
            silent.bind(("127.0.0.1", 0))
            silent.listen()
            url = f"nats://127.0.0.1:{silent.getsockname()[1]}"
            e = self.connect_error(url, nkeys_seed=SEED)
        self.assertIn("check the URL", str(e))
        self.assertEqual(e.servers, [url])
        # Not a URL at all: refused before anything is tried.
        for bad in ("http://127.0.0.1:4222", "nats://127.0.0.1:port", "", [URL, 4222]):
            with self.subTest(bad=bad):
                self.assertIn("URL" if bad != [URL, 4222] else "string", str(self.connect_error(bad)))

    def test_a_server_that_is_down_says_so(self):
        url = f"nats://127.0.0.1:{closed_port()}"
        heard = []

        async def closed():
            heard.append("closed")

        e = self.connect_error(url, nkeys_seed=SEED, closed_cb=closed, disconnected_cb=closed)
        self.assertIn("server is running", str(e))
        self.assertIsInstance(e.__cause__, Exception)
        # The failure is reported once, by the error: the connection callbacks hear nothing
        # of a connection that never came up.
        self.assertEqual(heard, [])

    def test_comma_separated_and_listed_urls_connect(self):
        down = f"nats://127.0.0.1:{closed_port()}"

        async def go():
            for url in (f"{down}, {URL}", [down, URL], f"{URL},"):
                async with await Tangram.connect(url, job="py-sdk", nkeys_seed=SEED) as client:
                    scores = await client.reward(SERVICE, ["def f(): pass"])
                    self.assertEqual(len(scores), 1)
                    # Connected once: from now on a lost connection is re-established for ever.
                    self.assertEqual(client._nc.options["max_reconnect_attempts"], -1)
        run(go())


class FlakyPublish:
    """Stands in for the client's JetStream publish: plays ``script`` (one entry per call:
    an exception to raise instead of publishing, ``"lost-ack"`` to publish and then raise a
    timeout as if the acknowledgement was lost, ``None`` to publish), and records every call."""

    def __init__(self, client: Tangram, script):
        self.real = client._js.publish
        self.script = list(script)
        self.ids = []
        self.acks = []
        client._js.publish = self

    async def __call__(self, subject, payload, *, headers, timeout):
        self.ids.append(headers["Nats-Msg-Id"])
        step = self.script.pop(0) if self.script else None
        if isinstance(step, BaseException):
            raise step
        ack = await self.real(subject, payload, headers=headers, timeout=timeout)
        self.acks.append(ack)
        if step == "lost-ack":
            raise nats.errors.TimeoutError
        return ack


class TransientFailuresTest(unittest.TestCase):
    def test_a_transient_publish_failure_is_retried_with_the_same_id_and_runs_once(self):
        async def go():
            async with await Tangram.connect(URL, job="py-sdk", nkeys_seed=SEED) as client:
                flaky = FlakyPublish(client, [nats.js.errors.NoStreamResponseError(),
                                              nats.errors.NoRespondersError(), "lost-ack", None])
                aid = await client.submit("t", {"kind": "reward", "service": SERVICE, "inputs": ["z"], "options": {}})
                self.assertEqual(flaky.ids, [aid] * 4, "every try carries the same Nats-Msg-Id")
                self.assertEqual([bool(a.duplicate) for a in flaky.acks], [False, True],
                                 "the stream stored the lost-ack try and dropped the retry as a duplicate")
                self.assertEqual(flaky.acks[0].seq, flaky.acks[1].seq)
                r = await client.result(aid, wait_s=60)
                self.assertEqual((r.id, r.outcome), (aid, Outcome.COMPLETED))
        run(go())

    def test_a_publish_that_never_gets_through_raises_a_tangram_error(self):
        async def go():
            async with await Tangram.connect(URL, job="py-sdk", nkeys_seed=SEED, publish_retries=3) as client:
                flaky = FlakyPublish(client, [nats.js.errors.NoStreamResponseError()] * 10)
                aid = "never-" + uuid.uuid4().hex[:8]
                with self.assertRaises(TangramUnavailable) as e:
                    await client.submit("t", {"kind": "reward", "service": SERVICE, "inputs": ["z"], "options": {}},
                                        action_id=aid)
                self.assertEqual(flaky.ids, [aid] * 4)
                self.assertIsInstance(e.exception.__cause__, nats.js.errors.NoStreamResponseError)
                # A batch gets the same error in the action's place.
                flaky.script = [nats.errors.TimeoutError()] * 10
                [item] = await client.submit_batch([Tangram.reward_action(SERVICE, ["z"])])
                self.assertIsInstance(item, TangramUnavailable)
        run(go())

    def test_transient_is_decided_by_type_not_by_message(self):
        for e in (nats.js.errors.NoStreamResponseError(), nats.errors.NoRespondersError(),
                  nats.errors.TimeoutError(), asyncio.TimeoutError(), nats.js.errors.ServiceUnavailableError(),
                  nats.errors.ConnectionReconnectingError(), nats.errors.OutboundBufferLimitError(),
                  ConnectionResetError()):
            self.assertTrue(is_transient(e), repr(e))
        # A full stream answers 503 as a stream without a leader does; only its error code
        # tells (regression: a full stream was retried and reported as unavailable, not as
        # backpressure).
        for e in (nats.js.errors.ServiceUnavailableError(code=503, err_code=10077,
                                                         description="maximum messages exceeded"),
                  nats.js.errors.APIError(code=400, err_code=10077, description="timeout, no responders"),
                  nats.js.errors.BadRequestError(), nats.errors.ConnectionClosedError(),
                  nats.errors.MaxPayloadError(), nats.errors.Error("nats: timeout")):
            self.assertFalse(is_transient(e), repr(e))

    def test_backoff_doubles_is_capped_and_jittered(self):
        b = Backoff(first_s=0.1, max_s=2.0, rng=random.Random(7))
        waits = [b.next_s() for _ in range(8)]
        steps = [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]
        for w, step in zip(waits, steps):
            self.assertTrue(step / 2 <= w <= step, (w, step))
        # Jitter: two clients failing together do not wait alike.
        other = Backoff(first_s=0.1, max_s=2.0, rng=random.Random(8))
        self.assertNotEqual(waits, [other.next_s() for _ in range(8)])
        b.reset()
        self.assertLessEqual(b.next_s(), 0.1)


if __name__ == "__main__":
    unittest.main()
