"""The judge's rubric filled in for a row (or a group of rows), the exact request, and reading scores back.

A request is the JSON body posted to <base_url>/chat/completions:

    {"model": ..., "messages": [{"role": "system", ...}?, {"role": "user", "content": <rubric>}],
     "temperature": ..., "max_tokens": ...}

and its cache key is the sha256 of that body serialised with sorted keys and no spaces (`request_key`).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from nanoverl_core.reward import ground_truth_value

from .settings import GROUP_PATTERN, POINTWISE_PATTERN, JudgeSettings


class Unparsable(Exception):
    """A reply the judge's score pattern does not read (or a score outside [min_score, max_score])."""


def prompt_of(row: dict, prompt_text: str, key: str) -> str:
    """{prompt}: the row's prompt field as text; a chat prompt's last user message; else the prompt as the
    policy saw it."""
    value = row.get(key)
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        users = [m.get("content", "") for m in value if isinstance(m, dict) and m.get("role") == "user"]
        if users and isinstance(users[-1], str):
            return users[-1]
    return prompt_text


def _fields(row: dict, prompt: str, settings: JudgeSettings) -> dict[str, Any]:
    fields = {k: v for k, v in row.items() if not k.startswith("__")}
    try:
        fields["ground_truth"] = ground_truth_value(row)
    except Exception:
        fields.pop("ground_truth", None)
    fields["prompt"] = prompt_of(row, prompt, settings.prompt_key)
    return fields


def render_pointwise(template: str, row: dict, prompt: str, response: str, settings: JudgeSettings) -> str:
    """The rubric for one response."""
    return template.format_map({**_fields(row, prompt, settings), "response": response})


def render_group(template: str, row: dict, prompt: str, responses: list[str], settings: JudgeSettings) -> str:
    """The rubric for one group: {responses} is "Answer 1:\\n<text>\\n\\nAnswer 2:\\n..."; {n} their number."""
    numbered = "\n\n".join(f"Answer {i}:\n{text}" for i, text in enumerate(responses, 1))
    return template.format_map({**_fields(row, prompt, settings), "responses": numbered, "n": len(responses)})


def build_request(rubric: str, settings: JudgeSettings) -> dict[str, Any]:
    """The exact JSON body of one chat-completions request (no key: that travels in a header)."""
    messages = ([{"role": "system", "content": settings.system}] if settings.system else []) + \
        [{"role": "user", "content": rubric}]
    return {"model": settings.model or ("local" if settings.serve else ""), "messages": messages,
            "temperature": settings.temperature, "max_tokens": settings.max_tokens}


def request_key(request: dict[str, Any]) -> str:
    """The cache key: sha256 of the request serialised with sorted keys and no spaces."""
    return hashlib.sha256(json.dumps(request, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def reply_text(body: str) -> str:
    """The message content of a chat-completions reply body, or Unparsable."""
    try:
        content = json.loads(body)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise Unparsable(f"the reply is not a chat completion: {body[:200]!r}") from None
    if not isinstance(content, str):
        raise Unparsable(f"the reply's content is {type(content).__name__}, not text")
    return content


def _scaled(raw: float, settings: JudgeSettings) -> float:
    if not settings.min_score <= raw <= settings.max_score:
        raise Unparsable(f"score {raw:g} is outside [{settings.min_score:g}, {settings.max_score:g}]")
    if not settings.normalize:
        return raw
    return (raw - settings.min_score) / (settings.max_score - settings.min_score)


def parse_pointwise(text: str, settings: JudgeSettings) -> float:
    """The last match of the score pattern in `text`, scaled; Unparsable if none or out of range."""
    matches = re.findall(settings.score_pattern or POINTWISE_PATTERN, text)
    if not matches:
        raise Unparsable(f"no score in the reply {text[:200]!r}")
    last = matches[-1]
    return _scaled(float(last[-1] if isinstance(last, tuple) else last), settings)


def parse_group(text: str, n: int, settings: JudgeSettings) -> list[float]:
    """Answer i's score for i = 1..n (the last match of each), scaled; Unparsable if any is missing."""
    found: dict[int, float] = {}
    for match in re.finditer(settings.score_pattern or GROUP_PATTERN, text):
        try:
            found[int(match.group(1))] = float(match.group(2))
        except (ValueError, IndexError):
            continue
    missing = [i for i in range(1, n + 1) if i not in found]
    if missing:
        raise Unparsable(f"no score for answer {missing[0]} of {n} in the reply {text[:200]!r}")
    return [_scaled(found[i], settings) for i in range(1, n + 1)]
