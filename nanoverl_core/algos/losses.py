"""Actor and critic losses: token losses, and how they become one number (agg_loss).

Shapes: B = rows of this (micro-)batch, R = response length. `response_mask` (B, R) is 1 on valid
response tokens; padded positions never contribute to a loss, a gradient or a metric.

Gradient accumulation. An optimizer step sees a mini-batch; it may be split into micro-batches
that each run forward/backward. Pass every micro-batch the totals of the whole mini-batch
(`loss_totals(mini_batch_mask)`: num_tokens, num_seqs) and call backward on each micro-batch loss
with no further scaling: the summed gradients then equal the gradient of the whole mini-batch's
loss computed in one piece. Under data parallelism with gradients *averaged* over D ranks, pass the
global totals divided by D (verl's `agg_loss` multiplies by dp_size instead).
"""

from __future__ import annotations

import torch

from .kl import kl_penalty
from .utils import masked_mean, masked_sum

LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def loss_totals(response_mask: torch.Tensor) -> dict[str, float]:
    """The normalisers agg_loss uses by default, for a whole mini-batch's (B, R) mask:
    num_tokens = valid tokens, num_seqs = rows with at least one valid token."""
    return {"num_tokens": float(response_mask.sum()), "num_seqs": float((response_mask.sum(-1) > 0).sum())}


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str, *,
             num_tokens: float | None = None, num_seqs: float | None = None,
             loss_scale_factor: float | None = None) -> torch.Tensor:
    """Aggregate a (B, R) token loss matrix into a scalar.

    loss_mat:  (B, R) per-token loss
    loss_mask: (B, R) 1 on tokens that count
    loss_agg_mode, with n = num_tokens (default: valid tokens here) and S = num_seqs (default: rows
    with at least one valid token here):
        token-mean               sum of valid token losses / n        (every token weighs the same)
        token-sum                sum of valid token losses            (no normaliser)
        seq-mean-token-sum       sum over rows of (row's token sum) / S
        seq-mean-token-mean      sum over rows of (row's token mean) / S   (every sequence weighs the same)
        seq-mean-token-sum-norm  sum of valid token losses / loss_scale_factor (Dr. GRPO). Despite the
                                 name it is not divided by S, exactly like verl; a constant
                                 loss_scale_factor (default, also for 0: R = loss_mask.shape[-1])
                                 keeps the scale fixed across steps.
    A denominator of 0 (nothing valid) is replaced by 1, so an all-padding batch gives 0, not NaN.
    With the defaults this equals verl's `agg_loss` (dp_size=1) on every input with a valid token.
    """
    if loss_agg_mode == "token-mean":
        n = loss_mask.sum() if num_tokens is None else num_tokens
        return masked_sum(loss_mat, loss_mask) / _at_least_one(n)
    if loss_agg_mode == "token-sum":
        return masked_sum(loss_mat, loss_mask)
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        seq_losses = masked_sum(loss_mat, loss_mask, dim=-1)  # (B,)
        tokens_per_seq = loss_mask.sum(dim=-1)  # (B,)
        if loss_agg_mode == "seq-mean-token-mean":
            seq_losses = seq_losses / (tokens_per_seq + 1e-8)
        s = (tokens_per_seq > 0).sum() if num_seqs is None else num_seqs  # empty rows do not count
        return seq_losses.sum() / _at_least_one(s)
    if loss_agg_mode == "seq-mean-token-sum-norm":
        scale = loss_scale_factor or loss_mask.shape[-1]
        return masked_sum(loss_mat, loss_mask) / scale
    raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; choose one of {', '.join(LOSS_AGG_MODES)}")


def _at_least_one(n: torch.Tensor | float) -> torch.Tensor | float:
    return n.clamp(min=1) if isinstance(n, torch.Tensor) else max(n, 1)


