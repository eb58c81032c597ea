"""The policy losses beyond PPO's clip: CISPO, SAPO, GMPO (`geo_mean`), GPG, Clip-Cov, KL-Cov, DRO and DPPO.

Each is a pure `compute_policy_loss_<name>` function (verl 0.9.1's function of the same name, with the
differences docs/verl-differences.md lists) and a registered wrapper `<name>(inputs, config)` that reads
the loss's own settings ([actor.<name>], nanoverl_core/algos/loss_settings.py). Shapes: B = rows of
this micro-batch, R = response length; every tensor argument is (B, R):

    old_log_prob   log pi_old(token) of the policy that sampled the batch (no grad)
    log_prob       log pi_theta(token) of the policy being trained (grad flows here)
    advantages     advantage per token
    response_mask  1 on the tokens that count (the batch's loss_mask)
    rollout_is_weights  detached rollout-correction weights, or None

The token ratio is r = exp(clamp(log_prob - old_log_prob, +-log_ratio_clamp)). Token losses are
aggregated by `agg_loss` with the mini-batch normalisers (`loss_agg_mode`, `num_tokens`, `num_seqs`,
`loss_scale_factor`: see losses.py), and every metric is this micro-batch's share of the mini-batch's
token mean, so gradient accumulation and the logged numbers do not depend on the micro-batch size;
Clip-Cov and KL-Cov are the exception, as in verl: which tokens they pick depends on the micro-batch.
"""

from __future__ import annotations

import torch

from ..config import settings_or_defaults
from .loss_settings import (CispoSettings, ClipCovSettings, DppoKlSettings, DppoTvSettings, DroSettings,
                                     GeoMeanSettings, KlCovSettings, SapoSettings)
from .losses import Metrics, PolicyLossInputs, agg_loss, token_mean_share
from .utils import masked_mean, masked_sum


def _log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor, log_ratio_clamp: float) -> torch.Tensor:
    return torch.clamp(log_prob - old_log_prob, -log_ratio_clamp, log_ratio_clamp)  # (B, R)


def _weighted(pg_losses: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    return pg_losses if rollout_is_weights is None else pg_losses * rollout_is_weights


# ---- CISPO ---------------------------------------------------------------------------------------------------
def compute_policy_loss_cispo(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                              response_mask: torch.Tensor, *, eps_low: float = 10.0, eps_high: float = 0.2,
                              log_ratio_clamp: float = 20.0, loss_agg_mode: str = "token-mean",
                              num_tokens: float | None = None, num_seqs: float | None = None,
                              loss_scale_factor: float | None = None,
                              rollout_is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, Metrics]:
    """CISPO (MiniMax-M1, https://arxiv.org/abs/2506.13585): clip the IS weight, never the gradient.

    loss_t = -sg(clip(r_t, 1 - eps_low, 1 + eps_high)) * A_t * log_prob_t, times rollout_is_weights.
    Every token keeps a gradient (PPO's clip drops the clipped tokens' gradients); the weight only
    scales it: d loss_t / d log_prob_t = -clip(r_t) A_t.
    Metrics: actor/pg_clipfrac (tokens whose weight was clipped, either side), actor/ppo_kl (mean of
    old - new log-prob).
    """
    log_ratio = _log_ratio(log_prob, old_log_prob, log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high).detach()  # (B, R)
    pg_losses = _weighted(-weight * advantages * log_prob, rollout_is_weights)
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs,
                    loss_scale_factor=loss_scale_factor)
    return loss, {"actor/pg_clipfrac": token_mean_share(torch.ne(ratio, weight).float(), response_mask, num_tokens),
                  "actor/ppo_kl": token_mean_share(-log_ratio, response_mask, num_tokens)}


def cispo(inputs: PolicyLossInputs, config) -> tuple[torch.Tensor, Metrics]:
    """Registered as policy loss "cispo" ([actor.cispo] eps_low, eps_high)."""
    settings = settings_or_defaults(config.settings, CispoSettings)
    loss, metrics = compute_policy_loss_cispo(
        inputs.old_log_prob, inputs.log_prob, inputs.advantages, inputs.loss_mask, eps_low=settings.eps_low,
        eps_high=settings.eps_high, log_ratio_clamp=config.log_ratio_clamp,
        rollout_is_weights=inputs.rollout_is_weights, **inputs.norms)
    return loss, ({} if inputs.on_policy else metrics)  # ratio 1 everywhere: both are 0 by construction


