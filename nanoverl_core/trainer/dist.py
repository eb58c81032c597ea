"""The little the trainer needs from torch.distributed: who is rank 0, and a barrier.

A single process (no torchrun) is a world of one. Imports torch.distributed only when it is in use.
"""

import os


def is_distributed() -> bool:
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    import torch.distributed as dist
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def is_rank0() -> bool:
    return rank() == 0


def barrier() -> None:
    if is_distributed():
        import torch.distributed as dist
        dist.barrier()
