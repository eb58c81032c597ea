"""Pinned numbers for masked reductions, logits helpers, agg_loss and the actor / critic losses."""

import math

import pytest
import torch

from nanoverl_core.algos import (LOSS_AGG_MODES, agg_loss, compute_entropy_loss, compute_kl_loss,
                                 compute_policy_loss_gspo, compute_policy_loss_vanilla, compute_value_loss, entropy_from_logits, logprobs_from_logits, loss_totals,
                                 masked_mean, masked_sum, masked_var, masked_whiten)

NAN = float("nan")


def close(actual, expected, tol=1e-6):
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float32),
                               torch.as_tensor(expected, dtype=torch.float32), rtol=0, atol=tol)


# ---- masked reductions ------------------------------------------------------------------------------
X = torch.tensor([[1.0, 2.0, NAN], [NAN, 5.0, 6.0]])
M = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0]])  # valid values: 1, 2, 5; NaN only on padding


def test_masked_sum_and_mean_ignore_padding_even_nan():
    close(masked_sum(X, M), 8.0)
    close(masked_mean(X, M), 8.0 / 3)
    close(masked_mean(X, M, dim=-1), [1.5, 5.0])  # row means: (1+2)/2, 5/1
    close(masked_mean(X, torch.zeros_like(M)), 0.0)  # empty mask: 0 / (0 + 1e-8)


def test_masked_var_is_unbiased_and_needs_two_elements():
    # mean 8/3; squared deviations (5/3)^2 + (2/3)^2 + (7/3)^2 = 78/9 = 26/3
    close(masked_var(X, M, unbiased=False), 26 / 9)  # / 3
    close(masked_var(X, M), 13 / 3)  # / (3 - 1)
    with pytest.raises(ValueError, match="at least 2 valid"):
        masked_var(X, torch.tensor([[1.0, 0, 0], [0, 0, 0]]))


def test_masked_whiten_uses_valid_statistics():
    # (x - 8/3) / sqrt(13/3): 1 -> -0.800641, 2 -> -0.320256, 5 -> 1.120897
    out = masked_whiten(X, M)
    close(out[M.bool()], [-0.800641, -0.320256, 1.120897])
    close(masked_whiten(X, M, shift_mean=False)[M.bool()], [-0.800641 + 8 / 3, -0.320256 + 8 / 3, 1.120897 + 8 / 3])


def test_logprobs_and_entropy_from_logits():
    # softmax([0, ln 2, ln 3]) = [1/6, 2/6, 3/6]; a uniform row over 4 tokens has entropy ln 4
    logits = torch.tensor([[[0.0, math.log(2), math.log(3), -1e9], [0.0, 0.0, 0.0, 0.0]]])  # (1, 2, 4)
    labels = torch.tensor([[2, 1]])
    close(logprobs_from_logits(logits, labels), [[math.log(0.5), math.log(0.25)]])
    # H = (1/6) ln 6 + (1/3) ln 3 + (1/2) ln 2 = 1.011404
    close(entropy_from_logits(logits), [[1.011404, math.log(4)]])


def test_logprobs_from_logits_matches_log_softmax_gradient_and_upcasts_bf16():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, requires_grad=True)
    labels = torch.randint(0, 11, (3, 5))
    ours = logprobs_from_logits(logits, labels)
    ref = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    close(ours, ref)
    (g_ours,) = torch.autograd.grad(ours.sum(), logits)
    (g_ref,) = torch.autograd.grad(ref.sum(), logits)
    close(g_ours, g_ref)
    out = logprobs_from_logits(logits.detach().bfloat16(), labels)
    assert out.dtype == torch.float32 and out.shape == (3, 5)
    assert entropy_from_logits(logits.detach().bfloat16()).dtype == torch.float32


