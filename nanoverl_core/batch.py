"""RLBatch: the one data structure that flows through the trainer step.

A batch is a set of named tensors that share their first (batch) dimension, plus non-tensor columns
(prompt text, the dataset row, `uid`) holding one Python object per row. Rows sharing a `uid` were
sampled from the same prompt.

Tensor keys used by the trainer (B = rows, P = prompt length, R = response length):

    prompts            (B, P) int64   left-padded prompt token ids
    prompt_mask        (B, P) int64   1 on real prompt tokens
    responses          (B, R) int64   right-padded response token ids
    response_mask      (B, R) float   1 on every token the rollout produced, up to and including EOS;
                                      set by the rollout, never changed after it
    truncated          (B,)   bool    the row ended without a stop token (the rollout reports it)
    model_mask         (B, R) float   1 on the tokens the model sampled, 0 on the ones it did not (an
                                      environment's or tool's answer inside a multi-turn episode); written
                                      by a rollout whose responses hold such tokens, never changed after
                                      it; `model_tokens` reads it (response_mask where it is absent)
    loss_mask          (B, R) float   1 on the tokens the losses, normalisers, estimators and update
                                      metrics count; absent until the trainer's stage 4b derives it
                                      (`derive_loss_mask`: model_tokens less truncated rows with
                                      algorithm.mask_truncated and rows in reward_dropped), narrowed after by
                                      rollout-correction rejection
    rollout_log_probs  (B, R) float   log pi_rollout(response token) as the engine reports it (a rollout
                                      with `returns_log_probs`), for rollout correction and its metrics
    sample_seed        (B,)   int64   under torchrun, each sampled row's seed, the same on any number of
                                      ranks (dist.shard_rollout): an engine that seeds each request uses it
    episode_key        (B,)   int64   in each turn's batch of a multi-turn episode, one value per episode
                                      (an engine's `turn_cache` keeps each key's KV cache between turns)
    episode_row        (B,)   int64   an agent rollout's: the input row each row belongs to; an episode split
                                      into several rows (its calls did not all extend one another) has
                                      consecutive rows with one value (rollout.rollout_rows, split_inputs)
    score              (B,)   float   the row's sequence score, the reward stage's (an episode's with its
                                      environment's rewards)
    token_level_scores (B, R) float   the reward score on the last valid response token
    reward_dropped     (B,)   bool    reward.on_error = "drop": the row's reward call failed; it has a uid of
                                      its own and no token in the loss_mask (absent otherwise)
    component_scores   (B, K) float   with [[reward.components]]: each component's own score, before its
    component_weights  (B, K) float   weight, and the weight (the same on every row)
    reward_baselines   (B,)   float   the score of one greedy response to the row's prompt (stage 4c, ReMax)
    old_log_probs      (B, R) float   log pi_old(response token) under the policy before the update
    sum_pi_squared     (B, R) float   sum over the vocabulary of pi_old^2 (an estimator that asks for it)
    ref_log_probs      (B, R) float   the same under the reference policy
    teacher_log_probs  (B, R) float   the same under the [teacher] (on-policy distillation's pass)
    teacher_topk_ids   (B, R, K) int64  with [algorithm.distill] top_k = K > 0: the teacher's K most likely
                                      tokens at each response position, most likely first (0 on padding)
    teacher_topk_log_probs            (B, R, K) float: their log-probs under the teacher's full-vocabulary
                                      softmax at rollout.temperature (0 on padding), the GKD loss's teacher side
    values             (B, R) float   critic values
    rollout_is_weights (B, R) float   rollout correction's importance weights (stage 6b), multiplied into
                                      the policy loss
    token_level_rewards(B, R) float   scores minus the in-reward KL penalty, if any
    advantages, returns(B, R) float   estimator output, zero on padding

Non-tensor columns, one Python object per row: `uid` (rows of one prompt share it), `prompt_text`, `row`
(the dataset row: ground truth and any extra field), `index` (its position in its split), `data_source`,
and after the reward stage `response_text`.

A multi-turn rollout adds its episodes' columns (`num_turns`, `turn_rewards`, ...: nanoverl_core.env.episode
lists them); `is_episodes` is the one place that tells the two kinds of batch apart. This docstring is the one
description of each field (tests/test_contracts.py holds the protocols' docstrings to it): the protocols, the
rollout helpers and the docs link here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

Index = int | slice | Sequence[int] | torch.Tensor


class RLBatch:
    """Named tensors and non-tensor columns sharing one batch dimension."""

    def __init__(self, tensors: dict[str, torch.Tensor] | None = None, non_tensors: dict[str, list] | None = None):
        self.tensors: dict[str, torch.Tensor] = {}
        self.non_tensors: dict[str, list] = {}
        self._size: int | None = None
        for key, value in (tensors or {}).items():
            self[key] = value
        for key, value in (non_tensors or {}).items():
            self[key] = list(value)

    @classmethod
    def from_dict(cls, tensors: dict[str, torch.Tensor], non_tensors: dict[str, Iterable] | None = None) -> RLBatch:
        return cls(tensors, {k: list(v) for k, v in (non_tensors or {}).items()})

    # ---- size and keys -------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._size or 0

    def _check_size(self, key: str, size: int) -> None:
        if self._size is None:
            self._size = size
        elif size != self._size:
            raise ValueError(f"RLBatch column {key!r} has {size} rows but the batch has {self._size}; "
                             "every tensor and non-tensor column must share the batch dimension")

    def keys(self) -> list[str]:
        return [*self.tensors, *self.non_tensors]

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.non_tensors

    def __setitem__(self, key: str, value: torch.Tensor | list) -> None:
        if isinstance(value, torch.Tensor):
            if value.dim() == 0:
                raise ValueError(f"RLBatch tensor {key!r} must have a batch dimension, got a scalar")
            self._check_size(key, value.shape[0])
            self.non_tensors.pop(key, None)
            self.tensors[key] = value
        else:
            value = list(value)
            self._check_size(key, len(value))
            self.tensors.pop(key, None)
            self.non_tensors[key] = value

    def __getitem__(self, item: str | Index) -> Any:
        if isinstance(item, str):
            if item in self.tensors:
                return self.tensors[item]
            if item in self.non_tensors:
                return self.non_tensors[item]
            raise KeyError(f"RLBatch has no column {item!r}; it has {sorted(self.keys())}")
        return self.index(item)

    def pop(self, key: str) -> Any:
        value = self.tensors.pop(key, None)
        return value if value is not None else self.non_tensors.pop(key)

    # ---- row operations ------------------------------------------------------------------------
    def index(self, item: Index) -> RLBatch:
        """Rows selected by an int, a slice, a list of ints or an index / bool tensor."""
        if isinstance(item, int):
            item = [item]
        if isinstance(item, slice):
            rows = list(range(len(self)))[item]
        elif isinstance(item, torch.Tensor):
            rows = (item.nonzero().flatten() if item.dtype == torch.bool else item).tolist()
        else:
            rows = list(item)
        idx = torch.as_tensor(rows, dtype=torch.long)
        out = RLBatch()
        for key, value in self.tensors.items():
            out[key] = value[idx.to(value.device)]
        for key, value in self.non_tensors.items():
            out[key] = [value[r] for r in rows]
        if not out.keys():
            out._size = len(rows)
        return out

    def split(self, size: int) -> list[RLBatch]:
        """Consecutive chunks of `size` rows (the last one may be shorter)."""
        if size <= 0:
            raise ValueError(f"split size must be positive, got {size}")
        return [self.index(slice(i, i + size)) for i in range(0, len(self), size)]

    def split_inputs(self, size: int) -> list[RLBatch]:
        """Consecutive chunks of `size` input rows: the rows one agent episode was split into (consecutive,
        with one `episode_row`: rollout.rollout_rows) count as one and stay together. Without that column,
        `split(size)`."""
        if "episode_row" not in self:
            return self.split(size)
        source = self["episode_row"].tolist()
        starts = [i for i in range(len(source)) if i == 0 or source[i] != source[i - 1]]
        bounds = starts[::size] + [len(source)]
        return [self.index(slice(a, b)) for a, b in zip(bounds, bounds[1:])]

    def repeat_interleave(self, n: int) -> RLBatch:
        """Each row repeated n times in place: rows [a, b] -> [a, a, b, b] for n=2."""
        return self.index([r for r in range(len(self)) for _ in range(n)])

    def to(self, device: torch.device | str) -> RLBatch:
        return RLBatch({k: v.to(device) for k, v in self.tensors.items()}, self.non_tensors)

    def update(self, other: RLBatch) -> RLBatch:
        """Add (or overwrite) other's columns in place; other must have the same number of rows."""
        for key in other.keys():
            self[key] = other[key]
        return self

    @staticmethod
    def concat(batches: Sequence[RLBatch]) -> RLBatch:
        """Rows of several batches with the same columns and tensor widths, in order."""
        if not batches:
            raise ValueError("concat needs at least one batch")
        keys = set(batches[0].keys())
        for b in batches[1:]:
            if set(b.keys()) != keys:
                raise ValueError(f"concat needs the same columns in every batch: {sorted(keys)} vs {sorted(b.keys())}")
        out = RLBatch()
        for key in batches[0].tensors:
            parts = [b.tensors[key] for b in batches]
            if len({p.shape[1:] for p in parts}) > 1:
                raise ValueError(f"concat: column {key!r} has different shapes {[tuple(p.shape) for p in parts]}")
            out[key] = torch.cat(parts)
        for key in batches[0].non_tensors:
            out[key] = [x for b in batches for x in b.non_tensors[key]]
        return out

    def __repr__(self) -> str:
        cols = [f"{k}:{tuple(v.shape)}" for k, v in self.tensors.items()] + list(self.non_tensors)
        return f"RLBatch(rows={len(self)}, {', '.join(cols)})"


