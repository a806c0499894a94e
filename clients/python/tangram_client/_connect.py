"""Opening the NATS connection: fail fast and say why the first time, reconnect for ever
after.

nats-py applies its reconnection options to the first connect as well: with
``max_reconnect_attempts=-1`` a server that refuses the credentials, or one that is not
there, is tried again every couple of seconds for ever, each failure logged with a
traceback. So the first connect runs with a small bound (each server tried twice, half a
second apart, its errors collected instead of logged), and only once it succeeded are the
caller's reconnection options (for ever by default) put in place. A first connect that
fails raises :class:`TangramConnectError` naming the likely fix, chosen by the type of
the errors seen.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Awaitable, Callable, List, Optional, Sequence, Union
from urllib.parse import urlsplit

import nats.errors
from nats.aio.client import Client as NatsClient

from ._wire import inbox_prefix_for
from .errors import TangramConnectError

log = logging.getLogger("tangram_client.connect")

# Where `tangram up` writes credentials, for the hints.
CREDS_HINT = ("the credentials file `tangram up` wrote: <state-dir>/creds/rollout.nk (any job) or "
              "<state-dir>/creds/rollout-<job>.nk (one job); the state dir is .tangram unless "
              "`tangram up --state-dir` named another")
_SCHEMES = ("nats", "tls", "ws", "wss")
# nats-py's defaults, restored after the first connect unless the caller set their own.
_RECONNECT_WAIT_S = 2.0
# Between the two tries of one server during the first connect.
_FIRST_CONNECT_WAIT_S = 0.5


def parse_servers(url: Union[str, Sequence[str]]) -> List[str]:
    """The server URLs in ``url``: one URL, several separated by commas, or a list.
    Raises :class:`TangramConnectError` for one that nats-py could not use."""
    if isinstance(url, str):
        parts = url.split(",")
    elif isinstance(url, Sequence) and all(isinstance(u, str) for u in url):
        parts = [p for u in url for p in u.split(",")]
    else:
        raise TangramConnectError(f"url must be a string or a list of strings, not {type(url).__name__}")
    servers = [p.strip() for p in parts if p.strip()]
    if not servers:
        raise TangramConnectError("no server URL given: pass url='nats://127.0.0.1:4222' (tangram up's default)")
    for s in servers:
        full = s if "://" in s else "nats://" + s
        try:
            u = urlsplit(full)
            u.port  # noqa: B018 - raises ValueError for a port that is not a number
        except ValueError:
            u = None
        if u is None or u.scheme not in _SCHEMES or not u.hostname:
            raise TangramConnectError(
                f"{s!r} is not a NATS server URL: write nats://HOST:PORT (tangram up's is "
                "nats://127.0.0.1:4222); several as a list or separated by commas", servers)
    if len({s.split("://", 1)[0].startswith("ws") for s in servers if "://" in s}) > 1:
        raise TangramConnectError("websocket (ws://, wss://) and nats:// URLs cannot be mixed", servers)
    return servers


def _credentials_hint(nkeys_seed: Optional[str]) -> str:
    if nkeys_seed is None:
        return ("it requires credentials: pass nkeys_seed= with " + CREDS_HINT
                + "; or start the cluster without users (`tangram up --no-auth`)")
    return (f"it did not accept the credentials in {nkeys_seed}: pass nkeys_seed= with " + CREDS_HINT
            + "; a file from another state dir or an earlier cluster names none of this cluster's users")


def _explain(servers: Sequence[str], errors: Sequence[BaseException], nkeys_seed: Optional[str],
             connect_timeout_s: float) -> str:
    """The failure of a first connect, from the errors it met, by their types: a server
    that answered and refused says the most, then one that did not answer, then one that
    could not be reached."""
    where = ", ".join(servers)
    tls = [e for e in errors if isinstance(e, (nats.errors.SecureConnRequiredError,
                                               nats.errors.SecureConnWantedError,
                                               nats.errors.SecureConnFailedError))]
    refused = [e for e in errors if isinstance(e, nats.errors.Error) and not isinstance(e, asyncio.TimeoutError)]
    silent = [e for e in errors if isinstance(e, asyncio.TimeoutError)]
    unreachable = [e for e in errors if isinstance(e, OSError)]
    if tls:
        return (f"could not connect to {where}: TLS ({tls[-1]}): for a server that requires TLS pass "
                "tls=ssl.create_default_context(cafile=...) (and tls_hostname= if the certificate "
                "names another host), or use a tls:// URL")
    if refused:
        return (f"could not connect to {where}: the server refused the connection ({refused[-1]}); "
                + _credentials_hint(nkeys_seed)
                + ". If that is not a NATS server's client port, check the URL")
    if silent:
        return (f"could not connect to {where}: nothing answered as a NATS server within "
                f"{connect_timeout_s:g} s: check the URL (the NATS client port, 4222 by default, "
                "not the monitoring port) and that the server is up")
    if unreachable:
        return (f"could not connect to {where}: {unreachable[-1]}: check the URL and that the "
                "server is running (`tangram up` listens on nats://127.0.0.1:4222 by default)")
    last = f" ({errors[-1]!r})" if errors else ""
    return f"could not connect to {where}{last}: check the URL and that the server is running"


async def open_connection(url: Union[str, Sequence[str]], nkeys_seed: Optional[str],
                          options: dict) -> NatsClient:
    """A connected nats-py client, or :class:`TangramConnectError` within a few seconds.
    ``options`` are nats-py's ``connect`` keyword arguments."""
    servers = parse_servers(url)
    options = dict(options)
    if "servers" in options:
        raise TangramConnectError("pass the servers as url=, not servers=", servers)
    if nkeys_seed is not None:
        if not os.path.isfile(nkeys_seed):
            raise TangramConnectError(f"credentials file {nkeys_seed} not found: pass nkeys_seed= with "
                                      + CREDS_HINT, servers)
        options["nkeys_seed"] = nkeys_seed
        options.setdefault("inbox_prefix", inbox_prefix_for(nkeys_seed))

    # What the connection does once it is up: the caller's, or reconnect for ever.
    after = {
        "allow_reconnect": options.pop("allow_reconnect", True),
        "max_reconnect_attempts": options.pop("max_reconnect_attempts", -1),
        "reconnect_time_wait": options.pop("reconnect_time_wait", _RECONNECT_WAIT_S),
    }
    user_error_cb: Optional[Callable[[Exception], Awaitable[None]]] = options.pop("error_cb", None)
    connect_timeout_s = float(options.setdefault("connect_timeout", 2))

    seen: List[BaseException] = []
    connected = False

    async def on_error(e: Exception) -> None:
        if not connected:
            seen.append(e)  # reported once, in the error raised
            log.debug("connecting: %r", e)
        elif user_error_cb is not None:
            await user_error_cb(e)
        else:
            log.warning("nats: %r", e)

    # The caller's connection callbacks hear of this connection once it is up: a first
    # connect that fails is reported once, by the error raised.
    for name in ("closed_cb", "disconnected_cb"):
        if options.get(name) is not None:
            options[name] = _once_connected(options[name], lambda: connected)

    nc = NatsClient()
    # Each server twice: a server restarting, or one address of several down, still lets
    # the connect through; a refusal or a wrong address ends it in about a second.
    tries = 2 * len(servers)
    bound_s = tries * (3 * connect_timeout_s + _FIRST_CONNECT_WAIT_S) + 1.0
    try:
        await asyncio.wait_for(
            nc.connect(servers=servers, error_cb=on_error, allow_reconnect=True, max_reconnect_attempts=1,
                       reconnect_time_wait=_FIRST_CONNECT_WAIT_S, **options),
            bound_s)
    except asyncio.CancelledError:
        await _discard(nc)
        raise
    except Exception as e:  # noqa: BLE001 - every way a first connect fails, explained below
        await _discard(nc)
        if not isinstance(e, (nats.errors.NoServersError, asyncio.TimeoutError)):
            seen.append(e)
        if isinstance(e, ImportError):
            raise TangramConnectError("credentials need the nkeys package: pip install "
                                      "'tangram-client[nkeys]' (or nkeys)", servers) from e
        if _is_bad_seed(e):
            raise TangramConnectError(f"{nkeys_seed} is not an nkey seed file: pass nkeys_seed= with "
                                      + CREDS_HINT, servers) from e
        raise TangramConnectError(_explain(servers, seen, nkeys_seed, connect_timeout_s), servers) from e
    connected = True
    nc.options.update(after)
    return nc


def _once_connected(cb: Callable[[], Awaitable[None]], up: Callable[[], bool]) -> Callable[[], Awaitable[None]]:
    """``cb``, called only once ``up()`` holds."""
    async def gated() -> None:
        if up():
            await cb()
    return gated


def _is_bad_seed(e: BaseException) -> bool:
    try:
        import nkeys
    except ImportError:
        return False
    return isinstance(e, nkeys.NkeysError)


async def _discard(nc: NatsClient) -> None:
    try:
        await nc.close()
    except Exception:  # noqa: BLE001 - never connected: nothing to close
        pass

