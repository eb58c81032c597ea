"""Hand-computed advantages for every group-relative estimator.

The shared batch: 8 rows, response length 3, string uids in shuffled order.

    row  uid  valid tokens  token_level_rewards    score   group
    0    q2   3             [0.5, -0.5, 2.0]       2.0     q2 = {2, 0}
    1    q1   1             [1.0, pad, pad]        1.0     q1 = {1, 0, 0}
    2    q3   2             [0.0, 0.5, pad]        0.5     q3 = {0.5}      (group of one)
    3    q1   3             [0.0, 0.0, 0.0]        0.0
    4    q2   2             [0.0, 0.0, pad]        0.0
    5    q5   1             [1.0, pad, pad]        1.0     q5 = {1, 1}     (all equal)
    6    q1   2             [0.0, 0.0, pad]        0.0
    7    q5   3             [0.0, 0.0, 1.0]        1.0

Group statistics: q1 mean 1/3, unbiased std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3) = 0.577350;
q2 mean 1, std sqrt((1 + 1) / 1) = sqrt(2). Scores are the sum of the row's token rewards.
"""

from pathlib import Path

import pytest
import torch

from nanoverl_core.batch import RLBatch
from nanoverl_core.config import AlgorithmConfig
from nanoverl_grpo import estimators
from nanoverl_grpo.estimators import (compute_grpo_advantages, compute_grpo_passk_advantages,
                                      compute_opo_advantages, compute_reinforce_plus_plus_baseline_advantages,
                                      compute_rloo_advantages)
from nanoverl_grpo.settings import GroupNormSettings


def grouped(**settings) -> AlgorithmConfig:
    """The [algorithm] section with [algorithm.grpo] (or grpo_passk) settings, as a loaded config has it."""
    config = AlgorithmConfig()
    config.settings = GroupNormSettings(**settings)
    return config


UIDS = ["q2", "q1", "q3", "q1", "q2", "q5", "q1", "q5"]
LENGTHS = torch.tensor([3, 1, 2, 3, 2, 1, 2, 3])
MASK = (torch.arange(3) < LENGTHS[:, None]).float()  # (8, 3)
REWARDS = torch.tensor([[0.5, -0.5, 2.0], [1.0, 0, 0], [0.0, 0.5, 0], [0.0, 0, 0],
                        [0.0, 0, 0], [1.0, 0, 0], [0.0, 0, 0], [0.0, 0, 1.0]])


def batch(rows=tuple(range(8))):
    idx = list(rows)
    return RLBatch.from_dict({"token_level_rewards": REWARDS[idx], "loss_mask": MASK[idx]},
                             non_tensors={"uid": [UIDS[i] for i in idx]})


def check(result, per_row, mask=MASK, tol=1e-6):
    """advantages == per-row scalar on valid tokens, 0 on padding; returns == advantages."""
    adv, ret = result
    expected = torch.tensor(per_row).unsqueeze(-1) * mask
    torch.testing.assert_close(adv, expected, rtol=0, atol=tol)
    torch.testing.assert_close(ret, adv, rtol=0, atol=0)
    assert (adv[mask == 0] == 0).all()


def test_grpo_normalises_by_group_std():
    # q2: +-1 / (sqrt 2 + 1e-6) = +-0.707106 | q1: (2/3) / (0.577350 + 1e-6) = 1.154699, (-1/3) / ... = -0.577349
    # q3 alone: mean 0, std 1 -> 0.5 / (1 + 1e-6) = 0.4999995 | q5 all equal: 0
    cfg = AlgorithmConfig(advantage_estimator="grpo")
    check(estimators.grpo(batch(), cfg),
          [0.707106, 1.154699, 0.4999995, -0.577349, -0.707106, 0.0, -0.577349, 0.0])


def test_grpo_without_std_and_dr_grpo_subtract_the_group_mean_only():
    expected = [1.0, 2 / 3, 0.5, -1 / 3, -1.0, 0.0, -1 / 3, 0.0]  # score - group mean; q3 alone: score
    check(estimators.grpo(batch(), grouped(norm_by_std=False)), expected)
    check(estimators.dr_grpo(batch(), AlgorithmConfig()), expected)  # never divides by the std


def test_grpo_epsilon_comes_from_the_config():
    # q2 with epsilon 1: +-1 / (sqrt 2 + 1) = +-0.414214
    adv, _ = estimators.grpo(batch([0, 4]), grouped(epsilon=1.0))
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.414214, -0.414214]), rtol=0, atol=1e-6)


def test_all_equal_group_is_exactly_zero_even_when_the_mean_rounds():
    # seven scores of 0.1: their float32 mean is 0.1 + 7.5e-9; dividing that rounding error by
    # (std + epsilon) would give -0.0074 (verl does); an all-equal group carries no signal: exactly 0
    rewards = torch.full((7, 1), 0.1)
    for fn in (compute_grpo_advantages, compute_rloo_advantages, compute_opo_advantages):
        adv, _ = fn(rewards, torch.ones(7, 1), ["a"] * 7)
        assert (adv == 0).all(), fn.__name__


def test_rloo_uses_the_mean_of_the_other_samples():
    # q2: 2 - 0 = 2, 0 - 2 = -2 | q1: 1 - mean(0, 0) = 1, 0 - mean(1, 0) = -0.5 | q3 alone: 0.5 | q5: 0
    check(estimators.rloo(batch(), AlgorithmConfig()), [2.0, 1.0, 0.5, -0.5, -2.0, 0.0, -0.5, 0.0])


