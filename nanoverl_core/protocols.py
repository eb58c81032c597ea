"""What the trainer needs from the components plugins register: one `typing.Protocol` each.

Two kinds. The objects a run works with: `Workers` (below) holds an `Actor` (the
policy), an optional frozen `Actor` (the reference) and an optional `Critic`; a `Rollout` generates;
a `Tracker` logs. And the callables the hooks of `nanoverl_core.hookspecs` register, which build or
are those components: `MakeWorkers`, `MakeRollout`, `Estimator`, `RewardFn`, `PolicyLoss`,
`MakeTracker`, `MakeEnvironment` (which builds an `Environment`), `MakeDataSource` (which builds a
`DataSource`). The framework reads a few optional
attributes off a registered callable (with `getattr` and a default: a callable without them is valid); each protocol's docstring lists them
under "Optional attributes" and says what the framework does with them.

`TorchActor` / `TorchCritic` implement the worker protocols over any Hugging Face-style module, so a
backend usually only builds modules; `nanoverl_core.testing` checks an implementation against these
contracts (`check_actor` calls `update` exactly as the trainer does). The rules on rows, ranks,
seeding and lifetime that every backend follows are in `nanoverl_core.hookspecs`.

Shapes: B = rows, R = response length (the batch's `responses` width).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import attrs

if TYPE_CHECKING:
    import torch

    from .algos.losses import PolicyLossInputs
    from .batch import RLBatch
    from .config import ActorConfig, AlgorithmConfig, Config
    from .env.contract import EnvStep, Turn
    from .rollout import SamplingParams


@runtime_checkable
class Actor(Protocol):
    """A policy (trainable) or the reference (frozen: `update` is never called on it).

    Optional attributes:
      * ``lora``: True for an actor that trains a LoRA adapter; `full_tensors` then yields the merged
        model's entries under the base model's names, and `nanoverl_core.testing.check_actor` checks that.
      * ``save_adapter``: ``save_adapter(folder) -> Path`` writes the adapter as a peft folder; with
        ``base_tensors()`` (the frozen base's entries), ``lora_rank`` and ``adapted_embedding`` it lets
        nanoverl-vllm load the adapter on its own (``[rollout.vllm] lora_sync = "adapter"``; a
        `TorchActor` with ``weights=nanoverl_hf.lora.LoraWeights()`` has them). Without it that sync
        mode is a ConfigError.
      * ``compute_log_probs_and_sum_pi_squared``: ``(batch) -> (log_probs, sum_pi_squared)``, both (B, R)
        as `compute_log_probs`, the second the sum over the vocabulary of pi^2 at each response token;
        an estimator with ``requires_sum_pi_squared`` needs it (`TorchActor` has it).
      * ``compute_log_probs_and_top_k``: ``(batch, k) -> (log_probs, ids, top_k_log_probs)``: (B, R) as
        `compute_log_probs`, then (B, R, k) int64 the k most likely tokens at each response position and (B, R, k)
        their log-probs, 0 on padding; a teacher needs it for ``[algorithm.distill] top_k`` (the columns
        ``teacher_topk_ids``, ``teacher_topk_log_probs``; `TorchActor` has it).
      * ``on_policy_update``: ``on_policy_update(batch, policy_loss) -> (metrics, log_probs)``: what
        ``update(batch, policy_loss, on_policy=True)`` does, returning with its metrics the (B, R) log-probs
        that update's forward computed (detached, on the CPU, 0 on padding, every rank's rows): pi_old of
        that step, what `compute_log_probs` would have returned before it. With it the trainer takes the
        rollout-mismatch metrics' pi_old from the update instead of a separate pass (`TorchActor` has it).
    """

    module: torch.nn.Module
    """The torch module: module(input_ids=, attention_mask=, position_ids=).logits is (B, T, V)."""
    device: torch.device
    """Where the module runs; batches arrive on the CPU and the actor moves what it needs."""

    def compute_log_probs(self, batch: RLBatch) -> torch.Tensor:
        """(B, R) log pi(response token) at the rollout temperature, 0 on padding, on the CPU, no grad."""

    def update(self, batch: RLBatch, policy_loss: PolicyLoss, *, on_policy: bool = False) -> dict[str, float]:
        """PPO epochs over the batch; returns the step's metrics (``actor/<name>`` -> float), equal however
        the work is split into micro-batches or ranks (nanoverl_core.algos.losses says how).

        The normalisers. Each `PolicyLossInputs` carries the *mini-batch's* ``num_tokens`` (the sum of
        ``loss_mask`` over every row of the mini-batch, on every rank), ``num_seqs`` (its rows with at least
        one loss token) and ``loss_scale_factor`` (``actor.loss_scale_factor``, or rollout.max_new_tokens
        when that is 0); a micro-batch's loss is its share of the mini-batch loss (``inputs.aggregate``
        divides its sums by them), so backpropagating every micro-batch's loss and stepping once gives the
        gradient of one whole-mini-batch pass. Do not divide again by the number of micro-batches or ranks
        (under data parallelism, sum the gradients across ranks: the normalisers are already global).

        An on-policy update's log-probs come back from ``on_policy_update`` (see Optional attributes); 0.3.0's
        ``keep_log_probs`` keyword is gone (the trainer has not passed it since 0.3.0; `TorchActor` answers it
        with one line naming ``on_policy_update``).

        Non-finite values: a loss or gradient norm that is NaN or inf must not reach the weights. Zero the
        gradients, do not step the optimizer (nor the LR schedule), and raise
        `nanoverl_core.errors.NonFiniteError` saying which; the trainer then stops or skips the update as
        ``trainer.on_nonfinite`` says (the built-in workers do this in ``clip_and_step``).

        The trainer calls ``actor.update(batch, policy_loss, on_policy=...)``. The batch holds
        ``responses``, ``response_mask`` (the tokens in the sequence), ``loss_mask`` (the tokens the loss,
        its normalisers and metrics count), ``advantages`` (B, R), ``old_log_probs`` (B, R) (possibly
        absent when `on_policy`), ``ref_log_probs`` when ``actor.use_kl_loss`` and ``rollout_is_weights``
        when rollout correction weights the loss. `policy_loss` is the registered loss (``actor.policy_loss``, see
        `PolicyLoss`). Per micro-batch: build `nanoverl_core.algos.PolicyLossInputs` (the log-probs with
        grad, at the rollout temperature; old log-probs; advantages; loss_mask; the mini-batch's normalisers;
        the rollout weights), get ``loss, metrics = compute_actor_loss(policy_loss, inputs, config.actor,
        entropy=..., ref_log_prob=...)`` (nanoverl_core.algos: it calls ``policy_loss(inputs,
        config.actor)`` and adds the entropy and KL terms) and backpropagate the loss; then step.
        on_policy: this is the step's only optimizer step and the batch was sampled by this very
        policy: take the old log-probs from this forward pass (detached) instead of the batch, and say
        so in ``PolicyLossInputs.on_policy``.
        """

    def full_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, full unsharded tensor) for every state-dict entry, one at a time (a collective under
        torchrun: call it on every rank and consume it whole). How every rollout reads the weights. A LoRA
        actor (`lora = True`) yields the merged model's entries under the base model's names instead."""

    def save(self, path: Path) -> None:
        """Write weights and optimizer state into the folder `path`, which exists and is empty (every rank,
        same path)."""

    def load(self, path: Path) -> None:
        """Restore what `save` wrote; raise CheckpointError for a checkpoint that does not fit."""


