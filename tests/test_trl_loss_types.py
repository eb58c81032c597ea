"""TRL's `loss_type` and `scale_rewards` in nanoverl: each "yes" row of the tables in
docs/from-verl-and-trl.md, run as written. The TRL side is this file's own implementation of the formula in
TRL 1.16's `GRPOTrainer._compute_loss` (one process, one optimizer step, no vLLM IS correction, no entropy
mask); the nanoverl side is the registered loss under the row's overrides, through `config_from_dict` and
`compute_actor_loss`, as the worker calls it. Loss values and gradients must agree to 1e-7 (relative) in
float64: nanoverl's seq-mean-token-mean divides by tokens + 1e-8, as verl does.
"""

from __future__ import annotations

import ast
import re

import pytest
import torch

from conftest import ROOT, first_party_registry

TRL_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
"""Every `loss_type` TRL 1.16's GRPOConfig accepts."""
PAGE = ROOT / "docs" / "from-verl-and-trl.md"
BASE = {"data": {"train_files": ["train.jsonl"]}}  # a config needs one; nothing here reads it


def table_rows(text: str) -> list[tuple[dict, list[str], bool, str]]:
    """(TRL kwargs, nanoverl overrides, equal?, the row's text) of every row whose first cell is a
    TRL setting in backticks (`name=value`)."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        trl = dict(re.findall(r"`([a-z_]+)=([^`]+)`", cells[0])) if len(cells) == 3 else {}
        if trl:
            kwargs = {k: ast.literal_eval(v) for k, v in trl.items()}
            rows.append((kwargs, re.findall(r"`([\w.]+=[^`]+)`", cells[1]), cells[2].startswith("yes"), line))
    return rows


ROWS = table_rows(PAGE.read_text())
LOSS_ROWS = [r for r in ROWS if "loss_type" in r[0]]
ADV_ROWS = [r for r in ROWS if "scale_rewards" in r[0]]


# ---- TRL 1.16's formulas, written from reading GRPOTrainer (no code copied) -----------------------------
def trl_loss(logp, old, adv, mask, ref, *, loss_type="dapo", epsilon=0.2, epsilon_high=None, delta=None, beta=0.0,
             importance_sampling_level="token", sapo_temperature_pos=1.0, sapo_temperature_neg=1.05,
             max_completion_length):
    """TRL's loss for (B, T) log-probs, old log-probs, ref log-probs and mask and (B,) advantages."""
    eps_high = epsilon if epsilon_high is None else epsilon_high
    a = adv[:, None]
    log_ratio = logp - old
    if importance_sampling_level == "sequence":
        log_w = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0))[:, None]  # (B, 1)
    else:
        log_w = log_ratio
    w = torch.exp(log_w)
    if loss_type == "cispo":
        per_token = -torch.clamp(w, max=eps_high).detach() * a * logp
    elif loss_type == "sapo":
        tau = torch.where(a > 0, torch.full_like(a, sapo_temperature_pos), torch.full_like(a, sapo_temperature_neg))
        per_token = -(torch.sigmoid(tau * (w - 1)) * 4 / tau) * a
    else:  # grpo, bnpo, dr_grpo, dapo, luspo: PPO's clip, and `delta` caps the unclipped ratio
        clipped = torch.clamp(w, 1 - epsilon, 1 + eps_high)
        capped = w if delta is None else torch.clamp(w, max=delta)
        per_token = -torch.minimum(capped * a, clipped * a)
    if beta:
        d = ref - logp
        per_token = per_token + beta * (torch.exp(d) - d - 1)
    masked = per_token * mask
    if loss_type in ("grpo", "sapo"):
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":
        return masked.sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return masked.sum() / (mask.shape[0] * max_completion_length)
    if loss_type in ("dapo", "cispo"):
        return masked.sum() / mask.sum().clamp(min=1.0)  # num_items_in_batch: one process, one step
    if loss_type == "luspo":
        return masked.sum(-1).mean()
    raise AssertionError(loss_type)


def trl_advantages(rewards: torch.Tensor, group: int, scale_rewards: str = "group") -> torch.Tensor:
    grouped = rewards.view(-1, group)
    advantages = (grouped - grouped.mean(1, keepdim=True)).view(-1)
    if scale_rewards == "group":
        advantages = advantages / (grouped.std(1).repeat_interleave(group) + 1e-4)
    return advantages


# ---- the checks ---------------------------------------------------------------------------------------
def _batch(seed: int, B: int = 8, T: int = 9):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).double()
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 1
    logp = (old + torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3).requires_grad_()
    ref = logp.detach() + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)  # k3 stays below 10
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return logp, old, adv, mask, ref


