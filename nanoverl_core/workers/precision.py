"""Which precision the module passes compute in: whether this machine has fast bf16 / fp16 matmuls, and
what `model.compute_dtype = "auto"` picks.

On x86 a bf16 matmul is fast only where oneDNN runs it with the CPU's own bf16 instructions
(AVX512-BF16, or AMX): `brg_matmul:avx512_core_bf16` in ONEDNN_VERBOSE's log. An AVX-512 CPU without
them runs oneDNN's emulation (`gemm:jit:bf16`, a fraction of float32's rate), an AVX2-only one falls back
to ATen's reference loop (~1 GFLOP/s). ONEDNN_MAX_CPU_ISA caps the instructions oneDNN may use, so a
machine that has them can be made to run (and be detected) as one that has not: the tests do that.

On CPU, torch's fused attention (`scaled_dot_product_attention`, its flash kernel) runs forward +
backward about 3x slower in bf16 than in float32 (benchmarks/attention_probe.py), and was a quarter of a
bf16 SmolLM2 update. `Float32Attention` runs the attention of a pass that will be differentiated in
float32 instead; forward-only passes (log-probs, generation) keep bf16's kernel, as fast as float32's there.

`autocast(model, device)` is the context every module pass of a worker (workers/forward.py) and of the hf
rollout runs in.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import sys

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

ONEDNN_ISAS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
               "AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16", "AVX10_1_512_AMX", "AVX512_CORE_AMX",
               "AVX10_1_512_AMX_FP16", "AVX512_CORE_AMX_FP16")
"""oneDNN's x86 instruction-set levels, lowest first (the values ONEDNN_MAX_CPU_ISA takes; ALL is no cap)."""
NATIVE = {"bfloat16": "AVX512_CORE_BF16", "float16": "AVX512_CORE_FP16"}
"""The lowest level at which oneDNN multiplies each dtype with the CPU's own instructions."""


def _isa_allowed(level: str) -> bool:
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
    return cap not in ONEDNN_ISAS or ONEDNN_ISAS.index(cap) >= ONEDNN_ISAS.index(level)


def cpu_has_fast(dtype: str) -> bool:
    """Whether this CPU multiplies `dtype` ("bfloat16", "float16") with its own instructions, as oneDNN will
    run them: on x86 the CPU reports AVX512-BF16 (or AMX) / AVX512-FP16 and ONEDNN_MAX_CPU_ISA allows that
    level; elsewhere, whether oneDNN has kernels for it at all."""
    onednn = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported" if dtype == "bfloat16" else
                     "_is_mkldnn_fp16_supported", None)
    if onednn is not None and not onednn():
        return False
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return onednn is not None
    cpu = torch.cpu._is_avx512_bf16_supported() if dtype == "bfloat16" else torch.cpu._is_amx_fp16_supported()
    return (cpu or torch.cpu._is_amx_tile_supported()) and _isa_allowed(NATIVE[dtype])


def pick_compute_dtype(device: str) -> tuple[str, str]:
    """("bfloat16" or "" for float32, why) for `model.compute_dtype = "auto"` on trainer.device `device`."""
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if cuda:
        fast = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return ("bfloat16", "this GPU computes in bf16") if fast else ("", "this GPU has no bf16")
    if cpu_has_fast("bfloat16"):
        return "bfloat16", "this CPU has bf16 matmul instructions (AVX512-BF16 or AMX)"
    return "", "this CPU has no bf16 matmul instructions"


def resolve_compute_dtype(config) -> None:
    """`model.compute_dtype = "auto"` made what it picks on this machine, said once on stderr; called
    before anything reads it (the run directory's config.json holds the pick)."""
    if config.model.compute_dtype != "auto":
        return
    dtype, why = pick_compute_dtype(config.trainer.device)
    config.model.compute_dtype = dtype if config.model.dtype == "float32" else ""   # bf16 weights: no cast
    print(f"model.compute_dtype = auto: {config.model.compute_dtype or 'float32'} ({why})", file=sys.stderr)


class Float32Attention(TorchFunctionMode):
    """Inside it and under autocast, `scaled_dot_product_attention` runs in float32 (autocast off for it,
    its inputs cast up: a transformers Llama hands it float32 queries and keys, after the rotary embedding,
    which autocast would cast down), its output cast to autocast's dtype as autocast would have made it;
    every other function runs as it would. For autocast passes on CPU that will be differentiated: there
    the float32 flash kernel's forward + backward is ~3x faster than bf16's."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        device = (args[0] if args else kwargs["query"]).device.type
        if not torch.is_autocast_enabled(device):
            return func(*args, **kwargs)
        with torch.autocast(device, enabled=False):
            up = [a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args]
            out = func(*up, **{k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v
                               for k, v in kwargs.items()})
        return out.to(torch.get_autocast_dtype(device))


def autocast_dtype(model) -> str:
    """The dtype `model.compute_dtype` casts to: "" when it is unset or model.dtype itself (the weights'
    own dtype: no cast to make)."""
    return model.compute_dtype if model.compute_dtype != model.dtype else ""


def autocast(model, device: torch.device) -> contextlib.AbstractContextManager:
    """`model.compute_dtype` (the [model] section) as a context for a forward pass on `device`: torch.autocast
    to `autocast_dtype`, or nothing when there is no cast to make. On CPU a pass entered with gradients
    enabled runs its attention in float32 (`Float32Attention`: bf16's backward is slow there), unless
    gradient checkpointing recomputes the blocks in backward, where only autocast is restored."""
    dtype = autocast_dtype(model)
    if not dtype:
        return contextlib.nullcontext()
    return _autocast(device, getattr(torch, dtype), float32_attention=not model.gradient_checkpointing)


@contextlib.contextmanager
def _autocast(device: torch.device, dtype: torch.dtype, float32_attention: bool):
    float32_attention = float32_attention and device.type == "cpu" and torch.is_grad_enabled()
    with torch.autocast(device.type, dtype=dtype), (Float32Attention() if float32_attention else
                                                    contextlib.nullcontext()):
        yield


@functools.cache
def warn_slow_compute_dtype(dtype: str) -> None:
    """Once per process: model.compute_dtype on a CPU that emulates it."""
    if not cpu_has_fast(dtype):
        print(f"warning: model.compute_dtype = {dtype!r}, but this CPU has no {dtype} matmul instructions: its "
              "matmuls run many times slower than float32 here; leave model.compute_dtype empty (or \"auto\") on "
              "this machine",
              file=sys.stderr)
