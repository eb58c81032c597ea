"""Regenerate tests/data/verl_estimator_cases.json: verl's gdpo, gpg, optimal_token_baseline and remax
advantage estimators on random padded float64 batches.

Needs an importable verl 0.9.1 (`verl.trainer.ppo.core_algos`); nanoverl is not imported: the file records
verl's answers (advantages and returns) and plugins/nanoverl-grpo/tests/test_estimators_verl.py checks
nanoverl_grpo.estimators against them, so CI needs no verl. The scratch venv of
scripts/make_verl_loss_cases.py is enough:

    PYTHONPATH=$D/src $D/v/bin/python scripts/make_verl_estimator_cases.py --verl-ref "verl 0.9.1 (PyPI wheel)"

Each case is one call as verl's trainer makes it (`ray_trainer.compute_advantage`): gdpo with a config
naming its reward keys and weights and the per-key scores in `non_tensor_batch` (verl turns them into
float32, so those scores are multiples of 1/16, exact in float32), or with no config (its fallback, GRPO on
token_level_rewards, then whitened); gpg and optimal_token_baseline with their defaults and, for the
latter, with and without rollout-correction weights and the zero-tail rule. Groups are shuffled and
include a group of one, a group with equal scores and (for the token baseline) ties for the longest
response. Padding of every per-token input but the rewards holds garbage. remax gets one greedy baseline
score per group on each of its rows, outcome rewards or (as with an in-reward KL) a reward on every token,
and garbage on the rewards' padding too (verl masks the rewards). The remax cases come last, so adding them
left the earlier cases' random draws unchanged.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "verl_estimator_cases.json"
PROMPT = 3  # prompt width of the fake batch gdpo reads its response lengths from


def rounded(t: torch.Tensor) -> list:
    return [[float(f"{v:.4f}") for v in row] for row in t.tolist()]


def layout(gen: torch.Generator, rows: int, width: int) -> tuple[list[str], torch.Tensor]:
    """Shuffled uids (groups of 4, 3, 2 and 1 ...) and right-padded lengths (no empty row: verl's gdpo would
    write the score of one at position -1)."""
    sizes, uids = [4, 3, 1, 2], []
    for g, size in enumerate(sizes * rows):
        uids += [f"p{g}"] * size
        if len(uids) >= rows:
            break
    uids = uids[:rows]
    uids = [uids[i] for i in torch.randperm(rows, generator=gen).tolist()]
    lengths = torch.randint(1, width + 1, (rows,), generator=gen)
    lengths[0] = width
    return uids, lengths


def outcome_rewards(gen: torch.Generator, lengths: torch.Tensor, width: int, scores: torch.Tensor) -> torch.Tensor:
    """(B, R): each row's score on its last valid token, 0 elsewhere (how nanoverl's reward stage places it)."""
    out = torch.zeros(len(lengths), width, dtype=torch.float64)
    out[torch.arange(len(lengths)), lengths - 1] = scores
    return out


def gdpo_case(core_algos, gen, rows, width, num_components, weighted, fallback) -> dict:
    uids, lengths = layout(gen, rows, width)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).to(torch.float64)
    # component k: binary (format-like) or in 1/16 steps over a spread that differs per component
    comps = []
    for k in range(num_components):
        if k % 2 == 0:
            c = (torch.rand(rows, generator=gen) < 0.5).to(torch.float64)
        else:
            c = torch.randint(-40 * (k + 1), 40 * (k + 1), (rows,), generator=gen).to(torch.float64) / 16
        comps.append(c)
    comps = torch.stack(comps, dim=1)                                   # (B, K)
    comps[[i for i, u in enumerate(uids) if u == uids[0]]] = comps[0].clone()  # row 0's group: all equal
    weights = [1.0, 0.5, 2.0, -0.25][:num_components] if weighted else [1.0] * num_components
    total = (comps * torch.tensor(weights, dtype=torch.float64)).sum(-1)
    rewards = outcome_rewards(gen, lengths, width, total)
    index = np.array(uids, dtype=object)
    if fallback:
        adv, ret = core_algos.compute_gdpo_outcome_advantage(rewards, mask, index)
    else:
        keys = [f"r{k}" for k in range(num_components)]
        config = {"gdpo_reward_keys": keys, **({"gdpo_reward_weights": weights} if weighted else {})}
        non_tensor = {key: comps[:, k].numpy().astype(np.float64) for k, key in enumerate(keys)}
        non_tensor["uid"] = index
        attention = torch.cat([torch.ones(rows, PROMPT, dtype=torch.long), mask.long()], dim=1)
        batch = {"prompts": torch.zeros(rows, PROMPT, dtype=torch.long), "attention_mask": attention}
        adv, ret = core_algos.compute_gdpo_outcome_advantage(rewards, mask, index, config=config,
                                                             non_tensor_batch=non_tensor, batch=batch)
    return {"name": "gdpo", "settings": {"fallback": fallback},
            "inputs": {"uid": uids, "mask": mask.long().tolist(), "token_level_rewards": rewards.tolist(),
                       "component_scores": comps.tolist(), "weights": weights},
            "advantages": adv.double().tolist(), "returns": ret.double().tolist()}


def gpg_case(core_algos, gen, rows, width, binary) -> dict:
    uids, lengths = layout(gen, rows, width)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).to(torch.float64)
    scores = (torch.rand(rows, generator=gen) < 0.4).to(torch.float64) if binary else \
        torch.randn(rows, generator=gen, dtype=torch.float64).mul(1.5).round(decimals=4)
    scores[[i for i, u in enumerate(uids) if u == uids[0]]] = scores[0].clone()  # row 0's group: all equal
    rewards = outcome_rewards(gen, lengths, width, scores)
    adv, ret = core_algos.compute_gpg_outcome_advantage(rewards, mask, np.array(uids, dtype=object))
    return {"name": "gpg", "settings": {},
            "inputs": {"uid": uids, "mask": mask.long().tolist(), "token_level_rewards": rewards.tolist()},
            "advantages": adv.tolist(), "returns": ret.tolist()}


def otb_case(core_algos, gen, rows, width, weights, zero_tail, token_rewards, epsilon) -> dict:
    uids, lengths = layout(gen, rows, width)
    first = uids[0]
    for i, u in enumerate(uids):                                       # a tie for the longest in one group
        if u == uids[1] and u != first and i != 1:
            lengths[i] = lengths[1] = width
            break
    mask = (torch.arange(width)[None, :] < lengths[:, None]).to(torch.float64)
    garbage = lambda: 8.0 * torch.randn(rows, width, generator=gen, dtype=torch.float64)
    pad = lambda x: torch.tensor(rounded(torch.where(mask.bool(), x, garbage())), dtype=torch.float64)
    scores = torch.randn(rows, generator=gen, dtype=torch.float64)
    rewards = outcome_rewards(gen, lengths, width, scores)
    if token_rewards:
        rewards = rewards + 0.3 * torch.randn(rows, width, generator=gen, dtype=torch.float64)
    rewards = pad(rewards)
    old = -torch.empty(rows, width, dtype=torch.float64).exponential_(0.7, generator=gen)
    pi = old.exp()
    spread = torch.rand(rows, width, generator=gen, dtype=torch.float64)
    sum_sq = pi ** 2 + (1 - pi) ** 2 * spread                           # within [pi^2, pi^2 + (1 - pi)^2]
    old, sum_sq = pad(old), pad(sum_sq)
    is_w = pad(torch.exp(0.4 * torch.randn(rows, width, generator=gen, dtype=torch.float64))) if weights else None
    adv, ret = core_algos.compute_optimal_token_baseline_advantage(
        rewards, mask, np.array(uids, dtype=object), old, sum_sq, rollout_is_weights=is_w,
        handle_zero_tail=zero_tail, epsilon=epsilon)
    inputs = {"uid": uids, "mask": mask.long().tolist(), "token_level_rewards": rewards.tolist(),
              "old_log_probs": old.tolist(), "sum_pi_squared": sum_sq.tolist()}
    if weights:
        inputs["rollout_is_weights"] = is_w.tolist()
    return {"name": "optimal_token_baseline", "settings": {"handle_zero_tail": zero_tail, "epsilon": epsilon},
            "inputs": inputs, "advantages": adv.tolist(), "returns": ret.tolist()}


def remax_case(core_algos, gen, rows, width, token_rewards) -> dict:
    uids, lengths = layout(gen, rows, width)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).to(torch.float64)
    rewards = outcome_rewards(gen, lengths, width, torch.randn(rows, generator=gen, dtype=torch.float64))
    if token_rewards:
        rewards = rewards + 0.3 * torch.randn(rows, width, generator=gen, dtype=torch.float64) * mask
    garbage = 8.0 * torch.randn(rows, width, generator=gen, dtype=torch.float64)
    rewards = torch.tensor(rounded(torch.where(mask.bool(), rewards, garbage)), dtype=torch.float64)
    greedy = {uid: float(f"{v:.4f}") for uid, v in zip(dict.fromkeys(uids), torch.randn(rows, generator=gen).tolist())}
    baselines = torch.tensor([greedy[u] for u in uids], dtype=torch.float64)
    adv, ret = core_algos.compute_remax_outcome_advantage(rewards, baselines, mask)
    return {"name": "remax", "settings": {"token_rewards": token_rewards},
            "inputs": {"uid": uids, "mask": mask.long().tolist(), "token_level_rewards": rewards.tolist(),
                       "reward_baselines": baselines.tolist()},
            "advantages": adv.tolist(), "returns": ret.tolist()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verl-ref", required=True, help="the verl version / commit these outputs come from")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from verl.trainer.ppo import core_algos

    gen = torch.Generator().manual_seed(args.seed)
    cases = []
    for rows, width in ((10, 6), (13, 9)):
        for k in (1, 2, 3, 4):
            cases.append(gdpo_case(core_algos, gen, rows, width, k, weighted=k > 1, fallback=False))
        cases.append(gdpo_case(core_algos, gen, rows, width, 2, weighted=False, fallback=False))
        cases.append(gdpo_case(core_algos, gen, rows, width, 1, weighted=False, fallback=True))
        for binary in (True, False, True):
            cases.append(gpg_case(core_algos, gen, rows, width, binary))
        for weights in (False, True):
            for zero_tail in (True, False):
                cases.append(otb_case(core_algos, gen, rows, width, weights, zero_tail, token_rewards=False,
                                      epsilon=1e-8))
        cases.append(otb_case(core_algos, gen, rows, width, True, True, token_rewards=True, epsilon=1e-8))
        cases.append(otb_case(core_algos, gen, rows, width, False, True, token_rewards=True, epsilon=0.5))
    for rows, width in ((10, 6), (13, 9)):
        for token_rewards in (False, True):
            cases.append(remax_case(core_algos, gen, rows, width, token_rewards))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"verl": args.verl_ref, "seed": args.seed, "cases": cases}, indent=None) + "\n")
    print(f"wrote {len(cases)} cases to {args.out}")


if __name__ == "__main__":
    main()
