"""Prompt KV sharing: each distinct prompt of a batch runs through the model once.

GRPO-style batches repeat every prompt `rollout.n` times. A module whose forward takes a KV cache
(`cache=` in transformers >= 5.2x, `past_key_values=` before, with `use_cache=`) can run each distinct
prompt once and continue every row from its prompt's cache. The training passes use it
(`actor.share_prompts`, `critic.share_prompts`: `TorchActor` / `TorchCritic`'s `module_inputs`) and so
does the hf rollout's prefill (`[rollout.hf] share_prompts`).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch


def forward_keyword(module: torch.nn.Module, *names: str) -> str | None:
    """The first of `names` that module.forward takes as a keyword, or None. A wrapper that passes
    **kwargs on to a model it exposes as `get_base_model()` (peft) is looked through."""
    forwards = [module.forward]
    if callable(getattr(module, "get_base_model", None)):
        forwards.append(module.get_base_model().forward)
    params = [inspect.signature(f).parameters for f in forwards]
    return next((name for name in names if any(name in p for p in params)), None)


def prompt_cache(module: torch.nn.Module, keyword: str, ids: torch.Tensor, mask: torch.Tensor,
                 keeps_logits: bool = False) -> Any | None:
    """The KV cache of left-padded prompts ids / mask (B, S) for every row, each distinct row run through the
    module once and its cache indexed out to the rows that repeat it (differentiable: autograd sums a
    prompt's gradient over its rows). `keyword` is the module's `cache_keyword`; keeps_logits: its forward
    takes logits_to_keep (only one position's logits are made). None when the module returned no cache."""
    distinct, rows = torch.unique(torch.cat([ids, mask.to(ids.dtype)], 1), dim=0, return_inverse=True)
    distinct_mask = distinct[:, ids.shape[1]:]
    out = module(input_ids=distinct[:, :ids.shape[1]], attention_mask=distinct_mask, use_cache=True,
                 position_ids=(distinct_mask.cumsum(-1) - 1).clamp(min=0),
                 **({"logits_to_keep": 1} if keeps_logits else {}))
    cache = getattr(out, keyword, None)
    if cache is not None:
        cache.reorder_cache(rows)     # (distinct, ...) -> (B, ...) for every layer type (batch_select_indices
    return cache                      # misses recurrent states)


def checkpointed(module: torch.nn.Module) -> bool:
    """Whether a transformers model (under peft: its base model) has activation checkpointing on."""
    if callable(getattr(module, "get_base_model", None)):
        module = module.get_base_model()
    name = "is_activation_checkpointing" if hasattr(type(module), "is_activation_checkpointing") \
        else "is_gradient_checkpointing"                                    # the name before transformers 5.2x
    return bool(getattr(module, name, False))


def cache_keyword(module: torch.nn.Module) -> str | None:
    """The forward's KV-cache keyword: `cache` (transformers >= 5.2x), `past_key_values` (before), or None.
    The output carries the cache under the same name."""
    return forward_keyword(module, "cache", "past_key_values") if forward_keyword(module, "use_cache") else None
