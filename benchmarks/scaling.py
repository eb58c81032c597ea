"""How a nanoverl step's cost grows: seconds per stage and peak memory over four sweeps.

    .venv/bin/python benchmarks/scaling.py                         # all four sweeps, ~15 min on 2 quiet cores
    .venv/bin/python benchmarks/scaling.py --sweeps length n       # some of them
    .venv/bin/python benchmarks/scaling.py --quick                 # ~1 min smoke: tiny shapes, one step a point

Every point runs in a fresh subprocess (its peak memory is its own) through the real trainer, as
`step_breakdown.py` runs its workloads (`step_breakdown.measure`): hf worker, hf rollout sharing the
actor's module, GRPO, one on-policy update a step, `--warmup` steps and then `--steps` measured ones,
one torch thread. The model is a Llama with tied embeddings on the 10m model's 4,014-token vocabulary,
random weights drawn from trainer.seed (`common.fixed_length_folder`: a config-only folder whose EOS
lies one id past the model's vocabulary, so it is never sampled and every response is exactly the
swept length); the prompts are the tiny copy task's ("dddd=", 5 tokens). Base shape: hidden 256, 4
layers, 8 heads, intermediate 4 x hidden (5.2M parameters); base workload: 4 prompts x 4 samples, 64
response tokens. Memory is bounded by a token budget (`--budget`, 576 tokens): the update and the
log-prob passes take `actor.max_tokens_per_micro_batch = budget`, the rollout generates
`rollout.micro_batch_size = budget // (5 + response tokens)` rows a call (the tokens of a call's KV
cache at its end are the budget's). 576 tokens fill 90-96% of the budget at every length of the
length sweep (15, 8, 4, 2 and 1 rows of 37, 69, 133, 261 and 517 tokens).

The sweeps, one setting varied around the base at a time (`--values` replaces the list of one sweep):
  length   response tokens 32, 64, 128, 256, 512 at the same token budget (memory should stay flat)
  batch    prompts x samples 4x4, 8x8, 16x8, 16x16 (16 to 256 rows)
  n        group size 2, 4, 8, 16 with 8 prompts
  width    hidden size 128, 256, 512, 768 (4 layers, 8 heads, intermediate 4 x hidden; 1.6M to 41M parameters)

One JSON line per point, as it finishes:
  sweep, value, label      the sweep and its setting (label: the figure's tick, e.g. "16x8")
  hidden, layers, heads, parameters, batch_prompts, n, rows, max_new_tokens
  budget_tokens, rollout_micro_batch_rows   the memory bound above (0: whole batch in one pass / call)
  stage_s                  median seconds of the trainer's `timing/<stage>` over the measured steps
                           (rollout, reward, old_log_probs, advantages, actor_update, weight_sync, data, step)
  step_s                   stage_s["step"]: the whole step; step_cpu_s the process's CPU seconds per step
  tokens_per_s             the trainer's throughput/tokens_per_s (prompt + response tokens / step seconds);
                           generated_tokens_per_s (response tokens / rollout s), trained_tokens_per_s
                           (prompt + response tokens / actor_update s)
  prompt_length_mean, response_length_mean   5 and max_new_tokens when the workload is as stated
  rss_before_steps_mb      resident memory after the trainer is built (model, libraries), before any step
  step_peak_rss_mb         the highest resident memory during the steps (/proc/self/statm every 2 ms,
                           memory_flat.RSSSampler); step_extra_mb = step_peak - before (AdamW state,
                           gradients, activations, KV cache, batch tensors)
  peak_rss_mb              ru_maxrss: the process's lifetime peak
and after each sweep a summary line: its PNG's path (`figure`), the per-point step seconds and memory,
their growth from the first point (`step_s_growth`, `step_peak_growth`, `step_extra_growth`: a value per
point), and for the length sweep, when it holds 32 and 256, the figure of the issue: `flat_32_to_256`,
the step peak's and the step extra's growth from 32 to 256 response tokens and whether the extra stays
within 1.3x.

Each sweep draws one PNG (`--out`/scaling_<sweep>.png, default benchmarks/figures/): stacked bars of
the median stage seconds against the swept value (stages under 1% of every step go into "other", with
the step's time outside every stage), and below them the step's peak resident memory and the memory
before the steps.

Time: the default run is 17 points, 3 steps each, one thread: ~15 minutes on a quiet CPU core, estimated
from one base point (2.9 CPU s a step: rollout 128 decode steps of 8 rows, update 1,104 tokens) and
`generate`'s cost per decode step on the base shape (7 ms for one row, 13 ms for 8). The 512-token point
is the longest, ~3 minutes: at the budget its rollout is 16 generate calls of one row x 512 decode steps
(~1 minute a step); the length sweep takes ~5.5 minutes, batch ~5, n ~3, width ~2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (ROOT, fixed_length_folder, machine, nanoverl_config, nanoverl_trainer,  # noqa: E402
                    run_json_subprocess, tmpdir)
from memory_flat import RSSSampler, current_rss_mb  # noqa: E402
from step_breakdown import measure  # noqa: E402

PROMPT_TOKENS = 5   # the tiny copy task's prompts, "dddd=" (character tokenizer, no BOS added)

BASE = {"hidden": 256, "layers": 4, "heads": 8, "batch": 4, "n": 4, "max_new_tokens": 64}
SWEEPS: dict[str, dict] = {
    "length": {"key": "max_new_tokens", "values": [32, 64, 128, 256, 512], "fixed": {},
               "xlabel": "response tokens (every response exactly this long)"},
    "batch": {"key": "batch_n", "values": ["4x4", "8x8", "16x8", "16x16"], "fixed": {},
              "xlabel": "prompts x samples per prompt"},
    "n": {"key": "n", "values": [2, 4, 8, 16], "fixed": {"batch": 8}, "xlabel": "group size n (8 prompts)"},
    "width": {"key": "hidden", "values": [128, 256, 512, 768], "fixed": {},
              "xlabel": "hidden size (parameters)"},
}
QUICK_BASE = {"hidden": 32, "layers": 1, "heads": 2, "batch": 2, "n": 2, "max_new_tokens": 8}
QUICK_VALUES = {"length": [8, 16], "batch": ["2x2", "4x2"], "n": [2, 4], "width": [16, 32]}
SHOWN = ("rollout", "actor_update", "old_log_probs", "ref_log_probs", "values", "critic_update", "reward",
         "advantages", "weight_sync", "data")
"""The stages drawn, bottom to top (the hf GRPO step runs no reference, values or critic)."""


def run_point(spec: dict) -> dict:
    """Child process: write the model folder, build the trainer, run the steps, return the point's figures."""
    import torch

    work = tmpdir(f"scaling-{spec['sweep']}-{spec['label']}")
    length, budget = spec["max_new_tokens"], spec["budget"]
    folder = fixed_length_folder(work / "model", hidden=spec["hidden"], layers=spec["layers"], heads=spec["heads"],
                                 intermediate=4 * spec["hidden"], max_positions=max(1024, PROMPT_TOKENS + length))
    rows = spec["batch"] * spec["n"]
    micro_rows = min(rows, budget // (PROMPT_TOKENS + length)) if budget else 0
    bound = [f"actor.max_tokens_per_micro_batch={budget}", f"rollout.micro_batch_size={micro_rows}"] if budget else []
    config = nanoverl_config(folder, work / "run", batch=spec["batch"], n=spec["n"], max_new_tokens=length,
                             extra=[*bound, f"trainer.device={spec['device']}", f"trainer.num_threads={spec['threads']}",
                                    "rollout.name=hf", "worker.name=hf", "algorithm.advantage_estimator=grpo",
                                    *spec["set"]])
    trainer = nanoverl_trainer(config)
    before, sampler = current_rss_mb(), RSSSampler()
    sampler.start()
    try:
        figures, metrics, _ = measure(trainer, spec["warmup"], spec["steps"], rows)
    finally:
        sampler.stop.set()
        sampler.join()
    out = {"benchmark": "scaling", "sweep": spec["sweep"], "value": spec["value"], "label": spec["label"],
           "hidden": spec["hidden"], "layers": spec["layers"], "heads": spec["heads"],
           "parameters": sum(p.numel() for p in trainer.workers.actor.module.parameters()),
           "batch_prompts": spec["batch"], "n": spec["n"], "rows": rows, "max_new_tokens": length,
           "budget_tokens": budget, "rollout_micro_batch_rows": micro_rows,
           "steps_measured": spec["steps"], "warmup": spec["warmup"], "device": str(trainer.workers.actor.device),
           "threads": torch.get_num_threads(), **figures, "step_s": figures["stage_s"]["step"],
           "prompt_length_mean": round(sum(m["rollout/prompt_length/mean"] for m in metrics) / len(metrics), 2),
           "rss_before_steps_mb": round(before, 1), "step_peak_rss_mb": round(sampler.peak, 1),
           "step_extra_mb": round(sampler.peak - before, 1)}
    if trainer.workers.actor.device.type == "cuda":
        out["peak_cuda_allocated_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return out


def parse_value(sweep: str, text: str):
    """A swept value from the command line: "PxN" for the batch sweep, an integer for the others."""
    try:
        if sweep == "batch":
            prompts, samples = text.lower().split("x")
            int(prompts), int(samples)
            return text.lower()
        return int(text)
    except ValueError:
        expected = "PROMPTSxSAMPLES such as 8x8" if sweep == "batch" else "an integer"
        raise SystemExit(f"error: --values {text!r} is not a value of the {sweep} sweep; give {expected}") from None


def points(sweep: str, base: dict, values: list, common: dict) -> list[dict]:
    """The specs of one sweep: the base with the swept setting (and the sweep's fixed ones) replaced."""
    key, fixed, specs = SWEEPS[sweep]["key"], SWEEPS[sweep]["fixed"], []
    for value in values:
        spec = {**base, **fixed, **common, "sweep": sweep, "value": value, "label": str(value)}
        if key == "batch_n":
            spec["batch"], spec["n"] = map(int, value.split("x"))
        else:
            spec[key] = value
        if spec["budget"] and spec["budget"] < PROMPT_TOKENS + spec["max_new_tokens"]:
            raise SystemExit(f"error: --budget {spec['budget']} is under one row of {PROMPT_TOKENS} prompt + "
                             f"{spec['max_new_tokens']} response tokens; raise --budget or use 0 (no micro-batches)")
        specs.append(spec)
    return specs


def draw(sweep: str, rows: list[dict], path: Path) -> None:
    """Stacked stage seconds per point above the memory panel; written to `path` (Agg, no display)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 6.5), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[2, 1])
    x = list(range(len(rows)))
    steps = [r["step_s"] for r in rows]
    shown = [s for s in SHOWN if any(r["stage_s"].get(s, 0) >= 0.01 * r["step_s"] for r in rows)]
    floor = [0.0] * len(rows)
    for stage in [*shown, "other"]:
        if stage == "other":
            heights = [max(0.0, r["step_s"] - sum(r["stage_s"].get(s, 0) for s in shown)) for r in rows]
        else:
            heights = [r["stage_s"].get(stage, 0.0) for r in rows]
        top.bar(x, heights, bottom=floor, label=stage, width=0.6)
        floor = [f + h for f, h in zip(floor, heights)]
    for i, seconds in enumerate(steps):
        top.annotate(f"{seconds:.2f} s", (i, seconds), ha="center", va="bottom", fontsize=8)
    top.set_ylabel("seconds per step (median)")
    top.set_ylim(0, max(steps) * 1.12)
    top.legend(loc="upper left", fontsize=8)
    first = rows[0]
    shape = f"hidden {first['hidden']}, {first['layers']} layer(s), {first['heads']} heads"
    budget = f"budget {first['budget_tokens']} tokens per micro-batch" if first["budget_tokens"] else "no micro-batches"
    if sweep == "width":
        shape = f"{first['layers']} layer(s), {first['heads']} heads"
    steps = f"{first['steps_measured']} step{'s' * (first['steps_measured'] != 1)}"
    top.set_title(f"scaling: {sweep} sweep ({shape}; {budget})\nGRPO, hf rollout, median of {steps} after "
                  f"{first['warmup']} warm-up, {first['threads']} torch thread(s)", fontsize=10)
    bottom.plot(x, [r["step_peak_rss_mb"] for r in rows], "o-", label="peak during the steps")
    bottom.plot(x, [r["rss_before_steps_mb"] for r in rows], "s--", label="before the first step")
    bottom.set_ylim(0, max(r["step_peak_rss_mb"] for r in rows) * 1.15)
    bottom.set_ylabel("resident memory (MiB)")
    bottom.legend(loc="lower right", fontsize=8)
    labels = [f"{r['label']}\n({r['parameters'] / 1e6:.1f}M)" if sweep == "width" else r["label"] for r in rows]
    bottom.set_xticks(x, labels)
    bottom.set_xlabel(SWEEPS[sweep]["xlabel"])
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def summarise(sweep: str, rows: list[dict], figure: Path) -> dict:
    first = rows[0]
    out = {"benchmark": "scaling", "sweep": sweep, "summary": True, "figure": str(figure),
           "values": [r["value"] for r in rows], "step_s": [r["step_s"] for r in rows],
           "step_peak_rss_mb": [r["step_peak_rss_mb"] for r in rows], "step_extra_mb": [r["step_extra_mb"] for r in rows],
           "step_s_growth": [round(r["step_s"] / first["step_s"], 3) for r in rows],
           "step_peak_growth": [round(r["step_peak_rss_mb"] / first["step_peak_rss_mb"], 3) for r in rows],
           "step_extra_growth": [round(r["step_extra_mb"] / max(first["step_extra_mb"], 1e-9), 3) for r in rows]}
    by_value = {r["value"]: r for r in rows}
    if sweep == "length" and 32 in by_value and 256 in by_value:
        short, long = by_value[32], by_value[256]
        extra = round(long["step_extra_mb"] / max(short["step_extra_mb"], 1e-9), 3)
        out["flat_32_to_256"] = {"step_peak_growth": round(long["step_peak_rss_mb"] / short["step_peak_rss_mb"], 3),
                                 "step_extra_growth": extra, "within_1_3x": extra <= 1.3}
    out["machine"] = machine()
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweeps", nargs="+", default=list(SWEEPS), choices=list(SWEEPS))
    parser.add_argument("--values", nargs="+", metavar="VALUE",
                        help="the swept values of the one sweep given (batch: PROMPTSxSAMPLES, e.g. 8x8)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: hidden 32, 1 layer, 2 x 2 rows, 8 tokens, two values a sweep, one measured step")
    parser.add_argument("--steps", type=int, help="measured steps per point (default 2; --quick 1)")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up steps per point (the first starts "
                        "the reward's worker processes)")
    parser.add_argument("--budget", type=int, help="tokens per micro-batch and per generate call "
                        "(default 576; --quick 64; 0: the whole batch in one pass and one call)")
    parser.add_argument("--device", default="cpu", help="trainer.device (cpu, cuda, auto)")
    parser.add_argument("--threads", type=int, default=1, help="trainer.num_threads (0: torch's default)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides for every point")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "figures",
                        help="folder for the PNGs, scaling_<sweep>.png")
    parser.add_argument("--one", help=argparse.SUPPRESS)   # internal: run one point's spec (JSON) here
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_point(json.loads(args.one))), flush=True)
        return
    if args.values and len(args.sweeps) != 1:
        raise SystemExit("error: --values needs exactly one sweep in --sweeps (each sweep has its own kind of value)")
    base = QUICK_BASE if args.quick else BASE
    common = {"steps": args.steps if args.steps is not None else 1 if args.quick else 2,
              "warmup": args.warmup,
              "budget": args.budget if args.budget is not None else 64 if args.quick else 576,
              "device": args.device, "threads": args.threads, "set": args.set}
    if common["steps"] < 1:
        raise SystemExit("error: --steps must be at least 1 (the measured steps)")
    plans = {}
    for sweep in args.sweeps:   # every spec checked before the first point runs
        values = [parse_value(sweep, v) for v in args.values] if args.values else \
            (QUICK_VALUES if args.quick else {k: v["values"] for k, v in SWEEPS.items()})[sweep]
        plans[sweep] = points(sweep, base, values, common)
    for sweep, specs in plans.items():
        rows = []
        for spec in specs:
            rows.append(run_json_subprocess([__file__, "--one", json.dumps(spec)]))
            print(json.dumps(rows[-1]), flush=True)
        figure = args.out / f"scaling_{sweep}.png"
        draw(sweep, rows, figure)
        print(json.dumps(summarise(sweep, rows, figure)), flush=True)


if __name__ == "__main__":
    main()
