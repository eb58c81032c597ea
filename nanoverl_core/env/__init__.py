"""Multi-turn episodes and tools: what an environment plugin implements and imports.

    EnvStep, Turn              an environment's answer, and the model turn it answers (episode.py)
    EpisodeRollout             multi-turn episodes over any rollout engine (episode.py)
    render_answer              an answer (text or chat messages) as token ids, rendered once (render.py)
    tool_environment           Python functions as tools the model calls (tools.py)

The contract (`nanoverl_core.protocols.MakeEnvironment` / `Environment`): a factory registered with
`register_environments` builds one environment per episode from its data row; the environment's
`step(turn)` returns an `EnvStep`; `close()` (optional) ends the episode.
"""

from .episode import EnvStep, EpisodeRollout, Turn, episode_metrics
from .render import render_answer
from .tools import ToolEnvironment, tool_environment, tool_prompt, tool_schemas, with_tools

__all__ = ["EnvStep", "EpisodeRollout", "Turn", "episode_metrics", "render_answer", "ToolEnvironment",
           "tool_environment", "tool_prompt", "tool_schemas", "with_tools"]
