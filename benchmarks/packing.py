"""Padding-free micro-batches against padded rectangles: the actor's passes on responses of mixed lengths.

    nice .venv/bin/python benchmarks/packing.py                  # the 10m Llama, 8 x 4 rows, ~3 min on 2 threads
    .venv/bin/python benchmarks/packing.py --model tiny --prompts 2 --n 2 --max-len 24 --repeats 1   # smoke

One process, one model (benchmarks/common.py builds it locally), one fixed batch: `--prompts` prompts of
16-48 tokens, `--n` samples each, responses drawn uniformly from `--min-len`..`--max-len` tokens (seeded).
Three actors from the same weights, `actor.pack = false` (padded; prompt sharing as configured),
`actor.pack = true` (packed: workers/packing.py, the model's own layout) and, for contrast, packed in
LINES (the layout of eager and checkpointed models), run the same work interleaved, `--repeats` times:
a reference log-prob pass (`compute_log_probs`, what the old-log-prob and reference stages run) and one
update (`update`, `--micro-batch` rows per micro-batch). One JSON object:

  layout                  how the packed actor lays its rows out (workers/packing.py: "rows" for an sdpa
                          model, every row in one sequence, attended row by row)
  padding_fraction        1 - real tokens / the padded path's tokens (each micro-batch's rows x its
                          longest prompt + longest response)
  update_tokens           {padded, packed, lines}: the tokens each actor's update feeds its model (its
                          forwards' input_ids), prompt sharing included; token_bound padded / packed
  update_s, log_probs_s   {padded, packed, lines}: median seconds; `*_speedup` padded / packed,
                          `*_lines_speedup` padded / lines
  passes_speedup          (log-prob pass + update) padded / packed: the trainer-side part of a step
  max_log_prob_diff       the largest |packed - padded| of the first log-prob pass (fp32: ~1e-6);
                          lines_max_log_prob_diff the same for lines
  loss_rel_diff, grad_norm_rel_diff   the first update's, relative: equal results
  isa                     avx512_bf16 / avx512f / avx2 (from /proc/cpuinfo); gemm_fp32_gflops: this CPU's
                          fp32 matmul rate at the same threads (common.gemm_gflops)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import build_model, gemm_gflops, isa, machine, median, nanoverl_config, tmpdir  # noqa: E402

from nanoverl_core.workers.packing import LINES  # noqa: E402


def mixed_batch(tokenizer, prompts: int, n: int, min_len: int, max_len: int, seed: int = 0):
    """prompts x n rows: prompts of 16-48 random tokens (left-padded), responses of min_len..max_len."""
    import torch

    from nanoverl_core import RLBatch
    from nanoverl_core.testing import with_loss_mask

    gen = torch.Generator().manual_seed(seed)
    vocab = len(tokenizer)
    prompt_ids = [torch.randint(3, vocab, (int(torch.randint(16, 49, (), generator=gen)),), generator=gen)
                  for _ in range(prompts)]
    rows = [p for p in prompt_ids for _ in range(n)]
    lengths = torch.randint(min_len, max_len + 1, (len(rows),), generator=gen)
    width_p, width_r = max(len(p) for p in rows), int(lengths.max())
    batch = RLBatch({"prompts": torch.full((len(rows), width_p), tokenizer.pad_token_id),
                     "prompt_mask": torch.zeros(len(rows), width_p, dtype=torch.long),
                     "responses": torch.randint(3, vocab, (len(rows), width_r), generator=gen),
                     "response_mask": (torch.arange(width_r)[None] < lengths[:, None]).float()})
    for i, p in enumerate(rows):
        batch["prompts"][i, width_p - len(p):] = p
        batch["prompt_mask"][i, width_p - len(p):] = 1
    with_loss_mask(batch)
    mask = batch["response_mask"]
    batch["advantages"] = torch.randn(mask.shape, generator=gen) * mask
    return batch


def padded_tokens(actor, batch) -> tuple[int, int]:
    """(real tokens, tokens of the padded path's rectangles) over `actor`'s micro-batches of `batch`."""
    real = padded = 0
    for rows in actor.micro_batches(batch):
        mb = batch.index(rows)
        p, r = mb["prompt_mask"].sum(-1), mb["response_mask"].sum(-1).long()
        real += int((p + r).sum())
        padded += len(rows) * (int(p.max()) + int(r.max()))
    return real, padded


def main(argv: list[str] | None = None) -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="10m", choices=["tiny", "10m"])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--min-len", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=8, help="rows per micro-batch (actor.micro_batch_size)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from nanoverl_core.algos import vanilla
    from nanoverl_hf.workers import make_workers

    tmp = tmpdir("packing")
    model = build_model(args.model, tmp / "model")
    rows = args.prompts * args.n
    micro = min(args.micro_batch, rows)
    actors = {}
    for name, pack in (("padded", "false"), ("packed", "true"), ("lines", "true")):
        cfg = nanoverl_config(model, tmp / name, batch=args.prompts, n=args.n, max_new_tokens=args.max_len,
                              lr=1e-5, extra=["worker.name=hf", "rollout.name=hf", "trainer.device=cpu",
                                              f"actor.pack={pack}", f"actor.micro_batch_size={micro}",
                                              f"trainer.num_threads={args.threads}"])
        torch.manual_seed(0)
        actors[name] = make_workers(cfg).actor
    actors["lines"].forward_pass.packing = LINES   # the layout of eager and checkpointed models, for contrast
    tokenizer = make_workers(cfg).tokenizer
    batch = mixed_batch(tokenizer, args.prompts, args.n, args.min_len, args.max_len)
    real, padded = padded_tokens(actors["padded"], batch)
    times = {stage: {name: [] for name in actors} for stage in ("log_probs", "update")}
    first: dict = {}
    fed = {name: [] for name in actors}
    for name, actor in actors.items():
        actor.module.get_input_embeddings().register_forward_pre_hook(
            lambda _, args, name=name: fed[name].append(args[0].numel()))
    tokens: dict = {}
    for repeat in range(args.repeats + 1):              # the first round warms up (the one-time checks)
        for name, actor in actors.items():
            start = time.perf_counter()
            log_probs = actor.compute_log_probs(batch)
            seconds = time.perf_counter() - start
            if repeat:
                times["log_probs"][name].append(seconds)
            batch["old_log_probs"] = log_probs.detach()
            fed[name].clear()
            start = time.perf_counter()
            metrics = actor.update(batch, vanilla)
            seconds = time.perf_counter() - start
            if repeat:
                times["update"][name].append(seconds)
                tokens[name] = sum(fed[name])
            first.setdefault(name, (log_probs, metrics))
    (lp0, m0), (lp1, m1), (lp2, _) = first["padded"], first["packed"], first["lines"]

    def rel(a: float, b: float) -> float:
        return abs(a - b) / max(abs(a), 1e-12)

    out = {"benchmark": "packing", "model": args.model, "rows": rows, "micro_batch_rows": micro,
           "response_lengths": [args.min_len, args.max_len], "layout": actors["packed"].forward_pass.packing,
           "real_tokens": real, "padded_tokens": padded,
           "padding_fraction": round(1 - real / padded, 3),
           "update_tokens": tokens, "token_bound": round(tokens["padded"] / tokens["packed"], 2),
           "max_log_prob_diff": float((lp1 - lp0).abs().max()),
           "lines_max_log_prob_diff": float((lp2 - lp0).abs().max()),
           "loss_rel_diff": rel(m0["actor/loss"], m1["actor/loss"]),
           "grad_norm_rel_diff": rel(m0["actor/grad_norm"], m1["actor/grad_norm"])}
    for stage, by_path in times.items():
        out[f"{stage}_s"] = {name: round(median(v), 3) for name, v in by_path.items()}
        out[f"{stage}_speedup"] = round(median(by_path["padded"]) / median(by_path["packed"]), 2)
        out[f"{stage}_lines_speedup"] = round(median(by_path["padded"]) / median(by_path["lines"]), 2)
    passes = {name: median(times["log_probs"][name]) + median(times["update"][name]) for name in actors}
    out["passes_speedup"] = round(passes["padded"] / passes["packed"], 2)
    out.update(isa=isa(), threads=args.threads, gemm_fp32_gflops=round(gemm_gflops(), 1), **machine())
    out.pop("load", None)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
