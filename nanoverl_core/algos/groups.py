"""Groups of rows sampled from one prompt (rows sharing a `uid`), and dropping groups with no signal.

A group whose sequence scores are all equal gives every row the same group-relative advantage
(0 for GRPO), so it adds no policy-gradient signal, only noise in the normalisers. DAPO's dynamic
sampling drops such groups; the trainer does so when `algorithm.filter_groups` is on.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..batch import RLBatch


def uniform_groups(scores: torch.Tensor, uids: Sequence[Hashable]) -> torch.Tensor:
    """Which rows belong to a group whose scores are all exactly equal.

    scores: (B,) float, the sequence score of each row
    uids:   B hashable group ids (any order; rows of one group need not be adjacent)
    Returns a (B,) bool tensor, True for every row of a uniform group. A group of one is uniform.
    """
    if len(uids) != scores.shape[0]:
        raise ValueError(f"uniform_groups got {scores.shape[0]} scores but {len(uids)} uids")
    group_of: dict[Hashable, int] = {}
    gid = torch.tensor([group_of.setdefault(u, len(group_of)) for u in uids], dtype=torch.long,
                       device=scores.device)  # (B,) group index 0..G-1
    num_groups = len(group_of)
    lo = torch.full((num_groups,), float("inf"), dtype=scores.dtype, device=scores.device)
    hi = torch.full((num_groups,), float("-inf"), dtype=scores.dtype, device=scores.device)
    lo = lo.scatter_reduce(0, gid, scores, reduce="amin")
    hi = hi.scatter_reduce(0, gid, scores, reduce="amax")
    return (lo == hi)[gid]


def filter_uniform_groups(batch: RLBatch, scores: torch.Tensor) -> tuple[RLBatch, int]:
    """The batch without the rows of uniform groups (row order kept), and how many groups were dropped.

    batch:  an RLBatch with the non-tensor column `uid`
    scores: (B,) sequence score of each row
    """
    uids = batch["uid"]
    uniform = uniform_groups(scores, uids)
    dropped = len({u for u, drop in zip(uids, uniform.tolist()) if drop})
    return batch.index(~uniform), dropped
