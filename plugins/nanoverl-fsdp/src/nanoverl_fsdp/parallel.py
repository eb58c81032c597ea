"""Data parallelism for the workers: `FSDPParallel`, the core's `parallel` strategy over FSDP ranks.

Every rank holds the whole step batch (the trainer gathers the rollout onto every rank). A worker
stage works on this rank's share of the rows, `nanoverl_core.dist.rank_rows` (the same
split the trainer's rollout uses): a share short of rows is filled with copies of the last row, so
every rank runs the same number of forward / backward passes (each FSDP pass is a collective, a
rank that skipped one would hang the others); the fill rows are dropped from outputs and masked
out of losses. The process group is the core's (`init_distributed`), a group of one without torchrun.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from nanoverl_core import RLBatch
from nanoverl_core.dist import init_distributed, rank, rank_rows, world_size
from nanoverl_core.workers import Weights

from .checkpoint import load_shards, save_hf_files, save_shards

__all__ = ["FSDPParallel", "all_reduce_sum", "gather_rows", "init_process_group", "rank", "rank_rows", "world_size"]


def init_process_group(device_type: str) -> None:
    """Join torchrun's process group (nanoverl-train has usually done so), or make a world of one,
    so the fsdp worker runs, and is tested, in a plain `python` process too."""
    init_distributed(device_type, world_of_one=True)


def gather_rows(local: torch.Tensor, num_rows: int) -> torch.Tensor:
    """Every rank's (share, ...) result stacked in row order, fill rows dropped: (num_rows, ...)."""
    parts = [torch.empty_like(local) for _ in range(world_size())]
    dist.all_gather(parts, local.contiguous())
    return torch.cat(parts)[:num_rows]


def all_reduce_sum(value: torch.Tensor) -> torch.Tensor:
    out = value.detach().clone()
    dist.all_reduce(out)
    return out


class FSDPParallel:
    """The `parallel` strategy of a worker whose module is sharded with `fully_shard` (workers.shard).

      - rows: log-probs and values are computed on this rank's share of the rows and gathered back;
        an update takes this rank's share of every mini-batch, so the ranks together see exactly the
        mini-batches one process would (the core counts the normalisers on the whole mini-batch);
      - gradients: FSDP averages them over ranks, and the core scales each micro-batch loss by `size`,
        so the summed gradient equals one process's; `clip_grad_norm_` over the DTensor gradients
        returns the global norm; a non-finite loss on any rank skips the step on every rank;
      - metrics: each rank's are its share of the mini-batch's; the core's update sums them over ranks;
      - checkpoints: every rank writes its own shards (nanoverl_fsdp.checkpoint).

    export_tokenizer: given (the policy's), a checkpoint also holds hf/ (the transformers config,
    generation config and this tokenizer), what `python -m nanoverl_fsdp.export` rebuilds a plain
    model from.
    """

    cached_backward = False
    """The log-prob and value passes share prompt caches ([actor] share_prompts); training passes run every
    row whole: FSDP2 frees a unit's gathered weights after each forward, and the backward of a first
    (prompt) forward followed by a second one before backward finds them gone."""

    def __init__(self, export_tokenizer=None):
        self.export_tokenizer = export_tokenizer

    @property
    def size(self) -> int:
        return world_size()

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        return all_reduce_sum(value)

    def max(self, value: int) -> int:
        out = torch.tensor(value)
        dist.all_reduce(out, op=dist.ReduceOp.MAX)
        return int(out)

    def anywhere(self, flag: bool) -> bool:
        return bool(all_reduce_sum(torch.tensor(float(flag))) > 0)

    def on_my_rows(self, batch: RLBatch, compute: Callable[[RLBatch], torch.Tensor]) -> torch.Tensor:
        rows, _ = rank_rows(len(batch))
        return gather_rows(compute(batch.index(rows)), len(batch))

    def my_share(self, mini_batch: RLBatch) -> RLBatch:
        """Fill rows get an all-zero loss mask: no loss, no metric."""
        rows, real = rank_rows(len(mini_batch))
        share = mini_batch.index(rows)
        if real < len(rows):
            mask = share["loss_mask"].clone()
            mask[real:] = 0
            share["loss_mask"] = mask
        return share

    def save(self, path: Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None, scheduler,
             weights: Weights) -> None:
        save_shards(path, module, optimizer, scheduler, weights)
        if self.export_tokenizer is not None:
            save_hf_files(path, module, self.export_tokenizer)

    def load(self, path: Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None, scheduler,
             weights: Weights, device: torch.device) -> None:
        load_shards(path, module, optimizer, scheduler, weights)
