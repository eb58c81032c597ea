"""The data source `code_tasks`: generated programming tasks (tasks.py) with call-based test cases.

A split's rows for an epoch come from a generator seeded by (split, seed, epoch): each epoch of training
draws fresh tasks, and validation (val_seed) is a stream of its own. Validation rows are all different tasks;
training skips a task whose question is a validation question and draws the next, so an epoch has exactly
`size` rows and none of them is a validation row.

A row is verl's prime_code layout (the test cases in reward_model.ground_truth as a JSON string, call-based
with fn_name; each expected value wrapped in a list, so a list answer [5] is never matched by a bare 5), with
the task's kind, level and reference solution in extra_info:

    {"prompt": [{"role": "user", "content": "Write a Python function `f(x)` that returns x multiplied by 3
                 plus 1. Reply with the function in one ```python code block."}],
     "data_source": "affine", "ability": "code",
     "reward_model": {"style": "rule", "ground_truth": "{\"fn_name\": \"f\", \"inputs\": [[4], ...],
                      \"outputs\": [[13], ...]}"},
     "extra_info": {"kind": "affine", "level": 1, "question": "Write ...", "solution": "def f(x): ..."}}
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

from nanoverl_core import ConfigError

from .tasks import KINDS, draw


def _derived_seed(*parts: Any) -> int:
    return int(hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()[:16], 16)


def kinds_of(settings) -> list[str]:
    """The kinds drawn: `tasks` when set, else every kind of `difficulty`."""
    return list(settings.tasks) or [name for name, (level, _) in KINDS.items() if level == settings.difficulty]


class CodeTasksSource:
    generated = True

    def __init__(self, settings) -> None:
        self.settings = settings
        self.kinds = kinds_of(settings)
        self._val_rows: list[dict[str, Any]] | None = None

    def rows(self, split: str, epoch: int) -> list[dict[str, Any]]:
        s = self.settings
        if self._val_rows is None:                            # drawn once: validation, and what training skips
            self._val_rows = self._draw("val", s.val_seed, 0, s.val_size, skip=set(), distinct=True)
        if split == "val":
            return list(self._val_rows)
        skip = {row["extra_info"]["question"] for row in self._val_rows}
        return self._draw("train", s.seed, epoch, s.size, skip=skip, distinct=False)

    def _draw(self, split: str, seed: int, epoch: int, count: int, skip: set[str], distinct: bool) -> list[dict]:
        s = self.settings
        rng = random.Random(_derived_seed("code_tasks", split, seed, epoch))
        rows: list[dict[str, Any]] = []
        seen = set(skip)
        for _ in range(50 * count + 100):
            if len(rows) == count:
                return rows
            task = draw(rng.choice(self.kinds), rng, s.tests)
            if task.question in seen:
                continue
            if distinct:
                seen.add(task.question)
            user = f"{task.question} {s.instruction}" if s.instruction else task.question
            cases = {"fn_name": task.fn_name, "inputs": task.inputs, "outputs": [[out] for out in task.outputs]}
            rows.append({"prompt": [{"role": "user", "content": user}], "data_source": task.kind, "ability": "code",
                         "reward_model": {"style": "rule", "ground_truth": json.dumps(cases)},
                         "extra_info": {"kind": task.kind, "level": task.level, "question": task.question,
                                        "solution": task.solution}})
        if len(rows) == count:
            return rows
        apart = "different validation tasks" if distinct else f"{split} tasks that are not validation tasks"
        raise ConfigError(f"[data.code_tasks] the kinds {', '.join(self.kinds)} gave only {len(rows)} of {count} "
                          f"{apart}; lower size / val_size or add kinds (tasks, difficulty)")


def make_source(config) -> CodeTasksSource:
    return CodeTasksSource(config.data.settings)


def check_config(config) -> None:
    """The validation rows can be drawn (enough different tasks for val_size): else one ConfigError."""
    CodeTasksSource(config.data.settings).rows("val", 0)


make_source.check_config = check_config
