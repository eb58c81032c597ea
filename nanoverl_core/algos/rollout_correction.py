"""Rollout-trainer mismatch: diagnostics, and the importance-weight / rejection correction.

(Over 400 lines because a third of it is this docstring and the mapping to verl's and TRL's options:
one file keeps the formulas, the options and the deliberate differences side by side.)

The rollout engine (vLLM, SGLang, ...) samples responses and reports the log-probability of each
sampled token under *its* numerics; the trainer recomputes the same tokens' log-probabilities before
the update. The two differ (bf16 vs fp32 kernels, batch-dependent reductions, stale weights), so the
PPO batch is slightly off-policy. With

    old_log_prob      (B, R)  log pi_train(y_t), the trainer's log-prob before the update (no grad)
    rollout_log_prob  (B, R)  log pi_rollout(y_t), the engine's log-prob of the sampled token
    response_mask     (B, R)  1 on valid response tokens, 0 on padding

(B rows, R response length) the per-token log-ratio is l_t = old_log_prob - rollout_log_prob =
log(pi_train / pi_rollout) and the importance ratio is rho_t = exp(l_t). Padded positions may hold
anything, even NaN or inf: they never reach a weight, a mask or a metric.

Correction (off by default), computed once per batch in the trainer, before advantages:

* importance weights (IS), detached, to multiply into the per-token policy loss:
    is_level="token"      w_t = rho_t                                  (verl rollout_is="token")
    is_level="sequence"   w_t = prod_s rho_s = exp(sum_s l_s)          (verl rollout_is="sequence")
    is_level="geometric"  w_t = exp(mean_s l_s), the geometric mean     (no verl IS equivalent)
  the exponent clamped to [-20, 20] before exp (verl's SAFETY_BOUND). Then either
    truncation (TIS), is_threshold_low=None:  w = min(w, is_threshold)
    a band (IcePop / masked IS), is_threshold_low=L >= 0:  w = w if L <= w <= is_threshold else 0
  and optionally is_batch_normalize: w / mean(w) (over valid tokens for "token", over valid
  sequences for the sequence levels).
* rejection (RS, "MIS"): tokens or whole sequences leave the response mask when
    rs_level="token"      rho_t                  (verl rollout_rs="token_k1")
    rs_level="sequence"   exp(sum_t l_t)         (verl "seq_sum_k1")
    rs_level="geometric"  exp(mean_t l_t)        (verl "seq_mean_k1", "Geo-RS")
  leaves [rs_threshold_low, rs_threshold_high] (low defaults to 1 / high; checked in log space with
  l_t clamped to [-20, 20] first), and/or when a KL estimate exceeds rs_kl_threshold:
    rs_kl = "token_k2" | "token_k3" | "seq_sum_k2" | "seq_sum_k3" | "seq_mean_k2" | "seq_mean_k3" |
            "seq_max_k2" | "seq_max_k3"       (verl's option of the same name)
  with k2 = l^2 / 2 and k3 = exp(l) - 1 - l per token (both >= 0, 0 when the policies agree).
  A token survives when it passes every enabled criterion.

How the policy loss uses the result (verl 0.9, decoupled mode; see `RolloutCorrection`):
    mask    becomes the trainer's loss_mask for the rest of the step (the function is handed the
            loss_mask as `response_mask`; the rollout's own response_mask never changes), after the
            in-reward KL and before the advantages (advantages, critic and actor losses, the loss
            normalisers and the loss metrics), so rejected tokens do not count at all: verl's
            token-mean divides by the surviving tokens of the mini-batch;
    weights multiplies the per-token policy loss after PPO clipping (and dual clip) and before
            aggregation: agg_loss(pg_losses * weights, mask, ...). Entropy and KL-loss terms are not
            weighted. TRL multiplies at the same place.
verl's bypass mode (old_log_prob := rollout_log_prob) instead calls the same computation inside the
loss with the current log_prob in place of old_log_prob (no grad) on every micro-batch.

Configuration names next to verl's (algorithm.rollout_correction.*) and TRL's (GRPOConfig, vllm_ prefix
dropped: importance_sampling_* below is vllm_importance_sampling_*):

    nanoverl                         verl                                 TRL
    is_level="off"                   rollout_is=null                      importance_sampling_correction=False
    is_level="token" | "sequence"    rollout_is="token" | "sequence"      importance_sampling_mode=token_*|sequence_*
    is_threshold=C                   rollout_is_threshold=C (TIS)         "*_truncate", importance_sampling_clip_max=C
    is_threshold_low=L               rollout_is_threshold="L_C" (IcePop)  "*_mask", clip_min=L (or 0), clip_max=C
    is_batch_normalize               rollout_is_batch_normalize           -
    rs_level="token"                 rollout_rs="token_k1"                -
    rs_level="sequence"              rollout_rs="seq_sum_k1"              ("sequence_mask" zeroes the weight)
    rs_level="geometric"             rollout_rs="seq_mean_k1"             -
    rs_threshold_low=a, _high=b      rollout_rs_threshold="{1/b}_{1/a}"   (!)
    rs_kl="seq_mean_k3", _threshold  rollout_rs="seq_mean_k3", threshold  -

(!) verl's k1 rejection statistic is -l = log(pi_rollout / pi_train), so its "lower_upper" bounds
the *inverse* ratio; here both IS and RS bounds are on rho = pi_train / pi_rollout, as verl's own IS
band and TRL are. A symmetric band (low = 1 / high, the default of both) is the same set either way.

Metrics: 0-dim detached tensors, every step when rollout log-probs exist. "Valid rows" are rows with
at least one valid token; [name] is the verl 0.9 metric with the same definition (both prefixed
rollout_corr/), where there is one.

    rollout_corr/kl_k1               mean over valid tokens of rollout - old: k1 of KL(rollout || train)  [kl]
    rollout_corr/kl_k3               mean of exp(l) - l - 1 (l clamped to +-20)                         [k3_kl]
    rollout_corr/chi2_token          mean of rho^2, minus 1 (l clamped)                                 [chi2_token]
    rollout_corr/chi2_seq            mean over valid rows of exp(2 clamp(sum_t l_t)), minus 1           [chi2_seq]
    rollout_corr/abs_diff_mean, abs_diff_max   mean and max of |old - rollout|
    rollout_corr/seq_log_ratio_mean, _min, _max   over valid rows of sum_t l_t (log sequence ratio)
    rollout_corr/log_ppl_diff        mean over valid rows of mean_t(rollout) - mean_t(old)              [log_ppl_diff]
    rollout_corr/training_ppl        mean over valid rows of exp(-mean_t old)                           [training_ppl]
    rollout_corr/rollout_ppl         mean over valid rows of exp(-mean_t rollout)                       [rollout_ppl]
  with IS on (before batch normalisation; "raw" = the weight before truncation / the band):
    rollout_corr/is_weight_mean      mean of the weights over valid tokens                             [rollout_is_mean]
    rollout_corr/is_weight_max, _min  over valid tokens                    [rollout_is_max, _min] (is_level="token")
    rollout_corr/is_token_frac_high  share of valid tokens with raw weight > C
                                                         [rollout_is_ratio_fraction_high] (is_level="token")
    rollout_corr/is_token_frac_low   ... with raw weight < L (1 / C without a band)
                                                         [rollout_is_ratio_fraction_low] (is_level="token")
    rollout_corr/is_seq_frac_high    share of valid rows holding a valid token with raw weight > C
                                                         [rollout_is_seq_fraction_high] (sequence level)
    rollout_corr/is_seq_frac_low     ... below L (1 / C)  [rollout_is_seq_fraction_low] (sequence level)
    rollout_corr/is_ess              effective sample size mean(w)^2 / mean(w^2)   [rollout_is_eff_sample_size]
    rollout_corr/is_token_frac_zeroed  band only: share of valid tokens the band zeroes        [rollout_is_oob_ratio]
    rollout_corr/is_batch_norm_factor  is_batch_normalize only: the divisor        [rollout_is_batch_norm_factor]
  with RS on:
    rollout_corr/rs_token_frac       share of valid tokens rejected                  [rollout_rs_masked_fraction]
    rollout_corr/rs_seq_frac         share of valid rows with a rejected token   [rollout_rs_seq_masked_fraction]
    rollout_corr/rs_ratio_frac_high  share of valid tokens (token level) or valid rows (sequence levels)
                                     whose ratio is above the band         [rollout_rs_<k1 option>_fraction_low] (!)
    rollout_corr/rs_ratio_frac_low   ... below the band                   [rollout_rs_<k1 option>_fraction_high] (!)
    rollout_corr/rs_kl_frac_high     share of valid tokens / rows over rs_kl_threshold
                                                                     [rollout_rs_<rs_kl>_fraction_high]

Differences from verl 0.9 (`verl/trainer/ppo/rollout_corr_helper.py`):
  1. RS ratio bounds are on rho = pi_train / pi_rollout, verl's k1 bounds on 1 / rho (see (!) above).
  2. is_level="geometric" (IS weight exp(mean l)) is an addition; verl 0.9 only has geometric rejection.
  3. At most one ratio-band and one KL rejection criterion; verl chains any number ("token_k1,seq_max_k2").
  4. Row averages (chi2_seq, log_ppl_diff, training/rollout_ppl, rs_seq_frac, is_seq_frac_*) run
     over valid rows; verl averages over all rows. There an all-padding row counts as a perfect one
     (ratio 1, perplexity 1, nothing rejected) except in rollout_is_seq_fraction_low, which counts it
     as a low row (its mean raw weight is 0).
  5. kl_k3 clamps l to [-20, 20] (verl does not, so one huge log-ratio makes verl's metric inf / NaN).
  6. is_weight_max/min are over the applied weights at every level; verl reports the pre-truncation
     sequence ratio for is_level="sequence". is_seq_frac_* for is_level="token" count rows with any
     token beyond the bound; verl compares each row's mean raw weight. ESS is 0 when every weight is
     0; verl raises (a ZeroDivisionError in its ESS).
  7. A batch with no valid token gives zero weights, an empty mask and zero metrics, except
     is_batch_norm_factor, which is 1.0 (no normalisation); verl raises.
     is_threshold_low may be 0 (TRL's "*_mask" without clip_min); verl needs a positive bound.
  8. Padding is sanitised first, so NaN / inf at padded positions never reach a weight. verl's token
     weights carry NaN there under truncation (TIS), harmless only because the loss masks them out;
     a band (IcePop) sets them to 0.
  9. Only the metrics above; verl's per-option RS statistics (mean/std/min/max of each criterion),
     rollout_is_std and the rollout_is_seq_mean/std/max/min/max_deviation family are not computed.
 10. TRL's "*_truncate" also clamps from below at clip_min; here (as in verl) truncation is upper only.
The weights and the mask equal verl's on valid tokens (tests/test_algos_rollout_correction.py
checks that on random batches generated by scripts/make_verl_rollout_corr_cases.py).

Truncated sampling (top_p < 1, top_k > 0, min_p > 0): see `truncated_sampling_warning`.
"""

