"""The reward `reasoning_gym`: the task's own verifier (`dataset.score_answer(answer, entry)`) on the answer
reasoning_gym's `extract_answer` finds in the response (or the last match of `answer_regex`). The item is
regenerated from the row's reference (task, params, seed, size, index), exactly the one the prompt was
drawn from."""

from __future__ import annotations

import re
from functools import lru_cache

from nanoverl_core.config import settings_or_defaults

from .settings import ReasoningGymRewardSettings
from .source import dataset_of


def score(prompt: str, response: str, sample: dict, settings: ReasoningGymRewardSettings | None = None) -> float:
    from reasoning_gym.utils import extract_answer

    settings = settings_or_defaults(settings, ReasoningGymRewardSettings)
    ref = sample.get("reasoning_gym")
    if not isinstance(ref, dict):
        raise ValueError("the row has no 'reasoning_gym' reference; reward.name = \"reasoning_gym\" scores rows of "
                         "data.source = \"reasoning_gym\"")
    dataset = dataset_of(ref)
    if settings.answer_regex:
        answer = last_match(settings.answer_regex, response)
    elif settings.answer_tag:
        answer = extract_answer(response, tag_name=settings.answer_tag)
    else:
        answer = response.strip()
    return float(dataset.score_answer(answer, dataset[ref["index"]]))


@lru_cache(maxsize=16)
def _compiled(pattern: str) -> re.Pattern:
    return re.compile(pattern)


def last_match(pattern: str, response: str) -> str | None:
    """The last match of `pattern` in `response` (its group when it has one), or None."""
    matches = list(_compiled(pattern).finditer(response))
    if not matches:
        return None
    last = matches[-1]
    return last.group(1) if last.re.groups else last.group(0)
