"""This CPU's fused attention (`scaled_dot_product_attention`) in float32 and bf16, forward and backward.

    .venv/bin/python benchmarks/attention_probe.py                 # SmolLM2's shapes, 2 threads, ~10 s
    .venv/bin/python benchmarks/attention_probe.py --rows 4 --tokens 512 --threads 1

Why a bf16 update on CPU runs its attention in float32 (nanoverl_core.workers.precision.Float32Attention):
milliseconds (the fastest of --repeats after a warm-up) of one attention call on --rows x --heads x
--tokens x 64 (SmolLM2-135M: 9 heads of 64; a 16-row micro-batch of ~70 tokens), causal, with a padding
mask as transformers passes it, in four ways: float32; bf16 (what autocast runs); bf16 inputs attended in
float32 and cast back (what Float32Attention runs); bf16 through the math kernel (plain matmuls). Each
way forward only and forward + backward. A CPU without bf16 matmul instructions (AVX2 only) emulates
bf16, so its bf16 rows are slower still. One JSON object, with the CPU's widest ISA.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import isa, machine  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--tokens", type=int, default=70)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    g = torch.Generator().manual_seed(0)
    shape = (args.rows, args.heads, args.tokens, 64)
    qkv = [torch.randn(shape, generator=g) for _ in range(3)]
    mask = torch.ones(args.rows, 1, args.tokens, args.tokens, dtype=torch.bool).tril()
    mask[: args.rows // 4, :, :, : args.tokens // 8] = False            # left padding on a quarter of the rows

    def attend(dtype, upcast=False, backend=SDPBackend.FLASH_ATTENTION):
        def call(q, k, v):
            with sdpa_kernel(backend):
                if upcast:
                    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask).to(dtype)
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return call

    def ms(call, dtype, backward: bool) -> float:
        best = float("inf")
        for _ in range(args.repeats + 1):
            leaves = [t.to(dtype, copy=True).requires_grad_(backward) for t in qkv]
            start = time.perf_counter()
            with torch.set_grad_enabled(backward):
                out = call(*leaves)
                if backward:
                    out.backward(torch.ones_like(out))
            best = min(best, time.perf_counter() - start)
        return round(best * 1000, 2)

    bf16 = torch.bfloat16
    ways = {"float32": (attend(torch.float32), torch.float32), "bfloat16": (attend(bf16), bf16),
            "bfloat16_attended_in_float32": (attend(bf16, upcast=True), bf16),
            "bfloat16_math_kernel": (attend(bf16, backend=SDPBackend.MATH), bf16)}
    results = {name: {"forward_ms": ms(call, dtype, False), "forward_backward_ms": ms(call, dtype, True)}
               for name, (call, dtype) in ways.items()}
    print(json.dumps({"benchmark": "attention_probe", "shape": list(shape), "threads": args.threads, "isa": isa(),
                      "results": results, "machine": machine()}), flush=True)


if __name__ == "__main__":
    main()
