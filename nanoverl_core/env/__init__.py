"""Multi-turn episodes and tools: what an environment plugin implements and imports.

    EnvStep, Turn              an environment's answer, and the model turn it answers (contract.py)
    tool_environment           Python functions as tools the model calls (tools.py)
    EpisodeRollout             multi-turn episodes over any rollout engine (episode.py)
    EnvironmentPool, InProcess where the environments live and their calls run (pool.py)
    render_answer              an answer (text or chat messages) as token ids, rendered once (render.py)
    EnvironmentSource          a registered environment or one from a file (environment.file), as workers load it

The contract (`nanoverl_core.protocols.MakeEnvironment` / `Environment`): a factory registered with
`register_environments` builds one environment per episode from its data row; the environment's
`step(turn)` returns an `EnvStep`; `close()` (optional) ends the episode. Environments run in worker
processes that import them without torch, so this package imports its modules lazily.
"""

from __future__ import annotations

import importlib

_LAZY = {"EnvStep": "contract", "Turn": "contract", "EpisodeRollout": "episode", "episode_metrics": "episode",
         "EnvironmentPool": "pool", "InProcess": "pool", "environment_calls": "pool", "render_answer": "render",
         "ToolEnvironment": "tools", "tool_environment": "tools", "tool_prompt": "tools", "tool_schemas": "tools",
         "with_tools": "tools", "EnvironmentSource": "source"}
__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