@runtime_checkable
class Critic(Protocol):
    """A value model."""

    module: torch.nn.Module
    """module(input_ids=, attention_mask=, position_ids=).logits is (B, T, 1)."""
    device: torch.device

    def compute_values(self, batch: RLBatch) -> torch.Tensor:
        """(B, R) value of the state before each response token, 0 on padding, on the CPU, no grad."""

    def update(self, batch: RLBatch) -> dict[str, float]:
        """Value-loss epochs over the batch (it holds values and returns); returns the metrics."""

    def save(self, path: Path) -> None: ...

    def load(self, path: Path) -> None: ...


@runtime_checkable
class Rollout(Protocol):
    """A generation engine.

    Optional attributes:
      * ``eos_token_ids``: the ids that end a response; a multi-turn episode's model turn that ends with
        one was not cut (default: the tokenizer's EOS and the generation config's, `rollout.stop_token_ids`).
      * ``awake``: a context manager the multi-turn driver (nanoverl_core.env.EpisodeRollout) holds around
        one batch of episodes, so an engine that frees memory after each `generate` (vLLM's sleep mode)
        stays up across the turns.
      * ``turn_cache``: a context manager the multi-turn driver holds around one batch of episodes (inside
        ``awake``). Each turn's batch carries ``episode_key`` (B,) int64, one value per episode, whichever the
        engine; a row's prompt begins with its episode's prompt and response of the previous call. Inside it
        the engine may keep each key's KV cache from one call to the next and prefill only the new tokens (the
        environment's answer), sampling as it would from the whole prompt; it frees what it kept on exit.
        An engine without it prefills each turn's whole prompt (vLLM finds it in its prefix cache); the `hf`
        rollout keeps its caches (nanoverl_hf.rollout).
    """

    returns_log_probs: bool
    """Whether `generate` adds `rollout_log_probs` (what rollout correction needs)."""

    def generate(self, batch: RLBatch, params: SamplingParams) -> RLBatch:
        """One response per row of `batch` (rows already repeated rollout.n times, `prompts` /
        `prompt_mask` left-padded (B, P)), rows in the same order: `responses` and `response_mask`
        (B, R) right-padded, the mask covering tokens up to and including the stop token; `truncated`
        (B,) bool, True for a row that ended without a stop token (cut at max_new_tokens or by the
        engine); optionally `rollout_log_probs` (B, R), and `model_mask` (B, R) when some response tokens
        are not the model's (tool or environment tokens: 0 there); never `loss_mask`, which the trainer alone
        derives (a rollout that returns one stops with one line). Each column: nanoverl_core.batch. Build
        them with `nanoverl_core.responses_to_batch`. Sampling seeds come from torch's global generator; a
        greedy call draws nothing from it. Under torchrun a sampled batch also holds `sample_seed`
        (B,) int64, the same for a row on any number of ranks (`dist.shard_rollout`); an
        engine that seeds each request should use it. A rollout that answers a row with several (an agent's
        episode that split) returns them consecutively, each naming its input row in `episode_row` (B',)
        int64 (`nanoverl_core.rollout.rollout_rows` joins them to the batch)."""

    def sync_weights(self, actor: Actor) -> None:
        """Make the next `generate` use the actor's current weights (`actor.full_tensors()`)."""

    def close(self) -> None:
        """Free the engine; the trainer calls it once, in `fit`'s finally."""


