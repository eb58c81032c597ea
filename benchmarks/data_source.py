"""What a generator data source costs the loader, against a tiny-task step.

    .venv/bin/python benchmarks/data_source.py              # ~30 s on 2 busy cores (needs nanoverl-reasoning-gym)
    .venv/bin/python benchmarks/data_source.py --size 2000 --epochs 3 --steps 20

Prints one JSON object:

  step_s              median seconds of a tiny-task step (examples/configs/tiny_grpo.toml through the real
                      trainer: hf worker and rollout, 16 prompts x 16 samples, the ~83k-parameter model),
                      after --warmup steps
  files_loader_s      median seconds the loader takes per step with data.source = "files" (the tiny task's
                      2,048 prompts): the trainer's timing/data of the same steps
  rg_loader_s         mean seconds per step of the loader (PromptLoader.next_batch, 16 prompts) with
                      data.source = "reasoning_gym" over --epochs epochs of --size rows: each epoch's
                      generation and tokenization (of every row, at the epoch's first batch) included,
                      spread over the epoch's steps; rg_generate_s is the generation alone per step,
                      rg_epoch_load_s one epoch's generation + tokenization, rg_val_load_s the validation
                      rows' one-time cost (before the first step), rg_prompt_tokens_mean the prompts' length
  rg_fraction_of_step rg_loader_s / step_s (the issue's budget: under 0.05); rg_generate_fraction_of_step,
                      files_fraction_of_step alike
  rg_no_system_*      the same without a system prompt (the question alone: ~6x shorter prompts)

The Reasoning Gym rows (chain_sum and gcd, weights 2 : 1, Reasoning Gym's default system prompt, chat
messages joined by newlines) are tokenized with a character tokenizer over printable ASCII, the tiny
model's kind of tokenizer with the vocabulary the questions need (the tiny model's own has only digits).
"""

from __future__ import annotations

import argparse
import json
import statistics
import string
import sys
import time

from common import ROOT, tmpdir

sys.path.insert(0, str(ROOT))


def tiny_step_times(warmup: int, steps: int) -> tuple[list[float], list[float]]:
    """(timing/step, timing/data) of `steps` tiny-task steps after `warmup`, through the real trainer."""
    from nanoverl_core import load_config, load_registry
    from nanoverl_core.trainer.trainer import Trainer

    registry = load_registry()
    config = load_config(ROOT / "examples/configs/tiny_grpo.toml", [
        f"trainer.output_dir={tmpdir('data-source') / 'run'}", f"trainer.total_steps={warmup + steps}",
        "trainer.val_every=0", "trainer.save_every=0", "trainer.rollout_samples=0", "tracking.trackers=[]",
        "trainer.progress=none"], registry=registry)
    for key in ("data.train_files", "data.val_files", "model.path"):   # relative to the checkout
        section, name = key.split(".")
        value = getattr(getattr(config, section), name)
        setattr(getattr(config, section), name,
                [str(ROOT / v) for v in value] if isinstance(value, list) else str(ROOT / value))
    trainer = Trainer(config, registry)
    rows = []
    for _ in range(warmup + steps):
        trainer.step += 1
        rows.append(trainer.train_step())
    rows = rows[warmup:]
    return [r["timing/step"] for r in rows], [r["timing/data"] for r in rows]


def rg_loader_times(size: int, epochs: int, batch: int, system_prompt: str) -> dict[str, float]:
    from tokenizers import Regex, pre_tokenizers

    from nanoverl_core import load_config, load_registry
    from nanoverl_core.data import PromptLoader, load_split
    from nanoverl_hf.tiny import build_tokenizer

    tasks = "[{name: chain_sum, weight: 2, params: {max_terms: 3}}, {name: gcd}]"
    config = load_config(None, ["data.source=reasoning_gym", f"data.reasoning_gym.tasks={tasks}",
                                f"data.reasoning_gym.size={size}", "data.reasoning_gym.val_size=128",
                                f"data.reasoning_gym.system_prompt={system_prompt}", f"data.batch_size={batch}",
                                "data.apply_chat_template=false", "data.max_prompt_length=2048",
                                "reward.name=reasoning_gym"], registry=load_registry())
    tokenizer = build_tokenizer(string.printable)
    # one token per character, newlines too (build_tokenizer's "." leaves runs of newlines as one unknown piece)
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    source = load_registry().get("data_source", "reasoning_gym")(config)
    start = time.perf_counter()
    val = load_split(source, "val", config.data, tokenizer)
    val_s = time.perf_counter() - start
    start = time.perf_counter()
    loader = PromptLoader(source, config.data, tokenizer, seed=0, exclude=frozenset(val.texts))
    first_epoch_s = time.perf_counter() - start                       # epoch 0 loads before the first step
    steps = epochs * loader.steps_per_epoch
    start = time.perf_counter()
    for _ in range(steps):
        loader.next_batch(tokenizer.pad_token_id)
    batches_s = time.perf_counter() - start
    start = time.perf_counter()
    source.rows("train", epochs)                                      # one epoch's generation alone
    generate_s = time.perf_counter() - start
    start = time.perf_counter()
    loader._load(epochs + 1)                                          # one epoch's generation + tokenization
    epoch_s = time.perf_counter() - start
    prompt_tokens = statistics.fmean(len(ids) for ids in loader.data.prompt_ids)
    per_step = (first_epoch_s + batches_s) / steps
    return {"loader_s": per_step, "generate_s": generate_s / loader.steps_per_epoch, "epoch_load_s": epoch_s,
            "val_load_s": val_s, "steps": steps, "rows_per_epoch": len(loader.data),
            "prompt_tokens_mean": round(prompt_tokens, 1)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=1000, help="Reasoning Gym training rows per epoch")
    p.add_argument("--epochs", type=int, default=2, help="epochs of Reasoning Gym rows to load")
    p.add_argument("--warmup", type=int, default=3, help="tiny-task steps before the measured ones")
    p.add_argument("--steps", type=int, default=10, help="measured tiny-task steps")
    args = p.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    step_s, data_s = tiny_step_times(args.warmup, args.steps)
    step, files = statistics.median(step_s), statistics.median(data_s)
    out = {"benchmark": "data_source", "step_s": round(step, 4), "files_loader_s": round(files, 6),
           "files_fraction_of_step": round(files / step, 4)}
    for name, prompt in (("rg", "default"), ("rg_no_system", "")):
        rg = rg_loader_times(args.size, args.epochs, 16, prompt)
        out.update({f"{name}_{k}": round(v, 6) if isinstance(v, float) else v for k, v in rg.items()})
        out[f"{name}_fraction_of_step"] = round(rg["loader_s"] / step, 4)
        out[f"{name}_generate_fraction_of_step"] = round(rg["generate_s"] / step, 4)
    print(json.dumps({**out, "size": args.size, "epochs": args.epochs, "batch_prompts": 16,
                      "steps_measured": args.steps}))

if __name__ == "__main__":
    main()
