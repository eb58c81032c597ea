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
from nanoverl_grpo.estimators import (compute_gdpo_advantages, compute_gpg_advantages, compute_grpo_advantages,
                                      compute_grpo_passk_advantages, compute_opo_advantages,
                                      compute_optimal_token_baseline_advantages,
                                      compute_reinforce_plus_plus_baseline_advantages, compute_remax_advantages,
                                      compute_rloo_advantages)
from nanoverl_grpo.settings import GroupNormSettings, OptimalTokenBaselineSettings


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
    assert set(seen) == {"grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline", "opo", "grpo_passk", "gdpo",
                         "gpg", "optimal_token_baseline", "remax"}
    rows = batch([0, 1, 3, 4])
    rows["old_log_probs"], rows["sum_pi_squared"] = torch.full((4, 3), -0.5), torch.full((4, 3), 0.4)
    rows["reward_baselines"] = torch.zeros(4)   # remax's (scores only at the last token: returns = advantages)
    for name, target in seen.items():
        assert isinstance(target, str), name  # lazy: imported only when selected
        module, _, attr = target.partition(":")
        fn = getattr(importlib.import_module(module), attr)
        adv, ret = fn(rows, AlgorithmConfig())
        assert adv.shape == (4, 3) and (torch.equal(adv, ret) or name == "optimal_token_baseline"), name


def test_group_settings_are_read_from_the_config_table_and_validated():
    from nanoverl_core import ConfigError, load_config, load_registry

    debug = Path(__file__).resolve().parents[3] / "examples" / "configs" / "debug_reinforce.toml"
    cfg = load_config(debug, ["algorithm.advantage_estimator=grpo", "algorithm.grpo.norm_by_std=false"],
                      registry=load_registry())
    assert cfg.algorithm.settings == GroupNormSettings(norm_by_std=False)
    assert load_registry().entry("advantage_estimator", "grpo").provider == "nanoverl-grpo"
    with pytest.raises(ConfigError, match="config key 'algorithm.grpo.epsilon': 0.0 is not a finite number > 0"):
        load_config(debug, ["algorithm.advantage_estimator=grpo", "algorithm.grpo.epsilon=0"], registry=load_registry())
    with pytest.raises(ConfigError, match="takes no settings"):
        load_config(debug, ["algorithm.advantage_estimator=rloo", "algorithm.rloo.epsilon=1"], registry=load_registry())


# ---- gpg ---------------------------------------------------------------------------------------------
def test_gpg_scales_the_group_centred_score_by_the_share_of_non_zero_scores():
    # scores 2, 1, 0.5, 0, 0, 1, 0, 1: five are not 0 -> alpha = 8 / 5 = 1.6
    # score - group mean (as rloo's table above): 1, 2/3, 0.5 (alone), -1/3, -1, 0 (all equal), -1/3, 0
    check(estimators.gpg(batch(), AlgorithmConfig()), [1.6, 1.6 * 2 / 3, 0.8, -1.6 / 3, -1.6, 0.0, -1.6 / 3, 0.0])
    # rows 0, 3, 4, 6: scores 2, 0, 0, 0, one non-zero -> alpha 4; q2 centred +-1, q1 (two zeros) all equal
    check(estimators.gpg(batch([0, 3, 4, 6]), AlgorithmConfig()), [4.0, 0.0, -4.0, 0.0], mask=MASK[[0, 3, 4, 6]])


def test_gpg_with_every_score_zero_gives_zero():
    adv, _ = compute_gpg_advantages(torch.zeros(4, 2), torch.ones(4, 2), ["a", "a", "b", "c"])
    assert (adv == 0).all()


# ---- gdpo --------------------------------------------------------------------------------------------
# rows: uid a, a, b, b with 2, 1, 2, 2 valid tokens (width 2); two rewards, weights 1 and 0.5
GDPO_MASK = torch.tensor([[1.0, 1], [1, 0], [1, 1], [1, 1]])
GDPO_SCORES = torch.tensor([[1.0, 3.0], [0.0, 1.0], [1.0, 4.0], [1.0, 0.0]])


