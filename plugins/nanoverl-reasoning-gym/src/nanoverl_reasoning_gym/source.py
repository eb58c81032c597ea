"""The data source `reasoning_gym`: rows drawn from Reasoning Gym's task generators.

Each task of [data.reasoning_gym] tasks is a `reasoning_gym.create_dataset(name, seed=..., size=...,
**params)`; an item is a pure function of the dataset's seed and the item's index. A split's rows for an
epoch come from datasets seeded by (seed, split, epoch, task), so each epoch of training draws fresh
rows and validation (val_seed) is a stream of its own; the mixture picks each row's task by weight from
a generator seeded the same way. Training skips an item whose question is a validation question and
draws the next, so an epoch has exactly `size` rows and none of them is a validation row.

A row is what the reward needs to regenerate its item exactly (task, params, seed, size, index): item
metadata is often not JSON (tuples, sets), and rewards run in worker processes.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import random
from functools import lru_cache
from typing import Any

from nanoverl_core import ConfigError


def _derived_seed(*parts: Any) -> int:
    """A 32-bit seed from parts, far from any other parts' (items use seed + index)."""
    return int(hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()[:8], 16)


@lru_cache(maxsize=256)
def _dataset(task: str, params_json: str, seed: int, size: int):
    import reasoning_gym
    return reasoning_gym.create_dataset(task, seed=seed, size=size, **json.loads(params_json))


def dataset_of(ref: dict[str, Any]):
    """The Reasoning Gym dataset a row's "reasoning_gym" reference names (cached per process)."""
    return _dataset(ref["task"], json.dumps(ref["params"], sort_keys=True), ref["seed"], ref["size"])


def system_prompt(text: str) -> str:
    from reasoning_gym.utils import SYSTEM_PROMPTS
    return SYSTEM_PROMPTS.get(text, text)


class ReasoningGymSource:
    generated = True

    def __init__(self, settings) -> None:
        self.settings = settings
        self.system = system_prompt(settings.system_prompt)
        self._val_rows: list[dict[str, Any]] | None = None

    def rows(self, split: str, epoch: int) -> list[dict[str, Any]]:
        s = self.settings
        if self._val_rows is None:                            # drawn once: validation, and what training skips
            self._val_rows = self._draw("val", s.val_seed, 0, s.val_size, skip=set())
        if split == "val":
            return list(self._val_rows)
        return self._draw("train", s.seed, epoch, s.size, skip={row["question"] for row in self._val_rows})

    def _draw(self, split: str, seed: int, epoch: int, count: int, skip: set[str]) -> list[dict[str, Any]]:
        tasks = self.settings.tasks
        capacity = 2 * count + 16                            # items per task dataset: room for skipped ones
        refs = [{"task": t.name, "params": t.params, "seed": _derived_seed(split, seed, epoch, i, t.name),
                 "size": capacity} for i, t in enumerate(tasks)]
        mix = random.Random(_derived_seed("mix", split, seed, epoch))
        next_index, rows = [0] * len(tasks), []
        while len(rows) < count:
            i = mix.choices(range(len(tasks)), weights=[t.weight for t in tasks])[0]
            if next_index[i] >= capacity:
                raise ConfigError(f"[data.reasoning_gym] task {tasks[i].name!r}: fewer than {count} of its {split} "
                                  "questions differ from the validation questions; widen its params or lower "
                                  "size / val_size")
            ref = {**refs[i], "index": next_index[i]}
            next_index[i] += 1
            item = dataset_of(ref)[ref["index"]]
            if item["question"] in skip:
                continue
            messages = [{"role": "user", "content": item["question"]}]
            if self.system:
                messages.insert(0, {"role": "system", "content": self.system})
            rows.append({"prompt": messages, "data_source": ref["task"], "ground_truth": str(item["answer"]),
                         "question": item["question"], "reasoning_gym": ref})
        return rows


def make_source(config) -> ReasoningGymSource:
    check_config(config)
    return ReasoningGymSource(config.data.settings)


def check_config(config) -> None:
    """Every task name known, every parameter one of the task's config fields and within the task's own
    validate(): else one ConfigError naming the task and the closest valid name or the parameter."""
    from reasoning_gym.factory import DATASETS

    settings = config.data.settings
    if not settings.tasks:
        raise ConfigError("[data.reasoning_gym] tasks is empty; add a task, e.g. [[data.reasoning_gym.tasks]] "
                          "name = \"chain_sum\"")
    names = sorted(n for n in DATASETS if n != "composite")
    for i, task in enumerate(settings.tasks):
        key = f"data.reasoning_gym.tasks[{i}]"
        if task.name not in names:
            close = difflib.get_close_matches(task.name, names, n=1, cutoff=0.0)
            raise ConfigError(f"{key}.name = {task.name!r} is not a Reasoning Gym task; did you mean {close[0]!r}? "
                              f"({len(names)} tasks: python -c \"import reasoning_gym.factory as f; "
                              "print(sorted(f.DATASETS))\")")
        config_cls = DATASETS[task.name][1]
        fields = [f.name for f in dataclasses.fields(config_cls) if f.name not in ("seed", "size")]
        for param in task.params:
            if param not in fields:
                close = difflib.get_close_matches(param, fields, n=1, cutoff=0.5)
                hint = f"did you mean {close[0]!r}?" if close else f"its parameters: {', '.join(fields)}"
                raise ConfigError(f"{key}.params.{param}: task {task.name!r} has no parameter {param!r}; {hint}")
        problem = _invalid(config_cls, task.params)
        if problem is not None:
            culprit = next((p for p in task.params
                            if _invalid(config_cls, {k: v for k, v in task.params.items() if k != p}) is None), None)
            where = f"{key}.params.{culprit} = {task.params[culprit]!r}" if culprit else f"{key}.params"
            raise ConfigError(f"{where}: out of range for task {task.name!r} ({problem}); fix the parameter")


def _invalid(config_cls, params: dict[str, Any]) -> str | None:
    """Reasoning Gym's own check of a task config (its validate() asserts), as a message, or None."""
    try:
        config = config_cls(**params, seed=0, size=1)
        if hasattr(config, "validate"):
            config.validate()
    except (AssertionError, ValueError, TypeError) as exc:
        return " ".join(str(exc).split()) or type(exc).__name__
    return None


make_source.check_config = check_config
