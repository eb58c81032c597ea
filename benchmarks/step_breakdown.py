"""Where a nanoverl step goes: seconds per stage, tokens/s and peak memory, per workload.

    .venv/bin/python benchmarks/step_breakdown.py                   # default set, ~5 min on 2 busy cores
    .venv/bin/python benchmarks/step_breakdown.py --workloads hf-10m --sweep-model 10m \\
        --sweep-batch 4 16 --sweep-n 4 16 --sweep-len 32 64        # bigger sweeps
    .venv/bin/python benchmarks/step_breakdown.py --no-sweep --device cuda --threads 0

Each workload runs in a fresh subprocess (so its peak memory is its own) through the real trainer:
`Trainer(load_config(base, overrides, registry=load_registry()), load_registry())`, `--warmup` steps,
then `--steps` measured steps, exactly as `Trainer.fit` runs them (validation, checkpoints, rollout
dumps and trackers off).
One JSON object per workload is printed as it finishes:

  stage_s            median of the trainer's own `timing/<stage>` metrics: data, rollout, reward,
                     old_log_probs, ref_log_probs, values, advantages, critic_update, actor_update,
                     weight_sync, step (a stage the workload does not run is absent)
  step_cpu_s         median CPU seconds of the process per step (robust to other jobs' load)
  generated_tokens_per_s   response tokens / rollout seconds
  trained_tokens_per_s     (prompt + response) tokens / actor_update seconds
  tokens_per_s       the trainer's throughput/tokens_per_s (prompt + response tokens / step seconds)
  peak_rss_mb        peak resident memory of the process (ru_maxrss); on CUDA also
                     peak_cuda_allocated_mb (torch.cuda.max_memory_allocated)

Workloads (models in benchmarks/common.py):
  debug        the core's debug backends, PPO with a critic (examples/configs/debug_ppo.toml)
  hf-tiny      the hf worker / rollout, GRPO, the ~83k-parameter tiny model (tiny_grpo.toml)
  hf-tiny-ppo  the same with a critic (GAE), a reference policy and a KL loss: every stage runs
  hf-10m       GRPO on the ~9.4M-parameter Llama
  hf-10m-v32k  GRPO on the ~10.3M-parameter Llama with a 32k vocabulary (--full or --workloads)
  smollm2      GRPO on the real SmolLM2-135M-Instruct, arithmetic prompts, 8 x 8 samples, exactly 32 new
               tokens (EOS never sampled), 16-row micro-batches, hf rollout
  smollm2-vllm the same with the vllm rollout (run with .venv-vllm/bin/python; the old-log-prob pass runs
               because the rollout-mismatch metrics need it)
  smollm2-plain  smollm2 with every row's prompt run whole (rollout.hf.share_prompts and actor.share_prompts
               off): what prompt sharing saves
For every workload the actor update is also stated against this CPU's limit, measured in the same
process at the same thread count (common.gemm_gflops: the fastest 2048^3 matmul in the precision the
update's matmuls run in, `gemm_dtype`: model.compute_dtype, else model.dtype):
  update_gflops_per_s      useful FLOPs of the update (common.update_flops: 6 x non-embedding parameters
                           x real tokens + the LM head on response positions) / its median seconds
  update_fraction_of_gemm  that over gemm_gflops_per_s. With actor.share_prompts each distinct prompt runs
                           once, so this counts work not done and can pass 1: the machine's efficiency is
  update_executed_fraction_of_gemm  the FLOPs run (distinct prompts once, every row's response) over GEMM
  rollout_* , old_log_probs_*   the same for the forward-only stages (a third of the update's FLOPs:
                           prefill plus one position per generated token); the rollout's decode runs
                           products of batch-size rows, the KV-cache attention and sampling besides
  actor_update_s_all       every measured step's update seconds (identical work on smollm2: the spread)
The sweep varies prompts per step, samples per prompt and response length one at a time around the
`--sweep-model`'s default workload.

`--config RECIPE` runs an example recipe as it ships instead (its model, data, rollout, environment and
micro-batches; evaluation, checkpoints, rollout dumps and trackers off; `--set` adds overrides), e.g.
the calculator's multi-turn episodes with packing on (the default) and off (`--set actor.pack=false`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (MODELS, ROOT, WORKLOADS, build_model, gemm_gflops, machine, median,  # noqa: E402
                    nanoverl_config, nanoverl_step, nanoverl_trainer, now, num_parameters, peak_rss_mb,
                    recipe_overrides, run_json_subprocess, since, tmpdir, update_flops, workload_config)

STAGES = ("data", "rollout", "reward", "old_log_probs", "ref_log_probs", "values", "advantages",
          "critic_update", "actor_update", "weight_sync", "step")
PPO = ["algorithm.advantage_estimator=gae", "critic.enable=true", "critic.lr=1e-5", "reference.enable=true",
       "actor.use_kl_loss=true"]
WORKLOAD_SPECS = {
    "debug": {"backend": "debug", "model": None, "extra": [], "batch": 16, "n": 8, "max_new_tokens": 4},
    "hf-tiny": {"backend": "hf", "model": "tiny", "extra": [], **WORKLOADS["tiny"]},
    "hf-tiny-ppo": {"backend": "hf", "model": "tiny", "extra": PPO, **WORKLOADS["tiny"]},
    "hf-10m": {"backend": "hf", "model": "10m", "extra": [], **WORKLOADS["10m"]},
    "hf-10m-v32k": {"backend": "hf", "model": "10m-v32k", "extra": [], **WORKLOADS["10m-v32k"]},
    "smollm2": {"backend": "hf", "model": "smollm2", "extra": ["rollout.name=hf"], **WORKLOADS["smollm2"]},
    "smollm2-vllm": {"backend": "hf", "model": "smollm2", "extra": ["rollout.name=vllm"], **WORKLOADS["smollm2"]},
    "smollm2-plain": {"backend": "hf", "model": "smollm2", **WORKLOADS["smollm2"],
                      "extra": ["rollout.name=hf", "rollout.hf.share_prompts=false", "actor.share_prompts=false"]},
}


def measure(trainer, warmup: int, steps: int, samples: int) -> tuple[dict, list[dict], tuple[float, float, float]]:
    """Run `warmup` + `steps` trainer steps of `samples` rows each. Returns the figures of the measured
    steps (stage_s, step_cpu_s, response_length_mean, generated / trained tokens/s, tokens_per_s,
    peak_rss_mb: see the module docstring), their metrics, and the step's median prompt, response and
    prompt + response tokens."""
    rows, cpu = [], []
    for _ in range(warmup + steps):
        start = now()
        rows.append(nanoverl_step(trainer))
        cpu.append(since(start)[1])
    rows, cpu = rows[warmup:], cpu[warmup:]
    stage = {s: round(median([r[f"timing/{s}"] for r in rows]), 4) for s in STAGES if f"timing/{s}" in rows[0]}
    response = median([r["rollout/response_length/mean"] for r in rows]) * samples
    prompt = median([r["rollout/prompt_length/mean"] for r in rows]) * samples
    tokens = median([(r["rollout/prompt_length/mean"] + r["rollout/response_length/mean"]) * samples for r in rows])
    figures = {
        "stage_s": stage, "step_cpu_s": round(median(cpu), 4),
        "response_length_mean": round(response / samples, 2),
        "generated_tokens_per_s": round(response / stage["rollout"], 1),
        "trained_tokens_per_s": round((prompt + response) / stage["actor_update"], 1),
        "tokens_per_s": round(median([r["throughput/tokens_per_s"] for r in rows]), 1),
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }
    return figures, rows, (prompt, response, tokens)


def run_one(spec: dict) -> dict:
    """Child process: build the model, run the trainer, return the workload's figures."""
    import torch

    from nanoverl_core.workers.precision import autocast_dtype

    work = tmpdir(f"breakdown-{spec['name']}")
    extra = [*spec["extra"], f"trainer.device={spec['device']}", f"trainer.num_threads={spec['threads']}"]
    if spec["backend"] == "recipe":
        from nanoverl_core import load_config, load_registry

        config = load_config(str(ROOT / spec["config"]), [*recipe_overrides(work / "run", 1000), *extra],
                             registry=load_registry())
        spec = {**spec, "batch": config.data.batch_size, "n": config.rollout.n,
                "max_new_tokens": config.rollout.max_new_tokens, "model": config.model.path}
        params = None
    elif spec["backend"] == "debug":
        config = nanoverl_config(None, work / "run", batch=spec["batch"], n=spec["n"],
                                 max_new_tokens=spec["max_new_tokens"], extra=extra,
                                 base="examples/configs/debug_ppo.toml",
                                 data=ROOT / "examples/data/debug_copy/train.jsonl")
        params = None
    else:
        model_dir = build_model(spec["model"], work / "model")
        params = num_parameters(model_dir)
        config = workload_config(spec["model"], model_dir, work / "run", spec, extra=extra)
    trainer = nanoverl_trainer(config)
    cuda = trainer.workers.actor.device.type == "cuda"
    samples = spec["batch"] * spec["n"]
    figures, rows, (prompt, response, tokens) = measure(trainer, spec["warmup"], spec["steps"], samples)
    stage = figures["stage_s"]
    out = {
        "benchmark": "step_breakdown", "workload": spec["name"], "backend": spec["backend"],
        "model": spec["model"], "parameters": params, "algorithm": config.algorithm.advantage_estimator,
        "critic": config.critic.enable, "reference": config.reference.enable,
        "batch_prompts": spec["batch"], "n": spec["n"], "max_new_tokens": spec["max_new_tokens"],
        "device": str(trainer.workers.actor.device), "threads": torch.get_num_threads(),
        "steps_measured": spec["steps"], "warmup": spec["warmup"], "overrides": spec["extra"],
        "actor_pack_layout": getattr(trainer.workers.actor, "packing", None) or "none", **figures,
    }
    if params is not None:
        module = trainer.workers.actor.module
        head, embedding = module.get_output_embeddings().weight, module.get_input_embeddings().weight
        untied = head.numel() if head.data_ptr() != embedding.data_ptr() else 0
        def flops_of(real_tokens: float) -> float:
            return update_flops(params - untied, embedding.numel(), head.shape[1], head.shape[0], real_tokens, response)
        flops = flops_of(tokens)
        # shared prompts: the batch's distinct prompts (all but their last token) once, every row from there
        executed = flops_of(spec["batch"] * (prompt / samples - 1) + samples + response
                            if trainer.workers.actor.forward_pass.cache_keyword is not None else tokens)
        gemm_dtype = autocast_dtype(config.model) or config.model.dtype     # "auto" is resolved by now
        gemm = gemm_gflops(dtype=gemm_dtype)
        out.update({"prompt_length_mean": round(prompt / samples, 2), "gemm_gflops_per_s": round(gemm, 1),
                    "gemm_dtype": gemm_dtype,
                    "actor_update_s_all": [round(r["timing/actor_update"], 3) for r in rows]})
        # forward-only stages do a third of the update's FLOPs (the rollout: prefill + one position per new token)
        for name, stage_flops in (("update", flops), ("rollout", flops / 3), ("old_log_probs", flops / 3)):
            seconds = stage.get("actor_update" if name == "update" else name, 0.0)
            if seconds > 0.01:
                out[f"{name}_gflops_per_s"] = round(stage_flops / seconds / 1e9, 1)
                out[f"{name}_fraction_of_gemm"] = round(stage_flops / seconds / 1e9 / gemm, 3)
        if stage.get("actor_update", 0.0) > 0.01:
            out["update_executed_fraction_of_gemm"] = round(executed / stage["actor_update"] / 1e9 / gemm, 3)
    if cuda:
        out["peak_cuda_allocated_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    out["machine"] = machine()
    return out


def plan(args) -> list[dict]:
    """The workloads to run: the named ones, then the sweep around --sweep-model's default."""
    common = {"steps": args.steps, "warmup": args.warmup, "device": args.device, "threads": args.threads}
    specs = [{"name": name, **WORKLOAD_SPECS[name], **common} for name in args.workloads]
    if not args.no_sweep:
        base = {"name": f"hf-{args.sweep_model}", **WORKLOAD_SPECS[f"hf-{args.sweep_model}"], **common}
        for key, values in (("batch", args.sweep_batch), ("n", args.sweep_n), ("max_new_tokens", args.sweep_len)):
            for value in values:
                if value != base[key]:
                    specs.append({**base, key: value, "name": f"{base['name']} {key}={value}"})
    return [{**spec, "extra": [*spec["extra"], *args.set]} for spec in specs]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=["debug", "hf-tiny", "hf-tiny-ppo", "hf-10m"],
                        choices=list(WORKLOAD_SPECS))
    parser.add_argument("--full", action="store_true",
                        help="add hf-10m-v32k and sweep the 10m model too (tens of minutes on a small CPU)")
    parser.add_argument("--sweep-model", default="tiny", choices=[m for m in MODELS])
    parser.add_argument("--sweep-batch", nargs="*", type=int, default=[4, 64], help="prompts per step")
    parser.add_argument("--sweep-n", nargs="*", type=int, default=[2, 32], help="samples per prompt")
    parser.add_argument("--sweep-len", nargs="*", type=int, default=[16, 64], help="max new tokens")
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument("--steps", type=int, default=4, help="measured steps per workload")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="trainer.device (cpu, cuda, auto)")
    parser.add_argument("--threads", type=int, default=1, help="trainer.num_threads (0: torch's default)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="config overrides added to every workload (e.g. actor.micro_batch_size=64)")
    parser.add_argument("--config", help="run this example recipe as it ships instead of --workloads (see above)")
    parser.add_argument("--one", help=argparse.SUPPRESS)   # internal: run one workload spec (JSON) here
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(json.loads(args.one))), flush=True)
        return
    if args.config:
        common = {"steps": args.steps, "warmup": args.warmup, "device": args.device, "threads": args.threads}
        spec = {"name": Path(args.config).stem, "backend": "recipe", "config": args.config, "extra": args.set,
                **common}
        print(json.dumps(run_json_subprocess([__file__, "--one", json.dumps(spec)])), flush=True)
        return
    specs = plan(args)
    if args.full:
        extra = argparse.Namespace(**{**vars(args), "full": False, "sweep_model": "10m", "workloads": ["hf-10m-v32k"]})
        specs += plan(extra)
    for spec in specs:
        print(json.dumps(run_json_subprocess([__file__, "--one", json.dumps(spec)])), flush=True)


if __name__ == "__main__":
    main()