from __future__ import annotations

import math

import attrs
import torch

from ..config import CORRECTION_LEVELS, RS_KL_OPTIONS
from .utils import masked_mean, masked_sum

SAFETY_BOUND = 20.0
"""Log-ratios (token or sequence) are clamped to [-SAFETY_BOUND, SAFETY_BOUND] before exp, like verl."""

PREFIX = "rollout_corr/"


@attrs.frozen
class RolloutCorrection:
    """What `compute_rollout_correction` returns.

    weights: (B, R) detached importance weights, 0 on padding, to multiply into the per-token policy
             loss (after clipping, before aggregation); None when is_level="off".
    mask:    (B, R) response_mask with rejected tokens / sequences set to 0 (same dtype); equal to
             response_mask when rejection is off. Use it instead of response_mask from then on.
    metrics: dict of 0-dim detached tensors, keys prefixed "rollout_corr/" (see the module docstring).
    """

    weights: torch.Tensor | None
    mask: torch.Tensor
    metrics: dict[str, torch.Tensor]


def _prepare(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log_ratio with 0 on padding, float mask, bool mask); inputs detached."""
    if not old_log_prob.shape == rollout_log_prob.shape == response_mask.shape or old_log_prob.dim() != 2:
        raise ValueError(f"old_log_prob {tuple(old_log_prob.shape)}, rollout_log_prob "
                         f"{tuple(rollout_log_prob.shape)} and response_mask {tuple(response_mask.shape)} "
                         "must all be (B, R)")
    valid = response_mask.bool()
    log_ratio = torch.where(valid, old_log_prob.detach() - rollout_log_prob.detach(), 0.0)
    return log_ratio, valid.to(log_ratio.dtype), valid


def _masked_max(x: torch.Tensor, valid: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Max of x over valid entries (all, or along dim); 0 where nothing is valid."""
    filled = x.masked_fill(~valid, float("-inf"))
    if dim is None:
        return torch.where(valid.any(), filled.max(), 0.0)
    return torch.where(valid.any(dim=dim), filled.max(dim=dim).values, 0.0)