@runtime_checkable
class Tracker(Protocol):
    """A metrics sink (`make_tracker(config, run_dir, state)`); a failing call is a warning, never fatal."""

    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...

    def log_samples(self, name: str, rows: list[dict], step: int) -> None: ...

    def state_dict(self) -> dict: ...

    def close(self, success: bool) -> None: ...


TOKENIZER_CONTRACT = {"encode": "encode(text, add_special_tokens=...) -> list[int]",
                      "decode": "decode(ids, skip_special_tokens=True) -> str",
                      "pad_token_id": "int", "eos_token_id": "int",
                      "batch_decode": "optional: batch_decode(rows, skip_special_tokens=True) -> list[str]",
                      "chat_template": "optional: str | None",
                      "apply_chat_template": "with chat_template: (messages, tokenize=False, add_generation_prompt=True) -> str",
                      "vocab_size": "optional: int (the debug worker)"}
"""Every attribute of `Workers.tokenizer` the core reads, and what it must be (tests/test_backend_contracts.py
greps the core for `tokenizer.<name>` and checks this list covers it)."""


@attrs.define
class Workers:
    """What `make_workers(config)` returns: build it as ``Workers(tokenizer, actor, reference=None,
    critic=None)`` (``from nanoverl_core import Workers``, the class defined here), inside the factory
    registered with `register_workers` (`MakeWorkers`); the trainer calls the factory once, after the run
    directory's config.json is written and before the data loads, and hands the object to the rollout
    factory (`MakeRollout`) and to every step. The trainer owns it for the run: it calls the actor,
    reference and critic from its own process and thread, and never closes them; a backend that starts
    processes of its own (engines, ranks) owns them and ends them with the interpreter (daemon processes or
    an atexit handler). The factory may raise a UserError (ConfigError) for a config it cannot build; a
    ValueError or RuntimeError from building the model is reported as one line naming worker.name."""

    tokenizer: Any
    """What the core reads off it (a Hugging Face tokenizer has all of it; `TOKENIZER_CONTRACT` lists it):
    ``encode(text, add_special_tokens=...) -> list[int]`` (the core passes add_special_tokens=False for a
    prompt rendered by a chat template; raise `DataError` or any exception for text it cannot encode: the
    core names the file and row); ``decode(ids, skip_special_tokens=True) -> str``; ``pad_token_id: int``
    and ``eos_token_id: int`` (a None pad is padded with EOS by the hf worker, not by the core). Optional:
    ``batch_decode(rows, skip_special_tokens=True) -> list[str]`` (else decode row by row);
    ``chat_template: str | None`` and, when it is set, ``apply_chat_template(messages, tokenize=False,
    add_generation_prompt=True) -> str`` (chat-format prompts; without a template they are an error unless
    data.apply_chat_template = false); ``vocab_size: int`` (the debug worker's model size)."""
    actor: Actor
    """The policy being trained."""
    reference: Actor | None = None
    """A frozen policy for KL terms (reference.enable), else None."""
    critic: Critic | None = None
    """The value model (critic.enable), else None."""
    teacher: Actor | None = None
    """A frozen teacher ([teacher], on-policy distillation), else None: only `compute_log_probs` (or, with
    [algorithm.distill] top_k, `compute_log_probs_and_top_k`) and `load` are called. For a teacher.path that
    names a model, the model it names (with the student's tokenizer); for a checkpoint
    (`config.teacher.from_checkpoint`), the student's architecture, into which the trainer loads the
    checkpoint's policy (`teacher.load(<checkpoint>/actor)`)."""


