"""An agent's episode as token ids: each call's prompt rendered once, the sampled ids kept, calls merged.

An agent sends whole conversations (chat messages, with tools as JSON schemas); the engine takes and
returns token ids. `Transcript` turns one into the other without ever re-tokenising what the model
sampled:

* the first call's messages are rendered through the chat template (`render_chat`), with the tools in
  the template's own format or, for a template that ignores `tools`, in the Hermes tag format
  (nanoverl_core.env.tools: a system block and `<tool_call>` JSON);
* a later call whose messages are the previous call's messages, then the assistant message the endpoint
  returned for it (its text and tool calls, whatever ids the agent gave them), then new messages (tool
  results, a user turn) *merges*: its prompt is the previous prompt, the sampled ids exactly, then only
  the new messages rendered as they follow an assistant turn (env/render.py's `render_answer`). The
  model reads what it would read from the template, and its earlier turns stay the ids it sampled;
* any other call (the agent dropped, rewrote or summarised turns, changed the tools, or the template
  renders an assistant turn differently once messages follow it) *splits* the episode (`Split`): its row
  ends with the completion the agent last got, and a new row starts at this call, its prompt rendered from
  the call's messages (agents/rollout.py; docs/agents.md, "What merges and what splits").

`/v1/completions` calls merge when their prompt ids extend the previous prompt and response as tokens, and
split otherwise.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from ..env.render import RenderError, render_answer
from ..env.tools import CALL, parse_calls, tool_prompt_from_schemas


class Split(Exception):
    """A call whose history does not extend its episode's row (why): the episode goes on in a new row."""


class CallRefused(Exception):
    """A request the endpoint answers with an error: (HTTP status, OpenAI error code, message)."""

    def __init__(self, status: int, code: str, message: str, kind: str = "refused"):
        super().__init__(message)
        self.status, self.code, self.kind = status, code, kind


# ---- messages --------------------------------------------------------------------------------------------
def text_of(content: Any) -> str:
    """A message's content as text: a string, None, or OpenAI's list of parts ({"type": "text", "text"})."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise CallRefused(400, "invalid_value", "message content must be a string or a list of text parts "
                                            "(images and audio are not supported)")


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    return raw


def normal(message: Any) -> tuple:
    """What identifies a message when histories are compared: role, text, tool calls as (name, arguments)."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise CallRefused(400, "invalid_value", 'each message must be an object with a "role"')
    calls = tuple((c.get("function", {}).get("name"), json.dumps(_arguments(c.get("function", {}).get("arguments")),
                                                                 sort_keys=True))
                  for c in message.get("tool_calls") or [])
    return message["role"], text_of(message.get("content")), calls


def hermes_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as a template without a tool format renders them: assistant tool calls written out as
    `<tool_call>` JSON in the text, every content as plain text."""
    out = []
    for m in messages:
        text = text_of(m.get("content"))
        for call in m.get("tool_calls") or []:
            fn = call.get("function", {})
            body = json.dumps({"name": fn.get("name"), "arguments": _arguments(fn.get("arguments"))})
            text += f"{chr(10) if text else ''}<tool_call>{body}</tool_call>"
        out.append({"role": m["role"], "content": text})
    return out


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as Hugging Face chat templates with a tool format take them (tool call arguments as objects)."""
    out = []
    for m in messages:
        m = {**m, "content": text_of(m.get("content"))}
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "function": {**c.get("function", {}),
                                                  "arguments": _arguments(c.get("function", {}).get("arguments"))}}
                               for c in m["tool_calls"]]
        out.append(m)
    return out


def uses_template_tools(tokenizer, tools: list[dict]) -> bool:
    """The chat template renders `tools` (its output changes when they are given): Qwen, Llama 3.x, Hermes."""
    probe = [{"role": "user", "content": "."}]
    return (tokenizer.apply_chat_template(probe, tools=tools, tokenize=False, add_generation_prompt=True)
            != tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True))


