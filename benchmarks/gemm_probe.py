"""This CPU's achievable fp32 and bf16 matmul throughput: the limit the actor update is measured against.

    .venv/bin/python benchmarks/gemm_probe.py                 # 1 and 2 threads, fp32 and bf16, ~2 min with bf16 instructions
    .venv/bin/python benchmarks/gemm_probe.py --threads 2 --tokens 1280 --dtypes bfloat16

One JSON object per thread count and dtype (--dtypes: float32 bfloat16 by default; bf16 is what the
update's matmuls run in with model.compute_dtype = "bfloat16"; a CPU without bf16 matmul instructions,
AVX2 only, emulates them and its bf16 rows take many minutes): GFLOP/s (2 m k n FLOPs / seconds, the
fastest of --repeats calls after a warm-up) of a square 2048^3 product (common.gemm_gflops, the figure
step_breakdown divides by) and of the products one SmolLM2-135M update pass runs on --tokens rows (a
16-row micro-batch of ~80 tokens): the attention projections (576 -> 576, 576 -> 192), the MLP
(576 -> 1536, 1536 -> 576), the LM head on --head-rows rows (the response positions, a quarter of
--tokens unless given; 576 -> 49,152), forward and backward shapes (the backward's two products per layer: activations x
weight^T and activations^T x grad).
`summary.min_shape_over_square` says how far the model's own shapes fall below the square product.

`update_mix`: the rate of all the products of one update pass together, as the update runs them: for
every linear layer of every block its forward, input-gradient and weight-gradient products, and the LM
head's three, each timed at its own shape, their FLOPs over the sum of their times.
`update_mix_over_square` is the most an update's matmuls can reach of the square product's rate on
this CPU, before any element-wise kernel or attention: the ceiling of step_breakdown's
`update_gflops / gemm_gflops`. For the `smollm2` workload's packed update (a 16-row micro-batch: 2
prompts of 37 tokens once, then 16 responses of 32) that is `--tokens 586 --head-rows 512`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import gemm_gflops, machine  # noqa: E402

HIDDEN, KV, MLP, VOCAB, BLOCKS = 576, 192, 1536, 49152, 30     # SmolLM2-135M


SHAPES = {"q_o_proj": "q_o_forward", "k_v_proj": "k_v_forward", "mlp_up": "gate_up_forward",
          "mlp_down": "down_forward", "mlp_up_weight_grad": "gate_up_weight_grad", "lm_head": "head_forward",
          "lm_head_input_grad": "head_input_grad"}
"""`shape_gflops`' names for the products of `update_products` they report (each timed once, for both)."""


LAYERS = {"q_o": (HIDDEN, HIDDEN, 2), "k_v": (HIDDEN, KV, 2), "gate_up": (HIDDEN, MLP, 2), "down": (MLP, HIDDEN, 1)}
"""A block's linear layers by shape: (in, out, how many), SmolLM2's."""


def update_products(tokens: int, head_rows: int) -> dict[str, tuple[tuple[int, int, int], int]]:
    """name -> ((m, k, n), how many of it one update pass runs) for every distinct product of the pass: each
    linear layer's forward, input-gradient and weight-gradient products over `tokens` rows in every block,
    and the LM head's over `head_rows`."""
    layers = {name: (k, n, count * BLOCKS, tokens) for name, (k, n, count) in LAYERS.items()}
    layers["head"] = (HIDDEN, VOCAB, 1, head_rows)
    return {f"{name}_{kind}": (mkn, count) for name, (k, n, count, m) in layers.items()
            for kind, mkn in (("forward", (m, k, n)), ("input_grad", (m, n, k)), ("weight_grad", (n, m, k)))}


def update_mix(rates: dict[str, float], products: dict[str, tuple[tuple[int, int, int], int]]) -> float:
    """GFLOP/s of `products` together, `rates` (GFLOP/s) each at its own shape: their FLOPs over their time."""
    flops = {name: count * 2 * m * k * n for name, ((m, k, n), count) in products.items()}
    return sum(flops.values()) / sum(f / rates[name] for name, f in flops.items())


def main(argv: list[str] | None = None) -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--tokens", type=int, default=1280, help="rows of one update pass (prompt + response tokens)")
    parser.add_argument("--head-rows", type=int, default=0,
                        help="rows the LM head runs on (the response positions; default: a quarter of --tokens)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--dtypes", nargs="+", choices=["float32", "bfloat16", "float16"],
                        default=["float32", "bfloat16"])
    args = parser.parse_args(argv)
    for threads in args.threads:
        torch.set_num_threads(threads)
        for dtype in args.dtypes:
            square = gemm_gflops(repeats=args.repeats, dtype=dtype)
            products = update_products(args.tokens, args.head_rows or max(1, args.tokens // 4))
            rates = {name: gemm_gflops(mkn, args.repeats, dtype) for name, (mkn, _) in products.items()}
            per_shape = {name: round(rates[product], 1) for name, product in SHAPES.items()}
            mix = update_mix(rates, products)
            print(json.dumps({"benchmark": "gemm_probe", "threads": threads, "dtype": dtype,
                              "square_2048_gflops": round(square, 1), "tokens": args.tokens, "shape_gflops": per_shape,
                              "update_mix_gflops": round(mix, 1),
                              "summary": {"min_shape_over_square": round(min(per_shape.values()) / square, 3),
                                          "max_shape_over_square": round(max(per_shape.values()) / square, 3),
                                          "update_mix_over_square": round(mix / square, 3)},
                              "machine": machine()}), flush=True)


if __name__ == "__main__":
    main()
