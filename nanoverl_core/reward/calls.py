"""Calling one reward function and checking what it returned (no torch here).

A reward call gets one response and returns a float or a dict with "score". The call styles:

    nanoverl   fn(prompt, response, sample[, settings=...])
    verl       fn(data_source, solution_str, ground_truth, extra_info)  -- recognised by a parameter
               named `solution_str`; ground_truth is the row's reward_model.ground_truth, extra_info its
               extra_info. The function gets only the names of VERL_ARGS its signature takes (all with
               **kwargs), so verl's per-dataset `compute_score(solution_str, ground_truth, ...)` files
               run unchanged too.
    trl        fn(prompts, completions, **kwargs) -> list  -- a TRL reward function, recognised by its
               parameters `prompts` and `completions`; batched, so the scorer calls it (`trl_arguments`).
    batched    fn(prompts, responses, rows[, settings=...][, context=...]) -> list  -- marked by fn.batched = True;
               `context` (a RewardContext: phase, step, run directory, each row's uid and index) only when
               the signature takes it; an item of the list may be a CallError: that row failed, with its kind.

`call_checked` makes the call and checks what came back; every failure is a `CallError` with a kind:
"raised", "invalid" (not a finite number), "memory" (MemoryError), and, from the pool, "timeout" and
"crash" (the worker process died: a segfault, `os._exit`, the kernel's OOM killer); a batched reward may fail
a row with a kind of its own (the judge's `judge_timeout`, ...), counted as reward/errors/<kind>.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from ..errors import ConfigError, RewardError
from ..plugins import import_file, import_ref

GROUND_TRUTH_KEYS = ("reward_model.ground_truth", "ground_truth", "target", "answer")
"""Where a data row holds its ground truth, in order (dotted paths into nested dicts)."""


@attrs.frozen
class ComponentSpec:
    """What a process needs to load one reward: a registry name, or a file and a function in it."""

    label: str
    """The name in metrics (reward/<label>/mean) and messages."""
    name: str = ""
    file: str = ""
    function: str = "compute_score"
    settings: Any = None
    """The reward's own settings object ([reward.<name>]), passed as settings=..."""
    weight: float = 1.0
    ref: str = ""
    """"module:qualname" of a registered reward's function, which a worker imports (a name registered
    in code, not through an entry point, resolves there too)."""

    @property
    def where(self) -> str:
        return f"{self.file}:{self.function}" if self.file else self.name


class CallTimeout(BaseException):
    """Raised into a call the trainer runs itself (reward.workers = 0) when reward.timeout_s is up (SIGALRM).
    A BaseException, so that a reward's own `except Exception` (math-verify has one around each comparison)
    cannot swallow it and turn the timeout into a score."""


class CallError(Exception):
    """One failed reward call: kind is raised / invalid / memory / timeout / crash, or a batched reward's own
    kind for one of its rows (an item of its returned list), e.g. the judge's judge_timeout."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message


@attrs.frozen
class RewardContext:
    """Where a batched reward's call comes from, passed as ``context=`` to one whose signature takes it."""

    phase: str
    """"train", "baseline" (ReMax's greedy responses), "val" (validation, `nanoverl-train eval`) or "score"."""
    step: int | None
    """The trainer step being scored (None outside a run)."""
    run_dir: str
    """The run directory (trainer.output_dir), where a reward may keep files of its own; "" outside a run
    (`nanoverl-train eval` and `score` write nothing)."""
    uids: tuple[str, ...]
    """Each row's uid: rows sharing one were sampled from the same prompt (a group)."""
    indices: tuple[int, ...]
    """Each row's position in its data split (the `index` column)."""


def importable_ref(fn: Callable) -> str:
    """"module:qualname" of a function another process can import, or "" (a closure, __main__'s)."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname:
        return ""
    return f"{module}:{qualname}"


def load_function(spec: ComponentSpec) -> Callable:
    """The reward function of `spec`: its file imported, or its ref ("module:qualname", which the trainer
    took from the registered function). A bare registry name is the caller's to resolve with the registry
    it holds (`RewardScorer`, `load_reward_fn`): this module discovers no plugins, in the trainer or in a
    reward worker."""
    if not spec.file and not spec.ref:
        raise ValueError(f"reward {spec.label!r} has no file and no ref; resolve its name with the registry")
    if not spec.file:
        return import_ref(spec.ref)
    path = Path(spec.file)
    module = import_file(path, "reward.file", RewardError)
    fn = getattr(module, spec.function, None)
    if not callable(fn):
        raise ConfigError(f"reward.function = {spec.function!r} is not a function in {path}; "
                          "set reward.function to the function's name")
    return fn


VERL_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")
"""What verl's reward manager passes `compute_score` (as keywords); a verl-style function gets the ones it takes."""


def _parameters(fn: Callable) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return {}


def call_style(fn: Callable) -> str:
    """"batched" (fn.batched = True: lists in, a list out), "trl" (has `prompts` and `completions`: a TRL
    reward function, batched too), "verl" (has `solution_str`), or "nanoverl"."""
    if getattr(fn, "batched", False):
        return "batched"
    params = _parameters(fn)
    if "prompts" in params and "completions" in params:
        return "trl"
    return "verl" if "solution_str" in params else "nanoverl"


