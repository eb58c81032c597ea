"""Where one actor update's time goes: torch.profiler's operators, by self CPU time.

    .venv-vllm/bin/python benchmarks/profile_update.py                  # smollm2 (the real LM), 2 threads, ~3 min
    .venv/bin/python benchmarks/profile_update.py --model 10m --threads 1

Builds the trainer on the model's default workload (benchmarks/common.py, the `hf` rollout), runs
`--warmup` steps, keeps the batch of one more step's update, times that same update `--repeats`
times (seconds, and the optimizer step alone), then runs it once under torch.profiler. Printed, one
JSON object: the update seconds, AdamW's seconds, and the `--top` operators by self CPU time with
their share of the profiled update (`aten::mm` is the matmuls; attention, element-wise kernels and
the optimizer are the rest). The update repeats on the same batch and weights keep changing, so each
repeat is the same work.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (MODELS, WORKLOADS, build_model, machine, nanoverl_step, nanoverl_trainer,  # noqa: E402
                    timed_method, tmpdir, workload_config)


def main(argv: list[str] | None = None) -> None:
    from torch.profiler import ProfilerActivity, profile

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", choices=[*MODELS, "smollm2"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="config overrides, e.g. model.compute_dtype=bfloat16")
    args = parser.parse_args(argv)

    work = tmpdir("profile-update")
    model = build_model(args.model, work / "model")
    config = workload_config(args.model, model, work / "run", WORKLOADS[args.model],
                             extra=["rollout.name=hf", f"trainer.num_threads={args.threads}", *args.set])
    trainer = nanoverl_trainer(config)
    for _ in range(args.warmup):
        nanoverl_step(trainer)
    actor, update, captured = trainer.workers.actor, trainer.workers.actor.update, {}

    def keep(batch, loss, on_policy=False):
        captured.update(batch=batch, loss=loss, on_policy=on_policy)
        return update(batch, loss, on_policy=on_policy)

    actor.update = keep
    nanoverl_step(trainer)
    actor.update = update
    batch, loss, on_policy = captured["batch"], captured["loss"], captured["on_policy"]

    seconds, optimizer = [], []
    timed_method(actor.optimizer, "step", optimizer)
    for _ in range(args.repeats):
        start = time.perf_counter()
        update(batch, loss, on_policy=on_policy)
        seconds.append(time.perf_counter() - start)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        update(batch, loss, on_policy=on_policy)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    print(json.dumps({
        "benchmark": "profile_update", "model": args.model, "threads": args.threads, "set": args.set,
        "rows": len(batch), "tokens": int(batch["prompt_mask"].sum() + batch["response_mask"].sum()),
        "update_s": [round(s, 3) for s in seconds], "optimizer_step_s": [round(s, 3) for s in optimizer[:args.repeats]],
        "profiled_self_cpu_s": round(total / 1e6, 3),
        "top_self_cpu": [{"op": e.key, "share": round(e.self_cpu_time_total / total, 4), "calls": e.count}
                         for e in events[:args.top]],
        "machine": machine()}), flush=True)


if __name__ == "__main__":
    main()
