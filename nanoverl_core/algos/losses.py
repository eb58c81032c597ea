"""Actor and critic losses: token losses, how they become one number (agg_loss), and the total actor loss.

Shapes: B = rows of this (micro-)batch, R = response length. The mask (B, R) is 1 on the tokens that
count (the batch's `loss_mask`; the tensor functions keep verl's name `response_mask`); masked positions
never contribute to a loss, a gradient or a metric.

Gradient accumulation. An optimizer step sees a mini-batch; it may be split into micro-batches
that each run forward/backward. Pass every micro-batch the totals of the whole mini-batch
(`loss_totals(mini_batch_mask)`: num_tokens, num_seqs) and call backward on each micro-batch loss
with no further scaling: the summed gradients then equal the gradient of the whole mini-batch's
loss computed in one piece. Under data parallelism over D ranks the totals are global (summed over
ranks), and since FSDP *averages* gradients over ranks, the worker multiplies each micro-batch loss
by D before backward (`_TorchWorker.optimizer_step`), as verl's `agg_loss` multiplies by dp_size.

Metrics follow the same rule: every metric a loss returns is this micro-batch's *share* of the
mini-batch value (a token mean is `masked_sum(x) / num_tokens` with the mini-batch's num_tokens), so
the worker sums them over micro-batches (and ranks) and logs exactly what one piece would give.

Policy losses are registered components (`register_policy_losses`, selected by `actor.policy_loss`):
`fn(inputs: PolicyLossInputs, config: ActorConfig) -> (loss, metrics)`. The built-ins `vanilla` and
`gspo` below are registered that way; `compute_actor_loss` adds the entropy bonus and the KL term.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import torch

from ..config import LOSS_AGG_MODES
from ..errors import removed
from .kl import kl_penalty
from .utils import masked_sum

Metrics = dict[str, torch.Tensor]
PolicyLossFn = Callable[..., tuple[torch.Tensor, Metrics]]
"""A registered policy loss (the contract: nanoverl_core.protocols.PolicyLoss)."""


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
        seq-mean-token-sum-norm  sum over rows of (row's token sum / loss_scale_factor) / S: Dr. GRPO's
                                 1/G sum_i sum_t / L_max. A constant loss_scale_factor (default, also
                                 for 0: R = loss_mask.shape[-1]) keeps the scale fixed across steps.
    A denominator of 0 (nothing valid) is replaced by 1, so an all-padding batch gives 0, not NaN.
    With the defaults this equals verl 0.9.0's `agg_loss` (dp_size=1) on every input with a valid
    token (verl's token-mean of an all-padding batch is NaN).
    """
    if loss_agg_mode == "token-mean":
        n = loss_mask.sum() if num_tokens is None else num_tokens
        return masked_sum(loss_mat, loss_mask) / _at_least_one(n)
    if loss_agg_mode == "token-sum":
        return masked_sum(loss_mat, loss_mask)
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; choose one of {', '.join(LOSS_AGG_MODES)}")
    seq_losses = masked_sum(loss_mat, loss_mask, dim=-1)  # (B,) token sums
    tokens_per_seq = loss_mask.sum(dim=-1)  # (B,)
    if loss_agg_mode == "seq-mean-token-mean":
        seq_losses = seq_losses / (tokens_per_seq + 1e-8)
    elif loss_agg_mode == "seq-mean-token-sum-norm":
        seq_losses = seq_losses / (loss_scale_factor or loss_mask.shape[-1])
    s = (tokens_per_seq > 0).sum() if num_seqs is None else num_seqs  # empty rows do not count
    return seq_losses.sum() / _at_least_one(s)


def _at_least_one(n: torch.Tensor | float) -> torch.Tensor | float:
    return n.clamp(min=1) if isinstance(n, torch.Tensor) else max(n, 1)


def token_mean_share(x: torch.Tensor, mask: torch.Tensor, num_tokens: float | None = None) -> torch.Tensor:
    """This micro-batch's share of the mini-batch's token mean of x: masked_sum(x) / num_tokens
    (default: this batch's own valid tokens, i.e. the plain masked mean). Detached."""
    n = mask.sum() if num_tokens is None else num_tokens
    return (masked_sum(x, mask) / _at_least_one(n)).detach()


