"""KL between the policy and the reference policy: per-token estimators and the in-reward penalty.

Estimators follow J. Schulman, "Approximating KL divergence" (http://joschu.net/blog/kl-approx.html)
and verl's `kl_penalty` / `kl_penalty_forward`. With log_ratio = log_prob - ref_log_prob:

    k1 / kl          log_ratio                                unbiased, can be negative
    abs              |log_ratio|
    k2 / mse         0.5 * log_ratio**2                        its gradient is the KL gradient
    k3 / low_var_kl  exp(-r) + r - 1 with r = clamp(log_ratio, -20, 20), clamped to [-10, 10]
                     (low variance, always >= 0)

A "+" suffix (k1+, abs+, k3+, low_var_kl+, k2+) keeps the forward value of the named estimator but
back-propagates the gradient of k2 (straight-through), because the expected gradient of k1 / k3
is not the gradient of KL. k2+ is k2.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..config import KL_ESTIMATORS
from .utils import masked_mean

if TYPE_CHECKING:
    from ..config import AlgorithmConfig

_SAME_AS = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}  # verl's names for Schulman's estimators


def _kl_forward(log_ratio: torch.Tensor, base: str) -> torch.Tensor:
    if base == "k1":
        return log_ratio
    if base == "abs":
        return log_ratio.abs()
    if base == "k2":
        return 0.5 * log_ratio.square()
    r = torch.clamp(-log_ratio, min=-20.0, max=20.0)  # log(ref / pi), clamped so exp cannot overflow
    return torch.clamp(r.exp() - r - 1.0, min=-10.0, max=10.0)


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate of pi || ref.

    log_prob:     (B, R) log pi(token) under the policy being trained (or pi_old for the reward)
    ref_log_prob: (B, R) log ref(token) under the reference policy
    kind:         k1 | kl | abs | k2 | mse | k3 | low_var_kl, optionally with a "+" suffix
    Returns (B, R), elementwise (no mask applied; callers mask or aggregate).
    """
    straight_through = kind.endswith("+")
    name = kind.removesuffix("+")
    if name not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {kind!r}; choose one of {sorted(KL_ESTIMATORS)} "
                         "(a '+' suffix takes the k2 gradient)")
    base = _SAME_AS.get(name, name)
    log_ratio = log_prob - ref_log_prob
    value = _kl_forward(log_ratio, base)
    if not straight_through or base == "k2":
        return value
    k2 = 0.5 * log_ratio.square()
    return k2 - k2.detach() + value.detach()  # value of `kind`, gradient of k2


class FixedKLController:
    """A constant KL coefficient; update() does nothing."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Adaptive coefficient of Ziegler et al. 2019 (https://arxiv.org/abs/1909.08593), as in verl.

    After each batch: error = clip(current_kl / target_kl - 1, -0.2, 0.2) and
    value *= 1 + error * n_steps / horizon. `n_steps` is the number of samples (rows) in the batch.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        if horizon <= 0:
            raise ValueError(f"adaptive KL controller horizon must be positive, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


def make_kl_controller(config: AlgorithmConfig) -> FixedKLController | AdaptiveKLController:
    """The controller named by `config.kl_ctrl` (an AlgorithmConfig): "fixed" or "adaptive"."""
    if config.kl_ctrl == "fixed":
        return FixedKLController(config.kl_coef)
    if config.kl_ctrl == "adaptive":
        return AdaptiveKLController(config.kl_coef, config.target_kl, config.kl_horizon)
    raise ValueError(f"unknown algorithm.kl_ctrl {config.kl_ctrl!r}; choose 'fixed' or 'adaptive'")


@torch.no_grad()
def apply_kl_penalty(token_level_scores: torch.Tensor, old_log_probs: torch.Tensor, ref_log_probs: torch.Tensor,
                     response_mask: torch.Tensor, kl_ctrl, kind: str) -> tuple[torch.Tensor, dict[str, float]]:
    """Subtract beta * KL(pi_old || ref) from the token-level scores (verl's `apply_kl_penalty`).

    token_level_scores: (B, R) reward score (on the last valid token)
    old_log_probs:      (B, R) log pi_old of the sampled tokens
    ref_log_probs:      (B, R) log ref of the sampled tokens
    response_mask:      (B, R) 1 on valid response tokens
    kl_ctrl:            a Fixed/AdaptiveKLController; beta = kl_ctrl.value before the update
    Returns token_level_rewards (B, R) = scores - beta * kl * mask (padding keeps the score's value,
    0 when scores sit on valid tokens) and metrics. The batch KL is the mean over rows of each row's
    masked token mean (a row with no valid token counts as 0); the controller is then updated with
    it and n_steps = B.
    """
    kld = kl_penalty(old_log_probs, ref_log_probs, kind)  # (B, R)
    kld = torch.where(response_mask.bool(), kld, torch.zeros_like(kld))  # 0 on padding, even if NaN there
    beta = kl_ctrl.value
    token_level_rewards = token_level_scores - beta * kld
    current_kl = masked_mean(kld, response_mask, dim=-1).mean().item()  # mean over rows of sequence KL
    kl_ctrl.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    metrics = {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": float(beta)}
    return token_level_rewards, metrics