def compute_policy_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                        response_mask: torch.Tensor, *, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
                        clip_ratio_c: float = 3.0, loss_agg_mode: str = "token-mean", policy_loss: str = "vanilla",
                        log_ratio_clamp: float = 20.0, num_tokens: float | None = None,
                        num_seqs: float | None = None, loss_scale_factor: float | None = None,
                        ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped PPO surrogate loss (to minimise) and its metrics.

    old_log_prob:  (B, R) log pi_old(token), from the rollout policy before this update (no grad)
    log_prob:      (B, R) log pi_theta(token), from the policy being trained (grad flows here)
    advantages:    (B, R) advantage per token
    response_mask: (B, R) 1 on valid tokens

    policy_loss="vanilla" (verl `compute_policy_loss_vanilla`): token ratio
        r = exp(clamp(log_prob - old_log_prob, -log_ratio_clamp, +log_ratio_clamp)),
        loss_t = max(-A r, -A clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high))     (clip-higher)
        and for A < 0 the dual clip caps it: loss_t = min(loss_t, -A * clip_ratio_c).
    policy_loss="gspo" (verl `compute_policy_loss_gspo`, https://arxiv.org/abs/2507.18071): one ratio
        per sequence s = exp(mean over valid tokens of log_prob - old_log_prob) (geometric mean of
        token ratios), written per token as log s_t = sg[log s] + log_prob - sg[log_prob] so each
        token's gradient is s * grad log_prob; clamped like vanilla, same clip, no dual clip.
        Combine with loss_agg_mode="seq-mean-token-mean" to reproduce the paper (and verl, which
        forces that mode for gspo).
    The token losses are aggregated by agg_loss(loss_agg_mode, num_tokens, num_seqs, loss_scale_factor).

    Metrics (detached scalar tensors, over this batch's valid tokens):
        actor/pg_loss            the returned loss
        actor/pg_clipfrac        fraction of tokens where the clipped term is the larger one
        actor/pg_clipfrac_lower  fraction of tokens where the dual clip is active (A < 0); 0 for gspo
        actor/ppo_kl             mean of old_log_prob - log_prob (clamped log-ratio), approx KL(old || new)
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c = {clip_ratio_c} must be greater than 1 (dual-clip bound)")
    log_ratio = torch.clamp(log_prob - old_log_prob, -log_ratio_clamp, log_ratio_clamp)  # (B, R)
    ppo_kl = masked_mean(-log_ratio, response_mask)

    if policy_loss == "vanilla":
        ratio = torch.exp(log_ratio)
    elif policy_loss == "gspo":
        tokens = response_mask.sum(dim=-1).clamp(min=1)  # (B,)
        seq_log_ratio = masked_sum(log_prob - old_log_prob, response_mask, dim=-1) / tokens  # (B,)
        token_log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)  # (B, R)
        ratio = torch.exp(torch.clamp(token_log_ratio, -log_ratio_clamp, log_ratio_clamp))
    else:
        raise ValueError(f"unknown policy_loss {policy_loss!r}; choose 'vanilla' or 'gspo'")

    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    pg_losses = torch.maximum(unclipped, clipped)  # (B, R) pessimistic bound
    clipfrac = masked_mean(torch.gt(clipped, unclipped).float(), response_mask)

    if policy_loss == "vanilla":
        dual_bound = -advantages * clip_ratio_c
        negative = advantages < 0
        clipfrac_lower = masked_mean((torch.gt(pg_losses, dual_bound) & negative).float(), response_mask)
        pg_losses = torch.where(negative, torch.minimum(pg_losses, dual_bound), pg_losses)
    else:
        clipfrac_lower = torch.zeros((), device=pg_losses.device)

    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs,
                    loss_scale_factor=loss_scale_factor)
    metrics = {"actor/pg_loss": loss.detach(), "actor/pg_clipfrac": clipfrac.detach(),
               "actor/pg_clipfrac_lower": clipfrac_lower.detach(), "actor/ppo_kl": ppo_kl.detach()}
    return loss, metrics


def compute_value_loss(vpreds: torch.Tensor, returns: torch.Tensor, values: torch.Tensor,
                       response_mask: torch.Tensor, *, cliprange_value: float, loss_agg_mode: str = "token-mean",
                       num_tokens: float | None = None, num_seqs: float | None = None,
                       loss_scale_factor: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss (verl `compute_value_loss`).

    vpreds:  (B, R) values predicted by the critic being trained
    returns: (B, R) regression targets (estimator returns)
    values:  (B, R) critic values at rollout time; predictions are clipped to values +- cliprange_value
    loss = 0.5 * agg_loss(max((vpreds - returns)^2, (clip(vpreds) - returns)^2)).
    Metrics: critic/vf_loss (the loss), critic/vf_clipfrac (fraction of valid tokens where the
    clipped error is the larger one).
    """
    vpred_clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    unclipped = (vpreds - returns) ** 2
    clipped = (vpred_clipped - returns) ** 2
    loss = 0.5 * agg_loss(torch.maximum(unclipped, clipped), response_mask, loss_agg_mode,
                          num_tokens=num_tokens, num_seqs=num_seqs, loss_scale_factor=loss_scale_factor)
    clipfrac = masked_mean(torch.gt(clipped, unclipped).float(), response_mask)
    return loss, {"critic/vf_loss": loss.detach(), "critic/vf_clipfrac": clipfrac.detach()}


def compute_entropy_loss(entropy: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str, *,
                         num_tokens: float | None = None, num_seqs: float | None = None,
                         loss_scale_factor: float | None = None) -> torch.Tensor:
    """Aggregated token entropy (B, R) -> scalar. The actor loss subtracts entropy_coeff times this."""
    return agg_loss(entropy, response_mask, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs,
                    loss_scale_factor=loss_scale_factor)


def compute_kl_loss(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, response_mask: torch.Tensor, kind: str,
                    loss_agg_mode: str, *, num_tokens: float | None = None, num_seqs: float | None = None,
                    loss_scale_factor: float | None = None) -> torch.Tensor:
    """Aggregated KL(pi_theta || ref) estimate, kl_penalty(log_prob, ref_log_prob, kind): (B, R) -> scalar.
    The actor loss adds kl_loss_coef times this."""
    return agg_loss(kl_penalty(log_prob, ref_log_prob, kind), response_mask, loss_agg_mode,
                    num_tokens=num_tokens, num_seqs=num_seqs, loss_scale_factor=loss_scale_factor)
