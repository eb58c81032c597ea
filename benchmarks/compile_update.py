"""`model.compile` against eager PyTorch: compile time, graphs, equal outputs, and step time, interleaved.

    .venv-vllm/bin/python benchmarks/compile_update.py                  # smollm2 (the real LM), 2 threads, ~8 min
    .venv/bin/python benchmarks/compile_update.py --model 10m --threads 1
    .venv-vllm/bin/python benchmarks/compile_update.py --set model.compute_dtype=bfloat16    # both trainers in bf16

Builds two trainers on the model's default workload (benchmarks/common.py, the `hf` rollout, the
same weights and seed): one eager, one with `model.compile = true`. Then:

1. equal outputs: the compiled actor gets the eager one's weights, and both compute the log-probs
   of one batch (the eager trainer's first step's): their largest difference on response tokens;
2. compile cost: the seconds of the compiled trainer's first step against the eager trainer's
   first step (`first_step_s`; the compilation happens there), and `perf/compiled_graphs` /
   `perf/compile_s` after it;
3. speed: `--steps` more steps of each, alternating eager, compiled, eager, ... (whatever else runs on
   the machine hits both alike): median seconds per stage (`timing/rollout`, `timing/actor_update`,
   `timing/step`) and the ratio eager / compiled; and whether any graph was compiled after the first
   step (`graphs_after_first_step`: a recompile storm shows there).

One JSON object on stdout. Each trainer's weights move with its own updates, so after step 1 the two
do the same work, not the same numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (MODELS, WORKLOADS, build_model, machine, nanoverl_step, nanoverl_trainer,  # noqa: E402
                    tmpdir, workload_config)

STAGES = ("rollout", "actor_update", "step")


def main(argv: list[str] | None = None) -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", choices=[*MODELS, "smollm2"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="measured steps of each trainer after the first")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="config overrides for both trainers, e.g. model.compute_dtype=bfloat16")
    args = parser.parse_args(argv)

    work = tmpdir("compile-update")
    model = build_model(args.model, work / "model")
    trainers = {}
    for name, flag in (("eager", "false"), ("compiled", "true")):
        config = workload_config(args.model, model, work / name, WORKLOADS[args.model],
                                 extra=["rollout.name=hf", f"trainer.num_threads={args.threads}",
                                        *args.set, f"model.compile={flag}"])
        trainers[name] = nanoverl_trainer(config)
    eager, compiled = trainers["eager"], trainers["compiled"]

    # 1. one batch (the eager trainer's first step's), both actors at the eager one's weights before it
    captured, update = {}, eager.workers.actor.update

    def keep(batch, *args, **kwargs):
        captured["batch"] = batch
        return update(batch, *args, **kwargs)

    initial = {k: v.clone() for k, v in eager.workers.actor.module.state_dict().items()}
    eager.workers.actor.update = keep
    start = time.perf_counter()
    nanoverl_step(eager)
    first_s = {"eager": time.perf_counter() - start}
    eager.workers.actor.update = update
    batch = captured["batch"]
    after_step = {k: v.clone() for k, v in eager.workers.actor.module.state_dict().items()}
    eager.workers.actor.module.load_state_dict(initial)
    compiled.workers.actor.module.load_state_dict(initial)
    start = time.perf_counter()
    log_probs = {name: t.workers.actor.compute_log_probs(batch) for name, t in trainers.items()}
    lp_first_s = time.perf_counter() - start
    eager.workers.actor.module.load_state_dict(after_step)
    mask = batch["response_mask"].bool()
    lp_diff = float((log_probs["eager"] - log_probs["compiled"])[mask].abs().max())

    # 2. the compiled trainer's first step (the training graphs compile here)
    start = time.perf_counter()
    graphs_first = nanoverl_step(compiled).get("perf/compiled_graphs", 0.0)
    first_s["compiled"] = time.perf_counter() - start

    # 3. alternate
    timings: dict[str, dict[str, list[float]]] = {name: {s: [] for s in STAGES} for name in trainers}
    last = {}
    for _ in range(args.steps):
        for name, trainer in trainers.items():
            last[name] = nanoverl_step(trainer)
            for stage in STAGES:
                timings[name][stage].append(last[name][f"timing/{stage}"])
    median = {name: {s: round(statistics.median(v), 3) for s, v in stages.items()} for name, stages in timings.items()}
    print(json.dumps({
        "benchmark": "compile_update", "model": args.model, "threads": args.threads, "steps": args.steps,
        "set": args.set, "rows": len(batch), "log_prob_max_abs_diff": lp_diff,
        "log_prob_pass_both_first_s": round(lp_first_s, 2),
        "first_step_s": {k: round(v, 2) for k, v in first_s.items()},
        "compiled_graphs_after_first_step": graphs_first,
        "compiled_graphs_at_end": last["compiled"].get("perf/compiled_graphs", 0.0),
        "graphs_after_first_step": last["compiled"].get("perf/compiled_graphs", 0.0) - graphs_first,
        "compile_s": round(last["compiled"].get("perf/compile_s", 0.0), 2),
        "median_s": median,
        "all_s": {name: {s: [round(x, 3) for x in v] for s, v in stages.items()} for name, stages in timings.items()},
        "eager_over_compiled": {s: round(median["eager"][s] / median["compiled"][s], 3) for s in STAGES},
        "torch_threads": torch.get_num_threads(), "machine": machine()}), flush=True)


if __name__ == "__main__":
    main()
