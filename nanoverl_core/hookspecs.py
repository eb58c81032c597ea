"""The eight plugin hooks, and the contracts of what they register.

A plugin is a module named by an entry point in the group ``nanoverl``. It implements any of the
hooks below with ``@hookimpl``; each hook is called once, with a ``register`` callback:

    register(name: str, obj, *, description: str = "", settings=None) -> None

(typed as ``Register`` below). ``obj`` is the object itself or a ``"module:attr"`` string imported
only when the name is selected, so ``nanoverl-train plugins`` stays cheap; what each hook's object
is, and the optional attributes the framework reads off it, are the protocols of
``nanoverl_core.protocols`` its docstring names. ``description`` is shown by ``nanoverl-train plugins``.
``settings`` (a class, or a ``"module:attr"`` string) is an ``attrs`` class with a default for every
field and a one-line docstring under each: the component's own typed settings. The user writes them
in the table ``[<section>.<name>]`` of the section that selects the component (``[rollout.vllm]``,
``[worker.fsdp]``, ``[actor.gspo]``, ``[algorithm.grpo]``, ``[reward.<name>]``, ``[tracking.<name>]``,
``[data.<name>]``);
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

from typing import Protocol

import pluggy

PROJECT = "nanoverl"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class Register(Protocol):
    """The callback every hook receives (nanoverl_core.plugins.load_registry builds one per hook)."""

    def __call__(self, name: str, obj: object | str, *, description: str = "",
                 settings: type | str | None = None) -> None: ...


@hookspec
def register_rollouts(register: Register) -> None:
    """Register rollout engines, selected by ``rollout.name``; settings in ``[rollout.<name>]``.

    obj: a ``nanoverl_core.protocols.MakeRollout``, ``make_rollout(config, workers) -> Rollout``
    (``nanoverl_core.protocols.Rollout``): ``generate(batch, params)`` returns ``responses``,
    ``response_mask``, ``truncated`` and optionally ``rollout_log_probs`` (build them with
    ``nanoverl_core.responses_to_batch``); ``sync_weights(actor)`` is called after every actor update
    (read ``actor.full_tensors()``) and the next ``generate`` must use the new weights; ``close()``
    frees the engine. Optional attribute: ``check_config`` (see ``MakeRollout``).
    """


@hookspec
def register_workers(register: Register) -> None:
    """Register training backends, selected by ``worker.name``; settings in ``[worker.<name>]``.

    obj: a ``nanoverl_core.protocols.MakeWorkers``, ``make_workers(config) -> Workers``: the tokenizer
    plus the actor, the reference and the critic, which follow ``nanoverl_core.protocols.Actor`` /
    ``Critic``. ``nanoverl_core.TorchActor`` and ``TorchCritic`` implement them over any Hugging
    Face-style torch module. Optional attributes: ``check_config``, ``export_checkpoint``,
    ``supports_lora`` (see ``MakeWorkers``).
    """


@hookspec
def register_advantage_estimators(register: Register) -> None:
    """Register advantage estimators, selected by ``algorithm.advantage_estimator``; settings in
    ``[algorithm.<name>]``.

    obj: a ``nanoverl_core.protocols.Estimator``, ``fn(batch: RLBatch, config: AlgorithmConfig) ->
    (advantages, returns)``, both ``(B, R)``, zero on padding; it reads ``loss_mask`` (the tokens that
    count), not ``response_mask``. Optional attributes: ``requires_critic``, ``requires_sum_pi_squared``,
    ``requires_greedy_baseline``, ``requires_teacher``, ``requires_old_log_probs``, ``bind``, ``check_config``
    (see ``Estimator``).
    """


@hookspec
def register_rewards(register: Register) -> None:
    """Register reward functions, selected by ``reward.name``; settings in ``[reward.<name>]``.

    obj: a ``nanoverl_core.protocols.RewardFn``, ``fn(prompt: str, response: str, sample: dict) ->
    float | dict``, called with ``settings=...`` when it registered settings. Optional attributes:
    ``batched``, ``error_kinds``, ``check_config`` (see ``RewardFn``).
    """


@hookspec
def register_trackers(register: Register) -> None:
    """Register metric trackers, selected by ``tracking.trackers``; settings in ``[tracking.<name>]``.

    obj: a ``nanoverl_core.protocols.MakeTracker``, ``make_tracker(config: Config, run_dir: Path,
    state: dict | None) -> Tracker`` (``nanoverl_core.protocols.Tracker``: ``log_metrics``,
    ``log_samples``, ``state_dict`` (JSON-safe), ``close(success)``).
    """


@hookspec
def register_policy_losses(register: Register) -> None:
    """Register policy losses, selected by ``actor.policy_loss``; settings in ``[actor.<name>]``.

    obj: a ``nanoverl_core.protocols.PolicyLoss``, ``fn(inputs: PolicyLossInputs, config: ActorConfig)
    -> (loss, metrics)``: a scalar loss and ``actor/<name>`` metrics that are this micro-batch's share
    of the mini-batch value. ``Actor.update`` calls it through ``nanoverl_core.algos.compute_actor_loss``,
    which adds the entropy and KL terms.
    """


@hookspec
def register_environments(register: Register) -> None:
    """Register environments for multi-turn episodes, selected by ``environment.name``; settings in
    ``[environment.<name>]``.

    obj: a ``nanoverl_core.protocols.MakeEnvironment``, ``make_env(sample: dict, settings=...) ->
    Environment``, called once per episode with its data row (``settings=`` only when it registered
    settings); the environment's ``step(turn: nanoverl_core.env.Turn) -> nanoverl_core.env.EnvStep``
    answers each model turn, and its optional ``close()`` ends the episode. Optional attribute:
    ``tools`` (see ``MakeEnvironment``). ``nanoverl_core.env.tool_environment(*functions)`` builds one
    from plain Python functions.
    """


@hookspec
def register_agents(register: Register) -> None:
    """Register agents, selected by ``agent.name``; settings in ``[agent.<name>]``.

    obj: an agent function, ``agent(row: dict, client[, settings=...])``, plain or ``async def``: it talks
    to the model through ``client`` (an ``openai.OpenAI``, or ``openai.AsyncOpenAI`` for an async one,
    pointed at the run's endpoint for this episode) as to any OpenAI-compatible server, and returns the
    episode's reward, None (scoring left to [reward]), or ``{"reward": ..., "info": {name: number}}``.
    Register it as a ``"module:attr"`` string: the agent worker processes import it by that name. Optional
    attribute: ``check_config(config)``, raising ConfigError before the run directory is written or a model
    loads (``--dry-run`` runs it too).
    """


@hookspec
def register_data_sources(register: Register) -> None:
    """Register where prompts come from, selected by ``data.source`` (default ``"files"``: the built-in
    reader of ``data.train_files`` / ``data.val_files``); settings in ``[data.<name>]``.

    obj: a ``nanoverl_core.protocols.MakeDataSource``, ``make_source(config) -> DataSource``
    (``nanoverl_core.protocols.DataSource``): ``rows(split, epoch)`` yields the rows of ``"train"`` or
    ``"val"`` as plain dicts like a file's rows (the prompt under ``data.prompt_key``, a string or chat
    messages; ``data.data_source_key``; whatever the reward reads), the same rows every time it is called
    with the same arguments, so the loader's state (epoch, position) is all a checkpoint keeps. Optional
    attributes: ``generated``, ``check_config`` (see ``MakeDataSource`` and ``DataSource``).
    """


HOOKS: dict[str, str] = {
    "register_rollouts": "rollout",
    "register_workers": "worker",
    "register_advantage_estimators": "advantage_estimator",
    "register_rewards": "reward",
    "register_trackers": "tracker",
    "register_policy_losses": "policy_loss",
    "register_environments": "environment",
    "register_agents": "agent",
    "register_data_sources": "data_source",
}
"""Hook name -> registry kind."""