# ---- what a batch holds ----------------------------------------------------------------------------------
def is_episodes(batch: RLBatch) -> bool:
    """True when `batch` holds multi-turn episodes (a multi-turn rollout's columns: `num_turns`, ...), False
    for single responses. Every reader that treats the two differently asks this, not which keys are present."""
    return "num_turns" in batch


def model_tokens(batch: RLBatch) -> torch.Tensor:
    """(B, R) 1 on the tokens the model sampled: `model_mask` where the rollout wrote one, else `response_mask`."""
    return batch["model_mask"] if "model_mask" in batch else batch["response_mask"]


def derive_loss_mask(batch: RLBatch, mask_truncated: bool) -> torch.Tensor:
    """(B, R) the trainer's stage 4b: the tokens the update counts, before rollout correction narrows them.
    Every token the model sampled (`model_tokens`); with `mask_truncated` (DAPO's overlong filtering) none
    of a truncated row's; none of a row the reward stage dropped (`reward_dropped`). A new tensor: the
    rollout's masks are never changed."""
    mask = model_tokens(batch)
    mask = mask * (~batch["truncated"]).to(mask.dtype)[:, None] if mask_truncated else mask.clone()
    if "reward_dropped" in batch:
        mask = mask * (~batch["reward_dropped"]).to(mask.dtype)[:, None]
    return mask
