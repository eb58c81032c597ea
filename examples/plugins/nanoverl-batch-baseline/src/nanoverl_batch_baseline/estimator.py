"""REINFORCE with a leave-one-out batch-mean baseline, optionally pulled toward the prompt's group.

The twist: the plain batch-mean baseline ignores that some prompts are easier than others, and the
group-mean baseline of GRPO/RLOO is noisy when `rollout.n` is small. `group_weight` (w, default 0,
set in the config's [algorithm.batch_mean_baseline] table, see settings.py) mixes the two: w = 0 is the batch baseline, w = 1 is RLOO's leave-one-out group mean,
anything between shrinks the noisy group mean toward the batch mean. Both means leave the row itself
out, so the baseline never contains the sample it judges and the gradient estimate stays unbiased.

Shapes: B = rows, R = response length.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from nanoverl_core.algos import Groups
from nanoverl_core.config import settings_or_defaults

from .settings import BatchBaselineSettings


@torch.no_grad()
def compute_batch_baseline_advantages(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                      uids: Sequence[Hashable], group_weight: float = 0.0,
                                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Leave-one-out baselines over the batch and over each prompt's group.

    token_level_rewards: (B, R) reward of each token (the score on the last valid token, minus any
                         in-reward KL penalty)
    response_mask:       (B, R) 1 on valid response tokens
    uids:                B group ids; rows sharing a uid were sampled from one prompt
    group_weight:        w in [0, 1]

    s_i = sum of row i's rewards over its valid tokens                          (B,)
    b_i = mean of s_j over every other row j != i of the batch (0 if there is none)
    g_i = mean of s_j over the other rows of i's group (b_i for a group of one)
    A_i = s_i - ((1 - w) b_i + w g_i), placed on every valid token of row i
    Rows without a valid token have no score and are left out of both means.
    Returns (advantages, returns), both (B, R), returns == advantages, 0 on padding.
    """
    if len(uids) != token_level_rewards.shape[0]:
        raise ValueError(f"got {token_level_rewards.shape[0]} rows but {len(uids)} uids")
    mask = response_mask.to(token_level_rewards.dtype)
    counts = (mask.sum(-1) > 0).to(mask.dtype)  # (B,) 1 for a row with a score
    scores = (token_level_rewards * mask).sum(-1)  # (B,)

    others = counts.sum() - counts  # (B,) scored rows other than i
    batch_base = (scores.sum() - scores) / others.clamp(min=1)  # (B,)

    groups = Groups(uids, scores.device)  # rows sharing a uid
    gid = groups.index  # (B,) each row's group
    group_others = groups.sum(counts)[gid] - counts  # (B,) scored rows of i's group other than i
    group_base = torch.where(group_others > 0, (groups.sum(scores)[gid] - scores) / group_others.clamp(min=1),
                             batch_base)

    baseline = (1 - group_weight) * batch_base + group_weight * group_base  # (B,)
    advantages = (scores - baseline).unsqueeze(-1) * mask  # (B, R)
    return advantages, advantages.clone()


def batch_mean_baseline(batch, config) -> tuple[torch.Tensor, torch.Tensor]:
    """The plugin contract: fn(batch: RLBatch, config: AlgorithmConfig) -> (advantages, returns).
    config.settings is this estimator's BatchBaselineSettings (nanoverl validated it when loading)."""
    settings = settings_or_defaults(config.settings, BatchBaselineSettings)
    return compute_batch_baseline_advantages(batch["token_level_rewards"], batch["loss_mask"], batch["uid"],
                                             group_weight=settings.group_weight)
