"""nanoverl's HF GRPO step side by side with TRL's GRPOTrainer, at equal work, in one process.

    .venv/bin/python benchmarks/vs_trl.py                  # tiny, 10m, 10m-v32k: one JSON object each (~6 min)
    .venv/bin/python benchmarks/vs_trl.py --models tiny --steps 60 --batch 32 --n 8 --max-new-tokens 16
    .venv/bin/python benchmarks/vs_trl.py --models smollm2            # the real LM, hf rollout on both sides
    .venv-vllm/bin/python benchmarks/vs_trl.py --models smollm2 --rollout vllm   # nanoverl's vllm rollout

Equal work, on both sides:
  - the same model files (benchmarks/common.py: safetensors drawn from seed 0, or smollm2's real
    weights), fp32, `--threads` torch threads (default 1);
  - the same prompts (examples/data/tiny_copy; for smollm2 the arithmetic chat prompts through the
    model's chat template), `--batch` prompts per step, `--n` samples each (TRL: num_generations),
    `--max-new-tokens` (defaults per model: common.WORKLOADS), sampling at temperature 1 with no
    top-p / top-k; smollm2's EOS is never sampled, so both generate exactly max_new_tokens;
  - the same reward (the core's `char_match`; for smollm2 examples/arithmetic/reward.py) and the
    same GRPO advantage (group mean / std);
  - one optimizer step per batch: TRL steps_per_generation=1, num_iterations=1,
    gradient_accumulation_steps=1, per_device_train_batch_size = batch * n; nanoverl ppo_epochs 1,
    mini-batch = batch, no micro-batching on either side (smollm2: nanoverl keeps its recipe's
    16-row micro-batches, the same gradient; TRL runs its 64 rows in one pass);
  - no reference model (TRL beta=0; nanoverl reference off), no KL, no entropy bonus, no gradient
    checkpointing (TRL's default is on), no dropout, AdamW at the same learning rate with a constant
    schedule and grad-norm clip 1.0;
  - float32, or with `--bf16` bf16 mixed precision on both sides: TRL's `bf16=True` (accelerate's
    autocast) and nanoverl's `model.compute_dtype = "bfloat16"`, float32 weights and AdamW state on both;
  - no logging, evaluation, saving or rollout dumps (TRL report_to="none", logging/save/eval
    strategy "no"; nanoverl no trackers, val_every=0, save_every=0, rollout_samples=0).

Load hits both equally: the two run interleaved step by step in one process. A TRL callback runs
one nanoverl step at every TRL `on_step_end`; TRL's step time is the wall time from the end of the
previous nanoverl step to TRL's next `on_step_end` (so it includes TRL's data loading, tokenisation
and bookkeeping), nanoverl's is the wall time of `train_step` plus its tracker call. The figure is
the median over `--steps` steps after `--warmup` steps; the ratio is TRL / nanoverl (> 1: nanoverl
is faster), given for wall time and for the process's CPU time (on a machine shared with other
jobs the CPU time is the steadier figure). The learning rate is small (1e-6) so the policy, and with
it the response lengths, stays comparable between the two over the run. TRL's own breakdown
(`trl_timing_median`: its generate call, its loss forward, its whole training_step) is read by
wrapping those methods.

`--rollout vllm` gives nanoverl its vllm rollout (run with the .venv-vllm of .ci/vllm-env.sh, with
trl installed there); TRL keeps transformers' generate, its only generator that runs on this CPU
(its vLLM modes target GPUs). The old-log-prob pass then runs on nanoverl's side, for the
rollout-mismatch metrics, and is counted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (ARITHMETIC_DATA, MODELS, ROOT, TINY_DATA, build_model, gemm_gflops, isa, machine,  # noqa: E402
                    median, nanoverl_step, nanoverl_trainer, now, num_parameters, peak_rss_mb, since, summary,
                    timed_method, tmpdir, workload, workload_config)


def trl_dataset(model_name: str):
    import datasets

    if model_name == "smollm2":
        rows = [json.loads(line) for line in ARITHMETIC_DATA.read_text().splitlines()]
        return datasets.Dataset.from_list([{"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"]}
                                           for r in rows])
    rows = [json.loads(line) for line in TINY_DATA.read_text().splitlines()]
    return datasets.Dataset.from_list([{"prompt": r["prompt"], "target": r["target"]} for r in rows])


def arithmetic_reward(prompts, completions, ground_truth, **_):
    """examples/arithmetic/reward.py's arithmetic, in TRL's reward signature (chat completions)."""
    sys.path.insert(0, str(ROOT / "examples" / "arithmetic"))
    from reward import arithmetic

    return [arithmetic("", c[-1]["content"] if isinstance(c, list) else c, {"ground_truth": t})
            for c, t in zip(completions, ground_truth)]


def char_match_reward(prompts, completions, target, **_):
    """The core's char_match, in TRL's reward signature."""
    from nanoverl_core.builtins.rewards import char_match

    return [char_match(p, c, {"target": t}) for p, c, t in zip(prompts, completions, target)]


def run(model_name: str, args) -> dict:
    import torch
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    work = tmpdir(f"vs-trl-{model_name}")
    model_dir = build_model(model_name, work / "model")
    w = workload(model_name, args)

    # nanoverl: the real trainer, driven one step at a time
    extra = [f"trainer.num_threads={args.threads}", f"model.compute_dtype={'bfloat16' if args.bf16 else ''}"]
    if model_name == "smollm2":
        extra.append(f"rollout.name={args.rollout}")
    cfg = workload_config(model_name, model_dir, work / "nanoverl", w, lr=args.lr, extra=extra)
    nv = nanoverl_trainer(cfg)

    total = args.warmup + args.steps
    trl_args = GRPOConfig(
        output_dir=str(work / "trl"), max_steps=total, seed=0, use_cpu=True, bf16=args.bf16, fp16=False,
        gradient_checkpointing=False, disable_dropout=True, learning_rate=args.lr, lr_scheduler_type="constant",
        weight_decay=0.0, max_grad_norm=1.0, per_device_train_batch_size=w["batch"] * w["n"],
        gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1, num_generations=w["n"],
        max_completion_length=w["max_new_tokens"], temperature=1.0, top_p=1.0, top_k=0, beta=0.0,
        loss_type="dapo", scale_rewards="group", epsilon=0.2, report_to="none", logging_strategy="no",
        save_strategy="no", eval_strategy="no", log_completions=False, dataloader_num_workers=0, disable_tqdm=True,
        model_init_kwargs={"dtype": torch.float32})
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"

    trl_times, nv_times, nv_rows = [], [], []   # (wall, cpu) seconds per step
    resume: list = [None]

    class Interleave(TrainerCallback):
        def on_step_begin(self, *_a, **_k):
            if resume[0] is None:
                resume[0] = now()   # first step: start the clock at TRL's first step

        def on_step_end(self, *_a, **_k):
            trl_times.append(since(resume[0]))
            start = now()
            nv_rows.append(nanoverl_step(nv))
            nv_times.append(since(start))
            resume[0] = now()

    score, trl_lengths = (arithmetic_reward if model_name == "smollm2" else char_match_reward), []

    def reward(prompts, completions, completion_ids, **kwargs):   # also records TRL's mean response length
        trl_lengths.append(sum(map(len, completion_ids)) / len(completion_ids))
        return score(prompts, completions, **kwargs)

    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=reward, args=trl_args,
                          train_dataset=trl_dataset(model_name), processing_class=tokenizer, callbacks=[Interleave()])
    # where TRL's step goes: its generate call, its loss forward, its backward (+ optimizer via the rest)
    trl_parts: dict[str, list[float]] = {"generate": [], "loss_forward": [], "training_step": []}
    timed_method(trainer, "_generate_single_turn", trl_parts["generate"])
    timed_method(trainer, "compute_loss", trl_parts["loss_forward"])
    timed_method(trainer, "training_step", trl_parts["training_step"])
    with contextlib.redirect_stdout(sys.stderr):   # TRL prints its run summary: stdout stays JSON only
        trainer.train()

    timing = {k.removeprefix("timing/"): round(median([r[k] for r in nv_rows[args.warmup:] if k in r]), 4)
              for k in nv_rows[-1] if k.startswith("timing/")}
    precision = "bfloat16" if args.bf16 else "float32"
    return {
        "benchmark": "vs_trl", "model": model_name, "parameters": num_parameters(model_dir),
        "nanoverl_rollout": cfg.rollout.name, "trl_rollout": "transformers generate",
        "batch_prompts": w["batch"], "n": w["n"], "max_new_tokens": w["max_new_tokens"],
        "steps_measured": args.steps, "warmup": args.warmup, "precision": precision, "isa": isa(),
        f"gemm_gflops_{precision}": round(gemm_gflops(dtype=precision), 1),
        **summary(trl_times, nv_times, args.warmup, ("trl", "nanoverl")),
        "nanoverl_timing_median": timing,
        "trl_timing_median": {k: round(median(v[args.warmup:]), 4) for k, v in trl_parts.items()},
        "nanoverl_response_length_mean": round(median([r["rollout/response_length/mean"] for r in nv_rows]), 2),
        "trl_response_length_mean": round(median(trl_lengths), 2),
        "trl_wall_s_all": [round(t[0], 3) for t in trl_times],
        "nanoverl_wall_s_all": [round(t[0], 3) for t in nv_times],
        "peak_rss_mb_both": round(peak_rss_mb(), 1), "machine": machine(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "10m", "10m-v32k"], choices=[*MODELS, "smollm2"])
    parser.add_argument("--steps", type=int, default=None,
                        help="measured steps per contender (default 30 for tiny, 8 for the others)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch", type=int, default=None, help="prompts per step (default: common.WORKLOADS)")
    parser.add_argument("--n", type=int, default=None, help="samples per prompt (TRL num_generations)")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--threads", type=int, default=1, help="torch threads, shared by both contenders")
    parser.add_argument("--rollout", default="hf", choices=["hf", "vllm"], help="nanoverl's rollout on smollm2")
    parser.add_argument("--bf16", action="store_true", help="bf16 mixed precision on both sides")
    args = parser.parse_args(argv)
    steps = args.steps
    for name in args.models:
        args.steps = steps or (30 if name == "tiny" else 8)
        print(json.dumps(run(name, args)), flush=True)


if __name__ == "__main__":
    main()
