"""Run a SmolLM2 recipe for several seeds and print its before/after table as JSON.

    python scripts/smollm2_recipe.py --seeds 0 1 2                 # the figures in docs/results.md
    python scripts/smollm2_recipe.py --seeds 0 -- actor.lr=3e-6   # a sweep point: overrides after --
    python scripts/smollm2_recipe.py --config examples/configs/smollm2_calculator.toml   # the tool recipe

Each seed is one `nanoverl-train --config CONFIG trainer.seed=S` (default smollm2_arithmetic.toml)
(with `trainer.eval_before_after = true`, as the config ships) in its own run directory under
--out; the run's eval.json holds the base model's and the trained policy's held-out accuracy,
greedy and sampled. Printed: per seed those numbers with a 95% Wilson interval (greedy over the 64
held-out prompts; sampled over their 64 x rollout.val_n samples, which is optimistic since samples
of one prompt are correlated), the training wall time, the machine load at the end, and the trainer's
peak resident memory (over the whole run, and the largest step's; its worker processes' summed); then the
mean gain over seeds. Needs the model (plugins/nanoverl-hf/scripts/fetch_smollm2.sh) and, for the
`vllm` rollout, the vLLM venv (.ci/vllm-env.sh): run this script with that venv's python.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nanoverl_core.processes import peak_resident_mib

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "configs" / "smollm2_arithmetic.toml"


def wilson(mean: float, n: int, z: float = 1.96) -> list[float]:
    """95% Wilson score interval of a proportion `mean` observed over `n` trials."""
    if n == 0:
        return [0.0, 1.0]
    centre = (mean + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(mean * (1 - mean) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def summarise(report: dict) -> dict:
    """{decoding: {"accuracy", "ci95", per data source, episode metrics}} of one eval.json report."""
    out = {}
    for name, metrics in report["results"].items():
        trials = report["prompts"] * int(metrics["n"])
        out[name] = {"accuracy": round(metrics["reward/mean"], 4), "ci95": wilson(metrics["reward/mean"], trials),
                     **{key.removesuffix("/reward/mean"): round(v, 4) for key, v in metrics.items()
                        if key.endswith("/reward/mean") and key != "reward/mean"},
                     **{key: round(v, 4) for key, v in metrics.items() if key.startswith("episode/")}}
    return out


def run_seed(seed: int, out: Path, overrides: list[str], config: Path = CONFIG) -> dict:
    run_dir = out / f"seed{seed}"
    train = Path(sys.executable).parent / "nanoverl-train"
    cmd = [str(train), "--config", str(config), f"trainer.seed={seed}", f"trainer.output_dir={run_dir}",
           "trainer.progress=log", *overrides]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    start = time.perf_counter()
    with (out / f"seed{seed}.log").open("w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        peak = 0.0
        while proc.poll() is None:          # the trainer resets its VmHWM every step: read it often, keep the max
            peak = max(peak, peak_resident_mib(proc.pid, reset=False) or 0.0)
            time.sleep(0.1)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"seed {seed} failed with exit status {proc.returncode}; see {out / f'seed{seed}.log'}")
    evals = json.loads((run_dir / "eval.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"seed": seed, "run_dir": str(run_dir), "wall_s": round(wall, 1),
            "train_s": round(sum(r.get("timing/step", 0.0) for r in rows), 1), "steps": len(rows),
            "load_avg_1m": round(os.getloadavg()[0], 2),
            "peak_rss_mib": round(peak),                        # the whole run: model loading and evaluations too
            "step_peak_rss_mib": round(max(r.get("perf/peak_rss_mib", 0.0) for r in rows)),
            "children_peak_rss_mib": round(max(r.get("perf/children_peak_rss_mib", 0.0) for r in rows)),
            "before": summarise(evals["before"]), "after": summarise(evals["after"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--config", type=Path, default=CONFIG, help=f"the recipe (default {CONFIG.relative_to(ROOT)})")
    parser.add_argument("--out", type=Path, default=None, help="folder for the runs (default: a new temp folder)")
    parser.add_argument("overrides", nargs="*", help="config overrides (after --)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="smollm2-recipe-"))
    out.mkdir(parents=True, exist_ok=True)
    config = args.config.resolve()
    runs = [run_seed(seed, out, args.overrides, config) for seed in args.seeds]
    gains = {name: round(sum(r["after"][name]["accuracy"] - r["before"][name]["accuracy"] for r in runs) / len(runs), 4)
             for name in runs[0]["after"]}
    print(json.dumps({"config": str(config.relative_to(ROOT)), "overrides": args.overrides, "cpus": os.cpu_count(),
                      "runs": runs, "mean_gain": gains}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