# ---- what the hooks register ----------------------------------------------------------------------
class MakeWorkers(Protocol):
    """`register_workers`: ``make_workers(config) -> Workers`` (selected by ``worker.name``).

    Returns the tokenizer plus the actor, the reference (None unless ``reference.enable``), the
    critic (None unless ``critic.enable``) and the teacher (None unless ``teacher.enable``), following `Actor`
    and `Critic`.

    Optional attributes:
      * ``check_config``: ``check_config(config) -> None`` raises ConfigError for what it can check
        cheaply (files, packages, settings); called before the run directory is written or a model loads.
      * ``export_checkpoint``: ``export_checkpoint(checkpoint: Path, out: Path, config: Config) -> None``
        writes a checkpoint's policy as a save_pretrained folder into ``out``: what ``nanoverl-train
        export`` calls; without it export is a ConfigError (the checkpoint holds plain weights).
      * ``supports_lora``: True if the workers train a LoRA adapter under ``[model.lora]``; any other
        worker with ``model.lora.enable`` is a ConfigError listing those that can.
    """

    def __call__(self, config: Config) -> Workers: ...


class MakeRollout(Protocol):
    """`register_rollouts`: ``make_rollout(config, workers) -> Rollout`` (selected by ``rollout.name``).

    Optional attributes:
      * ``check_config``: ``check_config(config) -> None`` raises ConfigError before any model loads,
        as the worker factory's.
      * ``log_probs``, a field of the rollout's settings (``[rollout.<name>] log_probs``): whether the
        rollout it builds will return ``rollout_log_probs``; ``--dry-run``'s step plan and the checks
        before a run starts read it, and a rollout without the field is taken to return none (rollout
        correction is refused before anything is written). The built rollout's ``returns_log_probs``
        must agree; the run checks it again.
    """

    def __call__(self, config: Config, workers: Workers) -> Rollout: ...


