"""The five plugin hooks.

A plugin is a module named by an entry point in the group ``nanoverl``. It implements any of the
hooks below with ``@hookimpl``; each hook is called once, with a ``register`` callback:

    register(name: str, obj, *, description: str = "") -> None

``obj`` is the object itself or a ``"module:attr"`` string imported only when the name is selected,
so ``nanoverl-train plugins`` stays cheap. What ``obj`` must be depends on the hook (see below and
``docs/plugins.md``). A name registered by two plugins is an error naming both.
"""

from __future__ import annotations

from collections.abc import Callable

import pluggy

PROJECT = "nanoverl"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

Register = Callable[..., None]


@hookspec
def register_rollouts(register: Register) -> None:
    """Register rollout engines, selected by ``rollout.name``.

    obj: ``make_rollout(config: Config, workers: Workers) -> Rollout``. A ``Rollout`` has
    ``generate(batch: RLBatch, params: SamplingParams) -> RLBatch`` (adds ``responses``,
    ``response_mask`` and optionally ``rollout_log_probs``) and ``sync_weights(actor) -> None``
    (called after every actor update; the next ``generate`` must use the new weights).
    """


@hookspec
def register_workers(register: Register) -> None:
    """Register training backends, selected by ``worker.name``.

    obj: ``make_workers(config: Config) -> Workers``: the tokenizer plus the actor, the reference
    (``None`` unless ``reference.enable``) and the critic (``None`` unless ``critic.enable``).
    See ``nanoverl_core.workers`` for the Actor / Critic protocols and the shared torch implementation.
    """


@hookspec
def register_advantage_estimators(register: Register) -> None:
    """Register advantage estimators, selected by ``algorithm.advantage_estimator``.

    obj: ``fn(batch: RLBatch, config: AlgorithmConfig) -> (advantages, returns)``, both ``(B, R)``
    float tensors, zero on padded positions. It reads ``token_level_rewards``, ``response_mask``,
    ``values`` (when a critic runs) and the non-tensor ``uid`` (rows sharing a uid come from one
    prompt). Set ``fn.requires_critic = True`` if it reads ``values``; settings specific to the
    estimator travel in ``config.params``.
    """


@hookspec
def register_rewards(register: Register) -> None:
    """Register reward functions, selected by ``reward.name``.

    obj: ``fn(prompt: str, response: str, sample: dict) -> float | dict``. ``sample`` is the dataset
    row. A dict holds ``"score"`` and may add numeric keys, logged as ``reward/<key>``. The score is
    placed on the last valid response token.
    """


@hookspec
def register_trackers(register: Register) -> None:
    """Register metric trackers, selected by ``tracking.trackers``.

    obj: ``make_tracker(config: Config, run_dir: Path, state: dict | None) -> Tracker``. ``state`` is
    what the tracker's ``state_dict()`` returned when the checkpoint being resumed was saved. A
    ``Tracker`` has ``log_metrics(metrics: dict[str, float], step: int)``,
    ``log_samples(name: str, rows: list[dict], step: int)``, ``state_dict() -> dict`` (JSON-safe) and
    ``close(success: bool)``.
    """


HOOKS: dict[str, str] = {
    "register_rollouts": "rollout",
    "register_workers": "worker",
    "register_advantage_estimators": "advantage_estimator",
    "register_rewards": "reward",
    "register_trackers": "tracker",
}
"""Hook name -> registry kind."""
