"""Reward throughput: the same rows scored in the trainer process and by pools of worker processes.

    python benchmarks/reward_pool.py                      # 256 rows; 50 ms and 10 us rewards; 0 / 2 / 8 workers
    python benchmarks/reward_pool.py --smoke              # 16 rows, 5 ms, one step (the CI check)

Each line of output is one JSON object: one per (reward, workers) with the median seconds per step
(one `RewardScorer.score_batch` call over every row, the pool already started) and the pool's start-up time,
then a summary with each pool's speed-up over in-process scoring and its overhead per step for the
cheap reward. The rewards are `reward.file` functions: one sleeps (an I/O-bound or sandboxed reward,
which parallelises on any machine), one busy-waits 10 us (the cost of the pool's messaging shows).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import load_average  # noqa: E402
from nanoverl_core.testing import score_texts  # noqa: E402

SLEEP = "import time\n\ndef compute_score(prompt, response, sample):\n    time.sleep({seconds})\n    return 1.0\n"
BUSY = ("import time\n\ndef compute_score(prompt, response, sample):\n    end = time.perf_counter() + {seconds}\n"
        "    while time.perf_counter() < end:\n        pass\n    return 1.0\n")


def measure(reward_file: Path, rows: int, workers: int, steps: int) -> dict:
    import torch

    from nanoverl_core.batch import RLBatch
    from nanoverl_core.config import RewardConfig
    from nanoverl_core.plugins import Registry
    from nanoverl_core.reward import RewardScorer

    scorer = RewardScorer(RewardConfig(file=str(reward_file), workers=workers), Registry())
    batch = RLBatch({"x": torch.zeros(rows)}, {"prompt_text": ["123="] * rows, "row": [{"target": "123"}] * rows,
                                               "index": list(range(rows)), "data_source": ["bench"] * rows})
    texts = ["123"] * rows
    start = time.perf_counter()
    if workers:
        scorer.pool().start()  # what the first step pays once
    startup = time.perf_counter() - start
    times = []
    try:
        for _ in range(steps):
            start = time.perf_counter()
            scores, metrics = score_texts(scorer, batch, texts)
            times.append(time.perf_counter() - start)
            assert scores.sum().item() == rows and metrics["reward/errors"] == 0
    finally:
        scorer.close()
    return {"workers": workers, "rows": rows, "s_per_step": statistics.median(times), "s_per_step_all": times,
            "startup_s": startup}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2, 8])
    p.add_argument("--slow-s", type=float, default=0.05, help="the slow reward's sleep per call")
    p.add_argument("--fast-s", type=float, default=1e-5, help="the cheap reward's busy wait per call")
    p.add_argument("--smoke", action="store_true", help="16 rows, a 5 ms reward, 1 step")
    args = p.parse_args(argv)
    if args.smoke:
        args.rows, args.steps, args.slow_s = 16, 1, 0.005
    folder = Path(tempfile.mkdtemp(prefix="nanoverl-reward-bench-"))
    rewards = {f"sleep_{args.slow_s * 1e3:g}ms": SLEEP.format(seconds=args.slow_s),
               f"busy_{args.fast_s * 1e6:g}us": BUSY.format(seconds=args.fast_s)}
    summary: dict = {"summary": True, "load_before": load_average(), "cpus": os.cpu_count()}
    for name, source in rewards.items():
        path = folder / f"{name}.py"
        path.write_text(source)
        results = {}
        for workers in args.workers:
            row = {"reward": name, **measure(path, args.rows, workers, args.steps)}
            results[workers] = row["s_per_step"]
            print(json.dumps(row), flush=True)
        base = results.get(0)
        for workers, seconds in results.items():
            if workers and base:
                summary[f"{name}_speedup_{workers}_workers"] = base / seconds
                summary[f"{name}_overhead_s_per_step_{workers}_workers"] = seconds - base
    summary["load_after"] = load_average()
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