# ---- agg_loss ---------------------------------------------------------------------------------------
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, NAN], [7.0, 8.0, 9.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # row 2 is all padding


@pytest.mark.parametrize("mode, expected", [
    ("token-mean", 7 / 3),               # (1 + 2 + 4) / 3 valid tokens
    ("token-sum", 7.0),                  # 1 + 2 + 4
    ("seq-mean-token-sum", 3.5),         # rows (1+2), 4; the empty row does not count: 7 / 2
    ("seq-mean-token-mean", 2.75),       # rows 1.5, 4 -> (1.5 + 4) / 2
    ("seq-mean-token-sum-norm", 7 / 6),  # rows (1+2)/R, 4/R with R = 3, averaged over the 2 non-empty rows
])
def test_agg_loss_modes(mode, expected):
    close(agg_loss(LOSS, MASK, mode), expected)


def test_agg_loss_uses_given_normalisers():
    close(agg_loss(LOSS, MASK, "token-mean", num_tokens=14), 0.5)  # 7 / 14
    close(agg_loss(LOSS, MASK, "seq-mean-token-sum", num_seqs=7), 1.0)  # 7 / 7
    close(agg_loss(LOSS, MASK, "seq-mean-token-mean", num_seqs=11), 0.5)  # 5.5 / 11
    close(agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=10), 0.35)  # 7 / 10 / 2 rows
    close(agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=0), 7 / 6)  # 0: use R
    close(agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", num_seqs=7, loss_scale_factor=10), 0.1)  # 7 / 10 / 7
    assert loss_totals(MASK) == {"num_tokens": 3.0, "num_seqs": 2.0}


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_agg_loss_of_all_padding_is_zero_not_nan(mode):
    close(agg_loss(LOSS[2:], MASK[2:], mode), 0.0)


def test_agg_loss_rejects_unknown_mode():
    with pytest.raises(ValueError, match="token-mean"):
        agg_loss(LOSS, MASK, "mean")


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batch_gradients_sum_to_the_mini_batch_gradient(mode):
    torch.manual_seed(0)
    theta = torch.randn(6, 5, requires_grad=True)
    lengths = torch.tensor([5, 1, 3, 0, 4, 2])  # uneven lengths and one empty row
    mask = (torch.arange(5) < lengths[:, None]).float()
    loss_of = lambda rows, **kw: agg_loss(theta[rows] ** 2 * 1.5, mask[rows], mode, loss_scale_factor=7.0, **kw)

    whole = loss_of(slice(0, 6))  # default normalisers: this batch's own counts
    (g_whole,) = torch.autograd.grad(whole, theta)
    totals = loss_totals(mask)
    micro = [loss_of(rows, **totals) for rows in (slice(0, 2), slice(2, 3), slice(3, 6))]
    (g_micro,) = torch.autograd.grad(sum(micro), theta)  # same as backward on each and accumulating
    close(sum(micro), whole, tol=1e-5)
    close(g_micro, g_whole)


# ---- policy loss -------------------------------------------------------------------------------------
def test_vanilla_policy_loss_clip_higher_and_dual_clip():
    # ratios 1.5, 0.5, 1.1, 5.0, 0.9 (old_log_prob = 0); clip range [1 - 0.2, 1 + 0.28]; clip_ratio_c = 3.
    # The 6th position is padding with an extreme log-ratio and advantage: it must not count.
    ratios = torch.tensor([[1.5, 0.5, 1.1, 5.0, 0.9, 1.0]])
    log_prob = ratios.log().clone()
    log_prob[0, 5] = 100.0
    log_prob.requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, 2.0, 7.0]])
    mask = torch.tensor([[1.0, 1, 1, 1, 1, 0]])
    loss, m = compute_policy_loss_vanilla(torch.zeros_like(log_prob), log_prob, adv, mask,
                                          clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    # token losses: max(-1.5, -1.28) = -1.28 (clipped high) | max(-0.5, -0.8) = -0.5 | 1.1 (A<0, inside)
    #               min(max(5, 1.28), 3) = 3 (dual clip) | -1.8; token-mean = (-1.28 - 0.5 + 1.1 + 3 - 1.8) / 5
    close(loss, 0.104)
    close(m["actor/pg_clipfrac"], 0.2)  # token 0
    close(m["actor/pg_clipfrac_lower"], 0.2)  # token 3
    close(m["actor/ppo_kl"], -math.log(1.5 * 0.5 * 1.1 * 5.0 * 0.9) / 5)  # mean(-log r) = -0.262341
    assert all(not v.requires_grad for v in m.values())
    # d loss / d log_prob_t = d(-A r)/d log r / 5 = -A r / 5 on unclipped tokens, 0 on clipped ones
    (grad,) = torch.autograd.grad(loss, log_prob)
    close(grad, [[0.0, -0.1, 0.22, 0.0, -0.36, 0.0]])


def test_vanilla_policy_loss_passes_normalisers():
    ratios = torch.tensor([[1.5, 0.5, 1.1, 5.0, 0.9]])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, 2.0]])
    loss, _ = compute_policy_loss_vanilla(torch.zeros(1, 5), ratios.log(), adv, torch.ones(1, 5),
                                          clip_ratio_high=0.28, num_tokens=10)
    close(loss, 0.052)  # the same token-loss sum 0.52, divided by the mini-batch's 10 tokens