def _masked_min(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return -_masked_max(-x, valid)


def _row_mean(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Mean of the (B,) values x over valid rows (rows: (B,) bool); 0 when there is none."""
    return torch.where(rows, x, torch.zeros_like(x)).sum() / rows.sum().clamp(min=1)


def rollout_mismatch_metrics(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor,
                             response_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """How far the engine's log-probs are from the trainer's: the rollout_corr/ diagnostics.

    old_log_prob:     (B, R) trainer log-prob of each sampled token before the update
    rollout_log_prob: (B, R) engine log-prob of the same token
    response_mask:    (B, R) 1 on valid tokens
    Returns the keys kl_k1, kl_k3, chi2_token, chi2_seq, abs_diff_mean, abs_diff_max,
    seq_log_ratio_mean/min/max, log_ppl_diff, training_ppl, rollout_ppl (prefixed "rollout_corr/";
    definitions in the module docstring), each a 0-dim detached tensor, 0 when nothing is valid.
    """
    log_ratio, mask, valid = _prepare(old_log_prob, rollout_log_prob, response_mask)
    rows = valid.any(dim=-1)  # (B,)
    zero = torch.zeros((), dtype=log_ratio.dtype, device=log_ratio.device)
    old = torch.where(valid, old_log_prob.detach().to(log_ratio.dtype), zero)
    rollout = torch.where(valid, rollout_log_prob.detach().to(log_ratio.dtype), zero)
    clamped = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    seq_log_ratio = masked_sum(log_ratio, mask, dim=-1)  # (B,)
    mean_old, mean_rollout = masked_mean(old, mask, dim=-1), masked_mean(rollout, mask, dim=-1)  # (B,)
    chi2_seq = _row_mean(torch.exp(2.0 * seq_log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)), rows) - 1.0
    metrics = {
        "kl_k1": masked_mean(-log_ratio, mask),
        "kl_k3": masked_mean(torch.exp(clamped) - clamped - 1.0, mask),
        "chi2_token": torch.where(valid.any(), masked_mean(torch.exp(clamped).square(), mask) - 1.0, zero),
        "chi2_seq": torch.where(rows.any(), chi2_seq, zero),
        "abs_diff_mean": masked_mean(log_ratio.abs(), mask),
        "abs_diff_max": _masked_max(log_ratio.abs(), valid),
        "seq_log_ratio_mean": _row_mean(seq_log_ratio, rows),
        "seq_log_ratio_min": _masked_min(seq_log_ratio, rows),
        "seq_log_ratio_max": _masked_max(seq_log_ratio, rows),
        "log_ppl_diff": _row_mean(mean_rollout - mean_old, rows),
        "training_ppl": _row_mean(torch.exp(-mean_old), rows),
        "rollout_ppl": _row_mean(torch.exp(-mean_rollout), rows),
    }
    return {PREFIX + key: value.detach() for key, value in metrics.items()}


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(choices)}")


def _importance_weights(log_ratio: torch.Tensor, mask: torch.Tensor, valid: torch.Tensor, level: str,
                        threshold: float, threshold_low: float | None, batch_normalize: bool
                        ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(B, R) weights (0 on padding) and the is_* metrics; see compute_rollout_correction."""
    if not threshold > 0:
        raise ValueError(f"is_threshold = {threshold} must be positive")
    if threshold_low is not None and not 0 <= threshold_low <= threshold:
        raise ValueError(f"is_threshold_low = {threshold_low} must be in [0, is_threshold = {threshold}]")
    if level == "token":
        log_w = log_ratio  # (B, R)
    elif level == "sequence":
        log_w = masked_sum(log_ratio, mask, dim=-1).unsqueeze(-1)  # (B, 1): log of the product of ratios
    else:  # geometric
        log_w = masked_mean(log_ratio, mask, dim=-1).unsqueeze(-1)  # (B, 1): log of the geometric mean
    raw = torch.exp(log_w.clamp(-SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio) * mask  # (B, R)
    high = raw > threshold
    low = raw < (threshold_low if threshold_low is not None else 1.0 / threshold)
    if threshold_low is None:
        weights = raw.clamp(max=threshold)  # TIS
    else:
        weights = torch.where(high | low, torch.zeros_like(raw), raw)  # band: zero outside [low, high]

    rows = valid.any(dim=-1)
    mean_w = masked_mean(weights, mask)
    second = masked_mean((weights / (mean_w + 1e-8)).square(), mask)
    metrics = {
        "is_weight_mean": mean_w,
        "is_weight_max": _masked_max(weights, valid),
        "is_weight_min": _masked_min(weights, valid),
        "is_token_frac_high": masked_mean(high.to(mask.dtype), mask),
        "is_token_frac_low": masked_mean(low.to(mask.dtype), mask),
        "is_seq_frac_high": _row_mean((high & valid).any(dim=-1).to(mask.dtype), rows),
        "is_seq_frac_low": _row_mean((low & valid).any(dim=-1).to(mask.dtype), rows),
        "is_ess": torch.where(second > 0, 1.0 / second, torch.zeros_like(second)),
    }
    if threshold_low is not None:
        metrics["is_token_frac_zeroed"] = masked_mean((high | low).to(mask.dtype), mask)
    if batch_normalize:
        if level == "token":
            batch_mean = mean_w
        else:  # one weight per sequence: average the sequences
            batch_mean = _row_mean(masked_mean(weights, mask, dim=-1), rows)
        factor = torch.where(batch_mean > 1e-8, batch_mean, torch.ones_like(batch_mean))
        weights = weights / factor
        metrics["is_batch_norm_factor"] = factor
    return weights.detach(), metrics


def _kl_statistic(clamped: torch.Tensor, mask: torch.Tensor, valid: torch.Tensor, kl_option: str) -> torch.Tensor:
    """rs_kl's statistic: the k2 or k3 KL estimate of each token (B, R), or its sum / mean / max over each row
    (B,), from the clamped log-ratios."""
    scope, estimator = kl_option.rsplit("_", 1)
    if estimator == "k2":
        token_kl = 0.5 * clamped.square()
    else:  # k3
        token_kl = torch.exp(clamped) - 1.0 - clamped
    if scope == "token":
        return token_kl
    if scope == "seq_sum":
        return masked_sum(token_kl, mask, dim=-1)
    if scope == "seq_mean":
        return masked_mean(token_kl, mask, dim=-1)
    return _masked_max(token_kl, valid, dim=-1)  # seq_max


def _rejection_keep(log_ratio: torch.Tensor, mask: torch.Tensor, valid: torch.Tensor, level: str,
                    threshold_low: float | None, threshold_high: float | None, kl_option: str,
                    kl_threshold: float | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(B, R) bool: tokens passing every enabled rejection criterion, and the rs_* metrics."""
    clamped = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    rows = valid.any(dim=-1)
    keep = torch.ones_like(valid)
    metrics: dict[str, torch.Tensor] = {}

    def share(flags: torch.Tensor, per_row: bool) -> torch.Tensor:
        return _row_mean(flags.to(mask.dtype), rows) if per_row else masked_mean(flags.to(mask.dtype), mask)

    if level != "off":
        if threshold_high is None or not threshold_high > 0:
            raise ValueError(f"rs_level={level!r} needs rs_threshold_high > 0, got {threshold_high}")
        low = 1.0 / threshold_high if threshold_low is None else threshold_low
        if not 0 < low <= threshold_high:
            raise ValueError(f"rs_threshold_low = {low} must be in (0, rs_threshold_high = {threshold_high}]")
        if level == "token":
            stat = clamped  # (B, R) log rho_t
        elif level == "sequence":
            stat = masked_sum(clamped, mask, dim=-1)  # (B,) log of the sequence ratio
        else:  # geometric
            stat = masked_mean(clamped, mask, dim=-1)  # (B,) log of the geometric mean ratio
        above, below = stat > math.log(threshold_high), stat < math.log(low)
        metrics["rs_ratio_frac_high"] = share(above, level != "token")
        metrics["rs_ratio_frac_low"] = share(below, level != "token")
        passed = ~(above | below)
        keep = keep & (passed if level == "token" else passed.unsqueeze(-1))
    if kl_option != "off":
        if kl_threshold is None or not kl_threshold > 0:
            raise ValueError(f"rs_kl={kl_option!r} needs rs_kl_threshold > 0, got {kl_threshold}")
        scope = kl_option.rsplit("_", 1)[0]
        over = _kl_statistic(clamped, mask, valid, kl_option) > kl_threshold
        metrics["rs_kl_frac_high"] = share(over, scope != "token")
        keep = keep & (~over if scope == "token" else ~over.unsqueeze(-1))

    rejected = valid & ~keep
    metrics["rs_token_frac"] = masked_mean(rejected.to(mask.dtype), mask)
    metrics["rs_seq_frac"] = _row_mean(rejected.any(dim=-1).to(mask.dtype), rows)
    return keep, metrics


def compute_rollout_correction(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor,
                               response_mask: torch.Tensor, *, is_level: str = "off", is_threshold: float = 2.0,
                               is_threshold_low: float | None = None, is_batch_normalize: bool = False,
                               rs_level: str = "off", rs_threshold_high: float | None = None,
                               rs_threshold_low: float | None = None, rs_kl: str = "off",
                               rs_kl_threshold: float | None = None, diagnostics: bool = True) -> RolloutCorrection:
    """Importance weights and rejection mask for the rollout-trainer mismatch, with all its metrics.

    old_log_prob:     (B, R) trainer log-prob of each sampled token before the update (pi_old)
    rollout_log_prob: (B, R) engine log-prob of the same token (pi_rollout)
    response_mask:    (B, R) 1 on valid tokens (float or bool)
    is_level:         "off" | "token" | "sequence" | "geometric": weight per token rho_t, per sequence
                      exp(sum l) or exp(mean l) (broadcast to its tokens); exponent clamped to +-20
    is_threshold:     C > 0. Truncation (TIS) w = min(w, C) when is_threshold_low is None
    is_threshold_low: L in [0, C]: instead zero weights outside [L, C] (IcePop / masked IS)
    is_batch_normalize: divide the weights by their mean over valid tokens ("token") or valid
                      sequences (sequence levels), when that mean exceeds 1e-8
    rs_level:         "off" | "token" | "sequence" | "geometric": reject a token (or the whole row)
                      whose rho_t (exp(sum l), exp(mean l)) leaves [rs_threshold_low, rs_threshold_high]
    rs_threshold_high, rs_threshold_low: the band (low defaults to 1 / high); required when rs_level is on
    rs_kl:            "off" or one of RS_KL_OPTIONS: reject a token / row whose k2 or k3 KL estimate
                      (per token, or its sum / mean / max over the row) exceeds rs_kl_threshold
    diagnostics:      False leaves rollout_mismatch_metrics out of the metrics (a caller that takes them
                      on their own, as the trainer does at the end of its step)
    Returns RolloutCorrection(weights (B, R) detached or None, mask (B, R), metrics): the metrics hold
    rollout_mismatch_metrics (with `diagnostics`), plus is_* / rs_* ones for what is enabled. The weights
    use every valid token of the original mask (rejected ones included), as verl does. With everything
    off this is only the metrics, and mask equals response_mask.
    """
    _check_choice("is_level", is_level, CORRECTION_LEVELS)
    _check_choice("rs_level", rs_level, CORRECTION_LEVELS)
    _check_choice("rs_kl", rs_kl, RS_KL_OPTIONS)
    metrics = rollout_mismatch_metrics(old_log_prob, rollout_log_prob, response_mask) if diagnostics else {}
    log_ratio, mask, valid = _prepare(old_log_prob, rollout_log_prob, response_mask)

    weights = None
    if is_level != "off":
        weights, is_metrics = _importance_weights(log_ratio, mask, valid, is_level, is_threshold,
                                                  is_threshold_low, is_batch_normalize)
        metrics.update({PREFIX + key: value.detach() for key, value in is_metrics.items()})

    new_mask = response_mask
    if rs_level != "off" or rs_kl != "off":
        keep, rs_metrics = _rejection_keep(log_ratio, mask, valid, rs_level, rs_threshold_low, rs_threshold_high,
                                           rs_kl, rs_kl_threshold)
        new_mask = torch.where(keep, response_mask, torch.zeros_like(response_mask))
        metrics.update({PREFIX + key: value.detach() for key, value in rs_metrics.items()})
    return RolloutCorrection(weights=weights, mask=new_mask, metrics=metrics)


def truncated_sampling_warning(top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0) -> str | None:
    """A one-line warning when the rollout samples from a truncated distribution, else None.

    With top_p < 1, top_k > 0 or min_p > 0 the engine samples from the tokens that survive the
    truncation, and an engine that reports log-probs of "the distribution actually sampled from"
    (vLLM's logprobs_mode="processed_logprobs", which nanoverl-vllm uses) renormalises them over
    that kept set, while the trainer's log_softmax runs over the whole vocabulary. For every sampled
    token old - rollout then carries log(kept probability mass) <= 0 on top of the real mismatch:
    the ratio is biased below 1 (a PR linked to TRL issue #6789, #7269, measured a mean ratio equal
    to the kept mass, 0.896 at top_p=0.8), so the rollout_corr/ metrics report a KL that is not a
    policy difference, truncated IS weights shrink the gradient, and a rejection band drops tokens for
    that alone. (Temperature does not cause this as long as the trainer divides its logits by it too.)
    TRL issue #6789 (open in the stored copy, Aug 2026; a maintainer's report) notes that two other
    frameworks fixed it on the training side, by replaying the truncation in the trainer
    (renormalising its log-probs over the engine's kept token set, DeepSeek-V3.2's "keep sampling
    mask"; vLLM >= 0.28 can return that set), and that the vLLM-side fix was not yet in a release
    TRL supports. TRL itself had only an open PR (#6880) warning at config time; the replay PR
    (#7269) was closed. nanoverl only warns: sample training rollouts with top_p=1, top_k=0
    (min_p=0) when rollout correction or its metrics matter. top_k <= 0 means "off" (vLLM spells it
    0 or -1).
    """
    knobs = []
    if top_p < 1.0:
        knobs.append(f"top_p={top_p}")
    if top_k > 0:
        knobs.append(f"top_k={top_k}")
    if min_p > 0.0:
        knobs.append(f"min_p={min_p}")
    if not knobs:
        return None
    return (f"rollout sampling truncates the distribution ({', '.join(knobs)}): the engine's log-probs are "
            "renormalised over the kept tokens but the trainer's are over the full vocabulary, so "
            "rollout_corr/ metrics and importance weights are biased (ratio < 1 by the kept mass, TRL #6789); "
            "use top_p=1 and top_k=0 for training rollouts")
