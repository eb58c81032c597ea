"""Pinned numbers for the KL estimators, the KL controllers and the in-reward KL penalty."""

import json
import math

import pytest
import torch

from nanoverl_core.algos import (AdaptiveKLController, FixedKLController, apply_kl_penalty, kl_penalty,
                                 make_kl_controller)
from nanoverl_core.config import AlgorithmConfig


def close(actual, expected, tol=1e-6):
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float32),
                               torch.as_tensor(expected, dtype=torch.float32), rtol=0, atol=tol)


# log_ratio = log_prob - ref_log_prob = [1, 0, -2]
LOG_PROB = torch.tensor([[0.0, -1.0, -2.0]])
REF = torch.tensor([[-1.0, -1.0, 0.0]])


@pytest.mark.parametrize("kinds, expected", [
    (("k1", "kl"), [1.0, 0.0, -2.0]),           # log_ratio
    (("abs",), [1.0, 0.0, 2.0]),                # |log_ratio|
    (("k2", "mse"), [0.5, 0.0, 2.0]),           # 0.5 * log_ratio^2
    # exp(r) - r - 1 with r = -log_ratio = [-1, 0, 2]: e^-1 + 1 - 1 = 0.367879, 0, e^2 - 3 = 4.389056
    (("k3", "low_var_kl"), [0.367879, 0.0, 4.389056]),
])
def test_kl_estimator_values(kinds, expected):
    for kind in kinds:
        close(kl_penalty(LOG_PROB, REF, kind), [expected])


def test_k3_is_clamped_for_extreme_log_ratios():
    # r = clamp(-log_ratio, -20, 20): +-100 -> -+20, e^20 - 21 and e^-20 + 19 both clamp to 10;
    # log_ratio = -3 gives e^3 - 4 = 16.09, also clamped to 10.
    out = kl_penalty(torch.tensor([[100.0, -100.0, -3.0]]), torch.zeros(1, 3), "k3")
    close(out, [[10.0, 10.0, 10.0]])


@pytest.mark.parametrize("kind", ["k1+", "abs+", "k3+", "low_var_kl+", "k2+"])
def test_plus_variants_keep_the_value_and_take_the_k2_gradient(kind):
    log_prob = LOG_PROB.clone().requires_grad_(True)
    value = kl_penalty(log_prob, REF, kind)
    close(value, kl_penalty(LOG_PROB, REF, kind.removesuffix("+")))
    (grad,) = torch.autograd.grad(value.sum(), log_prob)
    close(grad, [[1.0, 0.0, -2.0]])  # d(0.5 * log_ratio^2) / d log_prob = log_ratio


def test_plain_k1_gradient_is_one():
    log_prob = LOG_PROB.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(kl_penalty(log_prob, REF, "k1").sum(), log_prob)
    close(grad, [[1.0, 1.0, 1.0]])


def test_unknown_kl_estimator_is_an_error():
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'"):
        kl_penalty(LOG_PROB, REF, "k4")


# ---- controllers ------------------------------------------------------------------------------------
def test_fixed_controller_never_moves():
    ctrl = FixedKLController(0.05)
    ctrl.update(current_kl=123.0, n_steps=1000)
    assert ctrl.value == 0.05
    assert json.loads(json.dumps(ctrl.state_dict())) == {"value": 0.05}


def test_adaptive_controller_proportional_update():
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=1.0, horizon=10)
    ctrl.update(current_kl=1.5, n_steps=5)  # error clip(0.5, -0.2, 0.2) = 0.2 -> x (1 + 0.2 * 5 / 10) = x 1.1
    assert ctrl.value == pytest.approx(0.11, abs=1e-12)
    ctrl.update(current_kl=0.9, n_steps=10)  # error -0.1 -> x (1 - 0.1 * 10 / 10) = x 0.9
    assert ctrl.value == pytest.approx(0.099, abs=1e-12)


def test_adaptive_controller_state_round_trips_through_json():
    a = AdaptiveKLController(0.1, 1.0, 10)
    a.update(3.0, 4)
    b = AdaptiveKLController(0.1, 1.0, 10)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    for ctrl in (a, b):
        ctrl.update(0.5, 7)
    assert a.value == b.value


def test_make_kl_controller_from_algorithm_config():
    fixed = make_kl_controller(AlgorithmConfig(kl_coef=0.2))
    assert isinstance(fixed, FixedKLController) and fixed.value == 0.2
    adaptive = make_kl_controller(AlgorithmConfig(kl_ctrl="adaptive", kl_coef=0.3, target_kl=2.0, kl_horizon=50))
    assert isinstance(adaptive, AdaptiveKLController)
    assert (adaptive.value, adaptive.target, adaptive.horizon) == (0.3, 2.0, 50)
    with pytest.raises(ValueError, match="horizon"):
        make_kl_controller(AlgorithmConfig(kl_ctrl="adaptive", kl_horizon=0))


# ---- in-reward penalty ------------------------------------------------------------------------------
SCORES = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
OLD = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, math.nan]])  # NaN on padding must not leak
REF_LP = torch.tensor([[-1.5, -1.0, -0.5], [-1.0, -2.0, -9.0]])
MASK = torch.tensor([[1.0, 1, 1], [1, 1, 0]])


def test_apply_kl_penalty_subtracts_beta_times_kl_on_valid_tokens():
    # k1 = old - ref = [[0.5, 0, -0.5], [-1, 0, (pad)]]; beta = 0.1
    rewards, metrics = apply_kl_penalty(SCORES, OLD, REF_LP, MASK, FixedKLController(0.1), "k1")
    close(rewards, [[-0.05, 0.0, 1.05], [0.1, 2.0, 0.0]])
    # sequence KLs: 0 / 3 = 0 and -1 / 2 = -0.5; batch KL = their mean
    assert metrics == pytest.approx({"actor/reward_kl_penalty": -0.25, "actor/reward_kl_penalty_coeff": 0.1})


def test_apply_kl_penalty_updates_the_controller_after_using_its_value():
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=1.0, horizon=4)
    rewards, metrics = apply_kl_penalty(SCORES, OLD, REF_LP, MASK, ctrl, "k1")
    close(rewards[0, 0], -0.05)  # beta 0.1, the value before the update
    assert metrics["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1)
    # error clip(-0.25 / 1 - 1) = -0.2, n_steps = 2 rows: 0.1 * (1 - 0.2 * 2 / 4) = 0.09
    assert ctrl.value == pytest.approx(0.09, abs=1e-9)
