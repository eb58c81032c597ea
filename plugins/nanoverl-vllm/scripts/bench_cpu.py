"""Measure the vllm rollout against the hf rollout on a from-scratch Llama (the README's numbers).

    HF_HUB_OFFLINE=1 .venv-vllm/bin/python plugins/nanoverl-vllm/scripts/bench_cpu.py [--hidden 64 --layers 2 --heads 2]

Prints one JSON object: engine start-up, generate throughput for both rollouts (rows x max tokens,
temperature 1), weight-sync time (median of 20), and the largest |rollout log-prob - hf worker log-prob|.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()

    import torch
    torch.set_num_threads(1)
    from nanoverl_core import SamplingParams, load_config, load_registry
    from nanoverl_hf.rollout import HFRollout
    from nanoverl_hf.tiny import build_tiny_model, num_parameters
    from nanoverl_hf.workers import make_workers

    tmp = Path(tempfile.mkdtemp())
    model = build_tiny_model(tmp / "model", hidden=args.hidden, layers=args.layers, heads=args.heads)
    data = tmp / "train.jsonl"
    data.write_text('{"prompt": "12=", "target": "12"}\n')
    cfg = load_config(None, [f"data.train_files=[{data}]", f"model.path={model}", "worker.name=hf", "rollout.name=vllm",
                             "trainer.device=cpu", "data.batch_size=16", f"rollout.n={args.rows // 16}",
                             f"rollout.max_new_tokens={args.tokens}", "data.max_prompt_length=16"],
                      registry=load_registry())
    workers = make_workers(cfg)
    with torch.no_grad():
        workers.actor.module.get_input_embeddings().weight[workers.tokenizer.eos_token_id] = 0  # few early stops
    start = time.perf_counter()
    from nanoverl_vllm.rollout import VLLMRollout
    import_s = time.perf_counter() - start
    start = time.perf_counter()
    rollout = VLLMRollout(cfg, workers)
    total_start_s = time.perf_counter() - start

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from conftest import prompt_batch
    batch = prompt_batch(workers.tokenizer, [f"{i:04d}=" for i in range(args.rows)])
    params = SamplingParams(max_new_tokens=args.tokens, temperature=1.0)
    result = {"parameters": num_parameters(model), "rows": args.rows, "max_new_tokens": args.tokens,
              "vllm_import_s": round(import_s, 2), "engine_start_s": round(rollout.start_s, 2),
              "rollout_construct_s": round(total_start_s, 2)}
    for name, engine in (("vllm", rollout), ("hf", HFRollout(cfg, workers))):
        engine.generate(batch, params)                                      # warm-up
        times, tokens = [], 0
        for _ in range(5):
            t = time.perf_counter()
            out = engine.generate(batch, params)
            times.append(time.perf_counter() - t)
            tokens = int(out["response_mask"].sum())
        result[f"{name}_generate_s"] = round(statistics.median(times), 3)
        result[f"{name}_tokens_per_s"] = round(tokens / statistics.median(times))
    syncs = []
    for _ in range(20):
        rollout.sync_weights(workers.actor)
        syncs.append(rollout.last_sync_s)
    result["sync_s_median"] = round(statistics.median(syncs), 4)
    out = rollout.generate(batch, params)
    batch.update(out)
    diff = (out["rollout_log_probs"] - workers.actor.compute_log_probs(batch))[out["response_mask"].bool()]
    result["max_abs_logprob_diff"] = float(f"{diff.abs().max().item():.2e}")
    rollout.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