def render_chat(tokenizer, messages: list[dict[str, Any]], tools: list[dict], tool_format: str) -> str:
    """A conversation's prompt text, through the generation prompt of the next assistant turn: the template's
    own tool format ("template"), or the Hermes instructions in the system message ("hermes")."""
    if not getattr(tokenizer, "chat_template", None):
        raise CallRefused(400, "unsupported_model", "the model's tokenizer has no chat template; send the prompt "
                                                    "as text to /v1/completions")
    if tools and tool_format == "template":
        return tokenizer.apply_chat_template(template_messages(messages), tools=tools, tokenize=False,
                                             add_generation_prompt=True)
    messages = hermes_messages(messages)
    if tools:
        block = tool_prompt_from_schemas(tools)
        if messages and messages[0]["role"] == "system":
            messages = [{"role": "system", "content": f"{messages[0]['content']}\n\n{block}"}, *messages[1:]]
        else:
            messages = [{"role": "system", "content": block}, *messages]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def forced_opening(tool_choice, tools: list[dict]) -> str:
    """The text the endpoint writes at the start of the reply to enforce `tool_choice` (the model samples the
    rest): "" for "auto" (or none given), `<tool_call>` for "required", the call's opening up to its arguments
    for a named function. Decoding is not constrained: what the model writes after the opening is its own."""
    if tool_choice in (None, "auto", "none") or not tools:
        return ""
    if tool_choice == "required":
        return "<tool_call>"
    name = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else None
    if name is None:
        raise CallRefused(400, "invalid_value", 'tool_choice must be "auto", "none", "required" or '
                                                '{"type": "function", "function": {"name": ...}}')
    if name not in {t["function"]["name"] for t in tools}:
        raise CallRefused(400, "invalid_value", f"tool_choice names {name!r}, which is not among the tools")
    return '<tool_call>{"name": ' + json.dumps(name) + ', "arguments": '


