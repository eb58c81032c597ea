"""CISPO, SAPO, GMPO (geo_mean), GPG, Clip-Cov, KL-Cov, DRO, DPPO: hand-computed numbers, verl 0.9.1's answers,
the command line."""

import json
import math

import pytest
import torch

from conftest import EXAMPLES, ROOT, assert_user_error, run_cli
from nanoverl_core.algos import (PolicyLossInputs, compute_policy_loss_cispo, compute_policy_loss_clip_cov,
                                 compute_policy_loss_dppo, compute_policy_loss_dro, compute_policy_loss_geo_mean,
                                 compute_policy_loss_gpg, compute_policy_loss_kl_cov, compute_policy_loss_sapo)
from nanoverl_core.algos.loss_settings import CispoSettings, SapoSettings
from nanoverl_core.config import ActorConfig
from nanoverl_core.plugins import load_registry

NEW_LOSSES = ["cispo", "sapo", "geo_mean", "gpg", "clip_cov", "kl_cov", "dro", "dppo_tv", "dppo_kl"]
log = math.log


FUNCTIONS = {"cispo": compute_policy_loss_cispo, "sapo": compute_policy_loss_sapo,
             "geo_mean": compute_policy_loss_geo_mean, "gpg": compute_policy_loss_gpg,
             "clip_cov": compute_policy_loss_clip_cov, "kl_cov": compute_policy_loss_kl_cov,
             "dro": compute_policy_loss_dro,
             "dppo_tv": lambda *a, **kw: compute_policy_loss_dppo(*a, divergence="tv", **kw),
             "dppo_kl": lambda *a, **kw: compute_policy_loss_dppo(*a, divergence="kl", **kw)}
HAND_SETTINGS = {"dro": {"beta": 0.5}, "dppo_tv": {"delta_low": 0.15, "delta_high": 0.15},
                 "dppo_kl": {"delta_low": 0.05, "delta_high": 0.05}}


def close(actual, expected, tol=1e-6):
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float64),
                               torch.as_tensor(expected, dtype=torch.float64), rtol=0, atol=tol)


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


# ---- hand-computed ----------------------------------------------------------------------------------------
def test_cispo_clips_the_detached_weight_and_keeps_every_tokens_gradient():
    # old = 0, ratios 1.5, 0.5, 1.1; the 4th position is padding with an extreme ratio and advantage.
    # eps 0.2 / 0.28: weights 1.28, 0.8, 1.1; loss_t = -w A log r.
    log_prob = torch.tensor([[log(1.5), log(0.5), log(1.1), 30.0]], requires_grad=True)
    adv, mask = torch.tensor([[1.0, -1.0, 2.0, 9.0]]), torch.tensor([[1.0, 1, 1, 0]])
    loss, m = compute_policy_loss_cispo(torch.zeros(1, 4), log_prob, adv, mask, eps_low=0.2, eps_high=0.28)
    close(loss, -(1.28 * log(1.5) + 0.8 * log(2) + 2.2 * log(1.1)) / 3)  # -0.427732
    (grad,) = torch.autograd.grad(loss, log_prob)
    close(grad, [[-1.28 / 3, 0.8 / 3, -2.2 / 3, 0.0]])  # -w A / 3: clipped tokens keep a gradient
    close(m["actor/pg_clipfrac"], 2 / 3)  # tokens 0 and 1
    close(m["actor/ppo_kl"], -log(1.5 * 0.5 * 1.1) / 3)
    # the default eps_low = 10 sets no lower bound: token 1's weight is its ratio 0.5
    loss, m = compute_policy_loss_cispo(torch.zeros(1, 4), log_prob, adv, mask, eps_high=0.28)
    close(loss, -(1.28 * log(1.5) + 0.5 * log(2) + 2.2 * log(1.1)) / 3)
    close(m["actor/pg_clipfrac"], 1 / 3)


