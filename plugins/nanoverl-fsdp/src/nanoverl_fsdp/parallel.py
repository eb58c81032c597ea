"""Data parallelism for the workers: which rows a rank owns, and cross-rank sums and gathers.

Every rank holds the whole step batch (the trainer gathers the rollout onto every rank). A worker
stage works on this rank's share of the rows, `nanoverl_core.dist.rank_rows` (the same
split the trainer's rollout uses): a share short of rows is filled with copies of the last row, so
every rank runs the same number of forward / backward passes (each FSDP pass is a collective, a
rank that skipped one would hang the others); the fill rows are dropped from outputs and masked
out of losses. The process group is the core's (`init_distributed`), a group of one without torchrun.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from nanoverl_core.dist import init_distributed, rank, rank_rows, world_size

__all__ = ["all_reduce_sum", "gather_rows", "init_process_group", "rank", "rank_rows", "world_size"]


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
