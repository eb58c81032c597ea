"""On-policy distillation beside GRPO from the same start on the same prompts: steps and training time to reach
90% of the teacher's held-out greedy accuracy, per seed, printed as JSON.

    python scripts/distill_vs_grpo.py --teacher runs/smollm2_arithmetic --seeds 0 1 2 --out runs/distill_vs_grpo

The teacher is a finished run of the arithmetic recipe (examples/configs/smollm2_arithmetic.toml: 20 GRPO steps
from SmolLM2-135M-Instruct); its held-out greedy accuracy is its last validation. Each seed then runs
  grpo     the arithmetic recipe again, validated every 2 steps, and
  distill  examples/configs/smollm2_distill.toml: the same prompts, batch and learning rate, with per-token
           log teacher - log student as the advantage and no task reward in the loss,
  gkd      (only with --methods gkd) the same recipe with TRL's generalized JSD over the teacher's top 64
           tokens as the loss instead (coef 0, gkd_coef 1, gkd_beta 0.5),
each in its own run directory under --out (a directory whose run already finished is read, not rerun). The
held-out set is the recipe's 64 validation problems, which the loader keeps out of training. "steps" is the
first validated step whose greedy accuracy reaches the target, "train_s" the summed step times up to it
(validation excluded), with the machine's load at the end of each run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"grpo": ROOT / "examples" / "configs" / "smollm2_arithmetic.toml",
           "distill": ROOT / "examples" / "configs" / "smollm2_distill.toml",
           "gkd": ROOT / "examples" / "configs" / "smollm2_distill.toml"}
GKD = ["algorithm.distill.coef=0", "algorithm.distill.top_k=64", "algorithm.distill.gkd_coef=1",
       "algorithm.distill.gkd_beta=0.5"]
"""`gkd`: the distillation recipe with the GKD loss alone (the teacher's top 64 tokens, TRL's beta 0.5)."""
CURVE = ["trainer.val_every=2", "trainer.val_before_train=true", "trainer.eval_before_after=false",
         "tracking.trackers=[jsonl]", "trainer.progress=log"]


def metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def run(method: str, seed: int, out: Path, teacher: Path, steps: int) -> list[dict]:
    run_dir = out / f"{method}_s{seed}"
    rows = metrics(run_dir)
    if rows and rows[-1].get("step") == steps and "val/reward/mean" in rows[-1]:
        return rows                                           # finished before: read it
    train = Path(sys.executable).parent / "nanoverl-train"
    cmd = [str(train), "--config", str(CONFIGS[method]), f"trainer.seed={seed}", f"trainer.output_dir={run_dir}",
           f"trainer.total_steps={steps}", *CURVE, *([f"teacher.path={teacher}"] if method != "grpo" else []),
           *(GKD if method == "gkd" else [])]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    with (out / f"{method}_s{seed}.log").open("w") as log:
        if subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
            raise SystemExit(f"{method} seed {seed} failed; see {out / f'{method}_s{seed}.log'}")
    return metrics(run_dir)


def summary(rows: list[dict], target: float) -> dict:
    curve = {r["step"]: round(r["val/reward/mean"], 4) for r in rows if "val/reward/mean" in r}
    reached = next((step for step, acc in sorted(curve.items()) if acc >= target), None)
    train_s = sum(r.get("timing/step", 0.0) for r in rows if reached is not None and 0 < r["step"] <= reached)
    return {"val_greedy": curve, "final": curve[max(curve)], "steps_to_target": reached,
            "train_s_to_target": round(train_s, 1) if reached is not None else None,
            "step_s_median": round(statistics.median(r["timing/step"] for r in rows if "timing/step" in r), 1),
            "load_avg_1m_end": round(os.getloadavg()[0], 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", type=Path, default=ROOT / "runs" / "smollm2_arithmetic")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=["distill", "grpo"], choices=sorted(CONFIGS))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "distill_vs_grpo")
    args = parser.parse_args()
    teacher_rows = metrics(args.teacher)
    vals = [r["val/reward/mean"] for r in teacher_rows if "val/reward/mean" in r]
    if not vals:
        raise SystemExit(f"{args.teacher} holds no finished run with validation; train the teacher first: "
                         "nanoverl-train --config examples/configs/smollm2_arithmetic.toml")
    target = 0.9 * vals[-1]
    args.out.mkdir(parents=True, exist_ok=True)
    runs = {m: {s: summary(run(m, s, args.out, args.teacher.resolve(), args.steps), target) for s in args.seeds}
            for m in args.methods}
    print(json.dumps({"teacher": str(args.teacher), "teacher_val_greedy": round(vals[-1], 4),
                      "target": round(target, 4), "cpus": os.cpu_count(), "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