def test_sapo_gates_the_ratio_softly_with_one_temperature_per_advantage_sign():
    # row 0: ratios 1, 2 with A = +1 (tau_pos = 1); row 1: ratio 0.5 with A = -1 (tau_neg = 2); padding after.
    # f(r) = sigmoid(tau (r - 1)) 4 / tau; d loss_t / d log r = -A f'(r) r with f'(r) = 4 s (1 - s).
    log_prob = torch.tensor([[0.0, log(2), 5.0], [log(0.5), 5.0, 5.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 7.0], [-1.0, 7.0, 7.0]])
    mask = torch.tensor([[1.0, 1, 0], [1, 0, 0]])
    loss, m = compute_policy_loss_sapo(torch.zeros(2, 3), log_prob, adv, mask, tau_pos=1.0, tau_neg=2.0,
                                       loss_agg_mode="seq-mean-token-mean")
    s1, s2 = sigmoid(1.0), sigmoid(2 * (0.5 - 1))
    token = [-2.0, -4 * s1, 2 * s2]  # -f A: f(1) = 2 / tau_pos; f(2) = 4 s1; f(0.5) = 2 s2
    close(loss, ((token[0] + token[1]) / 2 + token[2]) / 2)  # -0.962117
    (grad,) = torch.autograd.grad(loss, log_prob)
    close(grad, [[-1 / 4, -4 * s1 * (1 - s1) * 2 / 4, 0.0], [4 * s2 * (1 - s2) * 0.5 / 2, 0.0, 0.0]])
    assert set(m) == {"actor/ppo_kl"}  # SAPO clips nothing
    # on the sampling policy the gradient is vanilla PPO's, -A per token (here token-mean over 3)
    (grad,) = torch.autograd.grad(compute_policy_loss_sapo(log_prob.detach(), log_prob, adv, mask)[0], log_prob)
    close(grad, [[-1 / 3, -1 / 3, 0.0], [1 / 3, 0.0, 0.0]])


def test_geo_mean_takes_the_geometric_mean_of_log_clipped_ratios_per_sequence():
    # row 0, A = +1: log-ratios 0.5, -0.1, 0.2 -> 0.4 (clipped), -0.1, 0.2; R0 = e^(0.5 / 3), loss -R0
    # row 1, A = -2: log-ratios -0.6, 0.3 -> max(x, clip(x)) = -0.4, 0.3; R1 = e^-0.05, loss 2 R1
    log_prob = torch.tensor([[0.5, -0.1, 0.2], [-0.6, 0.3, 40.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, 9.0]])
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0]])
    r0, r1 = math.exp(0.5 / 3), math.exp(-0.05)
    loss, m = compute_policy_loss_geo_mean(torch.zeros(2, 3), log_prob, adv, mask,
                                           loss_agg_mode="seq-mean-token-mean")
    close(loss, (-r0 + 2 * r1) / 2)  # 0.360549
    (grad,) = torch.autograd.grad(loss, log_prob)
    # d/dx_t of -A_i R_i = -A_i R_i / |y_i|, then / 2 sequences; clipped tokens get none
    close(grad, [[0.0, -r0 / 3 / 2, -r0 / 3 / 2], [0.0, 2 * r1 / 2 / 2, 0.0]])
    close(m["actor/pg_clipfrac"], 1 / 5)  # row 0 token 0 (A > 0)
    close(m["actor/pg_clipfrac_lower"], 1 / 5)  # row 1 token 0 (A < 0)
    loss_tm, _ = compute_policy_loss_geo_mean(torch.zeros(2, 3), log_prob, adv, mask)
    close(loss_tm, (3 * -r0 + 2 * 2 * r1) / 5)  # token-mean weighs each sequence by its length


def test_gpg_is_minus_advantage_times_log_prob():
    log_prob = torch.tensor([[-1.0, -2.0, 50.0]], requires_grad=True)
    adv, mask = torch.tensor([[2.0, 1.0, 9.0]]), torch.tensor([[1.0, 1, 0]])
    loss, m = compute_policy_loss_gpg(torch.full((1, 3), 9.0), log_prob, adv, mask)  # old_log_prob is unused
    close(loss, (2.0 + 2.0) / 2)
    (grad,) = torch.autograd.grad(loss, log_prob)
    close(grad, [[-1.0, -0.5, 0.0]])
    assert m == {}