# ---- SAPO ----------------------------------------------------------------------------------------------------
def compute_policy_loss_sapo(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                             response_mask: torch.Tensor, *, tau_pos: float = 1.0, tau_neg: float = 1.05,
                             log_ratio_clamp: float = 20.0, loss_agg_mode: str = "token-mean",
                             num_tokens: float | None = None, num_seqs: float | None = None,
                             loss_scale_factor: float | None = None,
                             rollout_is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, Metrics]:
    """SAPO (Qwen, https://arxiv.org/abs/2511.20347): a soft gate on the ratio instead of a hard clip.

    loss_t = -f(r_t; tau_t) * A_t, f(r; tau) = sigmoid(tau (r - 1)) * 4 / tau, tau_t = tau_pos where
    A_t > 0 else tau_neg; times rollout_is_weights. At r = 1 the gradient equals vanilla PPO's
    (f'(1) = 1); away from 1 it decays smoothly (f' = 4 s (1 - s), s the sigmoid) instead of dropping to 0.
    The paper (and verl, which forces it) aggregates with "seq-mean-token-mean".
    Metrics: actor/ppo_kl (mean of old - new log-prob); nothing is clipped.
    """
    log_ratio = _log_ratio(log_prob, old_log_prob, log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    tau = torch.where(advantages > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))  # (B, R)
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    pg_losses = _weighted(-gate * advantages, rollout_is_weights)
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs,
                    loss_scale_factor=loss_scale_factor)
    return loss, {"actor/ppo_kl": token_mean_share(-log_ratio, response_mask, num_tokens)}


def sapo(inputs: PolicyLossInputs, config) -> tuple[torch.Tensor, Metrics]:
    """Registered as policy loss "sapo" ([actor.sapo] tau_pos, tau_neg)."""
    settings = settings_or_defaults(config.settings, SapoSettings)
    loss, metrics = compute_policy_loss_sapo(
        inputs.old_log_prob, inputs.log_prob, inputs.advantages, inputs.loss_mask, tau_pos=settings.tau_pos,
        tau_neg=settings.tau_neg, log_ratio_clamp=config.log_ratio_clamp,
        rollout_is_weights=inputs.rollout_is_weights, **inputs.norms)
    return loss, ({} if inputs.on_policy else metrics)


# ---- GMPO (geo_mean) ------------------------------------------------------------------------------------------
def compute_policy_loss_geo_mean(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                                 response_mask: torch.Tensor, *, clip_low: float = 0.4, clip_high: float = 0.4,
                                 log_ratio_clamp: float = 20.0, loss_agg_mode: str = "token-mean",
                                 num_tokens: float | None = None, num_seqs: float | None = None,
                                 loss_scale_factor: float | None = None,
                                 rollout_is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, Metrics]:
    """GMPO (https://arxiv.org/abs/2507.20673): the geometric mean of clipped token ratios, per sequence.

    With x_t = log_prob_t - old_log_prob_t and s = sign(A_t), each token's log-ratio is clipped
    pessimistically in log space, x'_t = s * min(s x_t, s clip(x_t, -clip_low, clip_high)); the
    sequence's ratio is R_i = exp(mean over its valid tokens of x'_t) and its advantage A_i the mean of
    its valid A_t (GMPO assumes one advantage per sequence). The sequence loss -A_i R_i (times the
    geometric mean of its rollout_is_weights, if given) is written on each valid token and aggregated
    by loss_agg_mode: "seq-mean-token-mean" is the paper's (and verl's, which ignores the mode)
    1/G sum_i -A_i R_i.
    Metrics: actor/pg_clipfrac / actor/pg_clipfrac_lower (tokens whose log-ratio is outside the clip
    range, with A > 0 / A < 0), actor/ppo_kl (mean of old - new log-prob).
    """
    log_ratio = _log_ratio(log_prob, old_log_prob, log_ratio_clamp)  # (B, R)
    sign = torch.sign(advantages)
    clipped = torch.clamp(log_ratio, -clip_low, clip_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clipped)  # (B, R)
    tokens = response_mask.sum(dim=-1).clamp(min=1)  # (B,)
    seq_ratio = torch.exp(masked_sum(pessimistic, response_mask, dim=-1) / tokens)  # (B,)
    seq_advantage = masked_sum(advantages, response_mask, dim=-1) / tokens  # (B,)
    seq_losses = -seq_advantage * seq_ratio
    if rollout_is_weights is not None:  # one weight per sequence: the geometric mean of its token weights
        log_w = masked_sum(torch.log(rollout_is_weights + 1e-10), response_mask, dim=-1) / tokens
        seq_losses = seq_losses * torch.exp(log_w)
    pg_losses = seq_losses.unsqueeze(-1).expand_as(log_prob)  # (B, R): each row's loss on every token
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs,
                    loss_scale_factor=loss_scale_factor)
    outside = torch.ne(log_ratio, clipped)
    upper, lower = (outside & (advantages > 0)).float(), (outside & (advantages < 0)).float()
    return loss, {"actor/pg_clipfrac": token_mean_share(upper, response_mask, num_tokens),
                  "actor/pg_clipfrac_lower": token_mean_share(lower, response_mask, num_tokens),
                  "actor/ppo_kl": token_mean_share(-log_ratio, response_mask, num_tokens)}


