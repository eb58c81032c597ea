"""Wall time until a run's greedy validation reward reaches a target.

    python examples/tiny_task/time_to_target.py --config examples/configs/tiny_grpo.toml \
        --target 0.9 --seeds 0 1 2 [--stop] [override ...]

Starts `nanoverl-train` once per seed (output in runs/time_to_target/<config>_s<seed>), watches its
metrics.jsonl, and prints the wall time (from process start, so model loading counts) and step at
which val/reward/mean first reached the target. --stop ends a run as soon as it gets there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path


def watch(config: str, seed: int, target: float, stop: bool, overrides: list[str], root: Path) -> dict:
    run_dir = root / f"{Path(config).stem}_s{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    train = shutil.which("nanoverl-train") or str(Path(sys.executable).parent / "nanoverl-train")
    cmd = [train, "--config", config, f"trainer.seed={seed}", f"trainer.output_dir={run_dir}",
           "trainer.progress=none", *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    metrics, seen, hit, curve = run_dir / "metrics.jsonl", 0, None, []
    while True:
        done = proc.poll() is not None
        if metrics.is_file():
            lines = metrics.read_text().splitlines()
            for line in lines[seen:]:
                row = json.loads(line)
                if "val/reward/mean" in row:
                    curve.append((row["step"], round(row["val/reward/mean"], 3)))
                    if hit is None and row["val/reward/mean"] >= target:
                        hit = {"seconds": round(time.monotonic() - start, 1), "step": row["step"]}
            seen = len(lines)
        if done or (hit and stop):
            break
        time.sleep(0.5)
    if not done:
        proc.terminate()
        proc.wait()
    elif proc.returncode:
        sys.exit(f"seed {seed}: nanoverl-train failed ({proc.returncode}):\n{proc.stderr.read()[-2000:]}")
    return {"seed": seed, "reached": hit, "total_seconds": round(time.monotonic() - start, 1), "val_curve": curve}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--stop", action="store_true", help="end each run once it reaches the target")
    parser.add_argument("--root", default="runs/time_to_target")
    parser.add_argument("overrides", nargs="*", help="section.key=value overrides for every run")
    args = parser.parse_args()
    for seed in args.seeds:
        print(json.dumps(watch(args.config, seed, args.target, args.stop, args.overrides, Path(args.root))), flush=True)


if __name__ == "__main__":
    main()
