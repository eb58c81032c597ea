"""The agent `verifiers`: one data row is one rollout of a verifiers environment, run by verifiers itself.

For each row, in an agent worker (nanoverl_core.agents.runner), `run_environment`:

1. builds the environment of [agent.verifiers] once per worker (nanoverl_verifiers.loading);
2. turns the row into verifiers' rollout input (`rollout_input`, below);
3. runs `env.run_rollout(input, client, model, sampling_args)`, verifiers' own API for one rollout: the
   environment's loop (`rollout`: its `setup_state`, model calls, `env_response`, stop conditions), then its
   rubric's `score_rollout` and cleanup. The client is the episode's `openai.AsyncOpenAI`, wrapped in
   verifiers' `OpenAIChatCompletionsClient`, so every model call the environment makes is a
   `/v1/chat/completions` request to the endpoint: the tokens the model samples there are the row nanoverl
   trains on;
4. returns the rubric's reward and, as info numbers, its metrics by function name (`vf_<name>`), the reward
   (`vf_reward`), and `vf_error` (1 when the rollout ended on an error verifiers recorded: an empty reply, a
   tool error the environment stops on, a refused call).

The row as verifiers' input (a RolloutInput): every field of the row but nanoverl's own (`__file__`,
`__row__`) is passed as it is: `answer`, `info` (a dict or its JSON), `task`, `example_id` and any other
column, which verifiers hands to reward functions by name. The prompt is the row's `prompt` when it is a
list of chat messages (the environment's system_prompt put first when the first message is not a system
message, as verifiers formats a dataset with a prompt column), or else the row's `prompt` text or
`question`, formatted as verifiers formats a `question` column: the environment's system_prompt, its
few_shot messages, then the text as a user message. Rows of the data source `verifiers` are the
environment's own dataset rows, already in this form. `example_id` defaults to the row's position in its
file.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from nanoverl_core.errors import ConfigError, one_line

from .loading import environment

MODEL = "policy"
"""The `model` of every request; the endpoint serves the one model being trained whatever it is called."""


async def run_environment(row: dict[str, Any], client, settings) -> dict[str, Any]:
    import verifiers

    env = environment(settings.env_id, settings.env_args)
    sampling_args = {**copy.deepcopy(env.sampling_args), **copy.deepcopy(settings.sampling_args)}
    output = await env.run_rollout(rollout_input(row, env), verifiers.OpenAIChatCompletionsClient(client), MODEL,
                                   sampling_args)
    reward = float(output.get("reward") or 0.0)
    info = {f"vf_{name}": float(value) for name, value in (output.get("metrics") or {}).items()
            if isinstance(value, (int, float)) and math.isfinite(value)}
    info["vf_reward"] = reward
    info["vf_error"] = float(output.get("error") is not None)
    return {"reward": reward, "info": info}


def rollout_input(row: dict[str, Any], env) -> dict[str, Any]:
    """The row as verifiers' RolloutInput (see the module docstring)."""
    data = {k: v for k, v in row.items() if not k.startswith("__")}
    prompt = data.get("prompt")
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if env.system_prompt and not (isinstance(first, dict) and first.get("role") == "system"):
            prompt = [{"role": "system", "content": env.system_prompt}, *prompt]
    else:
        text = prompt if isinstance(prompt, str) else data.get("question")
        if not isinstance(text, str):
            raise ValueError("the row has no prompt: give it 'prompt' (chat messages or text) or 'question' "
                             f"(its fields: {', '.join(sorted(data)) or 'none'})")
        prompt = [*([{"role": "system", "content": env.system_prompt}] if env.system_prompt else []),
                  *(env.few_shot or []), {"role": "user", "content": text}]
    data["prompt"] = prompt
    data.setdefault("example_id", int(row.get("__row__", 0)))
    return data


def check_config(config) -> None:
    """[agent.verifiers]'s environment builds and can run one rollout per agent, or one ConfigError."""
    settings = config.agent.settings
    try:
        environment(settings.env_id, settings.env_args)
    except Exception as exc:
        raise ConfigError(f"[agent.verifiers] env_id = {settings.env_id!r}: the environment does not build here "
                          f"({one_line(exc) if not isinstance(exc, ValueError) else exc}); fix "
                          "agent.verifiers.env_args or the environment") from None


run_environment.check_config = check_config
