"""Turning responses into scores with a reward function, safely.

The function comes from the registry (`reward.name`) or from a file the user names (`reward.file`,
which runs that file's code: a warning says so). Each call may be time-limited; a call that raises,
runs over, or returns something that is not a finite number either stops the run with the row named
(`reward.on_error = "raise"`) or scores 0 and is counted in `reward/errors` (`"zero"`).
"""

from __future__ import annotations

import importlib.util
import math
import signal
import sys
import threading
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .batch import RLBatch
from .config import RewardConfig
from .errors import ConfigError, RewardError
from .plugins import Registry

RewardFn = Callable[[str, str, dict], "float | dict"]


def load_reward_fn(cfg: RewardConfig, registry: Registry) -> tuple[RewardFn, str]:
    """The reward function and a label for messages."""
    if not cfg.file:
        return registry.get("reward", cfg.name, key="reward.name"), cfg.name
    path = Path(cfg.file)
    if not path.is_file():
        raise ConfigError(f"reward.file = {cfg.file!r} does not exist; fix the path or use reward.name")
    print(f"warning: reward.file runs the Python code in {path}; only use files you trust", file=sys.stderr)
    spec = importlib.util.spec_from_file_location(f"nanoverl_reward_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise RewardError(f"reward.file {path} failed to import ({type(exc).__name__}: {exc})") from None
    fn = getattr(module, cfg.function, None)
    if not callable(fn):
        raise ConfigError(f"reward.function = {cfg.function!r} is not a function in {path}; "
                          "set reward.function to the function's name")
    return fn, f"{path}:{cfg.function}"


class _Timeout(Exception):
    pass


def _alarm(_signum, _frame):
    raise _Timeout


class RewardScorer:
    def __init__(self, cfg: RewardConfig, registry: Registry):
        self.cfg = cfg
        self.fn, self.label = load_reward_fn(cfg, registry)

    def _call(self, prompt: str, response: str, sample: dict) -> Any:
        timed = self.cfg.timeout_s > 0 and threading.current_thread() is threading.main_thread()
        if timed:
            previous = signal.signal(signal.SIGALRM, _alarm)
            signal.setitimer(signal.ITIMER_REAL, self.cfg.timeout_s)
        try:
            if self.cfg.settings is not None:  # a reward that registered settings gets [reward.<name>]
                return self.fn(prompt, response, sample, settings=self.cfg.settings)
            return self.fn(prompt, response, sample)
        except _Timeout:
            raise RewardError(f"timed out after reward.timeout_s={self.cfg.timeout_s}s") from None
        finally:
            if timed:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)

    def _one(self, prompt: str, response: str, sample: dict) -> tuple[float, dict[str, float]]:
        out = self._call(prompt, response, sample)
        extra: dict[str, float] = {}
        if isinstance(out, dict):
            if "score" not in out:
                raise RewardError(f"returned a dict without 'score' (keys: {sorted(out)})")
            extra = {k: v for k, v in out.items() if k != "score"}
            out = out["score"]
        if isinstance(out, bool) or not isinstance(out, (int, float)):
            raise RewardError(f"returned {type(out).__name__} {out!r}; a reward must return a float or a dict with 'score'")
        for key, value in [("score", out), *extra.items()]:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise RewardError(f"returned a non-finite or non-numeric {key!r}: {value!r}")
        return float(out), {k: float(v) for k, v in extra.items()}

    def score(self, batch: RLBatch, response_texts: list[str]) -> tuple[torch.Tensor, dict[str, float]]:
        """Sequence scores (B,) and metrics: reward/errors and the mean of any extra reward keys."""
        scores, extras, errors = [], defaultdict(list), 0
        for i, response in enumerate(response_texts):
            row = batch["row"][i]
            try:
                score, extra = self._one(batch["prompt_text"][i], response, row)
            except RewardError as exc:
                if self.cfg.on_error == "raise":
                    raise RewardError(f"reward {self.label} on data row {batch['index'][i]}: {exc}; fix the reward, "
                                      "or set reward.on_error=zero to score such rows 0") from None
                score, extra, errors = 0.0, {}, errors + 1
            except Exception as exc:
                if self.cfg.on_error == "raise":
                    raise RewardError(f"reward {self.label} raised {type(exc).__name__}: {exc} on data row "
                                      f"{batch['index'][i]}; fix the reward, or set reward.on_error=zero") from None
                score, extra, errors = 0.0, {}, errors + 1
            scores.append(score)
            for key, value in extra.items():
                extras[f"reward/{key}"].append(value)
        metrics = {key: sum(v) / len(v) for key, v in extras.items()}
        metrics["reward/errors"] = float(errors)
        return torch.tensor(scores, dtype=torch.float32), metrics


def place_scores(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B,) sequence scores -> (B, R) token-level scores on each row's last valid response token."""
    out = torch.zeros_like(response_mask, dtype=torch.float32)
    last = (response_mask.cumsum(-1) * response_mask).argmax(-1)  # index of the last 1
    out[torch.arange(len(scores)), last] = scores * (response_mask.sum(-1) > 0)
    return out
