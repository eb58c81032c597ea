"""What the trainer needs from the components plugins register: one `typing.Protocol` each.

`Workers` (nanoverl_core.workers) holds an `Actor` (the policy), an optional frozen `Actor` (the
reference) and an optional `Critic`; `make_rollout` returns a `Rollout`. `TorchActor` / `TorchCritic`
implement the worker protocols over any Hugging Face-style module, so a backend usually only builds
modules; `nanoverl_core.testing` checks an implementation against these contracts. The rules on
rows, ranks, seeding and lifetime that every backend follows are in `nanoverl_core.hookspecs`.

Shapes: B = rows, R = response length (the batch's `responses` width).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from .batch import RLBatch
    from .rollout import SamplingParams


@runtime_checkable
class Actor(Protocol):
    """A policy (trainable) or the reference (frozen: `update` is never called on it)."""

    module: torch.nn.Module
    """The torch module: module(input_ids=, attention_mask=, position_ids=).logits is (B, T, V)."""
    device: torch.device
    """Where the module runs; batches arrive on the CPU and the actor moves what it needs."""

    def compute_log_probs(self, batch: RLBatch) -> torch.Tensor:
        """(B, R) log pi(response token) at the rollout temperature, 0 on padding, on the CPU, no grad."""

    def update(self, batch: RLBatch, *, on_policy: bool = False) -> dict[str, float]:
        """PPO epochs over the batch (it holds old_log_probs unless `on_policy`, advantages, ...);
        returns the step's metrics, equal however the work is split into micro-batches or ranks."""

    def full_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, full unsharded tensor) for every state-dict entry, one at a time (a collective under
        torchrun: call it on every rank and consume it whole). How every rollout reads the weights. A LoRA
        actor (`lora = True`) yields the merged model's entries under the base model's names instead."""

    def save(self, path: Path) -> None:
        """Write weights and optimizer state into the folder `path` (every rank, same path)."""

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
    """A generation engine."""

    returns_log_probs: bool
    """Whether `generate` adds `rollout_log_probs` (what rollout correction needs)."""

    def generate(self, batch: RLBatch, params: SamplingParams) -> RLBatch:
        """One response per row of `batch` (rows already repeated rollout.n times, `prompts` /
        `prompt_mask` left-padded (B, P)), rows in the same order: `responses` and `response_mask`
        (B, R) right-padded, the mask covering tokens up to and including EOS (build them with
        `nanoverl_core.responses_to_batch`), optionally `rollout_log_probs` (B, R). Sampling seeds
        come from torch's global generator; a greedy call draws nothing from it. Under torchrun a
        sampled batch also holds `sample_seed` (B,) int64, the same for a row on any number of ranks
        (`dist.shard_rollout`); an engine that seeds each request should use it."""

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
