"""Data parallelism for the workers: the process group, which rows a rank owns, cross-rank sums.

Every rank holds the whole step batch (the trainer gathers the rollout onto every rank). A worker
stage splits the rows it is given into `world` contiguous shares of `share = ceil(B / world)` rows:
rank r owns rows [r * share, (r + 1) * share). A share short of rows is filled with copies of the
last row, so every rank runs the same number of forward / backward passes (each FSDP pass is a
collective, a rank that skipped one would hang the others); the fill rows are dropped from outputs
and masked out of losses.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def init_process_group(device_type: str) -> None:
    """Join torchrun's process group (nanoverl-train has usually done so), or make a world of one.

    A world of one (a plain `python` process) lets the fsdp worker run, and be tested, without torchrun.
    """
    if dist.is_initialized():
        return
    cuda = device_type == "cuda"
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo")
    else:
        dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo", store=dist.HashStore(),
                                rank=0, world_size=1)


def world_size() -> int:
    return dist.get_world_size()


def rank() -> int:
    return dist.get_rank()


def my_rows(num_rows: int) -> tuple[list[int], int]:
    """(row indices this rank works on, how many of them are real); always `share` indices."""
    world, me = world_size(), rank()
    share = -(-num_rows // world)
    rows = list(range(me * share, min(num_rows, (me + 1) * share)))
    real = len(rows)
    return rows + [num_rows - 1] * (share - real), real


def gather_rows(local: torch.Tensor, num_rows: int) -> torch.Tensor:
    """Every rank's (share, ...) result stacked in row order, fill rows dropped: (num_rows, ...)."""
    parts = [torch.empty_like(local) for _ in range(world_size())]
    dist.all_gather(parts, local.contiguous())
    return torch.cat(parts)[:num_rows]


def all_reduce_sum(value: torch.Tensor) -> torch.Tensor:
    out = value.detach().clone()
    dist.all_reduce(out)
    return out


def reduce_metrics(metrics: dict[str, float], summed: tuple[str, ...] = ()) -> dict[str, float]:
    """The mean over ranks of each metric (keys in `summed`: the sum), the same on every rank.

    Per-micro-batch metrics are averaged on each rank over the same number of micro-batches, so the
    mean over ranks is the mean over all micro-batches of the step, as one process would log it.
    A loss each rank computed against whole-mini-batch normalisers is its share of the total: summed.
    """
    keys = sorted(metrics)
    values = all_reduce_sum(torch.tensor([metrics[k] for k in keys], dtype=torch.float64))
    world = world_size()
    return {k: float(v) if k in summed else float(v) / world for k, v in zip(keys, values)}
