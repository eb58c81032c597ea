"""Pinned numbers for the rollout-trainer mismatch metrics and correction (IS weights, rejection).

Hand-computed cases for every mode, padding and empty rows, and parity with verl 0.9's
rollout_corr_helper on the random batches in tests/data/verl_rollout_corr_cases.json (made by
scripts/make_verl_rollout_corr_cases.py).
"""

import json
import math
from pathlib import Path

import pytest
import torch

from nanoverl_core.algos.rollout_correction import (RolloutCorrection, compute_rollout_correction,
                                                    rollout_mismatch_metrics, truncated_sampling_warning)

CASES = json.loads((Path(__file__).parent / "data" / "verl_rollout_corr_cases.json").read_text())
NAN = float("nan")
P = "rollout_corr/"


def close(actual, expected, tol=1e-7):  # masked_mean adds 1e-8 to its count
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float64),
                               torch.as_tensor(expected, dtype=torch.float64), rtol=0, atol=tol)


# Two rows, three positions; row 1 has two valid tokens. Per-token ratios rho = pi_train / pi_rollout:
#   row 0: 2, 0.5, 3      (sequence ratio 3, geometric mean 3 ** (1/3))
#   row 1: 1, 4, (pad)    (sequence ratio 4, geometric mean 2)
RHO = [[2.0, 0.5, 3.0], [1.0, 4.0, 1.0]]
ROLLOUT = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, NAN]], dtype=torch.float64)
OLD = ROLLOUT + torch.tensor(RHO, dtype=torch.float64).log()
OLD[1, 2] = float("inf")  # padding may hold anything
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
LN2, LN3, LN4 = math.log(2), math.log(3), math.log(4)


def correct(**kwargs) -> RolloutCorrection:
    return compute_rollout_correction(OLD, ROLLOUT, MASK, **kwargs)


def k3(r):
    return r - 1 - math.log(r)


# ---- metrics ----------------------------------------------------------------------------------------
def test_mismatch_metrics_by_hand():
    m = rollout_mismatch_metrics(OLD, ROLLOUT, MASK)
    close(m[P + "kl_k1"], -(LN2 - LN2 + LN3 + 0 + LN4) / 5)
    close(m[P + "kl_k3"], (k3(2) + k3(0.5) + k3(3) + k3(1) + k3(4)) / 5)
    close(m[P + "chi2_token"], (4 + 0.25 + 9 + 1 + 16) / 5 - 1)
    close(m[P + "chi2_seq"], (9 + 16) / 2 - 1)
    close(m[P + "abs_diff_mean"], (LN2 + LN2 + LN3 + LN4) / 5)
    close(m[P + "abs_diff_max"], LN4)
    close(m[P + "seq_log_ratio_mean"], (LN3 + LN4) / 2)
    close(m[P + "seq_log_ratio_min"], LN3)
    close(m[P + "seq_log_ratio_max"], LN4)
    close(m[P + "log_ppl_diff"], -(LN3 / 3 + LN4 / 2) / 2)  # mean_t rollout - mean_t old, per row
    close(m[P + "training_ppl"], (math.exp(1 - LN3 / 3) + math.exp(2 - LN4 / 2)) / 2)
    close(m[P + "rollout_ppl"], (math.e + math.e ** 2) / 2)
    assert all(v.dim() == 0 and not v.requires_grad for v in m.values())


def test_correction_off_returns_metrics_and_the_mask_unchanged():
    out = correct()
    assert out.weights is None
    assert torch.equal(out.mask, MASK)
    assert set(out.metrics) == set(rollout_mismatch_metrics(OLD, ROLLOUT, MASK))