def test_policy_loss_clamps_extreme_log_ratio():
    # log-ratio +100 and -100 are clamped to +-20 before exp: finite loss and gradients.
    log_prob = torch.tensor([[100.0, -100.0]], requires_grad=True)
    adv = torch.tensor([[-1.0, 1.0]])
    loss, m = compute_policy_loss_vanilla(torch.zeros(1, 2), log_prob, adv, torch.ones(1, 2))
    # token 0: A<0, ratio e^20 -> dual clip 3; token 1: max(-e^-20, -0.8) = -2.06e-9
    close(loss, (3.0 - math.exp(-20)) / 2)
    close(m["actor/ppo_kl"], 0.0)  # mean(-20, +20)
    (grad,) = torch.autograd.grad(loss, log_prob)
    assert torch.isfinite(grad).all()


def test_gspo_uses_one_geometric_mean_ratio_per_sequence():
    # row 0: token ratios 2, 0.5, 4 -> s = (2 * 0.5 * 4)^(1/3) = 4^(1/3) = 1.587401, A = +1 -> clipped to 1.28
    # row 1: token ratios 0.9, 0.9 -> s = 0.9, A = -1 -> loss 0.9 per token (no clipping)
    # row 2: token ratio 5, A = -1 -> loss 5: GSPO has no dual clip (vanilla would cap at 3)
    log_prob = torch.tensor([[math.log(2), math.log(0.5), math.log(4)],
                             [math.log(0.9), math.log(0.9), 100.0],
                             [math.log(5.0), 0.0, 0.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 9.0], [-1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 0, 0]])
    old = torch.zeros(3, 3)
    loss, m = compute_policy_loss_gspo(old, log_prob, adv, mask, clip_ratio_high=0.28,
                                       loss_agg_mode="seq-mean-token-mean")
    close(loss, (-1.28 + 0.9 + 5.0) / 3)  # seq-mean of per-row token means
    close(m["actor/pg_clipfrac"], 3 / 6)  # row 0's three tokens
    assert "actor/pg_clipfrac_lower" not in m  # GSPO has no dual clip
    # gradient: each unclipped token gets -A * s / |y_i| / num_seqs (stop-gradient trick)
    (grad,) = torch.autograd.grad(loss, log_prob)
    close(grad, [[0.0, 0.0, 0.0], [0.9 / 2 / 3, 0.9 / 2 / 3, 0.0], [5.0 / 3, 0.0, 0.0]], tol=1e-5)
    loss_tm, _ = compute_policy_loss_gspo(old, log_prob, adv, mask, clip_ratio_high=0.28)
    close(loss_tm, (3 * -1.28 + 2 * 0.9 + 5.0) / 6)  # token-mean over 6 valid tokens