def geo_mean(inputs: PolicyLossInputs, config) -> tuple[torch.Tensor, Metrics]:
    """Registered as policy loss "geo_mean" (GMPO; [actor.geo_mean] clip_low, clip_high)."""
    settings = settings_or_defaults(config.settings, GeoMeanSettings)
    loss, metrics = compute_policy_loss_geo_mean(
        inputs.old_log_prob, inputs.log_prob, inputs.advantages, inputs.loss_mask, clip_low=settings.clip_low,
        clip_high=settings.clip_high, log_ratio_clamp=config.log_ratio_clamp,
        rollout_is_weights=inputs.rollout_is_weights, **inputs.norms)
    return loss, ({} if inputs.on_policy else metrics)


# ---- GPG -----------------------------------------------------------------------------------------------------
def compute_policy_loss_gpg(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                            response_mask: torch.Tensor, *, loss_agg_mode: str = "token-mean",
                            num_tokens: float | None = None, num_seqs: float | None = None,
                            loss_scale_factor: float | None = None,
                            rollout_is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, Metrics]:
    """GPG (https://arxiv.org/abs/2504.02546): plain REINFORCE, loss_t = -A_t * log_prob_t (times
    rollout_is_weights); no ratio, no clip, so old_log_prob is unused. No metrics."""
    pg_losses = _weighted(-advantages * log_prob, rollout_is_weights)
    return agg_loss(pg_losses, response_mask, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs,
                    loss_scale_factor=loss_scale_factor), {}


def gpg(inputs: PolicyLossInputs, config) -> tuple[torch.Tensor, Metrics]:
    """Registered as policy loss "gpg": -A log pi per token."""
    return compute_policy_loss_gpg(inputs.old_log_prob, inputs.log_prob, inputs.advantages, inputs.loss_mask,
                                   rollout_is_weights=inputs.rollout_is_weights, **inputs.norms)


