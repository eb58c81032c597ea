"""The little nanoverl needs from torch.distributed: who is rank 0, a barrier, RNG forks, the rollout split.

The trainer, the reward stage, workers and plugins all import it from here (`nanoverl_core.dist`). A single
process (no torchrun) is a world of one. torch.distributed is imported only when in use.

Under `torchrun --nproc_per_node=N -m nanoverl_core.cli ...` every rank runs the whole trainer loop
on the same step batch (same prompts, same uids: the samplers and RNGs are seeded alike). Only two
things are split across ranks:

  - the rollout: each rank samples its share of the rows and every rank gets all rows back
    (`shard_rollout`), so reward, advantages and the trainer's metrics are computed on the whole
    step batch on every rank and rank 0 logs the global numbers without a metric all-reduce;
  - the model work (log-probs, values, updates): the worker splits rows itself (nanoverl-fsdp).

Only rank 0 writes run-directory files (config.json, metrics, rollouts, checkpoint metadata).
"""

import os


def is_distributed() -> bool:
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    import torch.distributed as dist
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def local_rank() -> int:
    """The rank on this node (torchrun's LOCAL_RANK): the index of this rank's GPU."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def world_size() -> int:
    return int(os.environ["WORLD_SIZE"]) if is_distributed() else 1


def is_rank0() -> bool:
    return rank() == 0


def barrier() -> None:
    if is_distributed():
        import torch.distributed as dist
        dist.barrier()


def init_distributed(device: str = "auto", *, world_of_one: bool = False) -> None:
    """Join torchrun's process group, once; in a single process a no-op, or (`world_of_one`, for a
    backend that needs a group, such as FSDP) a group of one rank.

    CPU runs use gloo. GPU runs pin this rank to cuda:LOCAL_RANK and use NCCL for CUDA tensors and
    gloo for CPU tensors (the "cpu:gloo,cuda:nccl" backend), so small CPU-side collectives (the
    rollout gather, metrics) need no device copies. `device` is trainer.device or a device type:
    "cpu" forces gloo.
    """
    single = int(os.environ.get("WORLD_SIZE", "1")) <= 1
    if single and not world_of_one:
        return
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    cuda = device != "cpu" and torch.cuda.is_available()
    backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
    if single:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        return
    if cuda:
        torch.cuda.set_device(local_rank())
    dist.init_process_group(backend)


def rank_rows(num_rows: int) -> tuple[list[int], int]:
    """(the row indices this rank works on, how many of them are real): rank r of `world` owns rows
    [r * share, (r + 1) * share) with share = ceil(num_rows / world). A short share is filled with
    copies of the last row, so every rank runs the same number of passes (each FSDP pass is a
    collective); callers drop the fill rows from outputs and mask them out of losses."""
    world, me = world_size(), rank()
    share = -(-num_rows // world)
    rows = list(range(me * share, min(num_rows, (me + 1) * share)))
    real = len(rows)
    return rows + [num_rows - 1] * (share - real), real


def gather_dicts(part: dict) -> dict:
    """The union of every rank's `part` (keys disjoint: each rank's own rows), on every rank; one process:
    `part`. For work split by `rank_rows` whose small, picklable results every rank needs (reward scores)."""
    if not is_distributed():
        return part
    import torch.distributed as dist

    parts: list = [None] * world_size()
    dist.all_gather_object(parts, part)
    return {key: value for each in parts for key, value in each.items()}


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's generators (torch's: the CPU and every CUDA device)."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def fork_rng():
    """torch.random.fork_rng over the CPU and every CUDA device, so re-seeding inside the block (which
    seeds all devices) leaves every generator outside it as it was."""
    import torch

    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    return torch.random.fork_rng(devices=devices)


def close_distributed() -> None:
    if is_distributed():
        import torch.distributed as dist
        dist.destroy_process_group()


def shard_rollout(generate, batch, *, pad_token_id: int, seed: tuple[int, ...], row_seeds: bool = False):
    """`generate(rows) -> RLBatch` run on this rank's contiguous share of `batch`; returns all rows.

    One process: plain `generate(batch)`. Under torchrun, rank r samples its `rank_rows` (the last
    ranks pad with copies of the last row, dropped again, so an engine never sees an empty batch),
    under a torch RNG forked and seeded from (*seed, rank); the trainer passes (trainer.seed, step).
    So ranks draw independent samples, and the trainer's own RNG stream stays the same on every rank,
    which keeps rank 0's checkpointed RNG state valid for all ranks (exact resume).

    `row_seeds` (a sampled, not greedy, call): the batch also gets `sample_seed` (B,) int64, one draw
    from torch's global generator plus each row's index in the whole batch, the seeds a rollout that
    seeds every request itself (vLLM) draws in one process. Such a rollout then samples the same
    tokens for every row on any number of ranks.

    The per-rank outputs are gathered and padded to one width, in row order: `prompts` / `prompt_mask` (an
    agent rollout returns the prompts its model read) on the left, `responses` with pad_token_id and other
    2-D columns with 0 on the right.
    """
    if not is_distributed():
        return generate(batch)
    import torch
    import torch.distributed as dist

    from .batch import RLBatch
    from .rollout import sample_seeds

    if row_seeds:
        batch["sample_seed"] = sample_seeds(len(batch))
    rows, real = rank_rows(len(batch))
    with fork_rng():
        torch.manual_seed(hash((*seed, rank())) & 0x7FFF_FFFF_FFFF_FFFF)  # int tuples hash alike in every process
        out = generate(batch.index(rows)).to("cpu")
    if "episode_row" in out:                   # an agent rollout's rows, several for an input row that split
        out = out.index(out["episode_row"] < real)
        out["episode_row"] = torch.tensor(rows)[out["episode_row"]]
    else:
        out = out.index(slice(0, real))
    parts: list = [None] * world_size()
    dist.all_gather_object(parts, out)
    for key in [k for k, v in out.tensors.items() if v.dim() == 2]:  # (rows, R): R differs between ranks
        width = max(part[key].shape[1] for part in parts)
        fill = pad_token_id if key in ("responses", "prompts") else 0
        left = key in ("prompts", "prompt_mask")                      # an agent rollout's own prompts
        for part in parts:
            missing = width - part[key].shape[1]
            part[key] = torch.nn.functional.pad(part[key], (missing, 0) if left else (0, missing), value=fill)
    return RLBatch.concat(parts)
