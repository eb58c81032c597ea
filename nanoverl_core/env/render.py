"""An environment's answer as token ids, rendered once and appended after the model's turn.

A multi-turn rollout never re-renders the conversation: the model's turns stay the ids it sampled,
and each environment answer is turned into ids exactly once, here. So the trainer trains on the
sampler's tokens even under a chat template that rewrites earlier turns (Qwen3 drops earlier
`<think>` blocks): re-rendering the whole conversation with such a template, then re-tokenising it,
is how trainers end up training on tokens the model never produced.

An answer is either text, appended as it is (`tokenizer.encode(text)`), or chat messages
(``[{"role": "tool", "content": ...}]``), which go through the tokenizer's chat template as they
would after an assistant turn, ending with the generation prompt of the next assistant turn. What the
template puts between an assistant turn's end-of-turn token and the next message (ChatML's newline)
comes first, since the model's turn ended at that token. A tokenizer without a chat template renders
messages as plain text (`plain_messages`).
"""

from __future__ import annotations

from typing import Any

from ..errors import EpisodeError

_ANCHOR = "\u2063nanoverl-turn-end\u2063"
"""The content of a stand-in assistant turn; only the text after it is used."""


class RenderError(EpisodeError):
    """An environment's answer cannot be rendered (a malformed message, a template that is not append-only)."""


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """`messages` as a list of {"role": str, "content": ...} dicts, or a RenderError saying what is wrong."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                                 and "content" in m for m in messages):
        raise RenderError(f"an environment answer must be text or a list of chat messages "
                          f"({{'role': ..., 'content': ...}}), got {str(messages)[:200]!r}")
    return messages


def plain_messages(messages: list[dict[str, Any]]) -> str:
    """Messages as text for a tokenizer without a chat template: tool results in <tool_response> tags
    (the tag format of nanoverl_core.env.tools), any other message's content on its own line."""
    parts = []
    for m in messages:
        content = str(m["content"])
        parts.append(f"<tool_response>\n{content}\n</tool_response>" if m["role"] == "tool" else content)
    return "\n" + "\n".join(parts) + "\n"


def template_messages(tokenizer, messages: list[dict[str, Any]], stop_texts: list[str]) -> str:
    """The text the chat template writes for `messages` after an assistant turn that ended with one of
    `stop_texts`, through the generation prompt of the next assistant turn."""
    anchor = [{"role": "user", "content": "."}, {"role": "assistant", "content": _ANCHOR}]
    before = tokenizer.apply_chat_template(anchor, tokenize=False)
    after = tokenizer.apply_chat_template(anchor + messages, tokenize=False, add_generation_prompt=True)
    if _ANCHOR not in before or not after.startswith(before):
        raise RenderError("the chat template renders an assistant turn differently once messages follow it, so an "
                          "environment answer cannot be appended to the sampled tokens; use a template whose "
                          "earlier turns are a prefix of later renderings, or answer with text instead of messages")
    tail = before[before.rindex(_ANCHOR) + len(_ANCHOR):]       # the assistant turn's end, e.g. "<|im_end|>\n"
    glue = next((tail[len(s):] for s in stop_texts if s and tail.startswith(s)), "")
    return glue + after[len(before):]


def render_answer(tokenizer, answer: str | list[dict[str, Any]], stop_ids: list[int]) -> tuple[list[int], str]:
    """(token ids, text) of an environment's answer, to append after a model turn (see the module docstring)."""
    if isinstance(answer, str):
        text = answer
    else:
        messages = check_messages(answer)
        if getattr(tokenizer, "chat_template", None):
            stop_texts = [tokenizer.decode([i], skip_special_tokens=False) for i in stop_ids]
            text = template_messages(tokenizer, messages, stop_texts)
        else:
            text = plain_messages(messages)
    if not text:
        return [], ""
    return list(tokenizer.encode(text, add_special_tokens=False)), text
