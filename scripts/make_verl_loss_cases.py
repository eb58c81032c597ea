"""Regenerate tests/data/verl_loss_cases.json: verl's policy losses on random padded float64 batches.

Needs an importable verl 0.9.1 (`verl.trainer.ppo.core_algos` registers `cispo`, `sapo`, `geo_mean`,
`gpg`, `clip_cov`, `kl_cov`, `dro`, `dppo_tv`, `dppo_kl`); nanoverl is not imported: the file records
verl's answers (the loss, its metrics and the gradient of the loss with respect to log_prob), and
tests/test_algos_losses_more.py checks nanoverl_core.algos.policy_losses against them, so CI needs no
verl. verl's import pulls in ray, tensordict, omegaconf, codetiming and orjson; a scratch venv that sees
torch (here through a .pth line naming the project venv's site-packages) is enough:

    python -m venv $D/v && $D/v/bin/pip install omegaconf tensordict ray codetiming orjson
    pip download verl==0.9.1 --no-deps -d $D && unzip -q $D/verl-0.9.1-py3-none-any.whl -d $D/src
    PYTHONPATH=$D/src $D/v/bin/python scripts/make_verl_loss_cases.py --verl-ref "verl 0.9.1 (PyPI wheel)"

Inputs are float64, rounded to 4 decimals (exact in the JSON); padding holds garbage. Each case is one
call of verl's registered function with a verl ActorConfig; `global_batch_info` passes mini-batch
normalisers in some cases, as verl's workers do.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "verl_loss_cases.json"

MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "token-sum"]

# (loss, ActorConfig fields, PolicyLossConfig fields): each runs over the aggregation modes it honours
LOSSES = [
    ("cispo", {"clip_ratio_low": 10.0, "clip_ratio_high": 0.2}, {}),            # verl's CISPO example
    ("cispo", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}, {}),            # both bounds active
    ("sapo", {"tau_pos": 1.0, "tau_neg": 1.05}, {}),                             # the paper's
    ("sapo", {"tau_pos": 2.0, "tau_neg": 0.5}, {}),
    ("geo_mean", {"clip_ratio_low": 0.4, "clip_ratio_high": 0.4}, {}),           # GMPO's recipe
    ("geo_mean", {"clip_ratio_low": 0.1, "clip_ratio_high": 0.3}, {}),
    ("gpg", {}, {}),
    ("clip_cov", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}, {"clip_cov_ratio": 1.0}),  # every candidate
    ("clip_cov", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2},                 # a random few: seeded
     {"clip_cov_ratio": 0.05, "clip_cov_lb": 0.2, "clip_cov_ub": 5.0}),
    ("kl_cov", {}, {"kl_cov_ratio": 0.0002, "ppo_kl_coef": 0.1}),                # verl's defaults: one token
    ("kl_cov", {}, {"kl_cov_ratio": 0.2, "ppo_kl_coef": 1.0}),
    ("dro", {}, {"dro_beta": 0.1}),
    ("dro", {}, {"dro_beta": 2.0}),
    ("dppo_tv", {"clip_ratio_low": 0.15, "clip_ratio_high": 0.15, "clip_ratio_c": 20.0}, {}),  # verl's DPPO example
    ("dppo_tv", {"clip_ratio_low": 0.05, "clip_ratio_high": 0.1, "clip_ratio_c": 1.5}, {}),   # + IS truncation
    ("dppo_kl", {"clip_ratio_low": 0.05, "clip_ratio_high": 0.05, "clip_ratio_c": 20.0}, {}),
    ("dppo_kl", {"clip_ratio_low": 0.01, "clip_ratio_high": 0.03, "clip_ratio_c": 1.5}, {}),
]
FIXED_MODE = {"sapo": "seq-mean-token-mean", "geo_mean": None}  # verl forces SAPO's mode; GMPO ignores it


def rounded(t: torch.Tensor) -> list:
    return [[float(f"{v:.4f}") for v in row] for row in t.tolist()]


def make_batch(gen: torch.Generator, rows: int, width: int, *, empty_row: bool, token_adv: bool,
               weights: bool) -> dict:
    """Right-padded (rows, width) tensors as lists; log-probs <= 0 on valid tokens, garbage on padding."""
    lengths = torch.randint(1, width + 1, (rows,), generator=gen)
    lengths[0] = width
    if empty_row:
        lengths[-1] = 0
    mask = torch.arange(width)[None, :] < lengths[:, None]
    old = -torch.empty(rows, width, dtype=torch.float64).exponential_(0.7, generator=gen)
    noise = 0.25 * torch.randn(rows, width, generator=gen, dtype=torch.float64)
    spikes = torch.rand(rows, width, generator=gen, dtype=torch.float64) < 0.15
    noise = torch.where(spikes, 1.2 * torch.sign(noise), noise)
    new = (old + noise).clamp(max=-1e-3)
    adv = torch.randn(rows, 1, generator=gen, dtype=torch.float64).expand(rows, width).clone()
    if token_adv:
        adv = adv + 0.5 * torch.randn(rows, width, generator=gen, dtype=torch.float64)
    garbage = lambda: 8.0 * torch.randn(rows, width, generator=gen, dtype=torch.float64)
    batch = {"old_log_prob": rounded(torch.where(mask, old, garbage())),
             "log_prob": rounded(torch.where(mask, new, garbage())),
             "advantages": rounded(torch.where(mask, adv, garbage())), "mask": mask.long().tolist()}
    if weights:
        w = torch.exp(0.4 * torch.randn(rows, width, generator=gen, dtype=torch.float64))
        batch["rollout_is_weights"] = rounded(torch.where(mask, w, torch.full_like(w, 7.0)))
    return batch


def verl_case(core_algos, ActorConfig, PolicyLossConfig, loss: str, actor: dict, policy: dict, mode: str | None,
              batch: dict, batch_info: dict, seed: int) -> dict:
    as_t = lambda key: torch.tensor(batch[key], dtype=torch.float64)
    log_prob = as_t("log_prob").requires_grad_(True)
    mask = as_t("mask")
    weights = as_t("rollout_is_weights") if "rollout_is_weights" in batch else None
    config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_mini_batch_size=1, ppo_micro_batch_size_per_gpu=1,
                         global_batch_info=batch_info, **actor,
                         policy_loss=PolicyLossConfig(loss_mode=loss, **policy))
    torch.manual_seed(seed)  # clip_cov draws its tokens with torch.randperm from the global generator
    value, metrics = core_algos.get_policy_loss_fn(loss)(
        as_t("old_log_prob"), log_prob, as_t("advantages"), mask, loss_agg_mode=mode or "token-mean",
        config=config, rollout_is_weights=weights)
    (grad,) = torch.autograd.grad(value, log_prob)
    return {"loss": value.item(), "metrics": {k: float(v) for k, v in metrics.items()}, "grad": grad.tolist()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verl-ref", required=True, help="the verl version / commit these outputs come from")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from verl.trainer.ppo import core_algos
    from verl.workers.config import ActorConfig, PolicyLossConfig

    gen = torch.Generator().manual_seed(args.seed)
    cases = []
    for index, (loss, actor, policy) in enumerate(LOSSES):
        modes = [FIXED_MODE[loss]] if loss in FIXED_MODE else MODES
        for mode in modes:
            for variant in range(2):  # 0: the micro-batch's own counts, no weights; 1: mini-batch totals, weights
                batch = make_batch(gen, rows=6, width=7, empty_row=variant == 1, token_adv=index % 2 == 1 or
                                   loss in ("clip_cov", "kl_cov"), weights=variant == 1)
                info = {}
                if variant == 1 and mode is not None:
                    info = {"batch_num_tokens": 40, "global_batch_size": 9}
                if mode == "seq-mean-token-sum-norm":
                    info["loss_scale_factor"] = 5
                seed = 1000 + len(cases)
                out = verl_case(core_algos, ActorConfig, PolicyLossConfig, loss, actor, policy, mode, batch,
                                info, seed)
                cases.append({"name": loss, "actor": actor, "policy_loss": policy, "loss_agg_mode": mode,
                              "global_batch_info": info, "seed": seed, "inputs": batch, **out})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"verl": args.verl_ref, "seed": args.seed, "cases": cases}, indent=None) + "\n")
    print(f"wrote {len(cases)} cases to {args.out}")


if __name__ == "__main__":
    main()
