"""Peak memory stays flat when prompts per step grow and the micro-batch size is fixed.

    .venv/bin/python benchmarks/memory_flat.py                       # 10m model, 4 -> 16 prompts per step
    .venv/bin/python benchmarks/memory_flat.py --model tiny --batches 8 32 --micro 32

Each configuration runs `--steps` real trainer steps in a fresh subprocess, so every peak is its own.
With micro-batching, `actor.micro_batch_size` and `rollout.micro_batch_size` are both `--micro` rows:
the rollout generates, the old log-probs and the update run `--micro` rows at a time, so only the
batch's token ids, masks and per-token floats (B x T numbers) grow with the batch. Without it (0: the
whole batch in one call) activations grow with the batch; both are measured, for contrast.

Reported per configuration (MiB):
  rss_before_steps   resident memory after the trainer is built (model, optimizer, libraries)
  step_peak_rss      the highest resident memory seen during the steps: /proc/self/statm sampled
                     every 2 ms by a thread (Linux; no psutil)
  ru_maxrss          the process's lifetime peak (resource.getrusage), which includes loading
  step_extra         step_peak_rss - rss_before_steps: what the step itself adds
and per micro-batch setting the growth from the smallest to the largest batch: the ratio of the
step peaks (the figure held to <= 1.10) and of the step extras.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (MODELS, build_model, machine, nanoverl_config, nanoverl_step, nanoverl_trainer,  # noqa: E402
                    peak_rss_mb, run_json_subprocess, tmpdir)

PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20


def current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE_MB


class RSSSampler(threading.Thread):
    """Highest resident memory seen while running, sampled every `interval` seconds."""

    def __init__(self, interval: float = 0.002):
        super().__init__(daemon=True)
        self.interval, self.peak, self.stop = interval, current_rss_mb(), threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            self.peak = max(self.peak, current_rss_mb())


def run_one(spec: dict) -> dict:
    import torch

    work = tmpdir(f"memory-{spec['batch']}-{spec['micro']}")
    model_dir = build_model(spec["model"], work / "model")
    extra = [f"actor.micro_batch_size={spec['micro']}", f"rollout.micro_batch_size={spec['micro']}",
             f"trainer.device={spec['device']}"]
    trainer = nanoverl_trainer(nanoverl_config(model_dir, work / "run", batch=spec["batch"], n=spec["n"],
                                               max_new_tokens=spec["max_new_tokens"], extra=extra))
    before = current_rss_mb()
    sampler = RSSSampler()
    sampler.start()
    lengths = []
    for _ in range(spec["steps"]):
        lengths.append(nanoverl_step(trainer)["rollout/response_length/mean"])
    sampler.stop.set()
    sampler.join()
    out = {"benchmark": "memory_flat", **spec, "rows": spec["batch"] * spec["n"],
           "response_length_mean": round(sum(lengths) / len(lengths), 2),
           "rss_before_steps_mb": round(before, 1), "step_peak_rss_mb": round(sampler.peak, 1),
           "step_extra_mb": round(sampler.peak - before, 1), "ru_maxrss_mb": round(peak_rss_mb(), 1)}
    if trainer.workers.actor.device.type == "cuda":
        out["peak_cuda_allocated_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="10m", choices=list(MODELS))
    parser.add_argument("--batches", nargs="+", type=int, default=[4, 16], help="prompts per step")
    parser.add_argument("--micro", type=int, default=16, help="rows per micro-batch (rollout and actor)")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-contrast", action="store_true", help="skip the runs without micro-batching")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(json.loads(args.one))), flush=True)
        return

    results: dict[int, list[dict]] = {}
    for micro in [args.micro] + ([] if args.no_contrast else [0]):
        for batch in args.batches:
            spec = {"model": args.model, "batch": batch, "n": args.n, "max_new_tokens": args.max_new_tokens,
                    "micro": micro, "steps": args.steps, "device": args.device}
            row = run_json_subprocess([__file__, "--one", json.dumps(spec)])
            results.setdefault(micro, []).append(row)
            print(json.dumps(row), flush=True)
    summary = {"benchmark": "memory_flat", "summary": True, "model": args.model, "batches": args.batches}
    for micro, rows in results.items():
        small, large = rows[0], rows[-1]
        key = f"micro_{micro}" if micro else "no_micro_batching"
        summary[key] = {"step_peak_growth": round(large["step_peak_rss_mb"] / small["step_peak_rss_mb"], 3),
                        "step_extra_growth": round(large["step_extra_mb"] / max(small["step_extra_mb"], 1e-9), 3),
                        "step_peak_rss_mb": [r["step_peak_rss_mb"] for r in rows],
                        "step_extra_mb": [r["step_extra_mb"] for r in rows]}
        if "peak_cuda_allocated_mb" in small:
            summary[key]["cuda_peak_growth"] = round(
                large["peak_cuda_allocated_mb"] / small["peak_cuda_allocated_mb"], 3)
    summary["flat"] = summary[f"micro_{args.micro}"]["step_peak_growth"] <= 1.10
    summary["machine"] = {**machine(), "torch_threads": 1}   # every run: trainer.num_threads=1
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
