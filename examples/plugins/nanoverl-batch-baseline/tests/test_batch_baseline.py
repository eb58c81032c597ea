"""Hand-computed advantages for `batch_mean_baseline`.

The batch: 6 rows, response length 3; row 5 has no valid token (no score, left out of every mean).

    row  uid  valid  token_level_rewards   score s
    0    a    3      [0,  0,   1.0]         1.0
    1    a    2      [0,  0.5, pad]         0.5
    2    b    1      [2.0, pad, pad]        2.0
    3    b    3      [0,  0,   0]           0.0
    4    c    2      [0, -1.0, pad]        -1.0     (group of one)
    5    b    0      [pad, pad, pad]        -

Batch leave-one-out mean b_i = (2.5 - s_i) / 4:   0.375, 0.5, 0.125, 0.625, 0.875
Group leave-one-out mean g_i:                      0.5,   1.0, 0.0,   2.0,   0.875 (= b_4, no other row)
"""

import sys
from importlib.util import find_spec
from pathlib import Path

if find_spec("nanoverl_batch_baseline") is None:  # run from a checkout without installing: use ../src
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import pytest
import torch

from nanoverl_core import ConfigError, RLBatch, load_config, load_registry
from nanoverl_core.config import AlgorithmConfig
from nanoverl_core.plugins import Registry
from nanoverl_batch_baseline import plugin
from nanoverl_batch_baseline.settings import BatchBaselineSettings

DEBUG = Path(__file__).resolve().parents[4] / "examples" / "configs" / "debug_reinforce.toml"


def weighted(group_weight: float) -> AlgorithmConfig:
    """The [algorithm] section as nanoverl hands it over, with [algorithm.batch_mean_baseline] group_weight set."""
    config = AlgorithmConfig(advantage_estimator="batch_mean_baseline")
    config.settings = BatchBaselineSettings(group_weight=group_weight)
    return config
from nanoverl_batch_baseline.estimator import batch_mean_baseline, compute_batch_baseline_advantages

UIDS = ["a", "a", "b", "b", "c", "b"]
LENGTHS = torch.tensor([3, 2, 1, 3, 2, 0])
MASK = (torch.arange(3) < LENGTHS[:, None]).float()  # (6, 3)
REWARDS = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.5, 0.0], [2.0, 0.0, 0.0],
                        [0.0, 0.0, 0.0], [0.0, -1.0, 0.0], [0.0, 0.0, 0.0]])


def batch(rows=range(6)) -> RLBatch:
    idx = list(rows)
    return RLBatch.from_dict({"token_level_rewards": REWARDS[idx], "loss_mask": MASK[idx]},
                             non_tensors={"uid": [UIDS[i] for i in idx]})


def check(result, per_row, mask=MASK):
    """advantages == the per-row value on valid tokens and 0 on padding; returns == advantages."""
    advantages, returns = result
    expected = torch.tensor(per_row).unsqueeze(-1) * mask
    torch.testing.assert_close(advantages, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(returns, advantages, rtol=0, atol=0)
    assert (advantages[mask == 0] == 0).all()


def test_batch_baseline_is_score_minus_mean_of_the_other_rows():
    # s - b = [1 - 0.375, 0.5 - 0.5, 2 - 0.125, 0 - 0.625, -1 - 0.875]; row 5 has no token.
    check(batch_mean_baseline(batch(), AlgorithmConfig()), [0.625, 0.0, 1.875, -0.625, -1.875, 0.0])


def test_group_weight_one_is_the_leave_one_out_group_mean_with_batch_fallback():
    config = weighted(1.0)
    # s - g = [1 - 0.5, 0.5 - 1, 2 - 0, 0 - 2, -1 - 0.875]: row 4 is alone in its group, so b_4.
    check(batch_mean_baseline(batch(), config), [0.5, -0.5, 2.0, -2.0, -1.875, 0.0])


def test_group_weight_mixes_the_two_baselines():
    config = weighted(0.5)
    # baseline = (b + g) / 2 = [0.4375, 0.75, 0.0625, 1.3125, 0.875]
    check(batch_mean_baseline(batch(), config), [0.5625, -0.25, 1.9375, -1.3125, -1.875, 0.0])


def test_batch_advantages_are_the_centred_scores_scaled_by_n_over_n_minus_1():
    advantages, _ = compute_batch_baseline_advantages(REWARDS[:5], MASK[:5], UIDS[:5])
    scores = torch.tensor([1.0, 0.5, 2.0, 0.0, -1.0])
    torch.testing.assert_close(advantages.sum(-1) / LENGTHS[:5], 5 / 4 * (scores - scores.mean()))


def test_row_order_does_not_matter():
    order = [4, 2, 0, 5, 3, 1]
    expected = torch.tensor([0.5625, -0.25, 1.9375, -1.3125, -1.875, 0.0])[order]
    check(batch_mean_baseline(batch(order), weighted(0.5)),
          expected.tolist(), mask=MASK[order])


def test_a_single_row_keeps_its_score():
    check(batch_mean_baseline(batch([2]), AlgorithmConfig()), [2.0], mask=MASK[[2]])


@pytest.mark.parametrize("bad, needle", [("-0.1", "-0.1 is not a finite number in [0, 1]"),
                                         ("1.5", "1.5 is not a finite number in [0, 1]"),
                                         ("half", "expected float"), ("true", "expected float")])
def test_group_weight_outside_zero_one_is_a_config_error_naming_the_key(bad, needle):
    registry = load_registry()  # finds the plugin when it is pip-installed; from a checkout, register it here
    if "batch_mean_baseline" not in registry.names("advantage_estimator"):
        plugin.register_advantage_estimators(register=lambda name, obj, description="", settings=None: registry.add(
            "advantage_estimator", name, obj, "nanoverl-batch-baseline", description, settings))
    overrides = ["algorithm.advantage_estimator=batch_mean_baseline", f"algorithm.batch_mean_baseline.group_weight={bad}"]
    with pytest.raises(ConfigError, match="algorithm.batch_mean_baseline.group_weight") as err:
        load_config(DEBUG, overrides, registry=registry)
    assert needle in str(err.value)
    config = load_config(DEBUG, overrides[:1] + ["algorithm.batch_mean_baseline.group_weight=0.25"], registry=registry)
    assert config.algorithm.settings == BatchBaselineSettings(group_weight=0.25)


def test_plugin_registers_the_estimator_lazily():
    registry = Registry()
    plugin.register_advantage_estimators(
        register=lambda name, obj, description="", settings=None: registry.add("advantage_estimator", name, obj, "test",
                                                                              description, settings))
    assert registry.names("advantage_estimator") == ["batch_mean_baseline"]
    assert isinstance(registry.entry("advantage_estimator", "batch_mean_baseline").obj, str)  # imported on use
    assert registry.get("advantage_estimator", "batch_mean_baseline") is batch_mean_baseline