class Estimator(Protocol):
    """`register_advantage_estimators`: ``fn(batch, config) -> (advantages, returns)``, both (B, R) float,
    0 on padding (selected by ``algorithm.advantage_estimator``).

    It reads ``token_level_rewards``, ``loss_mask`` (the tokens that count: the rollout's ``response_mask``
    less truncated or rejected tokens), ``values`` (when a critic runs) and the
    non-tensor ``uid`` (rows sharing a uid come from one prompt); its own settings are ``config.settings``.

    Optional attributes:
      * ``requires_critic``: True if it reads ``values``; selecting it without ``critic.enable`` is then
        a ConfigError before anything loads.
      * ``requires_sum_pi_squared``: True if it reads ``old_log_probs`` and ``sum_pi_squared`` (B, R), the
        policy's sum over the vocabulary of pi^2 at each response token; the trainer then computes both
        every step with the actor's ``compute_log_probs_and_sum_pi_squared`` (a ConfigError at start
        when the actor has none).
      * ``requires_greedy_baseline``: True if it reads ``reward_baselines`` (B,), the score of one greedy
        response per prompt (uid); the trainer then generates and scores those every step after step 4
        (ReMax; timing/baseline_rollout, timing/baseline_reward and remax/ metrics).
      * ``requires_teacher``: True if it reads ``teacher_log_probs`` (B, R), a `[teacher]`'s log-probs of the
        sampled tokens (a pass of the step); it is then a ConfigError to select it without ``teacher.path``,
        or to set ``teacher.path`` for an estimator without it.
      * ``requires_old_log_probs``: True if it reads ``old_log_probs`` (pi_old's) to compute the advantages;
        the trainer then runs the old-log-prob pass even in an on-policy step.
      * ``bind``: ``bind(config: Config, registry) -> Estimator``, what the run uses instead of the
        registered object, called once when the run resolves its plugins (an estimator built on another
        registered one: ``distill``'s task estimator).
      * ``check_config``: ``check_config(config: Config)`` raises ConfigError when the config cannot work
        with it; called before anything loads.
    """

    def __call__(self, batch: RLBatch, config: AlgorithmConfig) -> tuple[torch.Tensor, torch.Tensor]: ...


class RewardFn(Protocol):
    """`register_rewards`: ``fn(prompt, response, sample) -> float | dict`` (selected by ``reward.name``).

    ``sample`` is the dataset row. A dict holds ``"score"`` and may add numeric keys, logged as
    ``reward/<key>``; the score is placed on the last valid response token. A reward that registered
    settings is called with them as ``settings=...``. (A function with a ``solution_str`` parameter is
    called as verl calls ``compute_score``; nanoverl_core.reward.)

    Optional attributes:
      * ``batched``: True for ``fn(prompts, responses, samples) -> list[float | dict]``, one value per
        row: called once per step with every row (under torchrun: with this rank's share), in a worker
        process of its own (one for all batched rewards, so a reward model is loaded once and kept),
        timed out after reward.timeout_s per row; a crash or hang fails that call's rows and a fresh
        worker takes the next step. With reward.workers = 0 it runs in the trainer process. One that takes
        a ``context`` keyword gets a ``nanoverl_core.reward.RewardContext`` (phase, step, run directory,
        each row's uid and index); an item of its list may be a ``nanoverl_core.reward.CallError(kind,
        message)``: that row failed (reward.on_error decides what follows), counted as reward/errors/<kind>.
      * ``error_kinds``: the kinds of its CallErrors, each logged as reward/errors/<kind> every step (0 or more).
      * ``check_config``: ``check_config(config) -> None`` raises ConfigError for bad settings (a file, a URL)
        before the run directory is written or a model loads (``--dry-run`` runs it too).
    """

    def __call__(self, prompt: str, response: str, sample: dict, **settings: Any) -> float | dict: ...


