"""Rewards: the trainer's scoring stage, how one reward is called, and the worker processes that call them.

    scoring.py  RewardScorer: the configured rewards (one, a file, or weighted components) over a batch,
                under reward.on_error; the trainer's reward stage (score_batch) and the overlong penalty
    texts.py    plain texts as a batch's responses (ByteTokenizer), for `nanoverl-train score` and tests
    calls.py    one call: the nanoverl and verl call conventions, loading a reward.file, checking results
    pool.py     RewardPool: stateless calls on a WorkerPool (nanoverl_core.processes: worker processes with
                timeouts, crash isolation and a memory cap)

The worker processes import `nanoverl_core.reward.pool` without torch, so this package imports its
modules lazily.
"""

from __future__ import annotations

import importlib

_LAZY = {"RewardScorer": "scoring", "component_specs": "scoring", "load_reward_fn": "scoring",
         "overlong_penalty": "scoring", "place_scores": "scoring", "ComponentSpec": "calls", "CallError": "calls",
         "RewardContext": "calls", "call_checked": "calls", "call_batched": "calls", "call_style": "calls",
         "load_function": "calls", "BATCHED_STYLES": "calls", "GROUND_TRUTH_KEYS": "calls",
         "ground_truth_value": "calls", "RewardPool": "pool", "ByteTokenizer": "texts", "as_responses": "texts"}
__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
