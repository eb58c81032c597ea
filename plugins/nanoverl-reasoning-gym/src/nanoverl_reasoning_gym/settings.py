"""[data.reasoning_gym] and [reward.reasoning_gym]: attrs classes, a default and a docstring per field
(no reasoning_gym or torch import: checking a config's keys stays fast)."""

import re
from typing import Any

import attrs

from nanoverl_core.config import above, at_least, between


@attrs.define
class TaskSpec:
    """One task of the mixture: [[data.reasoning_gym.tasks]]."""

    name: str = ""
    """A Reasoning Gym dataset name (`reasoning_gym.factory.DATASETS`), e.g. "chain_sum"."""
    weight: float = attrs.field(default=1.0, validator=above(0))
    """Its share of the rows: weight / the sum of the tasks' weights (positive)."""
    params: dict[str, Any] = attrs.Factory(dict)
    """The task's config fields (its difficulty: min_terms, max_digits, ...), checked by the task's own
    config class and its validate(); seed and size come from [data.reasoning_gym]."""


@attrs.define
class ReasoningGymSettings:
    tasks: list[TaskSpec] = attrs.Factory(list)
    """The tasks and their mixture weights and parameters (at least one)."""
    size: int = attrs.field(default=1000, validator=at_least(1))
    """Training rows per epoch (fresh rows every epoch, drawn from (seed, epoch))."""
    seed: int = attrs.field(default=0, validator=between(0, 2**32 - 1))
    """Seed of the training rows."""
    val_size: int = attrs.field(default=100, validator=at_least(0))
    """Validation rows (0: no validation); a training row with a validation row's question is skipped."""
    val_seed: int = attrs.field(default=1, validator=between(0, 2**32 - 1))
    """Seed of the validation rows (its own stream, whatever seed is)."""
    system_prompt: str = "default"
    """The system message: a name of reasoning_gym.utils.SYSTEM_PROMPTS ("default", "DeepSeekZero", "simple",
    "direct", "chain_of_draft"; they ask for the answer in <answer> tags), any other text as it is, or ""
    for none (the prompt is then the question alone)."""


def _pattern(_instance, attribute, value: str) -> None:
    """A regular expression that compiles, with at most one group (the answer when it has one)."""
    if not value:
        return
    try:
        groups = re.compile(value).groups
    except re.error as exc:
        raise ValueError(f"'{attribute.name}' = {value!r} is not a regular expression ({exc})") from None
    if groups > 1:
        raise ValueError(f"'{attribute.name}' = {value!r} has {groups} groups; use at most one, around the answer "
                         "(make the others non-capturing: (?:...))")


@attrs.define
class ReasoningGymRewardSettings:
    answer_tag: str = "answer"
    """The answer is the text of the last <answer_tag>...</answer_tag> in the response (reasoning_gym's
    extract_answer; none scores the task's score of no answer, 0); "" scores the whole stripped response."""
    answer_regex: str = attrs.field(default="", validator=_pattern)
    """When set, the answer is instead the last match of this regular expression in the response (its group
    when it has one; no match scores the task's score of no answer, 0), e.g. "-?\\d+" for the last integer:
    for a model that states its answer plainly and never writes tags."""
