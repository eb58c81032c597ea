"""What an environment receives and returns (no torch here: environments import it in worker processes)."""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen
class Turn:
    """One model turn, as an environment receives it."""

    text: str
    """The turn decoded without special tokens."""
    token_ids: tuple[int, ...]
    """Exactly the ids the engine sampled, its stop token included."""
    index: int
    """0 for the first turn."""
    truncated: bool = False
    """The turn ended without a stop token (environment.max_turn_tokens, or the budget)."""


@attrs.frozen
class EnvStep:
    """An environment's answer to a model turn."""

    observation: str | list[dict[str, Any]] = ""
    """Text appended as it is, or chat messages ({"role", "content"}) rendered by the chat template."""
    reward: float = 0.0
    """This turn's reward (added to the episode's score, x environment.reward_weight)."""
    done: bool = False
    """The episode is over; the observation is not appended."""
    info: dict[str, float] = attrs.Factory(dict)
    """Counters summed over the episode and logged as episode/<key>/mean (tool_calls, tool_errors, ...)."""
