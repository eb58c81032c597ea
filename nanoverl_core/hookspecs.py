"""The six plugin hooks, and the contracts of what they register.

A plugin is a module named by an entry point in the group ``nanoverl``. It implements any of the
hooks below with ``@hookimpl``; each hook is called once, with a ``register`` callback:

    register(name: str, obj, *, description: str = "", settings=None) -> None

``obj`` is the object itself or a ``"module:attr"`` string imported only when the name is selected,
so ``nanoverl-train plugins`` stays cheap. ``description`` is shown by ``nanoverl-train plugins``.
``settings`` (a class, or a ``"module:attr"`` string) is an ``attrs`` class with a default for every
field and a one-line docstring under each: the component's own typed settings. The user writes them
in the table ``[<section>.<name>]`` of the section that selects the component (``[rollout.vllm]``,
``[worker.fsdp]``, ``[actor.gspo]``, ``[algorithm.grpo]``, ``[reward.<name>]``, ``[tracking.<name>]``);
they are validated like the core's keys (unknown key with a close match, wrong type, an ``attrs``
validator's message: exit 2) and shown by ``--dry-run``. The component reads them as
``config.<section>.settings`` (trackers: ``config.tracking.settings[name]``). Keep the settings class
in a module that imports neither torch nor your backend, so checking a config stays fast.

A name registered by two plugins is an error naming both.

Rules every backend follows (``nanoverl_core.testing`` checks them; run its checks in your tests):

* Rows. The trainer hands every stage the whole step batch, rows in a fixed order; rows sharing a
  ``uid`` come from one prompt. Whatever a stage returns has the same rows in the same order.
* Ranks. Under ``torchrun`` every rank runs the same trainer loop on the same batch. The trainer
  splits the rollout (``dist.shard_rollout``: rank r generates rows
  ``[r * share, (r + 1) * share)``, ``share = ceil(B / world)``) and gathers it back; a worker that
  shards model work splits rows the same way (``dist.rank_rows``) and returns all rows.
* Seeding. Randomness comes from torch's global generator, which the trainer seeds from
  ``trainer.seed`` and restores on resume: a rollout draws its seeds from it (``torch.randint``), so
  a run is reproducible and resumes exactly. A greedy call (temperature 0) draws nothing from it.
* Lifetime. The trainer calls ``Rollout.close()`` once, in ``fit``'s ``finally``, even after an error.
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
    """Register rollout engines, selected by ``rollout.name``; settings in ``[rollout.<name>]``.

    obj: ``make_rollout(config: Config, workers: Workers) -> Rollout`` (``nanoverl_core.protocols.Rollout``):
    ``generate(batch, params) -> RLBatch`` adds ``responses``, ``response_mask`` and optionally
    ``rollout_log_probs`` (build them with ``nanoverl_core.responses_to_batch``);
    ``sync_weights(actor)`` is called after every actor update (read ``actor.full_tensors()``) and the
    next ``generate`` must use the new weights; ``close()`` frees the engine. An optional
    ``make_rollout.check_config(config)`` raises ``ConfigError`` before any model loads (as a worker's).
    """


@hookspec
def register_workers(register: Register) -> None:
    """Register training backends, selected by ``worker.name``; settings in ``[worker.<name>]``.

    obj: ``make_workers(config: Config) -> Workers``: the tokenizer plus the actor, the reference
    (``None`` unless ``reference.enable``) and the critic (``None`` unless ``critic.enable``), which
    follow ``nanoverl_core.protocols.Actor`` / ``Critic``. ``nanoverl_core.TorchActor`` and
    ``TorchCritic`` implement them over any Hugging Face-style torch module. Optionally
    ``make_workers.export_checkpoint(checkpoint: Path, out: Path, config: Config)`` writes a checkpoint's
    policy as a save_pretrained folder into ``out``: what ``nanoverl-train export`` calls;
    ``make_workers.check_config(config)`` raises ``ConfigError`` for what it can check cheaply (files,
    packages), before the run directory is written; ``make_workers.supports_lora = True`` accepts
    ``[model.lora]``.
    """


@hookspec
def register_advantage_estimators(register: Register) -> None:
    """Register advantage estimators, selected by ``algorithm.advantage_estimator``; settings in
    ``[algorithm.<name>]``.

    obj: ``fn(batch: RLBatch, config: AlgorithmConfig) -> (advantages, returns)``, both ``(B, R)``
    float tensors, zero on padded positions. It reads ``token_level_rewards``, ``response_mask``,
    ``values`` (when a critic runs) and the non-tensor ``uid`` (rows sharing a uid come from one
    prompt). Set ``fn.requires_critic = True`` if it reads ``values``; its own settings are
    ``config.settings``.
    """


@hookspec
def register_rewards(register: Register) -> None:
    """Register reward functions, selected by ``reward.name``; settings in ``[reward.<name>]``.

    obj: ``fn(prompt: str, response: str, sample: dict) -> float | dict``. ``sample`` is the dataset
    row. A dict holds ``"score"`` and may add numeric keys, logged as ``reward/<key>``. The score is
    placed on the last valid response token. A reward that registered settings is called with them
    as a keyword argument: ``fn(prompt, response, sample, settings=...)``.
    """


@hookspec
def register_trackers(register: Register) -> None:
    """Register metric trackers, selected by ``tracking.trackers``; settings in ``[tracking.<name>]``.

    obj: ``make_tracker(config: Config, run_dir: Path, state: dict | None) -> Tracker``. ``state`` is
    what the tracker's ``state_dict()`` returned when the checkpoint being resumed was saved. A
    ``Tracker`` has ``log_metrics(metrics: dict[str, float], step: int)``,
    ``log_samples(name: str, rows: list[dict], step: int)``, ``state_dict() -> dict`` (JSON-safe) and
    ``close(success: bool)``.
    """


@hookspec
def register_policy_losses(register: Register) -> None:
    """Register policy losses, selected by ``actor.policy_loss``; settings in ``[actor.<name>]``.

    obj: ``fn(inputs: PolicyLossInputs, config: ActorConfig) -> (loss, metrics)``
    (``nanoverl_core.algos.PolicyLossInputs``: log-probs with grad, old log-probs, advantages, the
    response mask, ``inputs.aggregate`` bound to the mini-batch normalisers, ``inputs.on_policy``).
    ``loss`` is a scalar tensor; ``metrics`` maps ``actor/<name>`` to detached scalars that are this
    micro-batch's share of the mini-batch value (``inputs.token_mean(x)``), so they sum exactly over
    micro-batches. The loss's own settings are ``config.settings``; the trainer adds the entropy
    and KL terms (``nanoverl_core.algos.compute_actor_loss``).
    """


HOOKS: dict[str, str] = {
    "register_rollouts": "rollout",
    "register_workers": "worker",
    "register_advantage_estimators": "advantage_estimator",
    "register_rewards": "reward",
    "register_trackers": "tracker",
    "register_policy_losses": "policy_loss",
}
"""Hook name -> registry kind."""
