"""Agents written against an OpenAI client, trained through an endpoint the rollout serves (docs/agents.md).

    AgentRollout     one agent per row, its calls served by the rollout engine (rollout.py)
    Transcript       an episode's calls as token ids, merged without re-tokenising (transcript.py), with
                     render_chat (a request's prompt) and assistant_message (a sampled turn as the reply)
    Endpoint         the OpenAI-compatible FastAPI app on 127.0.0.1 (server.py)
    AgentSource      a registered agent, a file's function, or a program (source.py)

The agent workers (runner.py) import this package without torch, so it imports its modules lazily.
"""

from __future__ import annotations

import importlib

_LAZY = {"AgentRollout": "rollout", "Transcript": "transcript", "Endpoint": "server", "AgentSource": "source",
         "render_chat": "transcript", "assistant_message": "transcript"}
__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