def test_gdpo_normalises_each_reward_in_its_group_then_whitens_the_weighted_sum():
    # reward 1: a = {1, 0}: +-0.5 / sqrt(0.5) = +-1/sqrt 2; b = {1, 1} all equal: 0
    # reward 2: a = {3, 1}: +-1 / sqrt 2; b = {4, 0}: +-2 / sqrt 8 = +-1/sqrt 2
    # sum with weights 1, 0.5: k (3, -3, 1, -1), k = 1 / (2 sqrt 2). Over the 7 valid tokens
    # (3, 3, -3, 1, 1, -1, -1) k: mean 3k/7, unbiased var k^2 (31 - 9/7) / 6 = k^2 208/42, std 2.225393 k;
    # A = (x - 3/7) / 2.225393 (k cancels; epsilon and whitening's 1e-8 move the 7th digit)
    adv, ret = compute_gdpo_advantages(GDPO_SCORES, [1.0, 0.5], GDPO_MASK, ["a", "a", "b", "b"])
    check((adv, ret), [1.155493, -1.540658, 0.256777, -0.641941], mask=GDPO_MASK)


def test_gdpo_is_not_grpo_on_the_weighted_sum():
    # GRPO on the summed score 2.5, 0.5 | 3, 1 gives every row +-0.707 before whitening: the large
    # reward 2 decides alone; gdpo gives the a rows (where reward 1 differs) three times the b rows' advantage
    adv, _ = compute_gdpo_advantages(GDPO_SCORES, [1.0, 0.5], GDPO_MASK, ["a", "a", "b", "b"])
    summed = (GDPO_SCORES * torch.tensor([1.0, 0.5])).sum(-1, keepdim=True)
    grpo_then_whiten, _ = compute_gdpo_advantages(summed, [1.0], GDPO_MASK, ["a", "a", "b", "b"])
    assert not torch.allclose(adv, grpo_then_whiten, atol=1e-3)
    raw = adv[:, 0] * 2.225393 / (1 / (2 * 2 ** 0.5))  # undo the whitening's scale: k (3, -3, 1, -1) shifted
    torch.testing.assert_close(raw[0] - raw[1], 3 * (raw[2] - raw[3]), rtol=0, atol=1e-4)


def test_gdpo_groups_of_one_and_equal_groups_follow_grpo():
    # a group of one keeps its score (mean 0, std 1); reward 2 all equal in both groups: adds 0
    scores = torch.tensor([[2.0, 5.0], [1.0, 5.0], [0.0, 5.0], [4.0, 7.0]])
    mask = torch.ones(4, 1)
    adv, _ = compute_gdpo_advantages(scores, [1.0, 1.0], mask, ["a", "a", "a", "z"])
    # reward 1: a = {2, 1, 0}: mean 1, std 1 -> 1, 0, -1 (/(1 + 1e-6)); z alone: 4 / (1 + 1e-6)
    # reward 2: a all equal -> 0; z alone: 7 / (1 + 1e-6) -> row sums 1, 0, -1, 11 (1e-6 aside)
    # whitened over 4 tokens: mean 11/4, unbiased var (1 + 0 + 1 + 121 - 4 (11/4)^2) / 3 = 30.916667
    expected = (torch.tensor([1.0, 0.0, -1.0, 11.0]) - 2.75) / 30.916667 ** 0.5
    torch.testing.assert_close(adv[:, 0], expected, rtol=0, atol=2e-6)


def test_gdpo_reads_the_reward_components_from_the_batch():
    b = RLBatch.from_dict({"token_level_rewards": torch.zeros(4, 2), "loss_mask": GDPO_MASK,
                           "component_scores": GDPO_SCORES, "component_weights": torch.tensor([[1.0, 0.5]] * 4)},
                          non_tensors={"uid": ["a", "a", "b", "b"]})
    check(estimators.gdpo(b, AlgorithmConfig()), [1.155493, -1.540658, 0.256777, -0.641941], mask=GDPO_MASK)
    # without components (one reward): GRPO on the score, whitened over the tokens
    alone = RLBatch.from_dict({"token_level_rewards": REWARDS, "loss_mask": MASK}, non_tensors={"uid": UIDS})
    grpo, _ = compute_grpo_advantages(REWARDS, MASK, UIDS)
    from nanoverl_core.algos import masked_whiten
    check(estimators.gdpo(alone, AlgorithmConfig()), (masked_whiten(grpo, MASK) * MASK)[:, 0].tolist(), mask=MASK)


def test_gdpo_refuses_weights_that_do_not_match_the_components():
    with pytest.raises(ValueError, match="2 reward components but 1 weights"):
        compute_gdpo_advantages(GDPO_SCORES, [1.0], GDPO_MASK, ["a", "a", "b", "b"])


