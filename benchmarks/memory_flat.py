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

`--update`: the actor update alone when the response length doubles at a fixed token budget
(`actor.max_tokens_per_micro_batch`), the LM head chunked (`actor.logits_chunk_size`) vs the full logits:

    .venv/bin/python benchmarks/memory_flat.py --update     # SmolLM2-135M's shape (49k vocabulary), 32 -> 64 tokens

Rows of `--prompt-length` random prompt tokens and exactly `--response-lengths` response tokens (no
padding, so the work is known), random advantages, one on-policy update (`--rows` rows, one optimizer
step, micro-batches under the budget), hf worker, fp32, random weights. The defaults fill every
micro-batch at both lengths: 24 rows of 32 + 32 tokens are 2 passes of 12 rows (768 tokens, 384
response positions), of 32 + 64 tokens 3 passes of 8 rows (768 tokens, 512 positions); the chunk,
256 positions, is below both, so the chunked head really splits at these CPU-sized budgets. Per
response length and path, in a fresh subprocess (with glibc's MALLOC_MMAP_THRESHOLD_=65536, so that
resident memory follows the live tensors), AdamW's state is created by a zero step, then one update:
  rss_before_update  resident memory before it (model, AdamW state, libraries)
  update_peak_rss    the highest resident memory during it (sampled as above)
  update_extra       update_peak_rss - rss_before_update: gradients, activations and logits
  head_extra         what chunking changes, alone: the peak memory of log-probs through the head for one
                     pass's response positions (head_positions), forward and backward
(on CUDA also peak_cuda_allocated and cuda_extra, exact). The summary gives each path's growth when the
response length doubles (target: <= 1.3x) and the time of one update chunked vs full logits at the
longest response, both paths in one process on the same module, interleaved, `--repeats` times each
after a warm-up, medians of wall and CPU seconds.
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
                    now, peak_rss_mb, run_json_subprocess, since, smollm2_folder, summary, tmpdir)

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


EXACT_RSS = {"MALLOC_MMAP_THRESHOLD_": "65536"}
"""glibc serves every block of 64 KiB or more with its own mmap and unmaps it on free, so resident memory
follows the live tensors (by default freed activations stay in the heap and blur before / peak)."""


def update_actor(spec: dict, chunk: int):
    """The hf worker's actor for the --update workload, and its batch: rows x (prompt + response) random
    tokens, every response exactly response_length long, random advantages."""
    import torch

    from nanoverl_core import RLBatch
    from nanoverl_hf.workers import make_workers

    work = tmpdir(f"update-{spec['response_length']}-{chunk}")
    if spec["model"] == "smollm2-135m":
        folder, _ = smollm2_folder(work / "model")     # config only: random weights from trainer.seed
    else:
        folder = build_model(spec["model"], work / "model")
    config = nanoverl_config(folder, work / "run", batch=1, n=spec["rows"], max_new_tokens=spec["response_length"],
                             extra=[f"actor.max_tokens_per_micro_batch={spec['budget']}",
                                    f"actor.logits_chunk_size={chunk}", f"trainer.device={spec['device']}"])
    torch.set_num_threads(1)
    actor = make_workers(config).actor
    vocab = actor.module.config.vocab_size
    rows, prompt, response = spec["rows"], spec["prompt_length"], spec["response_length"]
    g = torch.Generator().manual_seed(0)
    batch = RLBatch({"prompts": torch.randint(3, vocab, (rows, prompt), generator=g),
                     "prompt_mask": torch.ones(rows, prompt, dtype=torch.long),
                     "responses": torch.randint(3, vocab, (rows, response), generator=g),
                     "response_mask": torch.ones(rows, response),
                     "loss_mask": torch.ones(rows, response),
                     "advantages": torch.randn(rows, response, generator=g)})
    return actor, batch


def one_update(actor, batch) -> None:
    from nanoverl_core.algos import vanilla

    actor.update(batch, vanilla, on_policy=True)     # one mini-batch, one epoch: the trainer's on-policy update