def test_clip_cov_detaches_high_covariance_tokens_that_ppo_did_not_clip():
    # A = 2, 0, 0, -2 (mean 0), log_prob = -0.5, -1.5, -1.5, -2.5 (mean -1.5): covariances 2, 0, 0, 2.
    # Token 0 has ratio 2 (A > 0): PPO clips it (loss -2 * 1.2), so only token 3 is a candidate in (1, 5).
    # The 5th position is padding with a huge covariance: never chosen.
    log_prob = torch.tensor([[-0.5, -1.5, -1.5, -2.5, 9.0]], requires_grad=True)
    old = log_prob.detach() - torch.tensor([[log(2), 0, 0, 0, 0]])
    adv, mask = torch.tensor([[2.0, 0.0, 0.0, -2.0, 50.0]]), torch.tensor([[1.0, 1, 1, 1, 0]])
    loss, m = compute_policy_loss_clip_cov(old, log_prob, adv, mask, ratio=0.5)  # up to 2 tokens
    close(loss, -2.4 / 4)  # token 3's loss 2 is detached to 0
    (grad,) = torch.autograd.grad(loss, log_prob)
    close(grad, torch.zeros(1, 5))  # token 0 clipped by PPO, token 3 by covariance
    close(m["actor/pg_clipfrac"], 1 / 4)
    close(m["actor/cov_clipfrac"], 1 / 4)
    # without candidates in the band it is vanilla PPO without the dual clip: token 3 keeps -A r / 4
    loss, m = compute_policy_loss_clip_cov(old, log_prob, adv, mask, ratio=0.5, upper_bound=1.5)
    close(loss, (-2.4 + 2.0) / 4)
    (grad,) = torch.autograd.grad(loss, log_prob)
    close(grad, [[0.0, 0.0, 0.0, 0.5, 0.0]])
    close(m["actor/cov_clipfrac"], 0.0)


def test_clip_cov_draws_at_most_ratio_times_valid_tokens_at_random():
    # ratio 1, A = 2, 0, 0, -2 on ratio-1 tokens: candidates 0 and 3, at most int(0.25 * 4) = 1 is drawn
    log_prob = torch.tensor([[-0.5, -1.5, -1.5, -2.5]])
    adv, mask = torch.tensor([[2.0, 0.0, 0.0, -2.0]]), torch.ones(1, 4)
    losses = set()
    for seed in range(8):
        loss, m = compute_policy_loss_clip_cov(log_prob, log_prob, adv, mask, ratio=0.25,
                                               generator=torch.Generator().manual_seed(seed))
        close(m["actor/cov_clipfrac"], 0.25)
        losses.add(round(loss.item(), 6))
    assert losses == {0.5, -0.5}  # token 0 (loss -2) or token 3 (loss +2) detached, over 4 tokens


def test_kl_cov_penalises_the_highest_covariance_tokens():
    # A = 2, 0, 0, -1 (mean 0.25), log_prob = -0.5, -1.5, -1.5, -2.5 (mean -1.5): covariances 1.75, 0, 0, 1.25.
    # ratio 0.25: int(0.25 * 4) = 1 token, token 0, gets coef |log r| = 0.1. Padding has a huge covariance.
    log_prob = torch.tensor([[-0.5, -1.5, -1.5, -2.5, 9.0]], requires_grad=True)
    old = log_prob.detach() - torch.tensor([[0.1, 0, 0, 0.2, 0]])
    adv, mask = torch.tensor([[2.0, 0.0, 0.0, -1.0, 50.0]]), torch.tensor([[1.0, 1, 1, 1, 0]])
    loss, m = compute_policy_loss_kl_cov(old, log_prob, adv, mask, ratio=0.25, coef=1.0)
    close(loss, (-2 * math.exp(0.1) + 0.1 + math.exp(0.2)) / 4)
    (grad,) = torch.autograd.grad(loss, log_prob)
    close(grad, [[(-2 * math.exp(0.1) + 1.0) / 4, 0.0, 0.0, math.exp(0.2) / 4, 0.0]])
    close(m["actor/ppo_kl"], -0.3 / 4)
    close(m["actor/ppo_kl_abs"], 0.3 / 4)


