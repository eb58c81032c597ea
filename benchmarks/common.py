"""Shared pieces of the benchmark scripts: model folders, data, nanoverl configs, machine facts.

Every benchmark builds its models locally (no downloads) into a temporary folder:

  tiny   the model of examples/tiny_task: Llama, hidden 64, 2 layers, 4 heads, vocabulary of 14
         characters (digits, "=", <pad>/<bos>/<eos>), tied embeddings: 83,136 parameters.
  10m    Llama, hidden 256, 8 layers, 8 heads (head_dim 32), intermediate 1024, tied embeddings, and
         a character vocabulary of 4,014 (digits, "=", 4,000 CJK characters, 3 specials): 9,420,544
         parameters, 89% of them in the decoder blocks. A random policy almost never samples EOS
         (1 in 4,014), so every response runs to max_new_tokens and two contenders do exactly the
         same work.
  10m-v32k
         the shape of the small real LMs (TinyStories-like): Llama, hidden 256, 2 layers, 8 heads,
         intermediate 1024 and a 32,014-token vocabulary (32,000 CJK / Hangul characters): 10,294,016
         parameters, 80% of them in the tied embedding. The LM head and the sampling over the
         vocabulary dominate, as they do for real tokenizers (32k-150k tokens).

Weights are drawn once from seed 0 and saved as safetensors, so every contender loads the same files.
`smollm2_folder` writes SmolLM2-135M's architecture (49,152-token vocabulary) as a config-only folder
instead (random weights from trainer.seed; `lora.py` and `memory_flat.py --update` use it), and
`fixed_length_folder` any Llama shape on the 10m vocabulary as a config-only folder whose EOS the model
cannot sample, so every response is exactly max_new_tokens long (`scaling.py` uses it).

  smollm2
         the real SmolLM2-135M-Instruct (models/SmolLM2-135M-Instruct.Q4_1.gguf, fetched by
         plugins/nanoverl-hf/scripts/fetch_smollm2.sh): its weights de-quantized to fp32 and its tokenizer,
         saved as a plain folder, on the arithmetic prompts of examples/data/arithmetic through its chat
         template, scored by examples/arithmetic/reward.py. 134,515,008 parameters, 21% of them in the
         tied 49,152 x 576 embedding. EOS is moved to `<empty_output>`, a special token the model never
         samples, so every response runs to max_new_tokens and both contenders do exactly the same work.
"""

from __future__ import annotations

import atexit
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
TINY_DATA = ROOT / "examples/data/tiny_copy/train.jsonl"

MODELS: dict[str, dict[str, Any]] = {   # build_tiny_model arguments
    "tiny": {"alphabet": "0123456789=", "hidden": 64, "layers": 2, "heads": 4, "intermediate": 128},
    "10m": {"alphabet": "0123456789=" + "".join(chr(0x4E00 + i) for i in range(4000)), "hidden": 256,
            "layers": 8, "heads": 8, "intermediate": 1024},
    "10m-v32k": {"alphabet": "0123456789=" + "".join(chr(0x4E00 + i) for i in range(32000)), "hidden": 256,
                 "layers": 2, "heads": 8, "intermediate": 1024},
}


GGUF = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
ARITHMETIC_DATA = ROOT / "examples/data/arithmetic/train.jsonl"
SMOLLM2_CONFIG = "examples/configs/smollm2_arithmetic.toml"
NEVER_SAMPLED = "<empty_output>"   # SmolLM2's special token 16: the EOS of the fixed-length workload
SMOL_SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                  num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                  tie_word_embeddings=True, rms_norm_eps=1e-5, rope_theta=100000.0)
"""HuggingFaceTB/SmolLM2-135M's config.json, used only when the GGUF file is not in models/."""


def smollm2_folder(out: Path) -> tuple[Path, str]:
    """A config-only folder of SmolLM2-135M's architecture with a small stand-in tokenizer."""
    from transformers import AutoConfig, LlamaConfig

    from nanoverl_hf.tiny import build_tokenizer

    if GGUF.is_file():
        config, source = AutoConfig.from_pretrained(GGUF.parent, gguf_file=GGUF.name), f"architecture of {GGUF.name}"
    else:
        config, source = LlamaConfig(**SMOL_SHAPE), "HuggingFaceTB/SmolLM2-135M's published config"
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    tokenizer = build_tokenizer("0123456789=")
    tokenizer.save_pretrained(out)
    return out, source + ", random weights"


NEVER_EOS = "<never>"
"""The EOS of `fixed_length_folder`: a tokenizer id one past the model's vocabulary."""