def run_update(spec: dict) -> dict:
    """Peak memory of one actor update, and of the head's part alone, in this fresh process."""
    import gc

    import torch

    actor, batch = update_actor(spec, spec["chunk"])
    # AdamW's state as after a first update, without running one: a step on zero gradients moves nothing
    for p in (p for group in actor.optimizer.param_groups for p in group["params"]):
        p.grad = torch.zeros_like(p)
    actor.optimizer.step()
    actor.optimizer.zero_grad(set_to_none=True)
    gc.collect()
    cuda = actor.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        cuda_before = torch.cuda.memory_allocated()
    before, sampler, start = current_rss_mb(), RSSSampler(), now()
    sampler.start()
    one_update(actor, batch)
    sampler.stop.set()
    sampler.join()
    wall, cpu = since(start)
    groups = actor.micro_batches(batch)
    out = {"benchmark": "memory_update", **spec, "vocab_size": actor.module.config.vocab_size,
           "chunked_head": actor.forward_pass.head is not None, "micro_batches": len(groups),
           "rows_per_micro_batch": max(map(len, groups)), "rss_before_update_mb": round(before, 1),
           "update_peak_rss_mb": round(sampler.peak, 1), "update_extra_mb": round(sampler.peak - before, 1),
           "update_wall_s": round(wall, 2), "update_cpu_s": round(cpu, 2)}
    if cuda:
        out["peak_cuda_allocated_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        out["cuda_extra_mb"] = round((torch.cuda.max_memory_allocated() - cuda_before) / 2**20, 1)
    return out | head_memory(actor, out["rows_per_micro_batch"] * spec["response_length"], spec["chunk"])


def head_memory(actor, positions: int, chunk: int) -> dict:
    """What chunking changes, alone: log-probs through the actor's head for one pass's `positions` response
    positions, forward and backward into random hidden states and the head's weight (whose gradient exists,
    as in every pass but the first); the peak resident (CUDA: allocated) memory above the start."""
    import torch
    import torch.nn.functional as F

    from nanoverl_core.algos import logprobs_from_hidden, logprobs_from_logits

    weight = actor.module.get_output_embeddings().weight
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(positions, weight.shape[1], generator=g).to(weight).requires_grad_()
    labels = torch.randint(0, weight.shape[0], (positions,), generator=g).to(weight.device)
    weight.grad = torch.zeros_like(weight)
    cuda = weight.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start, before, sampler = torch.cuda.memory_allocated() if cuda else 0, current_rss_mb(), RSSSampler()
    sampler.start()
    if chunk:
        log_probs = logprobs_from_hidden(hidden, weight, labels, chunk_size=chunk)[0]
    else:
        log_probs = logprobs_from_logits(F.linear(hidden, weight)[None], labels[None])[0]
    log_probs.sum().backward()
    sampler.stop.set()
    sampler.join()
    weight.grad = None
    extra = (torch.cuda.max_memory_allocated() - start) / 2**20 if cuda else sampler.peak - before
    return {"head_positions": positions, "head_extra_mb": round(extra, 1)}


def time_updates(spec: dict) -> dict:
    """Seconds per update, chunked vs full logits, on one module, interleaved (spec["repeats"] each)."""
    from nanoverl_core.workers import ChunkedHead

    actor, batch = update_actor(spec, spec["chunk"])
    heads = {"chunked": ChunkedHead.of(actor.module, spec["chunk"]), "plain": None}
    times: dict[str, list] = {"chunked": [], "plain": []}
    for repeat in range(spec["repeats"] + 1):                  # the first round is the warm-up
        for name, head in heads.items():
            actor.forward_pass.head = head
            start = now()
            one_update(actor, batch)
            if repeat:
                times[name].append(since(start))
    out = {"benchmark": "memory_update_time", **spec, **summary(times["chunked"], times["plain"], 0,
                                                                   ("chunked", "plain"))}
    out["chunked_wall_s_all"] = [round(t[0], 3) for t in times["chunked"]]
    out["plain_wall_s_all"] = [round(t[0], 3) for t in times["plain"]]
    return out


def update_main(args) -> None:
    lengths, rows = args.response_lengths, {}
    base = {"model": args.model or "smollm2-135m", "rows": args.rows, "prompt_length": args.prompt_length,
            "budget": args.budget, "device": args.device}
    for length in lengths:
        for name, chunk in (("chunked", args.chunk), ("plain", 0)):
            spec = {**base, "response_length": length, "chunk": chunk}
            rows[name, length] = run_json_subprocess([__file__, "--one-update", json.dumps(spec)], env=EXACT_RSS)
            print(json.dumps(rows[name, length]), flush=True)
    timing = run_json_subprocess([__file__, "--time-updates", json.dumps(
        {**base, "response_length": lengths[-1], "chunk": args.chunk, "repeats": args.repeats})])
    print(json.dumps(timing), flush=True)
    out = {"benchmark": "memory_update", "summary": True, **base, "response_lengths": lengths, "chunk": args.chunk}
    for name in ("chunked", "plain"):
        small, large = rows[name, lengths[0]], rows[name, lengths[-1]]
        out[name] = {"update_peak_growth": round(large["update_peak_rss_mb"] / small["update_peak_rss_mb"], 3),
                     "update_extra_growth": round(large["update_extra_mb"] / max(small["update_extra_mb"], 1e-9), 3),
                     "update_peak_rss_mb": [rows[name, n]["update_peak_rss_mb"] for n in lengths],
                     "update_extra_mb": [rows[name, n]["update_extra_mb"] for n in lengths],
                     "head_extra_mb": [rows[name, n]["head_extra_mb"] for n in lengths]}
        if "cuda_extra_mb" in small:
            out[name]["cuda_extra_growth"] = round(large["cuda_extra_mb"] / small["cuda_extra_mb"], 3)
    out["chunked_over_plain_extra"] = [
        round(rows["chunked", n]["update_extra_mb"] / rows["plain", n]["update_extra_mb"], 3) for n in lengths]
    out["target_met"] = out["chunked"]["update_extra_growth"] <= 1.3       # the figure
    out["time"] = {k: v for k, v in timing.items() if k.startswith(("chunked_", "plain_", "ratio_"))}
    out["machine"] = {**machine(), "torch_threads": 1}
    print(json.dumps(out), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=[*MODELS, "smollm2-135m"],
                        help="default: 10m (steps), smollm2-135m (--update)")
    parser.add_argument("--batches", nargs="+", type=int, default=[4, 16], help="prompts per step")
    parser.add_argument("--micro", type=int, default=16, help="rows per micro-batch (rollout and actor)")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-contrast", action="store_true", help="skip the runs without micro-batching")
    parser.add_argument("--update", action="store_true", help="measure the actor update alone (see the docstring)")
    parser.add_argument("--response-lengths", nargs="+", type=int, default=[32, 64], help="--update: response tokens")
    parser.add_argument("--prompt-length", type=int, default=32, help="--update: prompt tokens per row")
    parser.add_argument("--rows", type=int, default=24, help="--update: rows in the update")
    parser.add_argument("--budget", type=int, default=768, help="--update: actor.max_tokens_per_micro_batch")
    parser.add_argument("--chunk", type=int, default=256, help="--update: actor.logits_chunk_size when chunked")
    parser.add_argument("--repeats", type=int, default=2, help="--update: timed updates per path")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--one-update", help=argparse.SUPPRESS)
    parser.add_argument("--time-updates", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(json.loads(args.one))), flush=True)
        return
    if args.one_update or args.time_updates:
        spec = json.loads(args.one_update or args.time_updates)
        print(json.dumps(run_update(spec) if args.one_update else time_updates(spec)), flush=True)
        return
    if args.update:
        update_main(args)
        return
    args.model = args.model or "10m"

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