# ---- optimal token baseline -------------------------------------------------------------------------
# group g: row 0 (3 tokens, reward 1 on the last), row 1 (2 tokens, reward 0); row 2 alone (2 tokens,
# rewards 0.5 and 1.0 on its tokens). pi = exp(old_log_prob); w = 1 - 2 pi + sum pi^2.
#   row 0: pi 0.5, 0.5, 0.5 with sum pi^2 0.5  -> w 0.5, 0.5, 0.5 -> W 0.5, 1.0, 1.5
#   row 1: pi 0.25, 0.5 with sum pi^2 0.25, 0.5 -> w 0.75, 0.5     -> W 0.75, 1.25
# Padding holds garbage.
OTB_MASK = torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 1, 0]])
OTB_REWARDS = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 9.0], [0.5, 1.0, 9.0]])
OTB_OLD = torch.log(torch.tensor([[0.5, 0.5, 0.5], [0.25, 0.5, 0.9], [0.5, 0.5, 0.9]]))
OTB_SUM_SQ = torch.tensor([[0.5, 0.5, 0.5], [0.25, 0.5, 7.0], [0.5, 0.5, 7.0]])
OTB_UIDS = ["g", "g", "alone"]


def otb(weights=None, **settings):
    return compute_optimal_token_baseline_advantages(OTB_REWARDS, OTB_MASK, OTB_UIDS, OTB_OLD, OTB_SUM_SQ, weights,
                                                     **settings)


def test_optimal_token_baseline_weights_each_positions_baseline_by_the_path_variance():
    # returns (reward-to-go): row 0: 1, 1, 1; row 1: 0, 0; row 2: 1.5, 1.0
    # t0: B = (1 0.5 + 0 0.75) / 1.25 = 0.4; t1: B = (1 1.0 + 0) / 2.25 = 4/9; t2: only row 0 runs, and it
    # is the group's single longest row: B = 0 there (zero tail). Row 2 alone: B = 0, A = G.
    adv, ret = otb()
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1, 1], [0, 0, 0], [1.5, 1.0, 0]]), rtol=0, atol=0)
    torch.testing.assert_close(adv, torch.tensor([[0.6, 5 / 9, 1.0], [-0.4, -4 / 9, 0], [1.5, 1.0, 0]]),
                               rtol=0, atol=1e-6)


def test_optimal_token_baseline_without_the_zero_tail_rule_uses_the_longest_row_alone():
    # t2: B = 1 1.5 / (1.5 + 1e-8) -> A ~ 0
    adv, _ = otb(handle_zero_tail=False)
    torch.testing.assert_close(adv[0], torch.tensor([0.6, 5 / 9, 0.0]), rtol=0, atol=1e-6)


def test_optimal_token_baseline_scales_the_path_variance_by_the_squared_is_weight():
    # row 1's weight 2 at t0: w = 0.75 4 = 3 -> W 3, 3.5; t0: B = 0.5 / 3.5; t1: B = 1 / 4.5
    weights = torch.tensor([[1.0, 1, 1], [2, 1, 5], [1, 1, 5]])
    adv, _ = otb(weights)
    torch.testing.assert_close(adv[:2, :2], torch.tensor([[1 - 1 / 7, 1 - 2 / 9], [-1 / 7, -2 / 9]]),
                               rtol=0, atol=1e-6)


def test_optimal_token_baseline_keeps_the_tail_baseline_when_two_rows_tie_for_the_longest():
    mask = torch.ones(2, 2)
    rewards = torch.tensor([[0.0, 1.0], [0.0, 3.0]])
    adv, _ = compute_optimal_token_baseline_advantages(rewards, mask, ["g", "g"], torch.log(torch.full((2, 2), 0.5)),
                                                       torch.full((2, 2), 0.5), None)
    # every w = 0.5, W = 0.5, 1.0 on both rows: B = the plain mean 2 at both positions
    torch.testing.assert_close(adv, torch.tensor([[-1.0, -1.0], [1.0, 1.0]]), rtol=0, atol=1e-6)


def test_optimal_token_baseline_reads_the_policy_statistics_from_the_batch():
    b = RLBatch.from_dict({"token_level_rewards": OTB_REWARDS, "loss_mask": OTB_MASK, "old_log_probs": OTB_OLD,
                           "sum_pi_squared": OTB_SUM_SQ}, non_tensors={"uid": OTB_UIDS})
    config = AlgorithmConfig()
    config.settings = OptimalTokenBaselineSettings(handle_zero_tail=False)
    torch.testing.assert_close(estimators.optimal_token_baseline(b, config), otb(handle_zero_tail=False))
    b["rollout_is_weights"] = torch.tensor([[1.0, 1, 1], [2, 1, 5], [1, 1, 5]])
    torch.testing.assert_close(estimators.optimal_token_baseline(b, AlgorithmConfig()), otb(b["rollout_is_weights"]))
    assert estimators.optimal_token_baseline.requires_sum_pi_squared


