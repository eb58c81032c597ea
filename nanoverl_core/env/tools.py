"""Tools: plain Python functions a model calls during an episode.

    def calculate(expression: str) -> str:
        '''Evaluate an arithmetic expression.

        Args:
            expression: integers with + - * / and parentheses, e.g. "12 * (3 + 4)"
        '''
        ...

    make_env = tool_environment(calculate)          # register it with register_environments

A function with type hints and a Google-style docstring becomes a tool: its JSON schema is
`transformers.utils.get_json_schema`'s, the one `apply_chat_template(tools=...)` takes. Prompts are
rendered with the tools through the model's own chat template when it has a tool format; otherwise
(or for plain-text prompts) the instructions of `tool_prompt` are added: the Hermes tag format, which
is also what Qwen's and many other templates use, so one parser reads both:

    <tool_call>{"name": "calculate", "arguments": {"expression": "12 * 7"}}</tool_call>

Each model turn, `ToolEnvironment` runs the calls it contains and answers with one `tool` message per
call; a turn without a call is the model's final answer and ends the episode. A malformed call (bad
JSON, an unknown tool, wrong arguments, a tool that raises) is answered with an error message the
model can read, and the episode goes on: that is the model's mistake, not the run's. Counters:
`tool_calls` (every attempt), `tool_errors` (attempts that failed), logged as episode/<name>/mean.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import attrs

from .contract import EnvStep, Turn

CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
"""A tag-format call; an unclosed tag at the end of the turn is an attempt too (and malformed)."""


def tool_schemas(tools: list[Callable]) -> list[dict[str, Any]]:
    """The JSON schema of each tool, as chat templates take them (transformers' get_json_schema)."""
    try:
        from transformers.utils import get_json_schema
    except ImportError:
        from ..plugins import install_hint
        raise ImportError(f"tool schemas come from transformers: {install_hint('hf')}") from None
    return [get_json_schema(tool) for tool in tools]


def tool_prompt(tools: list[Callable]) -> str:
    """Instructions for the tag format and the tools' schemas, for a template without a tool format."""
    return tool_prompt_from_schemas(tool_schemas(tools))


def tool_prompt_from_schemas(schemas: list[dict[str, Any]]) -> str:
    """`tool_prompt` for tools given as OpenAI JSON schemas ({"type": "function", "function": {...}})."""
    lines = "\n".join(json.dumps(schema["function"]) for schema in schemas)
    return ("You can call tools. To call one, write\n"
            '<tool_call>{"name": <tool name>, "arguments": <arguments as a JSON object>}</tool_call>\n'
            "and its result comes back in <tool_response></tool_response>. When you have the result, give your "
            f"final answer without a tool call.\nTools:\n{lines}")


def with_tools(messages: list[dict[str, Any]], tokenizer, tools: list[Callable]) -> str:
    """A chat prompt rendered with `tools`: by the chat template's own tool format if it has one (its
    rendering changes when tools are given), else with `tool_prompt` in the system message."""
    plain = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    rendered = tokenizer.apply_chat_template(messages, tools=tool_schemas(tools), tokenize=False,
                                             add_generation_prompt=True)
    if rendered != plain:
        return rendered
    instructions = tool_prompt(tools)
    if messages and messages[0].get("role") == "system":
        messages = [{**messages[0], "content": f"{messages[0]['content']}\n\n{instructions}"}, *messages[1:]]
    else:
        messages = [{"role": "system", "content": instructions}, *messages]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def parse_calls(text: str) -> list[dict[str, Any] | str]:
    """Each tag-format call in `text`: {"name", "arguments"} when well formed, else a string saying why not."""
    calls: list[dict[str, Any] | str] = []
    for match in CALL.finditer(text):
        body = match.group(1).strip()
        if not match.group(0).endswith("</tool_call>"):
            calls.append("the tool call has no closing </tool_call>")
            continue
        try:
            call = json.loads(body)
        except json.JSONDecodeError as exc:
            calls.append(f"the tool call is not valid JSON ({exc.msg} at character {exc.pos})")
            continue
        arguments = call.get("arguments", {}) if isinstance(call, dict) else None
        if isinstance(arguments, str):                      # some templates write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                arguments = None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not isinstance(arguments, dict):
            calls.append('a tool call must be {"name": <tool name>, "arguments": {...}}')
            continue
        calls.append({"name": call["name"], "arguments": arguments})
    return calls


@attrs.define
class ToolEnvironment:
    """An episode in which every model turn either calls tools or answers (see the module docstring)."""

    tools: dict[str, Callable]
    max_calls_per_turn: int = 4

    def call(self, call: dict[str, Any] | str) -> tuple[str, bool]:
        """(the tool message's content, whether the call failed)."""
        if isinstance(call, str):
            return f"error: {call}", True
        tool = self.tools.get(call["name"])
        if tool is None:
            return f"error: there is no tool {call['name']!r}; tools: {', '.join(sorted(self.tools))}", True
        try:
            return str(tool(**call["arguments"])), False
        except Exception as exc:                            # the model's arguments, or the tool's own failure
            return f"error: {type(exc).__name__}: {exc}", True

    def step(self, turn: Turn) -> EnvStep:
        calls = parse_calls(turn.text)
        if not calls:
            return EnvStep(done=True)                       # a final answer: [reward] scores it
        results = [self.call(call) for call in calls[:self.max_calls_per_turn]]
        messages = [{"role": "tool", "content": content} for content, _ in results]
        if len(calls) > self.max_calls_per_turn:
            messages.append({"role": "tool", "content": f"error: at most {self.max_calls_per_turn} tool calls a turn"})
        errors = sum(failed for _, failed in results) + max(0, len(calls) - self.max_calls_per_turn)
        return EnvStep(observation=messages, info={"tool_calls": float(len(calls)), "tool_errors": float(errors)})


def tool_environment(*tools: Callable, max_calls_per_turn: int = 4) -> Callable[..., ToolEnvironment]:
    """An environment factory (`register_environments`) for `tools`; its `tools` attribute is what the
    trainer renders into the prompts."""
    by_name = {tool.__name__: tool for tool in tools}

    def make_env(sample: dict, settings: Any = None) -> ToolEnvironment:
        return ToolEnvironment(by_name, max_calls_per_turn)

    make_env.tools = list(tools)
    return make_env
