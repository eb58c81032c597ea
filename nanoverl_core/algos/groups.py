"""Groups of rows sampled from one prompt (rows sharing a `uid`), and dropping groups with no signal.

A group whose sequence scores are all equal gives every row the same group-relative advantage
(0 for GRPO), so it adds no policy-gradient signal, only noise in the normalisers. DAPO's dynamic
sampling drops such groups and samples more prompts until the batch is full again; the trainer does so
when `algorithm.filter_groups` is on (`Trainer.generate_until_full`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..batch import RLBatch


class Groups:
    """Rows grouped by uid. index: (B,) group of each row (0..G-1, by first appearance); size: (G,).

    uids: B hashable group ids (any order; rows of one group need not be adjacent).
    """

    def __init__(self, uids: Sequence[Hashable], device: torch.device | str = "cpu"):
        first_seen: dict[Hashable, int] = {}
        self.index = torch.tensor([first_seen.setdefault(u, len(first_seen)) for u in uids],
                                  dtype=torch.long, device=device)
        self.num = len(first_seen)
        self.size = torch.bincount(self.index, minlength=self.num)  # (G,)

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """(B,) -> (G,) sum over each group's rows."""
        return torch.zeros(self.num, dtype=x.dtype, device=x.device).index_add(0, self.index, x)

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        """(B,) -> (G,) mean over each group's rows."""
        return self.sum(x) / self.size.to(x.dtype)

    def std(self, x: torch.Tensor) -> torch.Tensor:
        """(B,) -> (G,) unbiased std over each group's rows (0 for a group of one)."""
        dev = x - self.mean(x)[self.index]
        return (self.sum(dev * dev) / (self.size - 1).clamp(min=1).to(x.dtype)).sqrt()

    def same_value(self, x: torch.Tensor) -> torch.Tensor:
        """(B,) -> (B,) bool: every row of the row's group holds exactly the same value (a group of one does)."""
        lo = torch.full((self.num,), float("inf"), dtype=x.dtype, device=x.device)
        hi = torch.full((self.num,), float("-inf"), dtype=x.dtype, device=x.device)
        lo = lo.scatter_reduce(0, self.index, x, reduce="amin")
        hi = hi.scatter_reduce(0, self.index, x, reduce="amax")
        return (lo == hi)[self.index]

    def all_equal(self, x: torch.Tensor) -> torch.Tensor:
        """(B,) -> (B,) bool: the row's group has two or more rows, all with the same value."""
        return self.same_value(x) & ~self.singleton()

    def singleton(self) -> torch.Tensor:
        """(B,) bool: the row is alone in its group."""
        return self.size[self.index] == 1


def uniform_groups(scores: torch.Tensor, uids: Sequence[Hashable]) -> torch.Tensor:
    """Which rows belong to a group whose scores are all exactly equal.

    scores: (B,) float, the sequence score of each row
    uids:   B hashable group ids (any order; rows of one group need not be adjacent)
    Returns a (B,) bool tensor, True for every row of a uniform group. A group of one is uniform.
    """
    if len(uids) != scores.shape[0]:
        raise ValueError(f"uniform_groups got {scores.shape[0]} scores but {len(uids)} uids")
    return Groups(uids, scores.device).same_value(scores)


def filter_uniform_groups(batch: RLBatch, scores: torch.Tensor) -> tuple[RLBatch, int]:
    """The batch without the rows of uniform groups (row order kept), and how many groups were dropped.

    batch:  an RLBatch with the non-tensor column `uid`
    scores: (B,) sequence score of each row
    """
    uids = batch["uid"]
    uniform = uniform_groups(scores, uids)
    dropped = len({u for u, drop in zip(uids, uniform.tolist()) if drop})
    return batch.index(~uniform), dropped


def first_groups(batch: RLBatch, k: int) -> RLBatch:
    """The rows of the batch's first k groups (by first appearance of their uid; row order kept).

    batch: an RLBatch with the non-tensor column `uid`
    """
    return batch.index(Groups(batch["uid"]).index < k)