# ---- Clip-Cov and KL-Cov ---------------------------------------------------------------------------------------
def compute_policy_loss_clip_cov(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                                 response_mask: torch.Tensor, *, clip_ratio_low: float = 0.2,
                                 clip_ratio_high: float = 0.2, ratio: float = 0.0002, lower_bound: float = 1.0,
                                 upper_bound: float = 5.0, log_ratio_clamp: float = 20.0,
                                 loss_agg_mode: str = "token-mean", num_tokens: float | None = None,
                                 num_seqs: float | None = None, loss_scale_factor: float | None = None,
                                 rollout_is_weights: torch.Tensor | None = None,
                                 generator: torch.Generator | None = None) -> tuple[torch.Tensor, Metrics]:
    """Clip-Cov (https://arxiv.org/abs/2505.22617): PPO's clipped loss, with the gradient of a few
    high-covariance tokens detached to slow entropy collapse.

    Candidates are the valid tokens PPO's clip left alone whose covariance
    (A_t - mean A)(log_prob_t - mean log_prob) (means over this micro-batch's valid tokens) lies strictly
    between lower_bound and upper_bound; max(1, int(ratio * valid tokens)) of them, drawn at random
    (torch.randperm with `generator`, default torch's global one), get loss 0. The others get
    vanilla's max(-A r, -A clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high)) (no dual clip), times
    rollout_is_weights.
    Metrics: actor/pg_clipfrac (PPO-clipped tokens, as vanilla), actor/cov_clipfrac (tokens detached by
    covariance), actor/ppo_kl (mean of old - new log-prob).
    """
    log_ratio = _log_ratio(log_prob, old_log_prob, log_ratio_clamp)
    r = torch.exp(log_ratio)
    unclipped = -advantages * r
    clipped = -advantages * torch.clamp(r, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    ppo_clipped = torch.gt(clipped, unclipped)  # (B, R)
    valid = response_mask > 0
    lp = log_prob.detach()
    cov = (advantages - masked_mean(advantages, response_mask)) * (lp - masked_mean(lp, response_mask))  # (B, R)
    candidates = torch.nonzero(valid & ~ppo_clipped & (cov > lower_bound) & (cov < upper_bound))  # (K, 2)
    count = max(int(ratio * valid.sum().item()), 1)
    chosen = candidates[torch.randperm(len(candidates), generator=generator)[:count]]
    keep = torch.ones_like(advantages)
    keep[chosen[:, 0], chosen[:, 1]] = 0.0
    pg_losses = _weighted(torch.maximum(unclipped, clipped) * keep, rollout_is_weights)
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs,
                    loss_scale_factor=loss_scale_factor)
    return loss, {"actor/pg_clipfrac": token_mean_share(ppo_clipped.float(), response_mask, num_tokens),
                  "actor/cov_clipfrac": token_mean_share(1.0 - keep, response_mask, num_tokens),
                  "actor/ppo_kl": token_mean_share(-log_ratio, response_mask, num_tokens)}


def clip_cov(inputs: PolicyLossInputs, config) -> tuple[torch.Tensor, Metrics]:
    """Registered as policy loss "clip_cov" ([actor.clip_cov] ratio, lower_bound, upper_bound; PPO's
    clip range from [actor])."""
    settings = settings_or_defaults(config.settings, ClipCovSettings)
    loss, metrics = compute_policy_loss_clip_cov(
        inputs.old_log_prob, inputs.log_prob, inputs.advantages, inputs.loss_mask,
        clip_ratio_low=config.clip_ratio_low, clip_ratio_high=config.clip_ratio_high, ratio=settings.ratio,
        lower_bound=settings.lower_bound, upper_bound=settings.upper_bound, log_ratio_clamp=config.log_ratio_clamp,
        rollout_is_weights=inputs.rollout_is_weights, **inputs.norms)
    if inputs.on_policy:  # ratio 1: nothing is PPO-clipped; the covariance selection still happens
        return loss, {"actor/cov_clipfrac": metrics["actor/cov_clipfrac"]}
    return loss, metrics