# ---- the policy loss contract -------------------------------------------------------------------
_RENAMED = ("PolicyLossInputs.response_mask", "use loss_mask (the same tensor: the tokens that count)")
"""0.1.0's name of loss_mask, deprecated in 0.2.0: reading it or passing it is one line naming loss_mask."""


@attrs.frozen(init=False)
class PolicyLossInputs:
    """What a registered policy loss receives for one micro-batch.

    log_prob, old_log_prob, advantages, loss_mask are (B, R); only log_prob carries a gradient.
    The normalisers are the mini-batch's (see the module docstring): aggregate with
    `inputs.aggregate(loss_mat)` and report token means with `inputs.token_mean(x)`.
    """

    log_prob: torch.Tensor
    """log pi_theta(token) of the policy being trained (grad flows here)."""
    old_log_prob: torch.Tensor
    """log pi_old(token) under the policy that sampled the batch (no grad)."""
    advantages: torch.Tensor
    """Advantage per token, 0 on padding."""
    loss_mask: torch.Tensor
    """1 on the tokens that count (the batch's loss_mask: padding, truncated rows with
    algorithm.mask_truncated and tokens rejected by rollout correction are 0)."""
    loss_agg_mode: str = "token-mean"
    """actor.loss_agg_mode."""
    num_tokens: float | None = None
    """Valid tokens of the whole mini-batch (all ranks); None: this micro-batch's."""
    num_seqs: float | None = None
    """Non-empty rows of the whole mini-batch; None: this micro-batch's."""
    loss_scale_factor: float | None = None
    """seq-mean-token-sum-norm divisor."""
    on_policy: bool = False
    """True when this is the step's only update and nothing changed the policy since sampling:
    old_log_prob is log_prob.detach(), every ratio is exactly 1, and clipping cannot happen."""
    rollout_is_weights: torch.Tensor | None = None
    """(B, R) detached rollout-correction importance weights (algorithm.rollout_correction), or None:
    multiply them into the per-token policy losses before aggregating, as the built-ins do."""

    def __init__(self, *args: Any, **kwargs: Any):
        if "response_mask" in kwargs:                       # 0.1.0's keyword
            raise removed(*_RENAMED)
        self.__attrs_init__(*args, **kwargs)

    @property
    def response_mask(self) -> torch.Tensor:
        """Removed: 0.1.0's name of `loss_mask`; reading it raises a PluginError naming `loss_mask`."""
        raise removed(*_RENAMED)

    def aggregate(self, loss_mat: torch.Tensor) -> torch.Tensor:
        """agg_loss of a (B, R) token loss matrix with the mini-batch normalisers."""
        return agg_loss(loss_mat, self.loss_mask, self.loss_agg_mode, num_tokens=self.num_tokens,
                        num_seqs=self.num_seqs, loss_scale_factor=self.loss_scale_factor)

    def token_mean(self, x: torch.Tensor) -> torch.Tensor:
        """This micro-batch's share of the mini-batch's token mean of x (detached)."""
        return token_mean_share(x, self.loss_mask, self.num_tokens)

    @property
    def norms(self) -> dict[str, Any]:
        return {"loss_agg_mode": self.loss_agg_mode, "num_tokens": self.num_tokens, "num_seqs": self.num_seqs,
                "loss_scale_factor": self.loss_scale_factor}


