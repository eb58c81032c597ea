"""The vllm rollout with a LoRA actor: merged-weight sync vs adapter-only sync ([rollout.vllm] lora_sync).

    HF_HUB_OFFLINE=1 .venv-vllm/bin/python benchmarks/lora_vllm.py                    # tiny + SmolLM2-135M, rank 8
    HF_HUB_OFFLINE=1 .venv-vllm/bin/python benchmarks/lora_vllm.py --models tiny --prompts 4 --max-new-tokens 4 --reps 1

One JSON line per model: for each mode ("merged", "adapter"), one engine in this process (one at a
time), the real LoRA actor of the hf worker (rank 8, alpha 16, all-linear), and `--reps` rounds of
sync_weights(actor) then generate (`--prompts` prompts, `--max-new-tokens`, temperature 1):
  start_s            engine start-up incl. the first weights (and, adapter mode, the first adapter)
  sync_s             median sync_weights wall time (merged: every tensor, W + alpha/r B@A computed and
                     reloaded in place; adapter: write the adapter folder, remove the old LoRA, add_lora)
  generate_s / tokens_per_s   median generate wall time, and generated tokens / that time
  first_generate_s   the first generate after start-up (adapter mode: vLLM's LoRA set-up runs here)
Models: "tiny" (hidden 64, 2 layers, 2 heads of 32: vLLM's CPU attention has no head_dim 16 kernel)
and "smollm2-135m" (models/SmolLM2-135M-Instruct.Q4_1.gguf as model.path: real de-quantized weights,
needs `gguf`; its architecture with random weights if the file is missing).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from common import ROOT, machine, median, tmpdir  # noqa: E402

GGUF = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_path(name: str, tmp: Path) -> tuple[Path, str]:
    from nanoverl_hf.tiny import build_tiny_model

    if name == "tiny":
        return build_tiny_model(tmp / "tiny", hidden=64, layers=2, heads=2), "tiny Llama, hidden 64, 2 layers, 2 heads"
    if name == "smollm2-135m":
        if GGUF.is_file():
            return GGUF, f"{GGUF.name} (de-quantized)"
        from lora import smollm2_folder
        return smollm2_folder(tmp / name)
    raise SystemExit(f"error: --models: unknown model {name!r}; valid choices: tiny, smollm2-135m")


def measure(name: str, path: Path, tmp: Path, args) -> dict:
    import torch

    from nanoverl_core import SamplingParams, load_config, load_registry
    from nanoverl_hf.workers import make_workers
    from nanoverl_vllm.rollout import VLLMRollout

    data = tmp / "data.jsonl"
    data.write_text('{"prompt": "12=", "target": "12"}\n')
    rows = args.prompts
    cfg = load_config(None, [f"data.train_files=[{data}]", f"model.path={path}", "worker.name=hf", "rollout.name=vllm",
                             "trainer.device=cpu", f"data.batch_size={rows}", "rollout.n=1", "data.val_batch_size=1",
                             f"rollout.max_new_tokens={args.max_new_tokens}", "data.max_prompt_length=32",
                             "model.lora.enable=true", f"model.lora.rank={args.rank}",
                             f"model.lora.alpha={2 * args.rank}"], registry=load_registry())
    start = time.perf_counter()
    workers = make_workers(cfg)
    load_s = time.perf_counter() - start
    with torch.no_grad():                             # a non-zero adapter (peft starts B at 0)
        gen = torch.Generator().manual_seed(0)
        for n, p in workers.actor.module.named_parameters():
            if "lora_B" in n:
                p.add_(torch.randn(p.shape, generator=gen) * 0.01)
    tok = workers.tokenizer
    texts = [f"{i:04d}=" if name == "tiny" else f"What is {i} + {i * 7}?" for i in range(rows)]
    ids = [tok.encode(t) for t in texts]
    width = max(map(len, ids))
    prompts = torch.full((rows, width), tok.pad_token_id if tok.pad_token_id is not None else 0, dtype=torch.long)
    mask = torch.zeros((rows, width), dtype=torch.long)
    for r, t in enumerate(ids):
        prompts[r, width - len(t):], mask[r, width - len(t):] = torch.tensor(t), 1
    from nanoverl_core import RLBatch
    batch = RLBatch({"prompts": prompts, "prompt_mask": mask})
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0)
    result = {"benchmark": "lora_vllm_sync", "model": name, "rank": args.rank, "target_modules": "all-linear",
              "workload": f"{rows} prompts x {args.max_new_tokens} new tokens, temperature 1, {args.reps} rounds",
              "policy_load_s": round(load_s, 2)}
    for mode in ("merged", "adapter"):
        cfg.rollout.settings.lora_sync = mode
        torch.manual_seed(0)
        start = time.perf_counter()
        rollout = VLLMRollout(cfg, workers)
        start_s = time.perf_counter() - start
        try:
            start = time.perf_counter()
            out = rollout.generate(batch, params)
            first = time.perf_counter() - start
            syncs, gens, tokens = [], [], []
            for _ in range(args.reps):
                rollout.sync_weights(workers.actor)
                syncs.append(rollout.last_sync_s)
                start = time.perf_counter()
                out = rollout.generate(batch, params)
                gens.append(time.perf_counter() - start)
                tokens.append(int(out["response_mask"].sum()))
        finally:
            rollout.close()
        result[mode] = {"start_s": round(start_s, 3), "first_generate_s": round(first, 3),
                        "sync_s": round(median(syncs), 4), "sync_s_all": [round(s, 4) for s in syncs],
                        "generate_s": round(median(gens), 4),
                        "tokens_per_s": round(median([t / g for t, g in zip(tokens, gens)]), 1)}
    result["adapter_over_merged_sync"] = round(result["adapter"]["sync_s"] / result["merged"]["sync_s"], 3)
    result["adapter_over_merged_tokens_per_s"] = round(result["adapter"]["tokens_per_s"]
                                                       / result["merged"]["tokens_per_s"], 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2-135m"])
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    results = os.fdopen(os.dup(1), "w")           # stdout holds the JSON lines only: everything else
    sys.stdout.flush()                              # (vLLM's logs, C-level prints) goes to stderr
    os.dup2(2, 1)
    import torch
    torch.set_num_threads(1)
    tmp = tmpdir("lora-vllm")
    for name in args.models:
        path, source = model_path(name, tmp)
        print(json.dumps(measure(name, path, tmp, args) | {"source": source, "machine": machine()}), file=results,
              flush=True)


if __name__ == "__main__":
    main()