# ---- remax -------------------------------------------------------------------------------------------
# greedy baselines per prompt: q2 0.5, q1 1.0, q3 0.0, q5 2.0
REMAX_BASELINES = {"q2": 0.5, "q1": 1.0, "q3": 0.0, "q5": 2.0}


def test_remax_is_the_reward_to_go_minus_the_greedy_baseline_on_valid_tokens():
    b = batch()
    b["reward_baselines"] = torch.tensor([REMAX_BASELINES[u] for u in UIDS])
    adv, ret = estimators.remax(b, AlgorithmConfig())
    # reward-to-go of row 0: [0.5 - 0.5 + 2, -0.5 + 2, 2] = [2, 1.5, 2]; row 2: [0.5, 0.5, pad]; row 7: [1, 1, 1]
    want_ret = torch.tensor([[2.0, 1.5, 2.0], [1, 0, 0], [0.5, 0.5, 0], [0, 0, 0],
                             [0, 0, 0], [1, 0, 0], [0, 0, 0], [1, 1, 1]])
    want_adv = torch.tensor([[1.5, 1.0, 1.5], [0, 0, 0], [0.5, 0.5, 0], [-1, -1, -1],
                             [-0.5, -0.5, 0], [-1, 0, 0], [-1, -1, 0], [-1, -1, -1]])
    torch.testing.assert_close(ret, want_ret, rtol=0, atol=1e-6)
    torch.testing.assert_close(adv, want_adv, rtol=0, atol=1e-6)
    assert estimators.remax.requires_greedy_baseline


def test_remax_ignores_rewards_on_masked_tokens_and_keeps_the_reward_to_go_across_a_hole():
    rewards = torch.tensor([[1.0, 5.0, 2.0, 9.0], [7.0, 3.0, 0.0, 4.0]])   # 9, 7, 4 sit on masked tokens
    mask = torch.tensor([[1.0, 0, 1, 0], [0, 1, 0, 0]])
    adv, ret = compute_remax_advantages(rewards, torch.tensor([0.5, 2.0]), mask)
    # masked rewards [1, 0, 2, 0] -> reward-to-go [3, 2, 2, 0]; [0, 3, 0, 0] -> [3, 3, 0, 0] (verl's formula:
    # the baseline only where the mask is 1, the reward-to-go of a masked token before the end is kept)
    torch.testing.assert_close(ret, torch.tensor([[3.0, 2, 2, 0], [3, 3, 0, 0]]), rtol=0, atol=0)
    torch.testing.assert_close(adv, torch.tensor([[2.5, 2, 1.5, 0], [3, 1, 0, 0]]), rtol=0, atol=0)


def test_remax_refuses_multi_turn_episodes():
    from nanoverl_core import ConfigError
    from nanoverl_core.config import Config

    config = Config()
    estimators.remax.check_config(config)       # single-turn: fine
    config.environment.name = "guess_digit"
    with pytest.raises(ConfigError, match="'remax' needs a greedy single-turn baseline.*unset environment.name"):
        estimators.remax.check_config(config)


def test_distill_with_grpo_adds_the_group_advantages_times_task_weight_to_the_teacher_term():
    """[algorithm.distill] task_estimator = "grpo": per token coef (log teacher - log student) + task_weight times
    GRPO's row advantage (its default settings), on the shared batch: the group of one (q3) and the all-equal
    group (q5, GRPO 0) included; padding stays 0."""
    from nanoverl_core.algos.distill import Distill
    from nanoverl_core.algos.distill_settings import DistillSettings

    old = -torch.arange(24, dtype=torch.float32).reshape(8, 3) / 10            # log student: 0, -0.1, ..., -2.3
    teacher = old + torch.tensor([0.5, -0.25, 1.0])                             # per position +0.5, -0.25, +1
    config = AlgorithmConfig()
    config.settings = DistillSettings(coef=2.0, task_estimator="grpo", task_weight=0.5)
    b = batch()
    b["old_log_probs"], b["teacher_log_probs"] = old, teacher
    adv, ret = Distill(estimators.grpo)(b, config)
    grpo_rows = torch.tensor([0.707106, 1.154699, 0.4999995, -0.577349, -0.707106, 0.0, -0.577349, 0.0])
    expected = (2.0 * torch.tensor([0.5, -0.25, 1.0]) + 0.5 * grpo_rows[:, None]) * MASK
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(ret, grpo_rows[:, None] * MASK, rtol=0, atol=1e-6)   # GRPO's returns
    assert adv[5].tolist() == [1.0, 0.0, 0.0]                                   # q5: the teacher term alone
