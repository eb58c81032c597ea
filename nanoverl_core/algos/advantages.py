"""Core advantage estimators: GAE (needs a critic) and REINFORCE++ (does not).

Shapes: B = rows, R = response length. `response_mask` (B, R) is 1 on the tokens that count (the
adapters pass the batch's `loss_mask`; the tensor functions keep verl's parameter names). A 0
between valid tokens (e.g. a tool observation inside a multi-turn response) is skipped: the
recursion carries over it as if it were not there. Outputs are 0 on every masked position.

Each estimator is a pure tensor function plus an adapter with the plugin contract
`fn(batch: RLBatch, config: AlgorithmConfig) -> (advantages, returns)`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .utils import masked_whiten

if TYPE_CHECKING:
    from ..batch import RLBatch
    from ..config import AlgorithmConfig


def whitened(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """masked_whiten(x, mask) * mask; all zeros when fewer than two tokens count (a step whose every episode
    failed before its first token: nothing to learn from, where verl's whitening raises)."""
    return masked_whiten(x, mask) * mask if mask.sum() >= 2 else torch.zeros_like(x)


@torch.no_grad()
def compute_gae_advantage_return(token_level_rewards: torch.Tensor, values: torch.Tensor,
                                 response_mask: torch.Tensor, gamma: float, lam: float,
                                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2015, https://arxiv.org/abs/1506.02438).

    token_level_rewards: (B, R) reward of each token (typically the score on the last valid token,
                         minus a KL penalty on every token)
    values:              (B, R) critic value V(s_t) of the state before each response token
    response_mask:       (B, R) 1 on valid tokens
    gamma, lam:          discount and GAE lambda

    Going backwards over valid tokens t (t' = the next valid token, V(t') = 0 after the last one):
        delta_t = r_t + gamma * V(t') - V(t)
        A_t     = delta_t + gamma * lam * A_t'
    Masked positions are skipped (their reward and value are ignored; verl
    `compute_gae_advantage_return` does the same). Returns (advantages, returns), both (B, R), with
    returns = advantages + values on valid tokens (the critic's target) and both 0 on padding.
    Advantages are not whitened here (the `gae` adapter does it when asked).
    """
    mask = response_mask.to(values.dtype)
    next_value = torch.zeros_like(values[:, 0])  # (B,) V(t') of the next valid token
    next_adv = torch.zeros_like(values[:, 0])  # (B,) A_t' of the next valid token
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        valid = mask[:, t].bool()
        next_value = torch.where(valid, values[:, t], next_value)  # carry over masked positions
        next_adv = torch.where(valid, adv, next_adv)
        advantages[:, t] = torch.where(valid, adv, torch.zeros_like(adv))
    returns = (advantages + values) * mask
    return advantages, returns


@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                                  gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (https://arxiv.org/abs/2501.03262): discounted return-to-go, whitened over the batch.

    token_level_rewards: (B, R); response_mask: (B, R); gamma: discount.
    returns     G_t = r_t + gamma * G_t' going backwards over valid tokens (t' = the next valid
                token, G = 0 after the last one)
    advantages  = masked_whiten(returns) over all valid tokens of the batch (mean 0, unbiased var 1).
    Both (B, R), 0 on padding. Masked positions are skipped like in GAE; verl
    (`compute_reinforce_plus_plus_outcome_advantage`) restarts the sum at a masked position instead,
    which only differs for a 0 *between* valid tokens.
    """
    mask = response_mask.to(token_level_rewards.dtype)
    running = torch.zeros_like(token_level_rewards[:, 0])  # (B,) G of the next valid token
    returns = torch.zeros_like(token_level_rewards)
    for t in reversed(range(token_level_rewards.shape[1])):
        valid = mask[:, t].bool()
        running = torch.where(valid, token_level_rewards[:, t] + gamma * running, running)
        returns[:, t] = torch.where(valid, running, torch.zeros_like(running))
    advantages = whitened(returns, mask)
    return advantages, returns


# ---- adapters: fn(batch, config) -> (advantages, returns) -------------------------------------------
def gae(batch: RLBatch, config: AlgorithmConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE with config.gamma / config.lam; whitens advantages over valid tokens when
    config.whiten_advantages (returns are never whitened: they are the critic's targets)."""
    mask = batch["loss_mask"]
    advantages, returns = compute_gae_advantage_return(batch["token_level_rewards"], batch["values"], mask,
                                                       gamma=config.gamma, lam=config.lam)
    if config.whiten_advantages:
        advantages = whitened(advantages, mask)
    return advantages, returns


gae.requires_critic = True


def reinforce_plus_plus(batch: RLBatch, config: AlgorithmConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with config.gamma; advantages are always whitened (part of the method)."""
    return compute_reinforce_plus_plus_outcome_advantage(batch["token_level_rewards"], batch["loss_mask"],
                                                         gamma=config.gamma)