def test_padding_rows_and_nan_padding_change_nothing():
    pad_old = torch.cat([OLD, torch.full((1, 3), NAN, dtype=torch.float64)])
    pad_rollout = torch.cat([ROLLOUT, torch.full((1, 3), float("-inf"), dtype=torch.float64)])
    pad_mask = torch.cat([MASK, torch.zeros(1, 3, dtype=torch.float64)])
    kwargs = dict(is_level="sequence", is_threshold=3.5, rs_level="token", rs_threshold_high=2.5)
    base = correct(**kwargs)
    padded = compute_rollout_correction(pad_old, pad_rollout, pad_mask, **kwargs)
    assert base.metrics.keys() == padded.metrics.keys()
    for key, value in base.metrics.items():
        close(padded.metrics[key], value)
    close(padded.weights[:2], base.weights)
    assert (padded.weights[2] == 0).all() and (padded.mask[2] == 0).all()
    assert padded.weights[1, 2] == 0 and not padded.weights.isnan().any()


def test_all_padding_batch_gives_zeros_not_errors():
    zeros = torch.zeros(2, 3, dtype=torch.float64)
    out = compute_rollout_correction(zeros, torch.full_like(zeros, NAN), zeros, is_level="token",
                                     rs_level="geometric", rs_threshold_high=2.0, rs_kl="seq_max_k3",
                                     rs_kl_threshold=0.1)
    assert (out.weights == 0).all() and (out.mask == 0).all()
    for key, value in out.metrics.items():
        assert value == 0, key


# ---- importance weights -----------------------------------------------------------------------------
def test_token_tis_truncates_at_the_threshold():
    out = correct(is_level="token", is_threshold=2.5)
    close(out.weights, [[2.0, 0.5, 2.5], [1.0, 2.5, 0.0]])
    m = out.metrics
    close(m[P + "is_weight_mean"], 8.5 / 5)
    close(m[P + "is_weight_max"], 2.5)
    close(m[P + "is_weight_min"], 0.5)
    close(m[P + "is_token_frac_high"], 2 / 5)  # 3 and 4 were truncated
    close(m[P + "is_token_frac_low"], 0.0)  # nothing below 1 / 2.5
    close(m[P + "is_seq_frac_high"], 1.0)  # both rows hold a truncated token
    close(m[P + "is_ess"], 1.7 ** 2 / ((4 + 0.25 + 6.25 + 1 + 6.25) / 5), tol=1e-7)
    assert P + "is_token_frac_zeroed" not in m and P + "is_batch_norm_factor" not in m
    assert torch.equal(out.mask, MASK)  # IS alone rejects nothing


def test_sequence_weight_is_the_product_of_token_ratios():
    out = correct(is_level="sequence", is_threshold=3.5)
    close(out.weights, [[3.0, 3.0, 3.0], [3.5, 3.5, 0.0]])  # row 1: min(4, 3.5)
    close(out.metrics[P + "is_seq_frac_high"], 1 / 2)
    close(out.metrics[P + "is_token_frac_high"], 2 / 5)


def test_geometric_weight_is_the_geometric_mean():
    out = correct(is_level="geometric", is_threshold=1.8)
    g = 3 ** (1 / 3)
    close(out.weights, [[g, g, g], [1.8, 1.8, 0.0]])  # row 1: min(2, 1.8)
    close(out.metrics[P + "is_weight_mean"], (3 * g + 2 * 1.8) / 5)


def test_band_zeroes_weights_outside_it():
    out = correct(is_level="token", is_threshold=2.5, is_threshold_low=0.6)
    close(out.weights, [[2.0, 0.0, 0.0], [1.0, 0.0, 0.0]])  # 0.5 below, 3 and 4 above
    close(out.metrics[P + "is_token_frac_zeroed"], 3 / 5)
    close(out.metrics[P + "is_token_frac_low"], 1 / 5)
    close(out.metrics[P + "is_seq_frac_low"], 1 / 2)


def test_band_without_a_lower_bound_zeroes_only_large_weights():  # TRL's "token_mask" without clip_min
    out = correct(is_level="token", is_threshold=2.5, is_threshold_low=0.0)
    close(out.weights, [[2.0, 0.5, 0.0], [1.0, 0.0, 0.0]])
    close(out.metrics[P + "is_token_frac_zeroed"], 2 / 5)


