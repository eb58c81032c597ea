"""`model.compile`: torch.compile (Inductor) over the parts of each transformer block that hold no KV cache.

The update is matmul-bound; what keeps it below the machine's GEMM rate is the element-wise work
between the matmuls (RMSNorm, SiLU x up), which eager PyTorch runs as separate memory-bound kernels
and Inductor fuses (C++/OpenMP on CPU, Triton on GPU). What is compiled, in place with
`nn.Module.compile`: each child of each block (the classes a transformers model names in
`_no_split_modules`, the units FSDP shards) whose forward takes no KV cache: a Llama block's two
RMSNorms and its MLP, not its attention. Why not whole blocks: attention updates the KV cache of
its own layer (`cache.layers[layer_idx]`), and a graph guards on that index, so the prompt-cached
passes (`actor.share_prompts`) and a rollout's decode steps compiled one graph per layer, and past
torch's recompile limit (8) fell back to eager (measured on a tiny Llama). The children:

- one graph serves every layer: their code is the same and their parameters are the graph's inputs;
- what runs between them stays eager Python: attention and its cache, the `ChunkedHead`'s hook on
  the LM head, the prompt cache's indexing, peft's adapter switch, FSDP's hooks around each block;
- the module's parameters and state_dict keep their names, so checkpoints do not change.

The LM head's chunked log-softmax is compiled where it lives (`algos.logprobs_from_hidden(compiled=True)`,
which `ChunkedHead` asks for under `model.compile`).

RL batches change rows and lengths at every step, so the parts compile with `dynamic=True`: sizes are
symbols from the first compilation on, not a new graph per shape. A new graph still comes for each kind
of pass (with gradients, without, a frozen reference's parameters) and, once, for a size of exactly 1
(torch specializes 0/1 sizes: a micro-batch with one distinct prompt, a one-token decode step): a few
per part, all within `RECOMPILE_LIMIT`. They are counted: `perf/compiled_graphs` and `perf/compile_s`
in every step's metrics (`compile_metrics`), the process's totals, so a recompile storm shows as a
count that keeps climbing.
"""

from __future__ import annotations

import shutil
import sys

import torch

from ..errors import ConfigError
from .prompt_cache import forward_keyword

CACHE_KEYWORDS = ("cache", "past_key_values", "past_key_value", "layer_past")
"""A forward taking one of these reads or writes a KV cache (transformers' names over its versions)."""
RECOMPILE_LIMIT = 32
"""Graphs torch may compile per code object before it runs that code eager (torch's default is 8)."""


def blocks(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a transformers model (under peft: of its base model), by the classes
    its `_no_split_modules` names (FSDP2's `fully_shard` subclasses them: FSDPLlamaDecoderLayer)."""
    base = module.get_base_model() if callable(getattr(module, "get_base_model", None)) else module
    names = set(getattr(base, "_no_split_modules", None) or ())
    return [m for m in module.modules() if any(cls.__name__ in names for cls in type(m).__mro__)]


def compiled_parts(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The children of each transformer block whose forward takes no KV cache (see the module docstring)."""
    return [child for block in blocks(module) for child in block.children()
            if forward_keyword(child, *CACHE_KEYWORDS) is None]


def compile_blocks(module: torch.nn.Module, device: torch.device) -> None:
    """torch.compile the `compiled_parts` of `module` in place (dynamic shapes), once: a module shared by
    two workers (a LoRA reference is the actor's own module) is compiled by the first. A model without
    named blocks, or a CPU without a C++ compiler for Inductor's kernels, is a ConfigError."""
    parts = compiled_parts(module)
    if not parts:
        raise ConfigError(f"model.compile = true, but {type(module).__name__} names no transformer blocks "
                          "(_no_split_modules) with parts to compile; set model.compile = false for this model")
    if device.type == "cpu" and not any(shutil.which(cxx) for cxx in ("g++", "c++", "clang++")):
        raise ConfigError("model.compile = true needs a C++ compiler on CPU (Inductor builds its kernels with one): "
                          "install g++, or set model.compile = false")
    # a part's code has a few expected variants (see the module docstring), up to 2 x 2 x 3: more than
    # torch's default of 8 graphs per code object, past which it would run eager without a word
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    for part in parts:
        if getattr(part, "_compiled_call_impl", None) is None:
            part.compile(dynamic=True)


def compile_metrics() -> dict[str, float]:
    """The process's torch.compile totals so far: graphs compiled (a first compilation and every
    recompilation) and seconds spent compiling. Empty when nothing was compiled."""
    dynamo = sys.modules.get("torch._dynamo.utils")        # never imported: nothing was compiled
    graphs = dynamo.counters["stats"]["unique_graphs"] if dynamo is not None else 0
    if not graphs:
        return {}
    seconds = sum(dynamo.compilation_time_metrics.get("_compile.compile_inner", ()))
    return {"perf/compiled_graphs": float(graphs), "perf/compile_s": seconds}
