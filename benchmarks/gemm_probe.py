"""This CPU's achievable fp32 and bf16 matmul throughput: the limit the actor update is measured against.

    .venv/bin/python benchmarks/gemm_probe.py                 # 1 and 2 threads, fp32 and bf16, ~2 min with bf16 instructions
    .venv/bin/python benchmarks/gemm_probe.py --threads 2 --tokens 1280 --dtypes bfloat16

One JSON object per thread count and dtype (--dtypes: float32 bfloat16 by default; bf16 is what the
update's matmuls run in with model.compute_dtype = "bfloat16"; a CPU without bf16 matmul instructions,
AVX2 only, emulates them and its bf16 rows take many minutes): GFLOP/s (2 m k n FLOPs / seconds, the
fastest of --repeats calls after a warm-up) of a square 2048^3 product (common.gemm_gflops, the figure
step_breakdown divides by) and of the products one SmolLM2-135M update pass runs on --tokens rows (a
16-row micro-batch of ~80 tokens): the attention projections (576 -> 576, 576 -> 192), the MLP
(576 -> 1536, 1536 -> 576), the LM head on a quarter of the rows (the response positions,
576 -> 49,152), forward and backward shapes (the backward's two products per layer: activations x
weight^T and activations^T x grad).
`summary.min_shape_over_square` says how far the model's own shapes fall below the square product.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import gemm_gflops, machine  # noqa: E402

HIDDEN, KV, MLP, VOCAB = 576, 192, 1536, 49152     # SmolLM2-135M


def shapes(tokens: int) -> dict[str, tuple[int, int, int]]:
    """name -> (m, k, n) of C(m x n) = A(m x k) B(k x n)."""
    head_rows = max(1, tokens // 4)
    return {"q_o_proj": (tokens, HIDDEN, HIDDEN), "k_v_proj": (tokens, HIDDEN, KV),
            "mlp_up": (tokens, HIDDEN, MLP), "mlp_down": (tokens, MLP, HIDDEN),
            "mlp_up_weight_grad": (MLP, tokens, HIDDEN), "lm_head": (head_rows, HIDDEN, VOCAB),
            "lm_head_input_grad": (head_rows, VOCAB, HIDDEN)}


def main(argv: list[str] | None = None) -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--tokens", type=int, default=1280, help="rows of one update pass (prompt + response tokens)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--dtypes", nargs="+", choices=["float32", "bfloat16", "float16"],
                        default=["float32", "bfloat16"])
    args = parser.parse_args(argv)
    for threads in args.threads:
        torch.set_num_threads(threads)
        for dtype in args.dtypes:
            square = gemm_gflops(repeats=args.repeats, dtype=dtype)
            per_shape = {name: round(gemm_gflops(mkn, args.repeats, dtype), 1)
                         for name, mkn in shapes(args.tokens).items()}
            print(json.dumps({"benchmark": "gemm_probe", "threads": threads, "dtype": dtype,
                              "square_2048_gflops": round(square, 1), "tokens": args.tokens, "shape_gflops": per_shape,
                              "summary": {"min_shape_over_square": round(min(per_shape.values()) / square, 3),
                                          "max_shape_over_square": round(max(per_shape.values()) / square, 3)},
                              "machine": machine()}), flush=True)


if __name__ == "__main__":
    main()
