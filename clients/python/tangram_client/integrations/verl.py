"""A reward function for verl that scores with a Tangram reward service.

verl calls a custom reward function as
``compute_score(data_source, solution_str, ground_truth, extra_info=None)`` and takes a
float back; point its ``custom_reward_function.path`` at this module, as its file's path
or as ``pkg://tangram_client.integrations.verl``, and ``name`` at ``compute_score`` (or
``compute_score_batch`` for verl's batch reward manager, which passes lists). Each call becomes one ``reward`` action (docs/PROTOCOL.md): the text scored is
``TANGRAM_REWARD_TEMPLATE`` filled in with the sample, and the sample's ``data_source`` and
``ground_truth`` go along in the action's ``options`` for engines that judge against them.

Configured by the environment, read at the first call in each process:

========================== ===========================================================
``TANGRAM_REWARD_SERVICE`` the service to score with (required)
``TANGRAM_NATS_URL``       the cluster, default ``nats://127.0.0.1:4222``
``TANGRAM_NKEY_FILE``      a rollout credentials file; unset for a server without users
``TANGRAM_JOB``            the job the actions belong to, default ``verl``
``TANGRAM_REWARD_TEMPLATE`` ``str.format`` template over ``data_source``,
                           ``solution_str``, ``ground_truth`` and ``extra_info``
                           (a dict: ``{extra_info[question]}``); default ``{solution_str}``
``TANGRAM_REWARD_OPTIONS`` a JSON object of further options for the engine
``TANGRAM_REWARD_TIMEOUT_S`` each action's limit, default 60
========================== ===========================================================

A sample that cannot be scored raises (:class:`~tangram_client.ActionFailed` carries the
result); there is no fallback score, so a broken reward service stops training instead of
teaching it noise.
"""

# No ``from __future__ import annotations``: a dataclass with string annotations looks its
# module up in sys.modules, where verl's loader does not put a module it loads by path.
import atexit
import json
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

# Absolute imports: verl loads ``custom_reward_function.path`` as a file of no package
# (importlib's spec_from_file_location), where relative imports fail. Loaded that way the
# module is a copy with a client of its own; loaded as ``pkg://tangram_client.integrations.verl``
# it is the package's module. Nothing here imports verl.
from tangram_client.errors import ActionFailed, TangramError
from tangram_client.results import Outcome
from tangram_client.sync import SyncClient

__all__ = ["RewardConfig", "compute_score", "compute_score_batch", "close"]


@dataclass(frozen=True)
class RewardConfig:
    """Where and how to score; :meth:`from_env` reads it from the variables above."""

    service: str
    url: str = "nats://127.0.0.1:4222"
    nkeys_seed: Optional[str] = None
    job: str = "verl"
    template: str = "{solution_str}"
    options: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 60.0

    @staticmethod
    def from_env(env: Optional[Mapping[str, str]] = None) -> "RewardConfig":
        """The configuration in ``env`` (the process environment by default). Raises
        :class:`TangramError` naming the variable that is missing or malformed."""
        env = os.environ if env is None else env
        service = env.get("TANGRAM_REWARD_SERVICE", "")
        if not service:
            raise TangramError("TANGRAM_REWARD_SERVICE is not set: name the reward service to score with")
        raw_options = env.get("TANGRAM_REWARD_OPTIONS", "{}")
        try:
            options = json.loads(raw_options)
        except ValueError as e:
            raise TangramError(f"TANGRAM_REWARD_OPTIONS is not JSON: {e}") from None
        if not isinstance(options, dict):
            raise TangramError("TANGRAM_REWARD_OPTIONS must be a JSON object")
        try:
            timeout_s = float(env.get("TANGRAM_REWARD_TIMEOUT_S", "60"))
        except ValueError:
            raise TangramError("TANGRAM_REWARD_TIMEOUT_S must be a number of seconds") from None
        return RewardConfig(
            service=service,
            url=env.get("TANGRAM_NATS_URL", "nats://127.0.0.1:4222"),
            nkeys_seed=env.get("TANGRAM_NKEY_FILE") or None,
            job=env.get("TANGRAM_JOB", "verl"),
            template=env.get("TANGRAM_REWARD_TEMPLATE", "{solution_str}"),
            options={str(k): str(v) for k, v in options.items()},
            timeout_s=timeout_s,
        )

    def text(self, data_source: str, solution_str: str, ground_truth: Any,
             extra_info: Optional[Mapping[str, Any]]) -> str:
        """The text scored for one sample."""
        return self.template.format(data_source=data_source, solution_str=solution_str,
                                    ground_truth=ground_truth, extra_info=dict(extra_info or {}))

    def sample_options(self, data_source: str, ground_truth: Any,
                       reward_kwargs: Optional[Mapping[str, Any]] = None) -> Dict[str, str]:
        """The action's options for one sample: the configured ones, verl's
        ``reward_kwargs``, and the sample's ``data_source`` and ``ground_truth``; values that
        are not strings go as JSON."""
        extra = {str(k): _text(v) for k, v in (reward_kwargs or {}).items()}
        return {**self.options, **extra, "data_source": str(data_source), "ground_truth": _text(ground_truth)}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