def test_batch_normalisation_divides_by_the_mean_weight():
    token = correct(is_level="token", is_threshold=2.5, is_batch_normalize=True)
    close(token.weights, torch.tensor([[2.0, 0.5, 2.5], [1.0, 2.5, 0.0]], dtype=torch.float64) / 1.7)
    close(token.metrics[P + "is_batch_norm_factor"], 1.7)
    close(token.metrics[P + "is_weight_mean"], 1.7)  # metrics are before normalisation
    seq = correct(is_level="sequence", is_threshold=3.5, is_batch_normalize=True)
    close(seq.metrics[P + "is_batch_norm_factor"], (3 + 3.5) / 2)  # mean over sequences
    close(seq.weights, torch.tensor([[3.0, 3.0, 3.0], [3.5, 3.5, 0.0]], dtype=torch.float64) / 3.25)


def test_log_ratios_are_clamped_before_exp():
    old = torch.tensor([[0.0, 0.0]], dtype=torch.float64)
    rollout = torch.tensor([[-30.0, -30.0]], dtype=torch.float64)  # l = 30 per token, 60 per sequence
    mask = torch.ones(1, 2, dtype=torch.float64)
    for level in ("token", "sequence", "geometric"):
        out = compute_rollout_correction(old, rollout, mask, is_level=level, is_threshold=1e12)
        close(out.weights, [[math.exp(20)] * 2], tol=1e-3)
    m = rollout_mismatch_metrics(old, rollout, mask)
    assert math.isclose(m[P + "kl_k3"], math.exp(20) - 21, rel_tol=1e-7)
    close(m[P + "abs_diff_max"], 30.0)  # the diagnostics of |l| itself are not clamped


def test_weights_are_detached():
    old = OLD.clone().requires_grad_(True)
    out = compute_rollout_correction(old, ROLLOUT, MASK, is_level="token", rs_level="token", rs_threshold_high=2.5)
    assert not out.weights.requires_grad and not out.mask.requires_grad
    assert not any(v.requires_grad for v in out.metrics.values())


def test_dtypes_follow_the_inputs():
    out = compute_rollout_correction(OLD.float(), ROLLOUT.float(), MASK.bool(), is_level="token",
                                     rs_level="token", rs_threshold_high=2.5)
    assert out.weights.dtype == torch.float32 and out.mask.dtype == torch.bool
    assert out.mask.tolist() == [[True, True, False], [True, False, False]]