def compute_policy_loss_kl_cov(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                               response_mask: torch.Tensor, *, ratio: float = 0.0002, coef: float = 0.1,
                               log_ratio_clamp: float = 20.0, loss_agg_mode: str = "token-mean",
                               num_tokens: float | None = None, num_seqs: float | None = None,
                               loss_scale_factor: float | None = None,
                               rollout_is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, Metrics]:
    """KL-Cov (https://arxiv.org/abs/2505.22617): the unclipped policy gradient, plus a |log r| penalty
    on the tokens of highest covariance to slow entropy collapse.

    loss_t = -A_t r_t, and on the max(1, int(ratio * valid tokens)) valid tokens with the largest
    covariance (A_t - mean A)(log_prob_t - mean log_prob) (means over this micro-batch's valid tokens)
    loss_t = -A_t r_t + coef * |log r_t|; times rollout_is_weights. No clipping.
    Metrics: actor/ppo_kl (mean of old - new log-prob), actor/ppo_kl_abs (mean of |log r|, what verl
    logs as actor/ppo_kl).
    """
    log_ratio = _log_ratio(log_prob, old_log_prob, log_ratio_clamp)
    pg_losses = -advantages * torch.exp(log_ratio)  # (B, R)
    valid = response_mask > 0
    n_valid = int(valid.sum().item())
    if n_valid > 0:
        adv, lp = advantages[valid], log_prob.detach()[valid]  # (n_valid,), row-major order
        cov = (adv - adv.mean()) * (lp - lp.mean())
        top = torch.topk(cov, max(1, int(n_valid * ratio))).indices
        rows, cols = torch.nonzero(valid, as_tuple=True)
        penalised = torch.zeros_like(valid)
        penalised[rows[top], cols[top]] = True
        pg_losses = torch.where(penalised, pg_losses + coef * log_ratio.abs(), pg_losses)
    pg_losses = _weighted(pg_losses, rollout_is_weights)
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs,
                    loss_scale_factor=loss_scale_factor)
    return loss, {"actor/ppo_kl": token_mean_share(-log_ratio, response_mask, num_tokens),
                  "actor/ppo_kl_abs": token_mean_share(log_ratio.abs(), response_mask, num_tokens)}


def kl_cov(inputs: PolicyLossInputs, config) -> tuple[torch.Tensor, Metrics]:
    """Registered as policy loss "kl_cov" ([actor.kl_cov] ratio, coef)."""
    settings = settings_or_defaults(config.settings, KlCovSettings)
    loss, metrics = compute_policy_loss_kl_cov(
        inputs.old_log_prob, inputs.log_prob, inputs.advantages, inputs.loss_mask, ratio=settings.ratio,
        coef=settings.coef, log_ratio_clamp=config.log_ratio_clamp, rollout_is_weights=inputs.rollout_is_weights,
        **inputs.norms)
    return loss, ({} if inputs.on_policy else metrics)  # ratio 1: the penalty and both metrics are 0


# ---- DRO -----------------------------------------------------------------------------------------------------
def compute_policy_loss_dro(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                            response_mask: torch.Tensor, *, beta: float, loss_agg_mode: str = "token-mean",
                            num_tokens: float | None = None, num_seqs: float | None = None,
                            loss_scale_factor: float | None = None,
                            rollout_is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, Metrics]:
    """DRO (Direct Reward Optimization, https://arxiv.org/abs/2405.19107): a policy gradient with a
    quadratic pull towards the sampling policy instead of a clip.

    loss_t = -(A_t log_prob_t - 0.5 beta (log_prob_t - old_log_prob_t)^2), times rollout_is_weights;
    d loss_t / d log_prob_t = -A_t + beta (log_prob_t - old_log_prob_t). The log-ratio is not clamped
    (the penalty is a polynomial: nothing overflows).
    Metrics: actor/ppo_kl (mean of old - new log-prob).
    """
    if beta <= 0:
        raise ValueError(f"beta = {beta} must be > 0 (the DRO penalty weight)")
    log_ratio = log_prob - old_log_prob  # (B, R)
    pg_losses = _weighted(-(advantages * log_prob - 0.5 * beta * log_ratio.square()), rollout_is_weights)
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs,
                    loss_scale_factor=loss_scale_factor)
    return loss, {"actor/ppo_kl": token_mean_share(-log_ratio, response_mask, num_tokens)}


def dro(inputs: PolicyLossInputs, config) -> tuple[torch.Tensor, Metrics]:
    """Registered as policy loss "dro" ([actor.dro] beta, required)."""
    if not isinstance(config.settings, DroSettings):
        raise TypeError("policy loss 'dro' needs its settings: set actor.dro.beta")
    loss, metrics = compute_policy_loss_dro(
        inputs.old_log_prob, inputs.log_prob, inputs.advantages, inputs.loss_mask, beta=config.settings.beta,
        rollout_is_weights=inputs.rollout_is_weights, **inputs.norms)
    return loss, ({} if inputs.on_policy else metrics)  # log-ratio 0: the metric is 0 by construction