# One client per process: verl may fork reward workers, and a client's thread and socket do
# not survive a fork, so a child makes its own.
_lock = threading.Lock()
_state: Dict[str, Any] = {"pid": None, "client": None, "config": None}


def _client() -> "tuple[SyncClient, RewardConfig]":
    with _lock:
        if _state["pid"] != os.getpid() or _state["client"] is None:
            config = RewardConfig.from_env()
            _state["client"] = SyncClient.connect(config.url, config.job, nkeys_seed=config.nkeys_seed)
            _state["config"] = config
            _state["pid"] = os.getpid()
        return _state["client"], _state["config"]


def close() -> None:
    """Closes this process's client; the next call connects again and rereads the
    environment."""
    with _lock:
        client = _state["client"] if _state["pid"] == os.getpid() else None
        _state.update(pid=None, client=None, config=None)
    if client is not None:
        client.close()


atexit.register(close)


def compute_score(data_source: str, solution_str: str, ground_truth: Any,
                  extra_info: Optional[Mapping[str, Any]] = None, **reward_kwargs: Any) -> float:
    """The score of one sample from the configured reward service. Keyword arguments
    (verl's ``custom_reward_function.reward_kwargs``) go to the engine as options. Raises
    :class:`~tangram_client.ActionFailed` or :class:`~tangram_client.TangramError` when it
    could not be scored."""
    client, config = _client()
    [score] = client.reward(config.service, [config.text(data_source, solution_str, ground_truth, extra_info)],
                            trajectory="verl", options=config.sample_options(data_source, ground_truth, reward_kwargs),
                            timeout_s=config.timeout_s)
    return float(score)


def compute_score_batch(data_sources: Sequence[str], solution_strs: Sequence[str], ground_truths: Sequence[Any],
                        extra_infos: Optional[Sequence[Optional[Mapping[str, Any]]]] = None,
                        **reward_kwargs: Any) -> List[float]:
    """:func:`compute_score` for many samples, all in flight together (one reward action
    each); scores in the order given. Raises the first sample's error after every sample
    has finished, so a failure is never hidden by a partial list."""
    client, config = _client()
    n = len(solution_strs)
    if not (len(data_sources) == len(ground_truths) == n) or (extra_infos is not None and len(extra_infos) != n):
        raise ValueError("data_sources, solution_strs, ground_truths and extra_infos must be the same length")
    infos = list(extra_infos) if extra_infos is not None else [None] * n
    actions = [client.reward_action(config.service, [config.text(ds, sol, gt, info)], trajectory="verl",
                                    options=config.sample_options(ds, gt, reward_kwargs), timeout_s=config.timeout_s)
               for ds, sol, gt, info in zip(data_sources, solution_strs, ground_truths, infos)]
    scores: List[float] = []
    for item in client.run_batch(actions):
        if isinstance(item, TangramError):
            raise item
        if item.outcome is not Outcome.COMPLETED or not item.scores:
            raise ActionFailed(item)
        scores.append(float(item.scores[0]))
    return scores