# ---- built-in policy losses ------------------------------------------------------------------------
def compute_policy_loss_vanilla(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                                response_mask: torch.Tensor, *, clip_ratio_low: float = 0.2,
                                clip_ratio_high: float = 0.2, clip_ratio_c: float = 3.0,
                                log_ratio_clamp: float = 20.0, loss_agg_mode: str = "token-mean",
                                num_tokens: float | None = None, num_seqs: float | None = None,
                                loss_scale_factor: float | None = None,
                                rollout_is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, Metrics]:
    """Clipped PPO surrogate loss (to minimise) and its metrics (verl `compute_policy_loss_vanilla`).

    old_log_prob:  (B, R) log pi_old(token), from the rollout policy before this update (no grad)
    log_prob:      (B, R) log pi_theta(token), from the policy being trained (grad flows here)
    advantages:    (B, R) advantage per token
    response_mask: (B, R) 1 on valid tokens

    Token ratio r = exp(clamp(log_prob - old_log_prob, -log_ratio_clamp, +log_ratio_clamp)),
    loss_t = max(-A r, -A clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high))     (clip-higher)
    and for A < 0 the dual clip caps it: loss_t = min(loss_t, -A * clip_ratio_c); then, with
    rollout_is_weights (B, R), loss_t *= w_t (rollout correction, where verl applies it).
    The token losses are aggregated by agg_loss(loss_agg_mode, num_tokens, num_seqs, loss_scale_factor).

    Metrics (detached shares of the mini-batch's token means, see the module docstring):
        actor/pg_clipfrac        fraction of tokens where the clipped term is the larger one
        actor/pg_clipfrac_lower  fraction of tokens where the dual clip is active (A < 0)
        actor/ppo_kl             mean of old_log_prob - log_prob (clamped log-ratio), approx KL(old || new)
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c = {clip_ratio_c} must be greater than 1 (dual-clip bound)")
    log_ratio = torch.clamp(log_prob - old_log_prob, -log_ratio_clamp, log_ratio_clamp)  # (B, R)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    pg_losses = torch.maximum(unclipped, clipped)  # (B, R) pessimistic bound
    dual_bound = -advantages * clip_ratio_c
    negative = advantages < 0
    dual_active = torch.gt(pg_losses, dual_bound) & negative
    pg_losses = torch.where(negative, torch.minimum(pg_losses, dual_bound), pg_losses)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs,
                    loss_scale_factor=loss_scale_factor)
    return loss, {"actor/pg_clipfrac": token_mean_share(torch.gt(clipped, unclipped).float(), response_mask, num_tokens),
                  "actor/pg_clipfrac_lower": token_mean_share(dual_active.float(), response_mask, num_tokens),
                  "actor/ppo_kl": token_mean_share(-log_ratio, response_mask, num_tokens)}


def compute_policy_loss_gspo(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                             response_mask: torch.Tensor, *, clip_ratio_low: float = 0.2,
                             clip_ratio_high: float = 0.2, log_ratio_clamp: float = 20.0,
                             loss_agg_mode: str = "token-mean", num_tokens: float | None = None,
                             num_seqs: float | None = None, loss_scale_factor: float | None = None,
                             rollout_is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, Metrics]:
    """GSPO (verl `compute_policy_loss_gspo`, https://arxiv.org/abs/2507.18071): one ratio per sequence.

    Tensors as in compute_policy_loss_vanilla. s = exp(mean over valid tokens of log_prob -
    old_log_prob) (geometric mean of token ratios), written per token as
    log s_t = sg[log s] + log_prob - sg[log_prob] so each token's gradient is s * grad log_prob;
    clamped to +-log_ratio_clamp before exp, PPO-clipped like vanilla, no dual clip, then multiplied
    by rollout_is_weights if given. Combine with loss_agg_mode="seq-mean-token-mean" to reproduce the paper.
    Metrics: actor/pg_clipfrac (tokens whose clipped term is larger) and actor/ppo_kl (mean of the
    raw token log-ratio old - new, as verl).
    """
    token_log_ratio = log_prob - old_log_prob  # (B, R)
    tokens = response_mask.sum(dim=-1).clamp(min=1)  # (B,)
    seq_log_ratio = masked_sum(token_log_ratio, response_mask, dim=-1) / tokens  # (B,)
    log_s = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)  # (B, R)
    ratio = torch.exp(torch.clamp(log_s, -log_ratio_clamp, log_ratio_clamp))
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    pg_losses = torch.maximum(unclipped, clipped)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs,
                    loss_scale_factor=loss_scale_factor)
    return loss, {"actor/pg_clipfrac": token_mean_share(torch.gt(clipped, unclipped).float(), response_mask, num_tokens),
                  "actor/ppo_kl": token_mean_share(-token_log_ratio, response_mask, num_tokens)}


def vanilla(inputs: PolicyLossInputs, config) -> tuple[torch.Tensor, Metrics]:
    """Registered as policy loss "vanilla": token-level PPO clip with clip-higher and dual clip."""
    loss, metrics = compute_policy_loss_vanilla(
        inputs.old_log_prob, inputs.log_prob, inputs.advantages, inputs.loss_mask,
        clip_ratio_low=config.clip_ratio_low, clip_ratio_high=config.clip_ratio_high,
        clip_ratio_c=config.clip_ratio_c, log_ratio_clamp=config.log_ratio_clamp,
        rollout_is_weights=inputs.rollout_is_weights, **inputs.norms)
    return loss, ({} if inputs.on_policy else metrics)  # ratio 1 everywhere: the metrics are 0 by construction


def gspo(inputs: PolicyLossInputs, config) -> tuple[torch.Tensor, Metrics]:
    """Registered as policy loss "gspo": sequence-level (geometric mean) ratio."""
    loss, metrics = compute_policy_loss_gspo(
        inputs.old_log_prob, inputs.log_prob, inputs.advantages, inputs.loss_mask,
        clip_ratio_low=config.clip_ratio_low, clip_ratio_high=config.clip_ratio_high,
        log_ratio_clamp=config.log_ratio_clamp, rollout_is_weights=inputs.rollout_is_weights, **inputs.norms)
    return loss, ({} if inputs.on_policy else metrics)


# ---- the total actor loss ------------------------------------------------------------------------
def compute_actor_loss(policy_loss: PolicyLossFn, inputs: PolicyLossInputs, config, *,
                       entropy: torch.Tensor | None = None,
                       ref_log_prob: torch.Tensor | None = None) -> tuple[torch.Tensor, Metrics]:
    """One micro-batch's actor loss = policy loss - entropy_coeff * entropy + kl_loss_coef * KL(pi || ref).

    policy_loss:  the registered loss (`actor.policy_loss`), called as policy_loss(inputs, config)
    inputs:       PolicyLossInputs of this micro-batch
    config:       the [actor] section (entropy_coeff, kl_loss_coef, kl_loss_type; the loss's own settings)
    entropy:      (B, R) token entropy of pi_theta (with grad) when entropy_coeff != 0, else None
    ref_log_prob: (B, R) log pi_ref(token) when actor.use_kl_loss, else None
    Each term is aggregated with the same mode and mini-batch normalisers. Metrics (shares, summed
    over micro-batches by the worker): the policy loss's own, actor/pg_loss, actor/entropy (token
    mean), actor/kl_loss, and actor/loss (the total).
    """
    loss, metrics = policy_loss(inputs, config)
    metrics = {**metrics, "actor/pg_loss": loss.detach()}
    mask, norms = inputs.loss_mask, inputs.norms
    if entropy is not None:
        loss = loss - config.entropy_coeff * compute_entropy_loss(entropy, mask, **norms)
        metrics["actor/entropy"] = inputs.token_mean(entropy)
    if ref_log_prob is not None:
        kl = compute_kl_loss(inputs.log_prob, ref_log_prob, mask, config.kl_loss_type, **norms)
        loss = loss + config.kl_loss_coef * kl
        metrics["actor/kl_loss"] = kl.detach()
    metrics["actor/loss"] = loss.detach()
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
    clipped error is the larger one, as a share of the mini-batch's tokens).
    """
    vpred_clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    unclipped = (vpreds - returns) ** 2
    clipped = (vpred_clipped - returns) ** 2
    loss = 0.5 * agg_loss(torch.maximum(unclipped, clipped), response_mask, loss_agg_mode,
                          num_tokens=num_tokens, num_seqs=num_seqs, loss_scale_factor=loss_scale_factor)
    clipfrac = token_mean_share(torch.gt(clipped, unclipped).float(), response_mask, num_tokens)
    return loss, {"critic/vf_loss": loss.detach(), "critic/vf_clipfrac": clipfrac}


def compute_entropy_loss(entropy: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str, *,
                         num_tokens: float | None = None, num_seqs: float | None = None,
                         loss_scale_factor: float | None = None) -> torch.Tensor:
    """Aggregated token entropy (B, R) -> scalar. The actor loss subtracts entropy_coeff times this."""
    return agg_loss(entropy, response_mask, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs,
                    loss_scale_factor=loss_scale_factor)


def compute_kl_loss(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, response_mask: torch.Tensor, kind: str,
                    loss_agg_mode: str = "token-mean", *, num_tokens: float | None = None, num_seqs: float | None = None,
                    loss_scale_factor: float | None = None) -> torch.Tensor:
    """Aggregated KL(pi_theta || ref) estimate, kl_penalty(log_prob, ref_log_prob, kind): (B, R) -> scalar.
    The actor loss adds kl_loss_coef times this."""
    return agg_loss(kl_penalty(log_prob, ref_log_prob, kind), response_mask, loss_agg_mode,
                    num_tokens=num_tokens, num_seqs=num_seqs, loss_scale_factor=loss_scale_factor)