def _nanoverl_loss(overrides: list[str], logp, old, adv, mask, ref):
    from nanoverl_core.algos.losses import PolicyLossInputs, compute_actor_loss
    from nanoverl_core.config import config_from_dict

    registry = first_party_registry()
    config = config_from_dict(BASE, [*overrides, f"rollout.max_new_tokens={mask.shape[1]}"], registry=registry)
    actor = config.actor
    inputs = PolicyLossInputs(logp, old, adv[:, None] * mask, mask, loss_agg_mode=actor.loss_agg_mode,
                              loss_scale_factor=actor.loss_scale_factor or config.rollout.max_new_tokens)
    loss, _ = compute_actor_loss(registry.get("policy_loss", actor.policy_loss), inputs, actor,
                                 ref_log_prob=ref if actor.use_kl_loss else None)
    return loss


def test_the_table_covers_every_trl_loss_type_and_the_readme_links_it():
    """The table has one home, the docs page (tests/test_docs.py: no table row in two files); the README links it."""
    assert sorted({r[0]["loss_type"] for r in LOSS_ROWS}) == sorted(TRL_LOSS_TYPES)
    readme = (ROOT / "README.md").read_text()
    assert "docs/from-verl-and-trl.md#trls-loss_type" in readme, "README does not link the TRL loss table"


@pytest.mark.parametrize("trl, overrides", [(r[0], r[1]) for r in LOSS_ROWS if r[2]],
                         ids=[" ".join(f"{k}={v}" for k, v in r[0].items()) for r in LOSS_ROWS if r[2]])
def test_each_trl_loss_type_equals_its_nanoverl_settings(trl, overrides):
    clipped = 0
    for seed in range(5):
        logp, old, adv, mask, ref = _batch(seed)
        expected = trl_loss(logp, old, adv, mask, ref, max_completion_length=mask.shape[1], **trl)
        got = _nanoverl_loss(overrides, logp, old, adv, mask, ref)
        torch.testing.assert_close(got, expected, rtol=1e-7, atol=1e-12)
        (g_expected,) = torch.autograd.grad(expected, logp)
        (g_got,) = torch.autograd.grad(got, logp)
        torch.testing.assert_close(g_got, g_expected, rtol=1e-7, atol=1e-12)
        ratio = (logp - old).exp()[mask.bool()]
        clipped += int(((ratio > 1.28) | (ratio < 0.8)).sum())
    assert clipped > 20  # the batches reach the clip ranges, so a wrong bound would show


def test_a_setting_the_table_leaves_out_changes_the_number():
    """The comparison can fail: TRL's grpo under nanoverl's default dual clip (ratio 3) differs."""
    logp, old, adv, mask, ref = _batch(0)
    expected = trl_loss(logp, old, adv, mask, ref, loss_type="grpo", max_completion_length=mask.shape[1])
    got = _nanoverl_loss(["actor.loss_agg_mode=seq-mean-token-mean"], logp, old, adv, mask, ref)
    assert abs(float((got - expected).detach())) > 1e-6


@pytest.mark.parametrize("trl, overrides", [(r[0], r[1]) for r in ADV_ROWS if r[2]],
                         ids=[str(r[0]["scale_rewards"]) for r in ADV_ROWS if r[2]])
def test_each_scale_rewards_equals_its_nanoverl_estimator(trl, overrides):
    from nanoverl_core.batch import RLBatch
    from nanoverl_core.config import config_from_dict
    from nanoverl_core.reward.scoring import place_scores

    registry = first_party_registry()  # the grpo estimators, in the core's nox session too
    config = config_from_dict(BASE, overrides, registry=registry)
    estimator = registry.get("advantage_estimator", config.algorithm.advantage_estimator)
    group, T = 4, 5
    g = torch.Generator().manual_seed(1)
    rewards = torch.randint(0, 3, (6 * group,), generator=g).float() / 2
    mask = (torch.arange(T)[None] < torch.randint(1, T + 1, (len(rewards),), generator=g)[:, None]).float()
    batch = RLBatch({"token_level_rewards": place_scores(rewards, mask), "loss_mask": mask},
                    {"uid": [i // group for i in range(len(rewards))]})
    advantages, _ = estimator(batch, config.algorithm)
    torch.testing.assert_close(advantages[:, 0], trl_advantages(rewards, group, trl["scale_rewards"]),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("row", ROWS, ids=[r[3].split("|")[1].strip() for r in ROWS])
def test_translate_gives_each_rows_settings_so_the_table_is_its_only_source(row):
    """`nanoverl-train translate` (foreign_keys.translate) of each row's GRPOConfig gives the row's nanoverl
    settings, checked against TRL's formula above; a "no" row is reported as not mapped, not guessed."""
    from nanoverl_core.config.load import _field_type, _parse_value
    from nanoverl_core.translate import translate

    trl, overrides, equal, line = row
    registry = first_party_registry()
    result = translate("TRL", trl, known=lambda path: _field_type(path.split("."), registry) is not None)
    if not overrides:
        assert result.unmapped, line
        return
    for override in overrides:
        key, _, text = override.partition("=")
        value = _parse_value(text)
        value = float(value) if isinstance(value, str) and re.fullmatch(r"[\d.]+e-?\d+", value) else value
        assert result.settings.get(key) == pytest.approx(value) if isinstance(value, float) else \
            result.settings.get(key) == value, (line, key, result.settings)