def test_policy_loss_rejects_bad_settings():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        compute_policy_loss_vanilla(x, x, x, x + 1, clip_ratio_c=1.0)


# ---- value, entropy and KL losses -------------------------------------------------------------------
def test_value_loss_takes_the_larger_of_clipped_and_unclipped_error():
    vpreds = torch.tensor([[1.0, 2.0, 0.0, 100.0]])
    values = torch.tensor([[0.5, 0.5, 0.5, 0.5]])  # clip window [0.3, 0.7]
    returns = torch.tensor([[2.0, 1.0, 0.0, -100.0]])
    mask = torch.tensor([[1.0, 1, 1, 0]])
    loss, m = compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.2)
    # token 0: (1-2)^2 = 1 vs (0.7-2)^2 = 1.69 -> 1.69 (clipped); token 1: 1 vs (0.7-1)^2 = 0.09 -> 1
    # token 2: 0 vs (0.3-0)^2 = 0.09 -> 0.09 (clipped);  0.5 * (1.69 + 1 + 0.09) / 3 = 0.463333
    close(loss, 0.5 * 2.78 / 3)
    close(m["critic/vf_loss"], 0.5 * 2.78 / 3)
    close(m["critic/vf_clipfrac"], 2 / 3)


def test_entropy_loss_aggregates_valid_tokens():
    entropy = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1, 0], [1, 0, 0]])
    close(compute_entropy_loss(entropy, mask, "token-mean"), 2.0)  # (1 + 2 + 3) / 3
    close(compute_entropy_loss(entropy, mask, "seq-mean-token-mean"), 2.25)  # (1.5 + 3) / 2


def test_kl_loss_uses_the_named_estimator():
    log_prob, ref = torch.tensor([[-1.0, -2.0, 0.0]]), torch.tensor([[-1.5, -1.0, 50.0]])
    mask = torch.tensor([[1.0, 1, 0]])
    close(compute_kl_loss(log_prob, ref, mask, "k1", "token-mean"), -0.25)  # (0.5 - 1) / 2
    # k3 with r = ref - log_prob = -0.5, 1: (e^-0.5 + 0.5 - 1 + e^1 - 1 - 1) / 2
    close(compute_kl_loss(log_prob, ref, mask, "low_var_kl", "token-mean"), 0.412406)


def test_rollout_correction_weights_multiply_the_clipped_token_losses_before_aggregation():
    # vanilla, ratios 1.5, 0.5, 1.1 (old = 0), A = 1, 1, -1: clipped token losses -1.2, -0.5, 1.1;
    # weights 2, 0.5, 1 -> -2.4, -0.25, 1.1; token-mean over 3: -1.55 / 3. The weights carry no gradient.
    log_prob = torch.tensor([[1.5, 0.5, 1.1]]).log().requires_grad_(True)
    adv, mask = torch.tensor([[1.0, 1.0, -1.0]]), torch.ones(1, 3)
    weights = torch.tensor([[2.0, 0.5, 1.0]])
    loss, _ = compute_policy_loss_vanilla(torch.zeros(1, 3), log_prob, adv, mask, rollout_is_weights=weights)
    close(loss, -1.55 / 3)
    (grad,) = torch.autograd.grad(loss, log_prob)
    close(grad, [[0.0, -0.5 * 0.5 / 3, 1.1 / 3]])  # d(-A r w)/d log r = -A r w, / 3 tokens; token 0 is clipped
    # gspo: one ratio per row (here 1: old = new), so the weighted loss is -A w per token
    loss, _ = compute_policy_loss_gspo(torch.zeros(1, 3), torch.zeros(1, 3), adv, mask, rollout_is_weights=weights)
    close(loss, -(2.0 + 0.5 - 1.0) / 3)