def accepted(fn: Callable, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of `kwargs` that `fn`'s signature takes (all of them if it has **kwargs)."""
    params = _parameters(fn)
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


def check_signature(fn: Callable, style: str, where: str) -> None:
    """A ConfigError if a verl-style function requires an argument it is never given (a TRL-style one may
    also name a dataset column: that is only known per call)."""
    if style != "verl":
        return
    missing = [name for name, p in _parameters(fn).items() if name not in VERL_ARGS and p.default is p.empty
               and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if missing:
        raise ConfigError(f"reward {where} requires {', '.join(missing)}, which a verl-style scorer is not given; "
                          f"it may take {', '.join(VERL_ARGS)} (give any other parameter a default)")


def trl_arguments(responses: list[str], rows: list[dict], prompt_key: str) -> dict[str, Any]:
    """TRL's reward-function call for a batch: `prompts` (each row's prompt column as written: text or a
    chat list), `completions` (the response text; for a chat prompt [{"role": "assistant", "content":
    text}]) and every other column of the rows as a list over the batch, as TRL passes dataset columns."""
    prompts = [row.get(prompt_key) for row in rows]
    completions = [[{"role": "assistant", "content": r}] if isinstance(p, list) else r
                   for p, r in zip(prompts, responses)]
    keys = dict.fromkeys(key for row in rows for key in row if key != prompt_key)
    return {**{key: [row.get(key) for row in rows] for key in keys}, "prompts": prompts, "completions": completions}


def ground_truth_value(sample: dict) -> Any:
    """The row's ground truth: the first of GROUND_TRUTH_KEYS (dotted paths) that is present, as stored
    (verl passes reward_model.ground_truth this way; the built-in rewards take its str)."""
    for key in GROUND_TRUTH_KEYS:
        node: Any = sample
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            return node
    raise RewardError(f"the data row has no ground truth; add one of the fields {', '.join(GROUND_TRUTH_KEYS)}")


def check_result(out: Any, allow_bool: bool = False) -> tuple[float, dict[str, float]]:
    """(score, extra keys) of what a reward returned, or CallError("invalid")."""
    extra: dict[str, Any] = {}
    if isinstance(out, dict):
        if "score" not in out:
            raise CallError("invalid", f"returned a dict without 'score' (keys: {sorted(out)})")
        extra = {k: v for k, v in out.items() if k != "score"}
        out = out["score"]
    if (isinstance(out, bool) and not allow_bool) or not isinstance(out, numbers.Real):
        raise CallError("invalid", f"returned {type(out).__name__} {out!r}; a reward must return a float or a "
                                   "dict with 'score'")
    for key, value in [("score", out), *extra.items()]:
        if (isinstance(value, bool) and not allow_bool) or not isinstance(value, numbers.Real) \
                or not math.isfinite(value):
            raise CallError("invalid", f"returned a non-finite or non-numeric {key!r}: {value!r}")
    return float(out), {k: float(v) for k, v in extra.items()}


def call_checked(fn: Callable, style: str, spec: ComponentSpec, prompt: str, response: str, sample: dict,
                 data_source: str) -> tuple[float, dict[str, float]]:
    """One reward call in the current process; any failure is a CallError."""
    try:
        if style == "verl":
            values = {"data_source": data_source, "solution_str": response,
                      "extra_info": dict(sample.get("extra_info") or {})}
            out = fn(**{name: ground_truth_value(sample) if name == "ground_truth" else values[name]
                        for name in accepted(fn, dict.fromkeys(VERL_ARGS))})
        elif spec.settings is not None:
            out = fn(prompt, response, sample, settings=spec.settings)
        else:
            out = fn(prompt, response, sample)
    except (CallError, CallTimeout):
        raise
    except MemoryError:
        raise CallError("memory", "ran out of memory (MemoryError)") from None
    except RewardError as exc:
        raise CallError("raised", str(exc)) from None
    except BaseException as exc:  # SystemExit from a reward is its error too; KeyboardInterrupt is ignored here
        raise CallError("raised", f"raised {type(exc).__name__}: {exc}") from None
    return check_result(out, allow_bool=style == "verl")


BATCHED_STYLES = ("batched", "trl")
"""Call styles that take the whole batch in one call (lists in, a list out)."""


def call_batched(fn: Callable, style: str, spec: ComponentSpec, calls: list[tuple], prompt_key: str,
                 context: RewardContext | None = None) -> list[tuple]:
    """A batched reward's outcomes ("ok", score, extra) | (kind, message, None) for every row of `calls`
    ((prompt, response, row, data_source) each), from one call with lists, in the current process (`context`
    passed to a function that takes it). No rows (a rank whose share is empty): no call."""
    if not calls:
        return []
    prompts, responses, rows, _ = (list(x) for x in zip(*calls))
    trl = style == "trl"
    try:
        if trl:
            out = fn(**accepted(fn, trl_arguments(responses, rows, prompt_key)))
        else:
            kwargs = {"settings": spec.settings} if spec.settings is not None else {}
            out = fn(prompts, responses, rows, **kwargs, **accepted(fn, {"context": context}))
    except MemoryError:
        return [("memory", "ran out of memory (MemoryError)", None)] * len(calls)
    except RewardError as exc:
        return [("raised", str(exc), None)] * len(calls)
    except Exception as exc:
        return [("raised", f"raised {type(exc).__name__}: {exc}", None)] * len(calls)
    if not isinstance(out, (list, tuple)) or len(out) != len(calls):
        got = f"{len(out)} values" if isinstance(out, (list, tuple)) else type(out).__name__
        return [("invalid", f"a batched reward returned {got} for {len(calls)} rows", None)] * len(calls)
    outcomes = []
    for value in out:
        if isinstance(value, CallError):  # the reward failed this row, with its own kind
            outcomes.append((value.kind, value.message, None))
            continue
        try:
            none = trl and value is None  # TRL: this reward does not apply to the row; it adds 0
            outcomes.append(("ok", 0.0, {}) if none else ("ok", *check_result(value, allow_bool=trl)))
        except CallError as exc:
            outcomes.append((exc.kind, exc.message, None))
    return outcomes
