"""What a generator data source costs the loader, against a tiny-task step.

    .venv/bin/python benchmarks/data_source.py              # ~1 min (needs nanoverl-reasoning-gym)
    .venv/bin/python benchmarks/data_source.py --size 640 --epochs 4

The steps are real tiny-task steps (examples/configs/tiny_grpo.toml through the real trainer: hf worker
and rollout, 16 prompts x 16 samples, the ~83k-parameter model, one torch thread). After --warmup steps,
blocks of steps alternate: the trainer alone, then the same number of steps each followed by a Reasoning
Gym loader's `next_batch` (16 prompts), so the loader's epoch loads, and the prefetch thread that makes
them while the steps run, land among real steps; blocks alternate so that drift in the machine's speed
falls on both. Prints one JSON object:

  step_s              mean seconds of a tiny-task step alone (the blocks without a loader, first sweep)
  files_loader_s      median seconds the loader takes per step with data.source = "files" (the tiny task's
                      2,048 prompts, tokenized once at load): the trainer's timing/data of those steps
  rg_loader_s         mean seconds of next_batch per step with data.source = "reasoning_gym" over --epochs
                      epochs of --size rows (collation, and waiting for an epoch the thread has not
                      finished); rg_startup_load_s the first epoch's load, made once before the first
                      step as a files source reads its files (neither is in the per-step figures)
  rg_step_with_loader_s  mean seconds of a step in the blocks with that loader (the step, slowed by
                      whatever the prefetch thread takes from it); rg_alone_step_s the blocks without
  rg_fraction_of_step (rg_step_with_loader_s + rg_loader_s - rg_alone_step_s) / rg_alone_step_s: what the
                      source adds to a step (the issue's budget: under 0.05)
  rg_epoch_load_s     one epoch's generation + tokenization, made in the caller's thread (what a loader
                      without prefetch would add at each epoch's first batch); rg_sync_fraction_of_step
                      is that spread over the epoch's steps, over step_s
  rg_generate_s       one epoch's generation alone; rg_val_load_s the validation rows' one-time cost
                      (before the first step, like rg_startup_load_s); rg_prompt_tokens_mean the prompts' length
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

from common import ROOT, load_average, nanoverl_step, tmpdir

sys.path.insert(0, str(ROOT))


def tiny_trainer(warmup: int):
    """The tiny-task trainer (no validation, checkpoints or trackers), after `warmup` steps."""
    from nanoverl_core import load_config, load_registry
    from nanoverl_core.trainer.trainer import Trainer

    registry = load_registry()
    config = load_config(ROOT / "examples/configs/tiny_grpo.toml", [
        f"trainer.output_dir={tmpdir('data-source') / 'run'}", "trainer.total_steps=100000",
        "trainer.val_every=0", "trainer.save_every=0", "trainer.rollout_samples=0", "tracking.trackers=[]",
        "trainer.progress=none"], registry=registry)
    for key in ("data.train_files", "data.val_files", "model.path"):   # relative to the checkout
        section, name = key.split(".")
        value = getattr(getattr(config, section), name)
        setattr(getattr(config, section), name,
                [str(ROOT / v) for v in value] if isinstance(value, list) else str(ROOT / value))
    trainer = Trainer(config, registry)
    for _ in range(warmup):
        nanoverl_step(trainer)
    return trainer


def rg_loader(size: int, batch: int, system_prompt: str):
    """(source, config, tokenizer) of the Reasoning Gym rows the module docstring describes."""
    from tokenizers import Regex, pre_tokenizers

    from nanoverl_core import load_config, load_registry
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
    return load_registry().get("data_source", "reasoning_gym")(config), config, tokenizer


def measure(trainer, size: int, epochs: int, batch: int, system_prompt: str, block: int) -> dict[str, float]:
    """Alternating blocks of `block` steps alone and `block` steps each followed by the loader's next_batch."""
    from nanoverl_core.data import PromptLoader, load_split

    source, config, tokenizer = rg_loader(size, batch, system_prompt)
    start = time.perf_counter()
    val = load_split(source, "val", config.data, tokenizer)
    val_s = time.perf_counter() - start
    start = time.perf_counter()
    loader = PromptLoader(source, config.data, tokenizer, seed=0, exclude=frozenset(val.texts))
    startup_s = time.perf_counter() - start                            # epoch 0 loads before the first step
    loader_s = []
    steps = epochs * loader.steps_per_epoch
    alone, with_loader, files = [], [], []
    while len(with_loader) < steps:
        for _ in range(block):
            start = time.perf_counter()
            files.append(nanoverl_step(trainer)["timing/data"])
            alone.append(time.perf_counter() - start)
        for _ in range(min(block, steps - len(with_loader))):
            start = time.perf_counter()
            nanoverl_step(trainer)
            with_loader.append(time.perf_counter() - start)
            start = time.perf_counter()
            loader.next_batch(tokenizer.pad_token_id)
            loader_s.append(time.perf_counter() - start)
    start = time.perf_counter()
    source.rows("train", epochs + 1)                                  # one epoch's generation alone
    generate_s = time.perf_counter() - start
    start = time.perf_counter()
    loader._load(epochs + 2, tokenizer)                               # one epoch's generation + tokenization
    epoch_s = time.perf_counter() - start
    step_s, rg_step = statistics.fmean(alone), statistics.fmean(with_loader)
    loader_mean = sum(loader_s) / steps
    return {"step_s": step_s, "files_loader_s": statistics.median(files), "loader_s": loader_mean,
            "step_with_loader_s": rg_step, "fraction_of_step": (rg_step + loader_mean - step_s) / step_s,
            "epoch_load_s": epoch_s, "sync_fraction_of_step": epoch_s / loader.steps_per_epoch / step_s,
            "generate_s": generate_s, "startup_load_s": startup_s, "val_load_s": val_s, "steps": steps,
            "rows_per_epoch": len(loader.data),
            "prompt_tokens_mean": statistics.fmean(len(ids) for ids in loader.data.prompt_ids)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=320, help="Reasoning Gym training rows per epoch")
    p.add_argument("--epochs", type=int, default=4, help="epochs of Reasoning Gym rows to load")
    p.add_argument("--warmup", type=int, default=5, help="tiny-task steps before the measured ones")
    p.add_argument("--block", type=int, default=10, help="steps per alternating block")
    args = p.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    trainer = tiny_trainer(args.warmup)
    out = {"benchmark": "data_source"}
    for name, prompt in (("rg", "default"), ("rg_no_system", "")):
        rg = measure(trainer, args.size, args.epochs, 16, prompt, args.block)
        step_s, files = rg.pop("step_s"), rg.pop("files_loader_s")
        if name == "rg":
            out.update({"step_s": round(step_s, 4), "files_loader_s": round(files, 6),
                        "files_fraction_of_step": round(files / step_s, 4)})
        rg["generate_fraction_of_step"] = rg["generate_s"] / (rg["rows_per_epoch"] / 16) / step_s
        out.update({f"{name}_{k}": round(v, 4 if "fraction" in k else 6) if isinstance(v, float) else v
                    for k, v in rg.items()})
        out[f"{name}_alone_step_s"] = round(step_s, 4)
    print(json.dumps({**out, "size": args.size, "epochs": args.epochs, "batch_prompts": 16, "block": args.block,
                      "load_average": load_average()}))


if __name__ == "__main__":
    main()
