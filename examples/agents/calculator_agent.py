"""An agent as it is written for any OpenAI-compatible server: a calculator offered only as a JSON schema.

    [agent]
    file = "examples/agents/calculator_agent.py"
    function = "solve"

`solve(row, client)` asks the row's question with the `calculate` tool in `tools` (no worked example of a
call anywhere in the prompt), runs every call the model makes and answers it with a `tool` message, and
stops at the first reply without a call, or after three replies. It returns None: the config's [reward]
scores the last reply's text. The same function runs against `vllm serve` or a hosted API:

    import openai
    solve(row, openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="..."))   # OPENAI_MODEL names the model
"""

from __future__ import annotations

import json
import os

from nanoverl_core.builtins.environments import calculate

MODEL = os.environ.get("OPENAI_MODEL", "policy")
CALCULATE = {"type": "function", "function": {
    "name": "calculate", "description": "Evaluate an arithmetic expression exactly.",
    "parameters": {"type": "object", "required": ["expression"], "properties": {"expression": {
        "type": "string", "description": 'numbers with + - * / and parentheses, for example "37 * (12 - 5)"'}}}}}
MAX_REPLIES = 3
MAX_TOKENS = 40


def run_tool(call) -> str:
    """The tool's answer to one call, or the error the model reads (a malformed call is its mistake)."""
    try:
        arguments = json.loads(call.function.arguments)
        if call.function.name != "calculate":
            return f"error: there is no tool {call.function.name!r}; tools: calculate"
        return calculate(**arguments)
    except Exception as exc:
        return f"error: {type(exc).__name__}: {exc}"


def solve(row: dict, client) -> None:
    messages = list(row["prompt"]) if isinstance(row["prompt"], list) else [{"role": "user", "content": row["prompt"]}]
    for _ in range(MAX_REPLIES):
        reply = client.chat.completions.create(model=MODEL, messages=messages, tools=[CALCULATE], max_tokens=MAX_TOKENS)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return None
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": run_tool(call)})
    return None
