"""GPU check: tokens/s and model FLOPs utilisation per stage on one GPU, HF path and FSDP path.

    python benchmarks/gpu_check.py              # on a single H200 (or any CUDA GPU): under 5 minutes
    python benchmarks/gpu_check.py --smoke      # on CPU: tiny shape, 2 steps; proves the script runs

The model has Qwen2.5-0.5B's shape (the config dict below: hidden 896, 24 layers, 14 heads, 2 KV
heads, intermediate 4864, vocabulary 151,936, tied embeddings) with random weights drawn from
trainer.seed at load time, and a tokenizer built locally (one token per character, 151,936 of them):
nothing is downloaded. A random policy almost never samples EOS, so every response runs to
max_new_tokens and the work per step is fixed. The prompts are examples/data/tiny_copy (5 tokens).
Every path trains in bf16 mixed precision, as GPU recipes do: float32 weights and AdamW state,
`model.compute_dtype = "bfloat16"` (autocast; FSDP2's `param_dtype` for the fsdp worker; the vLLM
engine's own weights in bf16).

Two paths, each in its own subprocess through the real trainer, GRPO, `--warmup` + `--steps` steps:
  hf     worker `hf`, rollout `hf` sharing the actor's module (trainer.device=cuda)
  fsdp   worker `fsdp` (FSDP2, a world of one, NCCL) with the `hf` rollout on its own copy that
         `weight_sync` refreshes each step; skipped with a note if nanoverl-fsdp is not importable
  fsdp_vllm  worker `fsdp` with the `vllm` rollout: an in-process engine on the same GPU that sleeps
         (frees its KV cache and weights) during the update and is woken and fed the gathered weights,
         tensor by tensor, at `weight_sync`; skipped with a note if vLLM or nanoverl-vllm is missing

Per stage it reports seconds (median), tokens/s and MFU = achieved FLOP/s / peak FLOP/s with
  forward-only stages (rollout, old / ref log-probs, values): 2 * N * tokens
  actor update (forward + backward):                           6 * N * tokens
where N counts every parameter once (the tied embedding once: it is the LM head's matmul) and tokens
are prompt + response tokens of every row (attention FLOPs are left out, small at these lengths).
The peak is --peak-tflops (default 989: H200 dense bf16; a plain bf16 matmul reaches ~790 there).

Setup on the H200 machine (it has torch and transformers; nothing can be fetched there): the
repository's packages are found from the checkout (no install needed); cattrs, datasets, dill and
multiprocess travel as wheels, see benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for src in [ROOT, *sorted((ROOT / "plugins").glob("*/src"))]:      # the checkout, installed or not
    if str(src) not in sys.path:
        sys.path.insert(0, str(src))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

QWEN25_05B = {
    "model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
    "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936, "tie_word_embeddings": True,
    "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "hidden_act": "silu",
    "use_sliding_window": False, "attention_dropout": 0.0, "torch_dtype": "bfloat16",
}
SMOKE = {**QWEN25_05B, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,   # head_dim 32:
         "num_key_value_heads": 1, "intermediate_size": 128, "vocab_size": 1024,           # vLLM's CPU kernels
         "max_position_embeddings": 512}
STAGES = ("rollout", "old_log_probs", "ref_log_probs", "values", "actor_update", "critic_update", "weight_sync")
FLOPS_PER_PARAM_TOKEN = {"rollout": 2, "old_log_probs": 2, "ref_log_probs": 2, "values": 2, "actor_update": 6,
                "critic_update": 6}
PLUGINS = {"nanoverl-hf": "nanoverl_hf.plugin", "nanoverl-grpo": "nanoverl_grpo.plugin",
           "nanoverl-fsdp": "nanoverl_fsdp.plugin", "nanoverl-vllm": "nanoverl_vllm.plugin"}
NEEDS = {"fsdp": ["nanoverl_fsdp.workers"], "fsdp_vllm": ["nanoverl_fsdp.workers", "nanoverl_vllm.engine"]}
"""Modules a path imports; an absent or broken one skips the path with a note."""


def build_model_folder(out: Path, shape: dict) -> Path:
    """config.json (no weights: the worker draws them from trainer.seed) and a character tokenizer
    with exactly vocab_size tokens."""
    from nanoverl_hf.tiny import SPECIALS, build_tokenizer
    from transformers import AutoConfig

    chars, code = [], 0x4E00
    while len(chars) < shape["vocab_size"] - len(SPECIALS) - 11:
        if not 0xD800 <= code <= 0xDFFF:                  # surrogates are not characters
            chars.append(chr(code))
        code += 1
    tokenizer = build_tokenizer("0123456789=" + "".join(chars))
    config = AutoConfig.for_model(**{**shape, "pad_token_id": tokenizer.pad_token_id,
                                     "bos_token_id": tokenizer.bos_token_id,
                                     "eos_token_id": tokenizer.eos_token_id})
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def count_parameters(folder: Path) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
    return sum(p.numel() for p in model.parameters())


def registry():
    """Plugins as nanoverl-train finds them, plus the checkout's own plugins when not installed."""
    from nanoverl_core import load_registry
    from nanoverl_core.plugins import HOOKS, PluginInfo

    reg = load_registry()
    have = {info.dist for info in reg.plugins}
    for dist, module_name in PLUGINS.items():
        if dist in have:
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        reg.plugins.append(PluginInfo(dist, "0+checkout", module_name))
        for hook, kind in HOOKS.items():
            if hasattr(module, hook):
                getattr(module, hook)(register=lambda name, obj, description="", _k=kind, _d=dist:
                                      reg.add(_k, name, obj, _d, description))
    return reg