def test_reinforce_plus_plus_baseline_whitens_over_the_batch_tokens():
    # score - group mean per row: 1, 2/3, 0.5, -1/3, -1, 0, -1/3, 0, repeated over each row's valid
    # tokens (3+1+2+3+2+1+2+3 = 17 tokens): sum 1 -> mean 1/17; sum of squares 6.5 ->
    # unbiased var (6.5 - 1/17) / 16 = 0.402574, std 0.634487; A = (a - 1/17) / 0.634487
    check(estimators.reinforce_plus_plus_baseline(batch(), AlgorithmConfig()),
          [1.483366, 0.958007, 0.695328, -0.618069, -1.668787, -0.092710, -0.618069, -0.092710])


def test_opo_uses_a_length_weighted_baseline():
    # q1 lengths 1, 3, 2: b = (1*1 + 3*0 + 2*0) / 6 = 1/6 -> 5/6, -1/6, -1/6
    # q2 lengths 3, 2:    b = (3*2 + 2*0) / 5 = 1.2   -> 0.8, -1.2 | q3 alone: 0.5 | q5: 0
    check(estimators.opo(batch(), AlgorithmConfig()), [0.8, 5 / 6, 0.5, -1 / 6, -1.2, 0.0, -1 / 6, 0.0])


def test_grpo_passk_reinforces_only_the_best_response():
    rows = [0, 1, 3, 4, 5, 6, 7]  # without the group of one
    # q2: best row 0, (2 - 0) / (sqrt 2 + 1e-6) = 1.414213 | q1: best row 1, (1 - 0) / (0.577350 + 1e-6) = 1.732048
    # q5: tie for the best -> 1 - 1 = 0 | every other row 0
    check(estimators.grpo_passk(batch(rows), AlgorithmConfig()),
          [1.414213, 1.732048, 0.0, 0.0, 0.0, 0.0, 0.0], mask=MASK[rows])
    check(estimators.grpo_passk(batch(rows), grouped(norm_by_std=False)),
          [2.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0], mask=MASK[rows])


def test_grpo_passk_refuses_a_group_of_one():
    with pytest.raises(ValueError, match="'q3' has 1"):
        estimators.grpo_passk(batch(), AlgorithmConfig())


@pytest.mark.parametrize("fn", [compute_grpo_advantages, compute_rloo_advantages, compute_opo_advantages,
                                compute_grpo_passk_advantages])
def test_rows_of_a_group_need_not_be_adjacent(fn):
    # uids x, y alternate; each row's advantage equals the one computed with the rows sorted by group
    rewards = torch.tensor([[1.0], [0.0], [3.0], [1.0], [5.0], [2.0]])
    mask = torch.ones(6, 1)
    uids = ["x", "y", "x", "y", "x", "y"]
    perm = [0, 2, 4, 1, 3, 5]
    adv, _ = fn(rewards, mask, uids)
    adv_sorted, _ = fn(rewards[perm], mask, [uids[i] for i in perm])
    torch.testing.assert_close(adv[perm], adv_sorted)


def test_reinforce_plus_plus_baseline_matches_whitened_group_centering():
    adv, _ = compute_reinforce_plus_plus_baseline_advantages(REWARDS, MASK, UIDS)
    valid = adv[MASK.bool()]
    assert abs(valid.mean().item()) < 1e-6 and abs(valid.std().item() - 1.0) < 1e-6


def test_mismatched_uids_are_an_error():
    with pytest.raises(ValueError, match="8 rows but 2 uids"):
        compute_grpo_advantages(REWARDS, MASK, ["a", "b"])


def test_plugin_registers_every_estimator_lazily():
    import importlib

    import pluggy
    from nanoverl_core import hookspecs
    from nanoverl_grpo import plugin

    pm = pluggy.PluginManager(hookspecs.PROJECT)  # a fresh manager: the hook names must match the specs
    pm.add_hookspecs(hookspecs)
    pm.register(plugin, name="nanoverl-grpo")
    pm.check_pending()
    seen = {}
    pm.hook.register_advantage_estimators(register=lambda name, obj, *, description="", settings=None:
                                          seen.update({name: obj}))
    assert set(seen) == {"grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline", "opo", "grpo_passk"}
    for name, target in seen.items():
        assert isinstance(target, str), name  # lazy: imported only when selected
        module, _, attr = target.partition(":")
        fn = getattr(importlib.import_module(module), attr)
        adv, ret = fn(batch([0, 1, 3, 4]), AlgorithmConfig())
        assert adv.shape == (4, 3) and torch.equal(adv, ret), name


def test_group_settings_are_read_from_the_config_table_and_validated():
    from nanoverl_core import ConfigError, load_config, load_registry

    debug = Path(__file__).resolve().parents[3] / "examples" / "configs" / "debug_reinforce.toml"
    cfg = load_config(debug, ["algorithm.advantage_estimator=grpo", "algorithm.grpo.norm_by_std=false"],
                      registry=load_registry())
    assert cfg.algorithm.settings == GroupNormSettings(norm_by_std=False)
    assert load_registry().entry("advantage_estimator", "grpo").provider == "nanoverl-grpo"
    with pytest.raises(ConfigError, match="config key 'algorithm.grpo.epsilon': 'epsilon' must be > 0"):
        load_config(debug, ["algorithm.advantage_estimator=grpo", "algorithm.grpo.epsilon=0"], registry=load_registry())
    with pytest.raises(ConfigError, match="takes no settings"):
        load_config(debug, ["algorithm.advantage_estimator=rloo", "algorithm.rloo.epsilon=1"], registry=load_registry())