def test_dro_pulls_towards_the_sampling_policy_quadratically():
    # log-ratios 0.5, -1 with A = 1, -2; beta = 2: loss_t = -(A log_prob - (log r)^2)
    old = torch.tensor([[-1.0, -0.5, 0.0]])
    log_prob = torch.tensor([[-0.5, -1.5, 60.0]], requires_grad=True)
    adv, mask = torch.tensor([[1.0, -2.0, 5.0]]), torch.tensor([[1.0, 1, 0]])
    loss, m = compute_policy_loss_dro(old, log_prob, adv, mask, beta=2.0)
    close(loss, (-(-0.5 - 0.25) - (3.0 - 1.0)) / 2)  # token 0: -(-0.5 - 0.25); token 1: -(3 - 1)
    (grad,) = torch.autograd.grad(loss, log_prob)
    close(grad, [[(-1.0 + 2 * 0.5) / 2, (2.0 + 2 * -1.0) / 2, 0.0]])  # (-A + beta log r) / 2
    close(m["actor/ppo_kl"], (-0.5 + 1.0) / 2)
    with pytest.raises(ValueError, match="beta"):
        compute_policy_loss_dro(old, log_prob, adv, mask, beta=0.0)


def test_dppo_tv_drops_the_gradient_of_tokens_whose_probability_moved_too_far():
    # probabilities q -> p: 0.5 -> 0.6 (A > 0, +0.1: inside 0.15), 0.2 -> 0.4 (A > 0, +0.2: outside),
    # 0.5 -> 0.3 (A < 0, -0.2: outside), 0.5 -> 0.9 (A < 0: rising is always inside for A < 0).
    q = torch.tensor([[0.5, 0.2, 0.5, 0.5, 0.5]])
    p = torch.tensor([[0.6, 0.4, 0.3, 0.9, 0.5]])
    log_prob = p.log().requires_grad_(True)
    adv, mask = torch.tensor([[1.0, 1.0, -1.0, -1.0, 3.0]]), torch.tensor([[1.0, 1, 1, 1, 0]])
    loss, m = compute_policy_loss_dppo(q.log(), log_prob, adv, mask, divergence="tv", delta_low=0.15,
                                       delta_high=0.15, is_cap=1.5)
    # inside: token 0, weight 1.2; token 3, weight min(1.8, 1.5) = 1.5. loss_t = -A w log p
    close(loss, (-1.2 * log(0.6) + 1.5 * log(0.9)) / 4)
    (grad,) = torch.autograd.grad(loss, log_prob)
    close(grad, [[-1.2 / 4, 0.0, 0.0, 1.5 / 4, 0.0]])
    close(m["actor/pg_clipfrac"], 2 / 4)  # tokens 1 and 2
    close(m["actor/pg_clipfrac_lower"], 1 / 4)  # token 3's weight was truncated


def test_dppo_kl_bounds_the_binary_kl_in_the_direction_the_advantage_pushes():
    # q = 0.5 -> p = 0.6 with A > 0: KL_b = 0.5 log(0.5/0.6) + 0.5 log(0.5/0.4) = 0.020411 (inside 0.05);
    # q = 0.5 -> p = 0.8 with A > 0: KL_b = 0.5 log(0.5/0.8) + 0.5 log(0.5/0.2) = 0.223144 (outside);
    # q = 0.5 -> p = 0.2 with A > 0: p fell, which A > 0 does not push: inside whatever the KL.
    q, p = torch.full((1, 3), 0.5), torch.tensor([[0.6, 0.8, 0.2]])
    log_prob = p.log().requires_grad_(True)
    adv, mask = torch.ones(1, 3), torch.ones(1, 3)
    loss, m = compute_policy_loss_dppo(q.log(), log_prob, adv, mask, divergence="kl", delta_low=0.05,
                                       delta_high=0.05)
    close(loss, (-1.2 * log(0.6) - 0.4 * log(0.2)) / 3)
    (grad,) = torch.autograd.grad(loss, log_prob)
    close(grad, [[-1.2 / 3, 0.0, -0.4 / 3]])
    close(m["actor/pg_clipfrac"], 1 / 3)


