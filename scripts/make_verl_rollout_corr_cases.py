"""Regenerate tests/data/verl_rollout_corr_cases.json: verl's rollout-correction outputs on random batches.

Needs an importable verl whose `verl.trainer.ppo.rollout_corr_helper` has
`compute_rollout_correction_and_rejection_mask` (verl >= 0.7.1; the committed file was made with
v0.9.0). nanoverl is not imported: the file records verl's answers, and
tests/test_algos_rollout_correction.py checks nanoverl_core.algos.rollout_correction against them,
so CI needs no verl.

    python scripts/make_verl_rollout_corr_cases.py --verl-ref "v0.9.0 (483b8a0)" [--out PATH]

Inputs are float64 log-probs rounded to 4 decimals (exact in the JSON); each case is one call with
a verl-style config. Outputs: the IS weights (or null), the rejection mask, and verl's metrics.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "verl_rollout_corr_cases.json"

# (rollout_is, rollout_is_threshold, rollout_is_batch_normalize, rollout_rs, rollout_rs_threshold)
CONFIGS = [
    (None, 2.0, False, None, None),                        # metrics only
    ("token", 2.0, False, None, None),                     # token TIS
    ("token", 1.2, False, None, None),
    ("sequence", 2.0, False, None, None),                  # sequence TIS (product of ratios)
    ("sequence", 5.0, True, None, None),                   # ... batch-normalised
    ("token", 1.5, True, None, None),
    ("token", "0.8_1.25", False, None, None),              # IcePop band
    ("sequence", "0.5_3.0", False, None, None),
    (None, 2.0, False, "token_k1", 1.3),                   # symmetric ratio band
    (None, 2.0, False, "token_k1", "0.7_1.6"),             # asymmetric: verl bounds pi_rollout / pi_train
    (None, 2.0, False, "seq_sum_k1", "0.4_1.5"),
    (None, 2.0, False, "seq_mean_k1", "0.95_1.01"),        # geometric RS
    (None, 2.0, False, "token_k2", 0.02),
    (None, 2.0, False, "token_k3", 0.02),
    (None, 2.0, False, "seq_sum_k2", 0.1),
    (None, 2.0, False, "seq_sum_k3", 0.1),
    (None, 2.0, False, "seq_mean_k2", 0.01),
    (None, 2.0, False, "seq_mean_k3", 0.01),
    (None, 2.0, False, "seq_max_k2", 0.05),
    (None, 2.0, False, "seq_max_k3", 0.05),
    ("token", 2.0, False, "seq_mean_k1", "0.95_1.01"),     # token TIS + geometric RS
    ("sequence", 3.0, False, "token_k1", 1.5),             # sequence TIS + token RS
    ("token", "0.8_1.25", False, "seq_max_k3", 0.1),       # IcePop + max-k3 RS
    ("sequence", 2.0, False, "seq_sum_k1,seq_mean_k3", "0.5_2.0,0.01"),  # two criteria chained
    ("token", 2.0, True, "token_k1,token_k2", "0.6_1.5,0.05"),
]


def make_batch(gen: torch.Generator, rows: int, width: int, sigma: float, outliers: float,
               empty_row: bool) -> tuple[list, list, list]:
    """Right-padded (rows, width) rollout / old log-probs and mask; padding holds garbage."""
    lengths = torch.randint(1, width + 1, (rows,), generator=gen)
    lengths[0] = width
    if empty_row:
        lengths[-1] = 0
    mask = (torch.arange(width)[None, :] < lengths[:, None]).double()
    rollout = -torch.empty(rows, width, dtype=torch.float64).exponential_(0.8, generator=gen)
    noise = sigma * torch.randn(rows, width, generator=gen, dtype=torch.float64)
    spikes = torch.rand(rows, width, generator=gen, dtype=torch.float64) < 0.1
    noise = torch.where(spikes, outliers * torch.sign(noise), noise)
    old = (rollout + noise).clamp(max=0.0)
    garbage = 50.0 * torch.randn(rows, width, generator=gen, dtype=torch.float64)
    rollout, old = torch.where(mask.bool(), rollout, garbage), torch.where(mask.bool(), old, -garbage)
    as_list = lambda t: [[float(f"{v:.4f}") for v in row] for row in t.tolist()]  # noqa: E731
    return as_list(old), as_list(rollout), mask.long().tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verl-ref", required=True, help="the verl version / commit these outputs come from")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import verl
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

    gen = torch.Generator().manual_seed(args.seed)
    cases = []
    for index, (rollout_is, is_thr, is_norm, rollout_rs, rs_thr) in enumerate(CONFIGS):
        for variant, (sigma, outliers, empty_row) in enumerate([(0.05, 1.5, False), (0.3, 25.0, True)]):
            old, rollout, mask = make_batch(gen, rows=6, width=10, sigma=sigma, outliers=outliers,
                                            empty_row=empty_row)
            tensors = [torch.tensor(x, dtype=torch.float64) for x in (old, rollout, mask)]
            weights, new_mask, metrics = compute_rollout_correction_and_rejection_mask(
                old_log_prob=tensors[0], rollout_log_prob=tensors[1], response_mask=tensors[2],
                rollout_is=rollout_is, rollout_is_threshold=is_thr, rollout_is_batch_normalize=is_norm,
                rollout_rs=rollout_rs, rollout_rs_threshold=rs_thr)
            w = None if weights is None else weights.batch["rollout_is_weights"]
            cases.append({
                "name": f"{index:02d}-{rollout_is or 'noIS'}-{rollout_rs or 'noRS'}-v{variant}",
                "config": {"rollout_is": rollout_is, "rollout_is_threshold": is_thr,
                           "rollout_is_batch_normalize": is_norm, "rollout_rs": rollout_rs,
                           "rollout_rs_threshold": rs_thr},
                "has_empty_row": empty_row,
                "old_log_prob": old, "rollout_log_prob": rollout, "response_mask": mask,
                "weights": None if w is None else [[float(f"{v:.12g}") for v in row] for row in w.tolist()],
                "mask": new_mask.long().tolist(),
                "metrics": {k: (float(f"{v:.12g}") if math.isfinite(v) else str(v)) for k, v in metrics.items()},
            })
    header = {"verl_ref": args.verl_ref, "verl_version": getattr(verl, "__version__", None),
              "seed": args.seed, "dtype": "float64"}
    lines = [json.dumps(case, separators=(",", ":")) for case in cases]  # one case per line
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(header)[:-1] + ', "cases": [\n' + ",\n".join(lines) + "\n]}\n")
    print(f"wrote {len(cases)} cases to {args.out} ({args.out.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