def assistant_message(text: str, tools: list[dict], call_id: str) -> tuple[dict[str, Any], int]:
    """The OpenAI assistant message for a sampled turn, and how many malformed calls it held: well-formed
    `<tool_call>`s of offered tools become `tool_calls` (the text around them the content); a turn with any
    malformed call, or a call of a tool that was not offered, is returned as plain text (the model's mistake)."""
    if not tools:
        return {"role": "assistant", "content": text}, 0
    calls = parse_calls(text)
    names = {t.get("function", {}).get("name") for t in tools}
    bad = sum(isinstance(c, str) or c["name"] not in names for c in calls)
    if not calls or bad:
        return {"role": "assistant", "content": text}, bad
    rest = CALL.sub("", text).strip()
    tool_calls = [{"id": f"{call_id}_{j}", "type": "function",
                   "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}} for j, c in enumerate(calls)]
    return {"role": "assistant", "content": rest or None, "tool_calls": tool_calls}, 0


# ---- one episode -----------------------------------------------------------------------------------------
@attrs.define
class Choice:
    """One sampled completion of a call: the ids kept (cut at a stop string), their log-probs, its reply."""

    ids: list[int]
    log_probs: list[float]
    text: str
    message: dict[str, Any] | None
    """The chat reply (None for /v1/completions)."""
    forced: list[int] = attrs.Factory(list)
    """The ids the endpoint wrote before the sampled ones to enforce tool_choice (`forced_opening`)."""


@attrs.define
class Transcript:
    """One episode's row as it grows: the first call's prompt ids, then every merged call's ids (the model's
    sampled, the rest rendered once), and the state the next call is compared with."""

    prompt: list[int] | None = None
    tokens: list[int] = attrs.Factory(list)
    model: list[bool] = attrs.Factory(list)
    log_probs: list[float] = attrs.Factory(list)
    turns: list[dict[str, Any]] = attrs.Factory(list)
    history: list[tuple] | None = None
    """The last call's messages, normalised; None before the first call or after a completions call."""
    tools: list[dict] = attrs.Factory(list)
    choices: list[Choice] = attrs.Factory(list)
    """The last call's completions; the one the next call continues (or the first) joins the row."""
    in_flight: bool = False
    """The last call is queued or being sampled (agents/rollout.py batches once every running agent's is)."""
    truncated: bool = False
    """The row's budget ran out: every later call gets an empty reply, "length"."""
    budget: int = 0
    """rollout.max_new_tokens: the row's tokens after its prompt, the model's and the rendered ones."""

    def context(self) -> list[int]:
        return (self.prompt or []) + self.tokens

    def _add(self, ids: list[int], model: bool, log_probs: list[float] | None = None) -> None:
        self.tokens += ids
        self.model += [model] * len(ids)
        self.log_probs += list(log_probs) if log_probs is not None else [0.0] * len(ids)

    def commit(self, choice: Choice | None = None) -> None:
        """Append the last call's chosen completion (default: its first) to the row."""
        if self.choices:
            choice = choice or self.choices[0]
            if choice.forced:                              # the endpoint's opening of a required call
                self._add(choice.forced, False)
                self.turns.append({"role": "environment", "text": "", "tokens": len(choice.forced)})
            self._add(choice.ids, True, choice.log_probs if len(choice.log_probs) == len(choice.ids) else None)
            self.turns.append({"role": "model", "text": choice.text, "tokens": len(choice.ids)})
            self.choices = []

    def chat_prompt(self, tokenizer, messages: list[dict], tools: list[dict], tool_format: str,
                    stop_ids: list[int]) -> list[int] | None:
        """The prompt ids of a chat call (merging it, see the module docstring); None when the row has no room
        left; Split for a call that cannot join the row."""
        history = [normal(m) for m in messages]
        if self.truncated:
            return None
        if self.prompt is None:
            self.history, self.tools = history, tools
            self.prompt = list(tokenizer.encode(render_chat(tokenizer, messages, tools, tool_format),
                                                add_special_tokens=False))
            return self.context()
        before = len(self.history or [])
        chosen = next((c for c in self.choices if c.message is not None and len(history) > before
                       and history[:before] == self.history and history[before] == normal(c.message)), None)
        if chosen is None or tools != self.tools or any(m[0] == "assistant" for m in history[before + 1:]):
            raise Split("the agent's messages do not extend its previous call's messages and the reply it got "
                        "(a dropped, rewritten or inserted turn, or other tools)")
        new = messages[before + 1:]
        try:
            ids, text = render_answer(tokenizer, hermes_messages(new) if tool_format == "hermes" else
                                      template_messages(new), stop_ids) if new else ([], "")
        except RenderError as exc:
            raise Split(str(exc)) from None
        self.commit(chosen)
        self.history = history
        return self._append(ids, text)

    def _append(self, ids: list[int], text: str) -> list[int] | None:
        """Append rendered ids (model_mask 0) and return the next call's prompt; None when they leave the model
        no room (the row ends truncated, as an episode does: nanoverl_core.env.episode)."""
        if len(self.tokens) + len(ids) >= self.budget:
            self.truncated = True
            return None
        self._add(ids, False)
        if ids:
            self.turns.append({"role": "environment", "text": text, "tokens": len(ids)})
        return self.context()

    def completion_prompt(self, ids: list[int]) -> list[int] | None:
        """The prompt ids of a /v1/completions call (None: no room left); Split for one that does not extend the
        row as tokens."""
        if self.truncated:
            return None
        if self.prompt is None:
            self.prompt, self.history = list(ids), None
            return ids
        chosen = next((c for c in self.choices if ids[:len(self.context()) + len(c.ids)] == self.context() + c.ids),
                      None)
        if chosen is None:
            raise Split("the prompt does not extend the previous call's prompt and completion as tokens")
        self.commit(chosen)
        return self._append(ids[len(self.context()):], "")