@pytest.mark.parametrize("name", NEW_LOSSES)
def test_rollout_correction_weights_scale_each_new_loss(name):
    # every valid weight 2: each loss (and its gradient) doubles; on padding the weight is ignored
    torch.manual_seed(0)
    log_prob = (torch.randn(2, 5) * 0.3 - 1).requires_grad_(True)
    old, adv = log_prob.detach() + 0.1 * torch.randn(2, 5), torch.randn(2, 5)
    mask = torch.tensor([[1.0, 1, 1, 1, 0], [1, 1, 0, 0, 0]])
    weights = torch.where(mask.bool(), 2.0, 50.0)
    fn, kw = FUNCTIONS[name], HAND_SETTINGS.get(name, {})
    torch.manual_seed(1)
    plain = fn(old, log_prob, adv, mask, **kw)[0]
    torch.manual_seed(1)
    weighted = fn(old, log_prob, adv, mask, rollout_is_weights=weights, **kw)[0]
    close(weighted, 2 * plain)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("name", ["cispo", "sapo", "geo_mean", "gpg", "dro", "dppo_tv", "dppo_kl"])
def test_micro_batch_gradients_sum_to_the_mini_batch_gradient(name, mode):
    # Clip-Cov and KL-Cov pick their tokens per micro-batch (as verl), so only the others split exactly
    torch.manual_seed(0)
    lengths = torch.tensor([5, 1, 3, 0, 4, 2])
    mask = (torch.arange(5) < lengths[:, None]).float()
    old, adv = -torch.rand(6, 5) * 2, torch.randn(6, 5)
    log_prob = (old + 0.3 * torch.randn(6, 5)).clamp(max=-1e-3).requires_grad_(True)
    fn, kw = FUNCTIONS[name], {**HAND_SETTINGS.get(name, {}), "loss_agg_mode": mode, "loss_scale_factor": 7.0}
    whole = fn(old, log_prob, adv, mask, **kw)[0]
    (g_whole,) = torch.autograd.grad(whole, log_prob)
    totals = {"num_tokens": float(mask.sum()), "num_seqs": float((mask.sum(-1) > 0).sum())}
    parts = [fn(old[rows], log_prob[rows], adv[rows], mask[rows], **kw, **totals)[0]
             for rows in (slice(0, 2), slice(2, 3), slice(3, 6))]
    (g_parts,) = torch.autograd.grad(sum(parts), log_prob)
    close(sum(parts), whole, tol=1e-5)
    close(g_parts, g_whole)


@pytest.mark.parametrize("name", NEW_LOSSES)
def test_registered_losses_read_their_settings_and_drop_constant_metrics_on_policy(name):
    registry = load_registry()
    fn = registry.get("policy_loss", name)
    settings_cls = registry.settings_class("policy_loss", name)
    config = ActorConfig()
    config.settings = settings_cls(beta=0.1) if name == "dro" else settings_cls() if settings_cls else None
    log_prob = torch.tensor([[-1.0, -0.5, -2.0]])
    adv, mask = torch.tensor([[1.0, -1.0, 0.5]]), torch.tensor([[1.0, 1, 0]])
    loss, metrics = fn(PolicyLossInputs(log_prob, log_prob, adv, mask, on_policy=True), config)
    assert set(metrics) <= {"actor/cov_clipfrac"}, metrics  # clip_cov's selection is not constant on-policy
    loss_off, metrics_off = fn(PolicyLossInputs(log_prob, log_prob - 0.1, adv, mask), config)
    assert torch.isfinite(loss) and torch.isfinite(loss_off)
    assert name == "gpg" or "actor/ppo_kl" in metrics_off