def fixed_length_folder(out: Path, *, hidden: int, layers: int, heads: int, intermediate: int,
                        alphabet: str = MODELS["10m"]["alphabet"], max_positions: int = 1024) -> Path:
    """A config-only Llama folder (random weights from trainer.seed, tied embeddings) whose responses
    always run to max_new_tokens: the tokenizer's EOS is `NEVER_EOS`, one id past the model's vocabulary,
    so the model cannot sample it (the hf loader warns that the tokenizer has one token more)."""
    from transformers import LlamaConfig

    from nanoverl_hf.tiny import build_tokenizer

    tokenizer = build_tokenizer(alphabet)
    vocab = len(tokenizer)
    tokenizer.add_special_tokens({"eos_token": NEVER_EOS})
    out.mkdir(parents=True, exist_ok=True)
    LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=heads, head_dim=hidden // heads,
                max_position_embeddings=max_positions, tie_word_embeddings=True,
                pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def smollm2_model(out: Path) -> Path:
    """The real SmolLM2-135M-Instruct as a plain fp32 folder whose EOS is never sampled (see above)."""
    from nanoverl_core import load_config, load_registry
    from nanoverl_hf.models import load_policy, load_tokenizer, resolve_source

    if not GGUF.is_file():
        raise SystemExit(f"error: {GGUF} is missing; fetch it with bash plugins/nanoverl-hf/scripts/fetch_smollm2.sh")
    config = load_config(str(ROOT / SMOLLM2_CONFIG), overrides=[f"model.path={GGUF}"], registry=load_registry())
    source = resolve_source(config.model)
    model, tokenizer = load_policy(config, source), load_tokenizer(config.model, source)
    eos = tokenizer.convert_tokens_to_ids(NEVER_SAMPLED)
    tokenizer.eos_token = NEVER_SAMPLED
    model.config.eos_token_id = model.generation_config.eos_token_id = eos
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def load_average() -> str:
    """`uptime`'s load averages (1, 5, 15 min), the figure to read every timing against."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return " ".join(f"{x:.2f}" for x in os.getloadavg())


def machine() -> dict[str, Any]:
    import torch
    import transformers

    return {"load": load_average(), "cpus": os.cpu_count(), "torch": torch.__version__,
            "transformers": transformers.__version__, "torch_threads": torch.get_num_threads(),
            "python": platform.python_version()}


def isa() -> str:
    """The widest of the CPU features that decide the matmul kernels (avx512_bf16, avx512f, avx2)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    return next((name for name in ("avx512_bf16", "avx512f", "avx2") if name in flags), "other")


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def build_model(name: str, out: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """Write `out`: config.json, tokenizer files and safetensors weights drawn from `seed`."""
    import torch
    from nanoverl_hf.tiny import build_tiny_model
    from transformers import AutoConfig, AutoModelForCausalLM

    if name == "smollm2":
        return smollm2_model(out)
    spec = MODELS[name]
    build_tiny_model(out, alphabet=spec["alphabet"], hidden=spec["hidden"], layers=spec["layers"],
                     heads=spec["heads"], intermediate=spec["intermediate"], max_positions=512)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out), dtype=getattr(torch, dtype))
    model.save_pretrained(out)
    return out


def num_parameters(folder: Path) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM

    return sum(p.numel() for p in AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder)).parameters())


def nanoverl_config(model: Path | None, out: Path, *, batch: int, n: int, max_new_tokens: int,
                    lr: float = 1e-6, extra: list[str] | None = None, base: str = "examples/configs/tiny_grpo.toml",
                    data: Path = TINY_DATA):
    """A nanoverl Config for one benchmark workload: `base` plus overrides that switch off everything
    that is not the RL step (validation, checkpoints, rollout dumps, trackers, progress output)."""
    from nanoverl_core import load_config, load_registry

    overrides = [f"trainer.output_dir={out}", "trainer.total_steps=1000", "trainer.val_every=0",
                 "trainer.save_every=0", "trainer.rollout_samples=0", "trainer.progress=none",
                 "trainer.num_threads=1", "tracking.trackers=[]", f"data.batch_size={batch}",
                 f"rollout.n={n}", f"rollout.max_new_tokens={max_new_tokens}", f"actor.lr={lr}",
                 "actor.entropy_coeff=0", f"data.train_files=[{data}]", "data.val_files=[]"]
    if model is not None:
        overrides.append(f"model.path={model}")
    return load_config(str(ROOT / base), overrides=overrides + list(extra or []), registry=load_registry())


def recipe_overrides(out: Path, steps: int, trackers: str = "[]") -> list[str]:
    """Overrides that run an example recipe as it ships for `steps` steps with its run directory in `out`
    and nothing but the RL steps: no evaluation, validation, checkpoints, rollout dumps or progress output;
    `trackers` as a config list."""
    return [f"trainer.output_dir={out}", f"trainer.total_steps={steps}", "trainer.eval_before_after=false",
            "trainer.val_every=0", "trainer.val_before_train=false", "trainer.save_every=0",
            "trainer.rollout_samples=0", "trainer.progress=none", f"tracking.trackers={trackers}"]


def nanoverl_trainer(config):
    from nanoverl_core import load_registry
    from nanoverl_core.trainer.trainer import Trainer

    return Trainer(config, load_registry())


