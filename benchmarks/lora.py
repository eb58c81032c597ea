"""LoRA vs full fine-tuning: parameters + optimizer state, and step time on the same work.

    .venv/bin/python benchmarks/lora.py                          # memory: 10m and SmolLM2-135M (rank 8, 32); time: 10m
    .venv/bin/python benchmarks/lora.py --memory tiny --time tiny --steps 1 --warmup 0     # the CI smoke run

Memory (one JSON line per model and setting), counted on the real workers (nanoverl_hf.workers.make_workers
with reference.enable = true), after one optimizer step so that AdamW's state exists:
  params_mb        every parameter tensor in the process's workers (a full fine-tuning reference is a
                   second copy of the policy; the LoRA reference is a view: no tensor of its own)
  trainable        parameters that require grad (LoRA: the adapter)
  grads_mb         their gradients (fp32, as trained)
  optimizer_mb     AdamW's state tensors (exp_avg, exp_avg_sq, step)
  total_mb         params + grads + optimizer state
SmolLM2-135M: its architecture (config.json from models/SmolLM2-135M-Instruct.Q4_1.gguf's metadata, or
HuggingFaceTB's published shape if the file is missing) with random weights: the counts do not depend
on the values. Activations are not included (they are the same for both, bar LoRA's rank-r ones).

Time (one JSON line per model): the median wall time of a GRPO trainer step (`--steps` after `--warmup`)
and of its actor update, full vs LoRA rank 8, the same prompts, seeds and response lengths.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (build_model, machine, median, nanoverl_config, nanoverl_trainer, smollm2_folder,  # noqa: E402
                    tmpdir)


def _mb(tensors) -> float:
    return sum(t.numel() * t.element_size() for t in tensors) / 2**20


def memory(folder: Path, data: Path, lora: list[str]) -> dict:
    import torch

    from nanoverl_core import load_config, load_registry
    from nanoverl_hf.workers import make_workers

    config = load_config(None, [f"model.path={folder}", f"data.train_files=[{data}]", "worker.name=hf",
                                "rollout.name=hf", "trainer.device=cpu", "reference.enable=true", *lora],
                         registry=load_registry())
    workers = make_workers(config)
    actor = workers.actor
    params = {id(p): p for w in (actor, workers.reference) for p in w.module.parameters()}
    ids = torch.tensor([[1, 4, 5, 6, 7]])
    actor.module(input_ids=ids).logits.float().square().mean().backward()
    actor.optimizer.step()
    trainable = [p for p in params.values() if p.requires_grad]
    state = [t for s in actor.optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    out = {"params": sum(p.numel() for p in params.values()), "params_mb": _mb(params.values()),
           "trainable": sum(p.numel() for p in trainable), "grads_mb": _mb(p.grad for p in trainable),
           "optimizer_mb": _mb(state)}
    out["total_mb"] = out["params_mb"] + out["grads_mb"] + out["optimizer_mb"]
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}


def memory_rows(models: list[str], ranks: list[int], tmp: Path):
    data = tmp / "data.jsonl"
    data.write_text('{"prompt": "12=", "target": "12"}\n')
    for name in models:
        if name == "smollm2-135m":
            folder, source = smollm2_folder(tmp / name)
        else:
            folder, source = build_model(name, tmp / name), f"benchmarks/common.py model {name!r}"
        full = memory(folder, data, [])
        for rank in ranks:
            lora = memory(folder, data, ["model.lora.enable=true", f"model.lora.rank={rank}",
                                         f"model.lora.alpha={2 * rank}"])
            yield {"benchmark": "lora_memory", "model": name, "source": source, "rank": rank,
                   "target_modules": "all-linear", "full": full, "lora": lora,
                   "lora_over_full_total": round(lora["total_mb"] / full["total_mb"], 4)}


def step_times(name: str, tmp: Path, steps: int, warmup: int, rank: int) -> dict:
    folder = build_model(name, tmp / f"time-{name}")
    result = {"benchmark": "lora_step_time", "model": name, "rank": rank, "steps": steps, "warmup": warmup,
              "workload": "GRPO, 4 prompts x 4 samples, 16 new tokens, hf rollout, reference on"}
    for label, extra in (("full", []), ("lora", ["model.lora.enable=true", f"model.lora.rank={rank}",
                                                 f"model.lora.alpha={2 * rank}"])):
        config = nanoverl_config(folder, tmp / f"run-{name}-{label}", batch=4, n=4, max_new_tokens=16,
                                 extra=["reference.enable=true", "actor.use_kl_loss=true", *extra])
        trainer = nanoverl_trainer(config)
        walls, updates = [], []
        for step in range(warmup + steps):
            start = time.perf_counter()
            trainer.step += 1
            metrics = trainer.train_step()                     # the step as fit runs it, without trackers
            if step >= warmup:
                walls.append(time.perf_counter() - start)
                updates.append(metrics["timing/actor_update"])
        trainer.rollout.close()
        result[label] = {"step_s": round(median(walls), 4), "actor_update_s": round(median(updates), 4),
                         "step_s_all": [round(w, 4) for w in walls]}
    result["lora_over_full_step"] = round(result["lora"]["step_s"] / result["full"]["step_s"], 3)
    result["lora_over_full_actor_update"] = round(result["lora"]["actor_update_s"] / result["full"]["actor_update_s"], 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memory", nargs="*", default=["10m", "smollm2-135m"], help="models for the memory count")
    parser.add_argument("--ranks", nargs="+", type=int, default=[8, 32])
    parser.add_argument("--time", nargs="*", default=["10m"], help="models for the step time")
    parser.add_argument("--time-rank", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()
    import torch
    torch.set_num_threads(1)
    tmp = tmpdir("lora")
    for row in memory_rows(args.memory, args.ranks, tmp):
        print(json.dumps(row), flush=True)
    for name in args.time:
        print(json.dumps(step_times(name, tmp, args.steps, args.warmup, args.time_rank) | {"machine": machine()}),
              flush=True)


if __name__ == "__main__":
    main()