# ---- rejection -------------------------------------------------------------------------------------
def test_token_rejection_band():
    out = correct(rs_level="token", rs_threshold_high=2.5, rs_threshold_low=0.6)
    close(out.mask, [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    m = out.metrics
    close(m[P + "rs_token_frac"], 3 / 5)
    close(m[P + "rs_seq_frac"], 1.0)
    close(m[P + "rs_ratio_frac_high"], 2 / 5)
    close(m[P + "rs_ratio_frac_low"], 1 / 5)
    assert out.weights is None


def test_rejection_low_bound_defaults_to_the_reciprocal():
    close(correct(rs_level="token", rs_threshold_high=2.5).mask, [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # 0.5 > 0.4
    close(correct(rs_level="token", rs_threshold_high=1.9).mask, [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])  # 0.5 < 1/1.9


def test_sequence_and_geometric_rejection_drop_whole_rows():
    seq = correct(rs_level="sequence", rs_threshold_high=3.5)
    close(seq.mask, [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])  # ratio 3 kept, 4 rejected
    close(seq.metrics[P + "rs_seq_frac"], 1 / 2)
    close(seq.metrics[P + "rs_token_frac"], 2 / 5)
    close(seq.metrics[P + "rs_ratio_frac_high"], 1 / 2)  # a share of sequences at sequence level
    geo = correct(rs_level="geometric", rs_threshold_high=1.8)
    close(geo.mask, [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])  # 3 ** (1/3) kept, 2 rejected
    close(correct(rs_level="geometric", rs_threshold_high=1.3).mask, torch.zeros(2, 3))


def test_kl_rejection():
    # k2 = l^2 / 2: 0.24, 0.24, 0.60 | 0, 0.96
    close(correct(rs_kl="token_k2", rs_kl_threshold=0.3).mask, [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    # k3 = rho - 1 - log rho: 0.31, 0.19, 0.90 | 0, 1.61; row max 0.90 | 1.61, row mean 0.47 | 0.81
    close(correct(rs_kl="seq_max_k3", rs_kl_threshold=1.0).mask, [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    close(correct(rs_kl="seq_mean_k3", rs_kl_threshold=0.5).mask, [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    close(correct(rs_kl="seq_sum_k3", rs_kl_threshold=1.5).mask, [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    out = correct(rs_kl="token_k3", rs_kl_threshold=0.25)
    close(out.mask, [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    close(out.metrics[P + "rs_kl_frac_high"], 3 / 5)


def test_criteria_combine_and_weights_ignore_rejection():
    out = correct(is_level="token", is_threshold=2.5, rs_level="sequence", rs_threshold_high=3.5,
                  rs_kl="token_k2", rs_kl_threshold=0.3)
    close(out.mask, [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])  # row 1 by the band, (0, 2) by k2
    close(out.weights, correct(is_level="token", is_threshold=2.5).weights)  # on the original mask
    close(out.metrics[P + "rs_token_frac"], 3 / 5)
    close(out.metrics[P + "rs_seq_frac"], 1.0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(is_level="tokens"), "is_level"),
    (dict(rs_level="seq"), "rs_level"),
    (dict(rs_kl="seq_mean_k1"), "rs_kl"),
    (dict(is_level="token", is_threshold=0.0), "is_threshold"),
    (dict(is_level="token", is_threshold=2.0, is_threshold_low=3.0), "is_threshold_low"),
    (dict(rs_level="token"), "rs_threshold_high"),
    (dict(rs_level="token", rs_threshold_high=2.0, rs_threshold_low=2.5), "rs_threshold_low"),
    (dict(rs_kl="token_k3"), "rs_kl_threshold"),
])
def test_bad_settings_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        correct(**kwargs)


def test_shapes_must_agree():
    with pytest.raises(ValueError, match="must all be"):
        compute_rollout_correction(OLD, ROLLOUT[:, :2], MASK)


# ---- truncated sampling ----------------------------------------------------------------------------
def test_truncated_sampling_warning():
    assert truncated_sampling_warning() is None
    assert truncated_sampling_warning(top_p=1.0, top_k=-1) is None  # vLLM's old "off"
    for kwargs, knob in [(dict(top_p=0.9), "top_p=0.9"), (dict(top_k=50), "top_k=50"), (dict(min_p=0.05), "min_p")]:
        text = truncated_sampling_warning(**kwargs)
        assert knob in text and "\n" not in text


# ---- parity with verl 0.9 --------------------------------------------------------------------------
K1_LEVELS = {"token_k1": "token", "seq_sum_k1": "sequence", "seq_mean_k1": "geometric"}


def nanoverl_kwargs(config: dict) -> dict:
    """verl's algorithm.rollout_correction settings as compute_rollout_correction keyword arguments."""
    kwargs = {}
    if config["rollout_is"] is not None:
        threshold = str(config["rollout_is_threshold"])
        low, high = threshold.split("_") if "_" in threshold else (None, threshold)
        kwargs.update(is_level=config["rollout_is"], is_threshold=float(high),
                      is_threshold_low=None if low is None else float(low),
                      is_batch_normalize=config["rollout_is_batch_normalize"])
    if config["rollout_rs"] is not None:
        options = config["rollout_rs"].split(",")
        specs = str(config["rollout_rs_threshold"]).split(",")
        specs = specs * len(options) if len(specs) == 1 else specs  # verl broadcasts a single threshold
        for option, spec in zip(options, specs):
            if option in K1_LEVELS:  # verl bounds pi_rollout / pi_train: invert (lower, upper)
                lower, upper = map(float, spec.split("_")) if "_" in spec else (1 / float(spec), float(spec))
                kwargs.update(rs_level=K1_LEVELS[option], rs_threshold_high=1 / lower, rs_threshold_low=1 / upper)
            else:
                kwargs.update(rs_kl=option, rs_kl_threshold=float(spec))
    return kwargs


def verl_metric_pairs(case: dict) -> dict[str, str]:
    """nanoverl metric -> verl metric, for the pairs defined identically on this case."""
    config, full_rows = case["config"], not case["has_empty_row"]
    pairs = {"kl_k1": "kl", "chi2_token": "chi2_token"}
    if full_rows:
        pairs.update(chi2_seq="chi2_seq", log_ppl_diff="log_ppl_diff", training_ppl="training_ppl",
                     rollout_ppl="rollout_ppl")
    valid = torch.tensor(case["response_mask"]).bool()
    log_ratio = torch.tensor(case["old_log_prob"]) - torch.tensor(case["rollout_log_prob"])
    if log_ratio[valid].abs().max() <= 20:  # verl's k3_kl does not clamp
        pairs["kl_k3"] = "k3_kl"
    level = config["rollout_is"]
    if level is not None:
        pairs.update(is_weight_mean="rollout_is_mean", is_ess="rollout_is_eff_sample_size")
        if level == "token":
            pairs.update(is_weight_max="rollout_is_max", is_weight_min="rollout_is_min",
                         is_token_frac_high="rollout_is_ratio_fraction_high",
                         is_token_frac_low="rollout_is_ratio_fraction_low")
        elif full_rows:
            pairs.update(is_seq_frac_high="rollout_is_seq_fraction_high",
                         is_seq_frac_low="rollout_is_seq_fraction_low")
        if "_" in str(config["rollout_is_threshold"]):
            pairs["is_token_frac_zeroed"] = "rollout_is_oob_ratio"
        if config["rollout_is_batch_normalize"]:
            pairs["is_batch_norm_factor"] = "rollout_is_batch_norm_factor"
    if config["rollout_rs"] is not None:
        pairs["rs_token_frac"] = "rollout_rs_masked_fraction"
        if full_rows:
            pairs["rs_seq_frac"] = "rollout_rs_seq_masked_fraction"
        for option in config["rollout_rs"].split(","):
            if option in K1_LEVELS:  # verl's k1 statistic is -log rho: its "high" is our "low"
                pairs["rs_ratio_frac_high"] = f"rollout_rs_{option}_fraction_low"
                pairs["rs_ratio_frac_low"] = f"rollout_rs_{option}_fraction_high"
            else:
                pairs["rs_kl_frac_high"] = f"rollout_rs_{option}_fraction_high"
    return pairs


def test_golden_file_covers_every_mode():
    assert len(CASES["cases"]) >= 40 and "v0.9" in CASES["verl_ref"]
    levels = {nanoverl_kwargs(c["config"]).get("is_level") for c in CASES["cases"]}
    options = {o for c in CASES["cases"] if c["config"]["rollout_rs"] for o in c["config"]["rollout_rs"].split(",")}
    assert {None, "token", "sequence"} <= levels and len(options) == 11  # every verl 0.9 rejection option


@pytest.mark.parametrize("case", CASES["cases"], ids=lambda c: c["name"])
def test_matches_verl(case):
    old, rollout = (torch.tensor(case[k], dtype=torch.float64) for k in ("old_log_prob", "rollout_log_prob"))
    mask = torch.tensor(case["response_mask"], dtype=torch.float64)
    valid = mask.bool()
    out = compute_rollout_correction(old, rollout, mask, **nanoverl_kwargs(case["config"]))

    assert out.mask.tolist() == torch.tensor(case["mask"], dtype=torch.float64).tolist()
    if case["weights"] is None:
        assert out.weights is None
    else:
        close(out.weights[valid], torch.tensor(case["weights"], dtype=torch.float64)[valid], tol=1e-6)
        assert (out.weights[~valid] == 0).all()
    for ours, theirs in verl_metric_pairs(case).items():
        expected = float(case["metrics"][P + theirs])
        torch.testing.assert_close(out.metrics[P + ours].double(), torch.tensor(expected, dtype=torch.float64),
                                   rtol=1e-6, atol=1e-6, msg=lambda m: f"{ours} vs verl {theirs}: {m}")