def nanoverl_step(trainer) -> dict[str, float]:
    """One step exactly as Trainer.fit runs it (train_step, then the trackers), without validation
    or checkpoints (both off in these configs anyway)."""
    trainer.step += 1
    metrics = trainer.train_step()
    trainer._tracker_call("log_metrics", metrics, trainer.step)
    return metrics


def run_json_subprocess(argv: list[str], env: dict[str, str] | None = None, timeout: float = 1800) -> dict:
    """Run `python argv...` in a fresh process (its own peak memory) and parse its last stdout line."""
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def tmpdir(prefix: str) -> Path:
    """A fresh temporary folder, removed when the process exits."""
    path = Path(tempfile.mkdtemp(prefix=f"nanoverl-bench-{prefix}-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


# Per-model default workload: prompts per step, samples per prompt, max new tokens. The tiny one is
# examples/configs/tiny_grpo.toml as first shipped (n = 8; the config now samples 16, see its
# comments), kept so the measured tables stay comparable; the 10M ones sample longer responses.
WORKLOADS: dict[str, dict[str, int]] = {
    "tiny": {"batch": 16, "n": 8, "max_new_tokens": 6},
    "10m": {"batch": 8, "n": 8, "max_new_tokens": 16},
    "10m-v32k": {"batch": 8, "n": 8, "max_new_tokens": 16},
    "smollm2": {"batch": 8, "n": 8, "max_new_tokens": 32},   # examples/configs/smollm2_arithmetic.toml's
}


def workload_config(model_name: str, model: Path, out: Path, w: dict[str, int], *, lr: float = 1e-6,
                    extra: list[str] | None = None):
    """nanoverl_config for a model of MODELS (tiny_grpo.toml on the copy prompts) or for smollm2
    (smollm2_arithmetic.toml: the arithmetic prompts, their reward; 16-row micro-batches, as the benchmark
    tables ran; the caller names the rollout; no evaluation)."""
    base = {} if model_name != "smollm2" else {
        "base": SMOLLM2_CONFIG, "data": ARITHMETIC_DATA,
        "extra": ["trainer.eval_before_after=false", "actor.micro_batch_size=16", *(extra or [])]}
    return nanoverl_config(model, out, batch=w["batch"], n=w["n"], max_new_tokens=w["max_new_tokens"], lr=lr,
                           **{"extra": extra, **base})


def gemm_gflops(shape: tuple[int, int, int] = (2048, 2048, 2048), repeats: int = 10, dtype: str = "float32") -> float:
    """This CPU's matmul throughput in `dtype` (fp32 by default) at torch's current thread count: GFLOP/s of
    the fastest of `repeats` (m x k) @ (k x n) products after one warm-up (2 m k n FLOPs each)."""
    import torch

    m, k, n = shape
    a, b = torch.randn(m, k, dtype=getattr(torch, dtype)), torch.randn(k, n, dtype=getattr(torch, dtype))
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * m * k * n / best / 1e9


def update_flops(parameters: int, embedding: int, hidden: int, vocab: int, tokens: float,
                 response_tokens: float) -> float:
    """Useful FLOPs of one forward + backward: 6 x non-embedding parameters x real (prompt + response)
    tokens, plus the LM head (6 x hidden x vocab) on the response positions only. Padding is waste,
    attention's score FLOPs are left out (small at these lengths)."""
    return 6 * (parameters - embedding) * tokens + 6 * hidden * vocab * response_tokens


def workload(model: str, args) -> dict[str, int]:
    """The model's default workload, with any of --batch / --n / --max-new-tokens given on the command line."""
    chosen = dict(WORKLOADS[model])
    for key in chosen:
        if getattr(args, key, None) is not None:
            chosen[key] = getattr(args, key)
    return chosen


def now() -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds). On a machine shared with other jobs the CPU time of
    a one-thread run is what a step costs; the wall time also counts the time others held the cores."""
    return time.perf_counter(), time.process_time()


def since(start: tuple[float, float]) -> tuple[float, float]:
    wall, cpu = now()
    return wall - start[0], cpu - start[1]


def timed_method(obj, name: str, sink: list[float]) -> None:
    """Wrap obj.name so each call's wall time is appended to sink (TRL's breakdown, the optimizer step)."""
    method = getattr(obj, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            sink.append(time.perf_counter() - start)

    setattr(obj, name, wrapper)


def summary(a: list[tuple[float, float]], b: list[tuple[float, float]], warmup: int, names: tuple[str, str]) -> dict:
    """Medians of two contenders' (wall, cpu) step times after warm-up, and the ratios a / b."""
    out = {}
    for i, kind in enumerate(("wall", "cpu")):
        ma, mb = median([t[i] for t in a[warmup:]]), median([t[i] for t in b[warmup:]])
        out[f"{names[0]}_{kind}_s_per_step"] = round(ma, 4)
        out[f"{names[1]}_{kind}_s_per_step"] = round(mb, 4)
        out[f"ratio_{kind}_{names[0]}_over_{names[1]}"] = round(ma / mb, 3)
    return out
