"""The blocking client: the async client on an event loop of its own, in a background
thread, for code that has no loop (a reward function, a script, a thread pool).

Every method blocks until the matching coroutine on that loop finishes and returns what it
returned, or raises what it raised. One :class:`SyncClient` may be shared by many threads;
their calls run concurrently on its loop. Do not call it from inside a coroutine running
on the client's own loop (nothing in this package does).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any, Coroutine, List, Literal, Mapping, Optional, Sequence, Tuple, TypeVar, Union, overload

from .client import Action, BatchItem, Sandbox, Tangram
from .errors import TangramError
from .results import HttpReply, Result

T = TypeVar("T")


class SyncClient:
    """A :class:`Tangram` client with blocking methods. Create with :meth:`connect`; close
    with :meth:`close` or a ``with`` block."""

    def __init__(self, loop: asyncio.AbstractEventLoop, thread: threading.Thread, client: Tangram) -> None:
        self._loop = loop
        self._thread = thread
        self._client = client
        self.job = client.job

    @classmethod
    def connect(cls, url: Union[str, Sequence[str]] = "nats://127.0.0.1:4222", job: str = "default",
                **options: Any) -> "SyncClient":
        """Starts the client's thread and connects; takes :meth:`Tangram.connect`'s arguments
        and raises what it raises (:class:`TangramConnectError` when it cannot connect)."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name=f"tangram-client-{job}", daemon=True)
        thread.start()
        try:
            client = asyncio.run_coroutine_threadsafe(Tangram.connect(url, job, **options), loop).result()
        except BaseException:
            _stop(loop, thread)
            raise
        return cls(loop, thread, client)

    @property
    def thread(self) -> threading.Thread:
        """The thread the client's event loop runs in (it ends with :meth:`close`)."""
        return self._thread

    @property
    def aio(self) -> Tangram:
        """The async client underneath, for coroutines scheduled on :attr:`loop`."""
        return self._client

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if not self._thread.is_alive():
            coro.close()
            raise TangramError("client closed")
        fut: "Future[T]" = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result()
        except BaseException:
            # Interrupted (Ctrl-C): do not leave the coroutine running on the loop.
            fut.cancel()
            raise

    def close(self) -> None:
        """Closes the connection and ends the thread. Calling it again does nothing."""
        if not self._thread.is_alive():
            return
        try:
            self._call(self._client.close())
        finally:
            _stop(self._loop, self._thread)

    def __enter__(self) -> "SyncClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the same calls as Tangram --------------------------------------------------------

    def submit(self, trajectory: str, spec: Mapping[str, Any], *, timeout_s: float = 60.0,
               action_id: Optional[str] = None, queue_timeout_s: Optional[float] = None) -> str:
        """:meth:`Tangram.submit`."""
        return self._call(self._client.submit(trajectory, spec, timeout_s=timeout_s, action_id=action_id,
                                              queue_timeout_s=queue_timeout_s))

    def result(self, action_id: str, wait_s: float = 300.0) -> Result:
        """:meth:`Tangram.result`."""
        return self._call(self._client.result(action_id, wait_s))

    def run(self, trajectory: str, spec: Mapping[str, Any], *, timeout_s: float = 60.0,
            wait_s: Optional[float] = None, action_id: Optional[str] = None,
            queue_timeout_s: Optional[float] = None) -> Result:
        """:meth:`Tangram.run`."""
        return self._call(self._client.run(trajectory, spec, timeout_s=timeout_s, wait_s=wait_s,
                                           action_id=action_id, queue_timeout_s=queue_timeout_s))

    def submit_batch(self, actions: Sequence[Action], *, max_in_flight: int = 256) -> List[Union[str, TangramError]]:
        """:meth:`Tangram.submit_batch`."""
        return self._call(self._client.submit_batch(actions, max_in_flight=max_in_flight))

    def run_batch(self, actions: Sequence[Action], *, wait_s: Optional[float] = None,
                  max_in_flight: int = 256) -> List[BatchItem]:
        """:meth:`Tangram.run_batch`."""
        return self._call(self._client.run_batch(actions, wait_s=wait_s, max_in_flight=max_in_flight))

    def open_sandbox(self, trajectory: str, image: Optional[str] = None, memory_mb: int = 512,
                     workdir_mb: int = 64, env: Optional[Mapping[str, str]] = None,
                     timeout_s: float = 120.0, idle_timeout_s: Optional[float] = None) -> "SyncSandbox":
        """:meth:`Tangram.open_sandbox`; the sandbox's methods block too."""
        return SyncSandbox(self, self._call(self._client.open_sandbox(trajectory, image, memory_mb, workdir_mb,
                                                                      env, timeout_s, idle_timeout_s)))

    def close_job(self, timeout_s: float = 10.0) -> int:
        """:meth:`Tangram.close_job`."""
        return self._call(self._client.close_job(timeout_s))

    reward_action = staticmethod(Tangram.reward_action)

    @overload
    def reward(self, service: str, inputs: Sequence[str], *, trajectory: str = ...,
               options: Optional[Mapping[str, str]] = ..., timeout_s: float = ...,
               result: Literal[False] = ...) -> List[float]: ...

    @overload
    def reward(self, service: str, inputs: Sequence[str], *, trajectory: str = ...,
               options: Optional[Mapping[str, str]] = ..., timeout_s: float = ...,
               result: Literal[True]) -> Result: ...

    def reward(self, service: str, inputs: Sequence[str], *, trajectory: str = "reward",
               options: Optional[Mapping[str, str]] = None, timeout_s: float = 60.0,
               result: bool = False) -> Union[List[float], Result]:
        """:meth:`Tangram.reward`."""
        if result:
            return self._call(self._client.reward(service, inputs, trajectory=trajectory, options=options,
                                                  timeout_s=timeout_s, result=True))
        return self._call(self._client.reward(service, inputs, trajectory=trajectory, options=options,
                                              timeout_s=timeout_s))

    def reward_batch(self, service: str, batches: Sequence[Sequence[str]], *, trajectory: str = "reward",
                     options: Optional[Mapping[str, str]] = None,
                     timeout_s: float = 60.0) -> List[Union[List[float], TangramError]]:
        """:meth:`Tangram.reward_batch`."""
        return self._call(self._client.reward_batch(service, batches, trajectory=trajectory, options=options,
                                                    timeout_s=timeout_s))

    def api(self, provider: str, method: str = "GET", path: str = "/", *,
            query: Optional[Mapping[str, str]] = None, body: Optional[str] = None,
            headers: Optional[Mapping[str, str]] = None, trajectory: str = "api",
            timeout_s: float = 30.0) -> HttpReply:
        """:meth:`Tangram.api`."""
        return self._call(self._client.api(provider, method, path, query=query, body=body, headers=headers,
                                           trajectory=trajectory, timeout_s=timeout_s))


class SyncSandbox:
    """A :class:`Sandbox` with blocking methods."""

    def __init__(self, client: SyncClient, sandbox: Sandbox) -> None:
        self._client = client
        self._sandbox = sandbox
        self.trajectory = sandbox.trajectory
        self.opened = sandbox.opened
        self.worker = sandbox.worker

    exec_spec = staticmethod(Sandbox.exec_spec)

    def exec(self, argv: Sequence[str], cpus: Union[int, Tuple[int, int]] = 1, timeout_s: float = 60.0,
             files: Optional[Mapping[str, str]] = None, env: Optional[Mapping[str, str]] = None,
             stdin: Optional[str] = None, wait_s: Optional[float] = None,
             queue_timeout_s: Optional[float] = None) -> Result:
        """:meth:`Sandbox.exec`."""
        return self._client._call(self._sandbox.exec(argv, cpus, timeout_s, files, env, stdin, wait_s,
                                                     queue_timeout_s))

    def close(self) -> Result:
        """:meth:`Sandbox.close`."""
        return self._client._call(self._sandbox.close())

    def __enter__(self) -> "SyncSandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _stop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()