# ---- DPPO (binary TV and binary KL) ------------------------------------------------------------------------------
def compute_policy_loss_dppo(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                             response_mask: torch.Tensor, *, divergence: str, delta_low: float, delta_high: float,
                             is_cap: float = 20.0, log_ratio_clamp: float = 20.0, loss_agg_mode: str = "token-mean",
                             num_tokens: float | None = None, num_seqs: float | None = None,
                             loss_scale_factor: float | None = None,
                             rollout_is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, Metrics]:
    """DPPO (https://arxiv.org/abs/2602.04879): a trust region on the divergence between the sampled
    token's probabilities p = exp(log_prob), q = exp(old_log_prob), not on their ratio.

    A token is inside the region when, for A_t > 0 (pushing p up) / A_t <= 0 (pushing p down):
        divergence "tv":  p - q <= delta_high          /  q - p <= delta_low
        divergence "kl":  p <= q or KL_b <= delta_high  /  p >= q or KL_b <= delta_low, with the binary KL
                          KL_b = q log(q / p) + (1 - q) log((1 - q + 1e-8) / (1 - p + 1e-8))
    loss_t = -A_t sg(min(r_t, is_cap)) log_prob_t inside the region, 0 outside (no gradient), times
    rollout_is_weights. At r = 1 the gradient is vanilla PPO's.
    Metrics: actor/pg_clipfrac (tokens outside the region), actor/pg_clipfrac_lower (tokens inside
    whose IS weight was truncated at is_cap), actor/ppo_kl (mean of old - new log-prob).
    """
    log_ratio = _log_ratio(log_prob, old_log_prob, log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, max=is_cap).detach()  # (B, R)
    p, q = torch.exp(log_prob.detach()), torch.exp(old_log_prob)
    if divergence == "tv":
        rising_ok, falling_ok = p - q <= delta_high, q - p <= delta_low
    elif divergence == "kl":
        binary_kl = q * (old_log_prob - log_prob.detach()) + (1 - q) * torch.log((1 - q + 1e-8) / (1 - p + 1e-8))
        rising_ok, falling_ok = (binary_kl <= delta_high) | (p <= q), (binary_kl <= delta_low) | (p >= q)
    else:
        raise ValueError(f"unknown divergence {divergence!r}; choose tv or kl")
    inside = torch.where(advantages > 0, rising_ok, falling_ok).to(log_prob.dtype)  # (B, R)
    pg_losses = _weighted(-advantages * weight * log_prob * inside, rollout_is_weights)
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs,
                    loss_scale_factor=loss_scale_factor)
    truncated = (ratio > is_cap).to(log_prob.dtype) * inside
    return loss, {"actor/pg_clipfrac": token_mean_share(1.0 - inside, response_mask, num_tokens),
                  "actor/pg_clipfrac_lower": token_mean_share(truncated, response_mask, num_tokens),
                  "actor/ppo_kl": token_mean_share(-log_ratio, response_mask, num_tokens)}


def _dppo(divergence: str, settings, inputs: PolicyLossInputs, config) -> tuple[torch.Tensor, Metrics]:
    loss, metrics = compute_policy_loss_dppo(
        inputs.old_log_prob, inputs.log_prob, inputs.advantages, inputs.loss_mask, divergence=divergence,
        delta_low=settings.delta_low, delta_high=settings.delta_high, is_cap=settings.is_cap,
        log_ratio_clamp=config.log_ratio_clamp, rollout_is_weights=inputs.rollout_is_weights, **inputs.norms)
    return loss, ({} if inputs.on_policy else metrics)  # p = q: every token is inside, nothing truncated


def dppo_tv(inputs: PolicyLossInputs, config) -> tuple[torch.Tensor, Metrics]:
    """Registered as policy loss "dppo_tv" ([actor.dppo_tv] delta_low, delta_high, is_cap)."""
    return _dppo("tv", settings_or_defaults(config.settings, DppoTvSettings), inputs, config)


def dppo_kl(inputs: PolicyLossInputs, config) -> tuple[torch.Tensor, Metrics]:
    """Registered as policy loss "dppo_kl" ([actor.dppo_kl] delta_low, delta_high, is_cap)."""
    return _dppo("kl", settings_or_defaults(config.settings, DppoKlSettings), inputs, config)