class PolicyLoss(Protocol):
    """`register_policy_losses`: ``fn(inputs, config) -> (loss, metrics)`` (selected by ``actor.policy_loss``).

    ``inputs`` is one micro-batch's `nanoverl_core.algos.PolicyLossInputs` (log-probs with grad, old
    log-probs, advantages, the response mask, ``inputs.aggregate`` bound to the mini-batch normalisers,
    ``inputs.on_policy``, ``inputs.rollout_is_weights``); ``config`` the ``[actor]`` section, the loss's own
    settings in ``config.settings``. ``loss`` is a scalar tensor; ``metrics`` maps ``actor/<name>`` to
    detached scalars that are this micro-batch's share of the mini-batch value (``inputs.token_mean(x)``),
    so they sum exactly over micro-batches. `Actor.update` calls it through
    ``nanoverl_core.algos.compute_actor_loss``, which adds the entropy and KL terms.
    """

    def __call__(self, inputs: PolicyLossInputs,
                 config: ActorConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...


class MakeTracker(Protocol):
    """`register_trackers`: ``make_tracker(config, run_dir, state) -> Tracker`` (selected by
    ``tracking.trackers``). ``state`` is what the tracker's ``state_dict()`` returned when the checkpoint
    being resumed was saved, else None."""

    def __call__(self, config: Config, run_dir: Path, state: dict | None) -> Tracker: ...


@runtime_checkable
class Environment(Protocol):
    """One multi-turn episode's world (state lives on the object; a fresh one per episode)."""

    def step(self, turn: Turn) -> EnvStep:
        """Answer the model's turn (its text and exact token ids): the observation to append (text, or chat
        messages rendered by the chat template), this turn's reward, whether the episode is done, and
        counters (``info``) logged as ``episode/<key>/mean``. Raising, hanging past
        ``environment.timeout_s`` or returning anything but an ``EnvStep`` is a failure handled under
        ``environment.on_error``; a model's malformed action should be answered, not raised."""

    # optional: def close(self) -> None, called once when the episode ends (also after a failure)


class MakeEnvironment(Protocol):
    """`register_environments`: ``make_env(sample, settings=...) -> Environment`` (selected by
    ``environment.name``), called once per episode with the episode's data row (``settings=`` only when
    it registered settings). Multi-turn episodes run through any rollout (nanoverl_core.env.episode).

    Optional attributes:
      * ``tools``: a list of Python functions (type hints, Google-style docstring): prompts are rendered
        with their schemas, through the chat template's tool format or the tag format of
        nanoverl_core.env.tools. ``nanoverl_core.env.tool_environment`` sets it.
    """

    def __call__(self, sample: dict, **settings: Any) -> Environment: ...


@runtime_checkable
class DataSource(Protocol):
    """The prompts of a run: files, or a generator that draws rows from its settings and seeds.

    Optional attributes:
      * ``generated``: True for a source that draws rows (a task generator). The loader then asks for
        the training rows of every epoch anew (``rows("train", epoch)``: fresh rows each epoch, when the
        source seeds them by its seed and the epoch) and drops training rows whose prompt is a validation
        prompt, so training never sees one. Epoch e + 1's rows are drawn in a background thread while
        epoch e trains, so ``rows`` must not touch state the trainer shares (the global ``random``, say):
        seed a generator of its own. False or absent: the rows of epoch 0 are every epoch's, reshuffled
        (``data.shuffle``), and used as given.
    """

    def rows(self, split: str, epoch: int) -> Iterable[dict[str, Any]]:
        """The rows of ``split`` ("train" or "val"; validation is always epoch 0), each a plain dict like
        a file's row: the prompt under ``data.prompt_key`` (a string or chat messages), the data source
        under ``data.data_source_key``, and what the reward reads (ground truth, extra info), JSON-safe,
        since rewards run in worker processes. The same arguments give the same rows, in the same order:
        a resumed run regenerates its epoch and continues at the checkpoint's position. No rows for
        "val": no validation. A row may carry ``__file__`` / ``__row__`` (how errors name it)."""


class MakeDataSource(Protocol):
    """`register_data_sources`: ``make_source(config) -> DataSource`` (selected by ``data.source``; its
    settings are ``config.data.settings``), called once per run and once by ``nanoverl-train eval``.

    Optional attributes:
      * ``check_config``: ``check_config(config) -> None`` raises ConfigError for bad settings (an unknown
        task, a parameter out of range) before the run directory is written or a model loads; ``--dry-run``
        runs it too.
    """

    def __call__(self, config: Config) -> DataSource: ...
