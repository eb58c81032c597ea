"""The two strategies a `TorchActor` / `TorchCritic` is composed of, and the core's defaults.

The PPO mechanics (workers/ppo.py) are the same for every backend; what differs is asked of two
small objects the worker is given:

    parallel  how the rows and sums of a step are split over data-parallel ranks, and how the module
              and optimizer are saved: `SingleProcess` here (a world of one; the files of
              workers/checkpoint.py), nanoverl_fsdp's `FSDPParallel` (row shards, cross-rank sums,
              one file per rank);
    weights   what trains, what a checkpoint holds of it and what a rollout loads: `FullWeights` here
              (every weight), nanoverl_hf.lora's `LoraWeights` (an adapter on a frozen base).

Any pair combines: a sharded LoRA policy is `TorchActor(module, config, parallel=FSDPParallel(...),
weights=LoraWeights())`. The protocols below are the whole contract. A strategy keeps no state of
its own worker (the module, optimizer and scheduler are passed to it), so one object may serve
several workers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import torch

from ..batch import RLBatch
from .checkpoint import MODEL_FILE, checkpoint_fits, load_optimizer, save_optimizer


class DataParallel(Protocol):
    """How a worker's work is split over data-parallel ranks, and its checkpoint format.

    Every rank holds the whole step batch. A rank computes log-probs and values for its share of the
    rows (`on_my_rows`) and trains on its share of each mini-batch (`my_share`), while the loss
    normalisers count the whole mini-batch. Every rank must run as many forward / backward passes (a
    sharded pass is a collective): `max` and `anywhere` let the ranks agree on counts and on skipping
    a step."""

    size: int
    """The number of ranks; the update scales each micro-batch loss by it (gradients are averaged over ranks)."""
    cached_backward: bool
    """Whether a training pass may run through a shared prompt cache (two forwards before one backward)."""

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        """`value` summed over ranks."""

    def max(self, value: int) -> int:
        """The largest `value` over ranks."""

    def anywhere(self, flag: bool) -> bool:
        """Whether `flag` is set on any rank: a decision every rank must take alike (skip a step)."""

    def on_my_rows(self, batch: RLBatch, compute: Callable[[RLBatch], torch.Tensor]) -> torch.Tensor:
        """compute(rows) -> (rows, R) on this rank's rows of `batch`; every rank's results, in row order: (B, R)."""

    def my_share(self, mini_batch: RLBatch) -> RLBatch:
        """This rank's rows of a mini-batch (rows added to even out the ranks have an all-zero loss_mask)."""

    def save(self, path: Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None, scheduler,
             weights: Weights) -> None:
        """Write the folder `path`: the module's entries that `weights` says a checkpoint holds, the optimizer
        and the schedule (called on every rank with the same path)."""

    def load(self, path: Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None, scheduler,
             weights: Weights, device: torch.device) -> None:
        """Read back what `save` wrote; what does not fit is a CheckpointMismatch (`checkpoint_fits`)."""


class Weights(Protocol):
    """What of a worker's module trains, and what a checkpoint and a rollout get of it."""

    lora: bool
    """True: an adapter trains on a frozen base. A checkpoint then holds only what trains (the base is
    rebuilt from model.path) and `full_tensors` yields the merged model (the Actor protocol's `lora`)."""

    def parameters(self, module: torch.nn.Module) -> list[torch.nn.Parameter]:
        """The parameters the optimizer steps."""

    def inference(self, module: torch.nn.Module) -> contextlib.AbstractContextManager:
        """The context a log-prob or value pass runs in."""

    def full_tensors(self, module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, full tensor) of the model a rollout loads, one at a time (sharded entries gathered:
        a collective every rank consumes whole)."""

    def checkpoint_entries(self, module: torch.nn.Module, state: dict[str, Any]) -> dict[str, Any]:
        """Of the module's state dict (its own names), the entries a sharded checkpoint holds."""

    def save_config(self, module: torch.nn.Module, folder: Path) -> None:
        """Next to a sharded checkpoint's entries: the files that say what they are (rank 0)."""

    def save(self, module: torch.nn.Module, folder: Path) -> None:
        """A single-process checkpoint's weight files."""

    def load(self, module: torch.nn.Module, folder: Path, device: torch.device) -> None:
        """Read back what `save` wrote."""

    def actor_attributes(self, module: torch.nn.Module) -> dict[str, Any]:
        """What these weights add to an actor that holds them (the Actor protocol's optional attributes)."""


class SingleProcess:
    """One process, a world of one: every row is this process's, sums are the values themselves, and
    a checkpoint is the files of workers/checkpoint.py."""

    size = 1
    cached_backward = True

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        return value

    def max(self, value: int) -> int:
        return value

    def anywhere(self, flag: bool) -> bool:
        return flag

    def on_my_rows(self, batch: RLBatch, compute: Callable[[RLBatch], torch.Tensor]) -> torch.Tensor:
        return compute(batch)

    def my_share(self, mini_batch: RLBatch) -> RLBatch:
        return mini_batch

    def save(self, path: Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None, scheduler,
             weights: Weights) -> None:
        path.mkdir(parents=True, exist_ok=True)
        weights.save(module, path)
        if optimizer is not None:
            save_optimizer(path, optimizer, scheduler)

    def load(self, path: Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None, scheduler,
             weights: Weights, device: torch.device) -> None:
        with checkpoint_fits(path):
            weights.load(module, path, device)
            if optimizer is not None:
                load_optimizer(path, optimizer, scheduler, device)


class FullWeights:
    """Every weight of the module: all of it trains (unless the worker is frozen), a checkpoint holds
    all of it (`MODEL_FILE`), and a rollout loads the module's own state dict."""

    lora = False

    def parameters(self, module: torch.nn.Module) -> list[torch.nn.Parameter]:
        return [p for p in module.parameters() if p.requires_grad]

    def inference(self, module: torch.nn.Module) -> contextlib.AbstractContextManager:
        """Nothing to switch: the modules are built without dropout."""
        return contextlib.nullcontext()

    def full_tensors(self, module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        for name, value in module.state_dict().items():
            yield name, (value.full_tensor() if hasattr(value, "full_tensor") else value).detach()

    def checkpoint_entries(self, module: torch.nn.Module, state: dict[str, Any]) -> dict[str, Any]:
        return state

    def save_config(self, module: torch.nn.Module, folder: Path) -> None:
        """Nothing: the entries are the model's own."""

    def save(self, module: torch.nn.Module, folder: Path) -> None:
        from safetensors.torch import save_model
        save_model(module, str(folder / MODEL_FILE))

    def load(self, module: torch.nn.Module, folder: Path, device: torch.device) -> None:
        from safetensors.torch import load_model
        load_model(module, str(folder / MODEL_FILE), device=str(device))

    def actor_attributes(self, module: torch.nn.Module) -> dict[str, Any]:
        return {}