def run_path(spec: dict) -> dict:
    """Child process: one path (hf or fsdp) through the trainer; returns its figures."""
    import time

    import torch
    from nanoverl_core import load_config
    from nanoverl_core.trainer.trainer import Trainer

    for module in NEEDS.get(spec["path"], []):
        try:
            importlib.import_module(module)
        except Exception as exc:  # an absent or broken plugin is a note, not a failure of the check
            return {"path": spec["path"], "skipped": f"{module} is not importable ({type(exc).__name__}: {exc})"}
    out = Path(spec["work"]) / spec["path"]
    overrides = [
        f"model.path={spec['model']}", "model.dtype=float32", f"model.compute_dtype={spec['dtype']}", f"trainer.device={spec['device']}",
        f"trainer.output_dir={out}", "trainer.total_steps=1000", "trainer.val_every=0", "trainer.save_every=0",
        "trainer.rollout_samples=0", "trainer.progress=none", f"trainer.num_threads={spec['threads']}",
        "tracking.trackers=[]", f"data.train_files=[{ROOT / 'examples/data/tiny_copy/train.jsonl'}]",
        "data.val_files=[]", f"data.batch_size={spec['batch']}", f"rollout.n={spec['n']}",
        f"rollout.max_new_tokens={spec['max_new_tokens']}", f"actor.micro_batch_size={spec['micro']}",
        "actor.lr=1e-6", "actor.entropy_coeff=0", "algorithm.advantage_estimator=grpo", "reward.name=char_match"]
    if spec["path"] == "fsdp_vllm":
        overrides += ["rollout.name=vllm"]
    if spec["path"] in ("fsdp", "fsdp_vllm"):
        overrides += ["worker.name=fsdp", f"worker.fsdp.param_dtype={spec['dtype']}", "worker.fsdp.reduce_dtype=float32"]
    plugins = registry()
    config = load_config(str(ROOT / "examples/configs/tiny_grpo.toml"), overrides=overrides, registry=plugins)
    start = time.perf_counter()
    trainer = Trainer(config, plugins)
    build_s = time.perf_counter() - start
    cuda = trainer.workers.actor.device.type == "cuda"
    rows = []
    for _ in range(spec["warmup"] + spec["steps"]):
        trainer.step += 1
        rows.append(trainer.train_step())
    rows = rows[spec["warmup"]:]

    def med(key: str) -> float:
        values = sorted(r[key] for r in rows if key in r)
        return values[len(values) // 2] if values else 0.0

    samples = spec["batch"] * spec["n"]
    prompt, response = med("rollout/prompt_length/mean") * samples, med("rollout/response_length/mean") * samples
    tokens, peak, n_params = prompt + response, spec["peak_tflops"] * 1e12, spec["parameters"]
    stages, total_flops = {}, 0.0
    for stage in STAGES:
        seconds = med(f"timing/{stage}")
        if f"timing/{stage}" not in rows[0]:
            continue
        entry = {"s": round(seconds, 4)}
        if stage == "old_log_probs" and getattr(trainer, "old_log_probs_from_update", False):
            entry["note"] = "not run: one on-policy update per step takes them from its own forward"
        elif stage in FLOPS_PER_PARAM_TOKEN and seconds > 0:
            flops = FLOPS_PER_PARAM_TOKEN[stage] * n_params * tokens
            total_flops += flops
            entry.update({"tokens_per_s": round((response if stage == "rollout" else tokens) / seconds, 1),
                          "tflops": round(flops / seconds / 1e12, 2), "mfu": round(flops / seconds / peak, 4)})
        stages[stage] = entry
    step_s = med("timing/step")
    result = {
        "path": spec["path"], "device": str(trainer.workers.actor.device),
        "gpu": torch.cuda.get_device_name() if cuda else None, "parameters": n_params, "dtype": spec["dtype"],
        "batch_prompts": spec["batch"], "n": spec["n"], "max_new_tokens": spec["max_new_tokens"],
        "micro_batch_rows": spec["micro"], "steps_measured": spec["steps"], "build_s": round(build_s, 1),
        "response_length_mean": round(response / samples, 1), "prompt_length_mean": round(prompt / samples, 1),
        "step_s": round(step_s, 4), "step_tokens_per_s": round(tokens / step_s, 1),
        "step_mfu": round(total_flops / step_s / peak, 4), "stages": stages,
        "peak_tflops_assumed": spec["peak_tflops"], "reward_mean": round(med("reward/mean"), 4),
    }
    if spec["path"] == "fsdp_vllm":   # did the engine free its memory during the update, and stay up
        result["vllm"] = {"sleep": trainer.rollout.sleep, "restarts": trainer.rollout.restarts,
                          "start_s": round(trainer.rollout.start_s, 1)}
    if cuda:
        result["peak_cuda_allocated_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny shape, 2 steps: the script works")
    parser.add_argument("--paths", nargs="+", default=["hf", "fsdp", "fsdp_vllm"], choices=["hf", "fsdp", "fsdp_vllm"])
    parser.add_argument("--batch", type=int, default=16, help="prompts per step")
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--micro", type=int, default=32, help="rows per actor forward/backward")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="peak dense bf16 TFLOP/s of the GPU")
    parser.add_argument("--timeout", type=float, default=95, help="seconds allowed per path (3 paths < 5 min)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_path(json.loads(args.one))), flush=True)
        return

    import tempfile

    import torch

    if not args.smoke and not torch.cuda.is_available():
        sys.exit("error: no CUDA device; run on the GPU machine, or use --smoke to check the script on CPU")
    work = Path(tempfile.mkdtemp(prefix="nanoverl-gpu-check-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    shape = SMOKE if args.smoke else QWEN25_05B
    model = build_model_folder(work / "model", shape)
    common = {"work": str(work), "model": str(model), "parameters": count_parameters(model),
              "dtype": "bfloat16", "device": "cpu" if args.smoke else "cuda", "threads": 1 if args.smoke else 0,
              "batch": 2 if args.smoke else args.batch, "n": 2 if args.smoke else args.n,
              "max_new_tokens": 8 if args.smoke else args.max_new_tokens, "micro": 2 if args.smoke else args.micro,
              "steps": 1 if args.smoke else args.steps, "warmup": 1 if args.smoke else args.warmup,
              "peak_tflops": args.peak_tflops}
    results = []
    for path in args.paths:
        spec = {**common, "path": path}
        try:
            proc = subprocess.run([sys.executable, __file__, "--one", json.dumps(spec)], capture_output=True,
                                  text=True, timeout=args.timeout, cwd=ROOT)
            lines = proc.stdout.strip().splitlines()
            result = json.loads(lines[-1]) if proc.returncode == 0 and lines else \
                {"path": path, "failed": f"exit {proc.returncode}", "stderr_tail": proc.stderr[-2000:]}
        except subprocess.TimeoutExpired:
            result = {"path": path, "failed": f"ran over --timeout={args.timeout}s"}
        result["smoke"] = args.smoke
        results.append(result)
        print(json.dumps(result), flush=True)
    ok = all("failed" not in r for r in results)
    final = {"gpu_check": "ok" if ok else "failed", "smoke": args.smoke,
             "model": "smoke shape" if args.smoke else "Qwen2.5-0.5B shape (random)",
             "paths": {r["path"]: ("skipped" if "skipped" in r else "failed" if "failed" in r else r.get("step_s"))
                       for r in results}}
    if args.smoke:   # the full-size folder too (config and 151,936-token tokenizer), counted on the meta device
        final["full_shape_parameters"] = count_parameters(build_model_folder(work / "full", QWEN25_05B))
    print(json.dumps(final), flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