def test_cispo_and_sapo_read_their_settings():
    config = ActorConfig()
    config.settings = CispoSettings(eps_high=0.05)
    log_prob = torch.tensor([[log(2.0)]])
    inputs = PolicyLossInputs(log_prob, torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1))
    close(load_registry().get("policy_loss", "cispo")(inputs, config)[0], -1.05 * log(2.0))  # -sg(1.05) A log 2
    config.settings = SapoSettings(tau_pos=2.0)
    inputs = PolicyLossInputs(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1))
    close(load_registry().get("policy_loss", "sapo")(inputs, config)[0], -2 / 2.0)  # f(1) = 2 / tau_pos


# ---- verl 0.9.1's answers ---------------------------------------------------------------------------------
CASES = json.loads((ROOT / "tests" / "data" / "verl_loss_cases.json").read_text())
# verl metric -> nanoverl metric; None: verl logs a constant 0 there, nanoverl leaves it out
METRICS = {"cispo": {"actor/pg_clipfrac": "actor/pg_clipfrac", "actor/ppo_kl": "actor/ppo_kl",
                     "actor/pg_clipfrac_lower": None},
           "sapo": {"actor/ppo_kl": "actor/ppo_kl", "actor/pg_clipfrac": None, "actor/pg_clipfrac_lower": None},
           "geo_mean": {"actor/pg_clipfrac": "actor/pg_clipfrac", "actor/pg_clipfrac_lower": "actor/pg_clipfrac_lower",
                        "actor/ppo_kl": "actor/ppo_kl"},
           "gpg": {},
           "clip_cov": {"actor/pg_clipfrac": "actor/cov_clipfrac", "actor/ppo_kl": "actor/ppo_kl"},
           "kl_cov": {"actor/ppo_kl": "actor/ppo_kl_abs"},
           "dro": {"actor/ppo_kl": "actor/ppo_kl"},
           "dppo_tv": {k: k for k in ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl")},
           "dppo_kl": {k: k for k in ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl")}}


def settings_of(case) -> dict:
    """nanoverl's settings for a case's verl ActorConfig / PolicyLossConfig fields."""
    actor, policy, name = case["actor"], case["policy_loss"], case["name"]
    if name == "cispo":
        return {"eps_low": actor["clip_ratio_low"], "eps_high": actor["clip_ratio_high"]}
    if name == "sapo":
        return {"tau_pos": actor["tau_pos"], "tau_neg": actor["tau_neg"]}
    if name == "geo_mean":
        return {"clip_low": actor["clip_ratio_low"], "clip_high": actor["clip_ratio_high"]}
    if name == "clip_cov":
        return {"clip_ratio_low": actor["clip_ratio_low"], "clip_ratio_high": actor["clip_ratio_high"],
                "ratio": policy["clip_cov_ratio"], "lower_bound": policy.get("clip_cov_lb", 1.0),
                "upper_bound": policy.get("clip_cov_ub", 5.0)}
    if name == "kl_cov":
        return {"ratio": policy["kl_cov_ratio"], "coef": policy["ppo_kl_coef"]}
    if name == "dro":
        return {"beta": policy["dro_beta"]}
    if name in ("dppo_tv", "dppo_kl"):
        return {"delta_low": actor["clip_ratio_low"], "delta_high": actor["clip_ratio_high"],
                "is_cap": actor["clip_ratio_c"]}
    return {}  # gpg


def test_the_cases_cover_every_new_loss_and_mode():
    assert CASES["verl"].startswith("verl 0.9.1")
    assert {c["name"] for c in CASES["cases"]} == set(NEW_LOSSES)
    assert len([c for c in CASES["cases"] if c["name"] == "cispo"]) == 20  # 2 settings x 5 modes x 2 variants


@pytest.mark.parametrize("index", range(len(CASES["cases"])), ids=lambda i: f"{CASES['cases'][i]['name']}-{i}")
def test_new_losses_equal_verl(index):
    case = CASES["cases"][index]
    inputs = {k: torch.tensor(v, dtype=torch.float64) for k, v in case["inputs"].items()}
    mask = inputs["mask"]
    log_prob = inputs["log_prob"].clone().requires_grad_(True)
    info = case["global_batch_info"]
    norms = {"num_tokens": info.get("batch_num_tokens"), "num_seqs": info.get("global_batch_size"),
             "loss_scale_factor": info.get("loss_scale_factor")}
    mode = case["loss_agg_mode"]
    if mode is None:  # verl's GMPO ignores the mode: a mean over all rows, empty ones included
        mode, norms["num_seqs"] = "seq-mean-token-mean", float(mask.shape[0])
    torch.manual_seed(case["seed"])  # clip_cov draws from torch's global generator, as verl does
    loss, metrics = FUNCTIONS[case["name"]](inputs["old_log_prob"], log_prob, inputs["advantages"], mask,
                                            loss_agg_mode=mode, rollout_is_weights=inputs.get("rollout_is_weights"),
                                            **settings_of(case), **norms)
    close(loss, case["loss"])
    (grad,) = torch.autograd.grad(loss, log_prob)
    close(grad, case["grad"])
    # verl logs the micro-batch's own token mean; nanoverl its share of the mini-batch's (num_tokens)
    share = (norms["num_tokens"] or mask.sum().item()) / mask.sum().item()
    assert set(case["metrics"]) == set(METRICS[case["name"]])
    for verl_key, ours in METRICS[case["name"]].items():
        if ours is None:
            assert case["metrics"][verl_key] == 0.0
            assert verl_key not in metrics
        else:
            close(metrics[ours] * share, case["metrics"][verl_key])


# ---- the command line -------------------------------------------------------------------------------------
REINFORCE = str(EXAMPLES / "debug_reinforce.toml")


def test_plugins_lists_every_new_loss_with_a_description():
    proc = run_cli("plugins", "--json")
    assert proc.returncode == 0, proc.stderr
    core = next(p for p in json.loads(proc.stdout) if p["dist"] == "nanoverl")
    assert set(NEW_LOSSES) <= set(core["names"]["policy_loss"])
    for name in NEW_LOSSES:
        assert len(core["descriptions"]["policy_loss"][name]) > 20, name


def test_dry_run_shows_a_loss_settings_and_a_bad_one_exits_2_with_one_line():
    proc = run_cli("--config", REINFORCE, "--dry-run", "actor.policy_loss=sapo", "actor.sapo.tau_neg=1.2")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["config"]["actor"]["sapo"] == {"tau_pos": 1.0, "tau_neg": 1.2}
    proc = run_cli("--config", REINFORCE, "--dry-run", "actor.policy_loss=cispo")
    assert json.loads(proc.stdout)["config"]["actor"]["cispo"] == {"eps_low": 10.0, "eps_high": 0.2}
    bad = run_cli("--config", REINFORCE, "--dry-run", "actor.policy_loss=cispo", "actor.cispo.eps_high=0")
    assert_user_error(bad, "config key 'actor.cispo.eps_high': 0.0 is not a finite number > 0")
    bad = run_cli("--config", REINFORCE, "--dry-run", "actor.policy_loss=dro")  # DRO's beta has no default
    assert_user_error(bad, "config key 'actor.dro.beta'", "must be set")
    bad = run_cli("--config", REINFORCE, "--dry-run", "actor.policy_loss=gpg", "actor.gpg.beta=1")
    assert_user_error(bad, "[actor.gpg] is set, but the policy_loss 'gpg' takes no settings")


def test_a_new_loss_trains_by_name_and_logs_its_metrics(tmp_path):
    proc = run_cli("--config", REINFORCE, "actor.policy_loss=cispo", "actor.cispo.eps_high=0.1", "actor.ppo_epochs=2",
                   "trainer.total_steps=2", "trainer.val_every=0", "trainer.save_every=0",
                   f"trainer.output_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(math.isfinite(r["actor/pg_loss"]) for r in rows)
    assert {"actor/pg_clipfrac", "actor/ppo_kl"} <= set(rows[-1]) and "actor/pg_clipfrac_lower" not in rows[-1]
