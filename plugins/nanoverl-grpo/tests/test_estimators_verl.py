"""gdpo, gpg, optimal_token_baseline and remax equal verl 0.9.1's estimators on recorded random padded batches.

tests/data/verl_estimator_cases.json holds verl's answers (scripts/make_verl_estimator_cases.py writes it
from an importable verl), so this runs without verl.
"""

import json
from pathlib import Path

import pytest
import torch

from nanoverl_grpo.estimators import (compute_gdpo_advantages, compute_gpg_advantages,
                                      compute_optimal_token_baseline_advantages, compute_remax_advantages)

ROOT = Path(__file__).resolve().parents[3]
CASES = json.loads((ROOT / "tests" / "data" / "verl_estimator_cases.json").read_text())


def as_t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def nanoverl(case) -> tuple[torch.Tensor, torch.Tensor]:
    x, name = case["inputs"], case["name"]
    mask, rewards = as_t(x["mask"]), as_t(x["token_level_rewards"])
    if name == "gdpo":
        if case["settings"]["fallback"]:  # verl without reward keys: the one score
            return compute_gdpo_advantages(rewards.sum(-1, keepdim=True), [1.0], mask, x["uid"])
        return compute_gdpo_advantages(as_t(x["component_scores"]), x["weights"], mask, x["uid"])
    if name == "gpg":
        return compute_gpg_advantages(rewards, mask, x["uid"])
    if name == "remax":
        return compute_remax_advantages(rewards, as_t(x["reward_baselines"]), mask)
    weights = as_t(x["rollout_is_weights"]) if "rollout_is_weights" in x else None
    return compute_optimal_token_baseline_advantages(rewards, mask, x["uid"], as_t(x["old_log_probs"]),
                                                     as_t(x["sum_pi_squared"]), weights, **case["settings"])


def test_the_cases_cover_every_estimator_and_variant():
    assert CASES["verl"].startswith("verl 0.9.1")
    names = [c["name"] for c in CASES["cases"]]
    assert set(names) == {"gdpo", "gpg", "optimal_token_baseline", "remax"}
    remax = [c for c in CASES["cases"] if c["name"] == "remax"]
    assert {c["settings"]["token_rewards"] for c in remax} == {False, True}
    assert all((as_t(c["inputs"]["token_level_rewards"])[as_t(c["inputs"]["mask"]) == 0] != 0).any()
               for c in remax)   # garbage on the rewards' padding
    otb = [c for c in CASES["cases"] if c["name"] == "optimal_token_baseline"]
    assert {(("rollout_is_weights" in c["inputs"]), c["settings"]["handle_zero_tail"]) for c in otb} == \
        {(False, False), (False, True), (True, False), (True, True)}
    assert {len(c["inputs"]["weights"]) for c in CASES["cases"] if c["name"] == "gdpo"} == {1, 2, 3, 4}


@pytest.mark.parametrize("index", range(len(CASES["cases"])),
                         ids=[f"{c['name']}-{i}" for i, c in enumerate(CASES["cases"])])
def test_estimators_equal_verl(index):
    case = CASES["cases"][index]
    mask = as_t(case["inputs"]["mask"])
    adv, ret = nanoverl(case)
    # verl leaves values outside the mask (optimal_token_baseline's returns); nanoverl writes 0 there
    torch.testing.assert_close(adv, as_t(case["advantages"]) * mask, rtol=0, atol=1e-6)
    torch.testing.assert_close(ret, as_t(case["returns"]) * mask, rtol=0, atol=1e-6)
    assert (adv[mask == 0] == 0).all() and (ret[mask == 0] == 0).all()
    if case["name"] == "remax":     # right-padded: verl's own outputs are 0 on the padding as well
        torch.testing.assert_close(adv, as_t(case["advantages"]), rtol=0, atol=1e-6)
        torch.testing.assert_close(ret, as_t(case["returns"]), rtol=0, atol=1e-6)
