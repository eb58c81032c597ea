"""The worker processes that call reward functions (no torch here).

`RewardPool` is a `nanoverl_core.processes.WorkerPool` (fresh interpreters running `python -m
nanoverl_core.reward.pool`, with its timeouts, kills, crash charging and memory cap) used for stateless
calls: any free worker takes the next chunk of calls. A call past `timeout_s` or whose worker dies fails
alone; the calls queued behind it on that worker go to the other workers. A worker that ran out of memory
(`memory_limit_mb`) is replaced after it answers, since its heap may hold the leak.
"""

from __future__ import annotations

import sys
from collections import deque
from typing import Any

from ..errors import RewardError
from ..processes import WorkerPool, serve
from .calls import BATCHED_STYLES, CallError, ComponentSpec, call_batched, call_checked, call_style, load_function


class _Rewards:
    """In a worker: the rewards of `specs`, loaded once; a call is (key, component, args), for a batched
    component args is (the batch's list of calls, its RewardContext)."""

    def __init__(self, init: tuple[list[ComponentSpec], str]):
        self.specs, self.prompt_key = init
        # Only a file or a ref can be loaded here; a reward registered in code without one (a closure) is
        # called in the trainer (RewardScorer.in_trainer), never here.
        self.fns = [load_function(spec) if spec.file or spec.ref else None for spec in self.specs]
        self.styles = [call_style(fn) if fn is not None else "" for fn in self.fns]

    def __call__(self, call: tuple) -> tuple[tuple, bool]:
        """(outcome, spent): ("ok", score, extra) | (kind, message, None), for a batched component ("ok",
        [outcome per row], None); spent after a MemoryError."""
        _, c, args = call
        fn, style, spec = self.fns[c], self.styles[c], self.specs[c]
        try:
            if style in BATCHED_STYLES:
                calls, context = args
                outcome = ("ok", call_batched(fn, style, spec, calls, self.prompt_key, context), None)
            else:
                outcome = ("ok", *call_checked(fn, style, spec, *args))
        except CallError as exc:
            outcome = (exc.kind, exc.message, None)
        except MemoryError:
            outcome = ("memory", "ran out of memory (MemoryError)", None)
        rows = outcome[1] if outcome[0] == "ok" and style in BATCHED_STYLES else [outcome]
        return outcome, any(row[0] == "memory" for row in rows)


class RewardPool(WorkerPool):
    """`size` worker processes loading `specs`; `run` scores a list of calls and returns their outcomes by key.
    `prompt_key`: the data column TRL-style rewards get as `prompts`."""

    def __init__(self, specs: list[ComponentSpec], size: int, timeout_s: float = 0.0, memory_limit_mb: int = 0,
                 prompt_key: str = "prompt"):
        what = ", ".join(s.where if s.file else s.ref for s in specs if s.file or s.ref)
        super().__init__("nanoverl_core.reward.pool", (specs, prompt_key), size, section="reward", what=what,
                         error=RewardError, memory_limit_mb=memory_limit_mb)
        self.timeout_s = timeout_s

    def failed(self, kind: str, message: str) -> tuple:
        return kind, message, None

    def run(self, calls: list[tuple[Any, int, tuple]], stop_on_error: bool = False,
            timeout_s: float | None = None) -> dict[Any, tuple]:
        """Outcomes {key: ("ok", score, extra) | (kind, message, None)} of (key, component, args) calls; for a
        batched component, args is (the batch's list of calls, its RewardContext) and the outcome ("ok",
        [outcome per row], None).
        `stop_on_error`: return at the first failure (the other workers are killed). `timeout_s`: this
        run's limit per call instead of the pool's. Workers start lazily: calls go to each once it is ready."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        expired = f"timed out after reward.timeout_s={self.timeout_s:g}s" if timeout_s is None else \
            f"timed out after {limit:g}s (reward.timeout_s={self.timeout_s:g}s per row)"
        pending, results = deque(calls), {}
        chunk_size = max(1, min(64, len(calls) // (4 * self.size)))
        while pending or self.busy():
            self.fill()  # replaces the workers retired in the last round
            for worker in self.idle():
                chunk = [pending.popleft() for _ in range(min(chunk_size, len(pending)))]
                if chunk and not self.send(worker, chunk):  # it went away while idle: another worker takes them
                    pending.extendleft(reversed(chunk))
            for key, outcome, unanswered in self.wait(limit, expired):
                results[key] = outcome
                pending.extendleft(reversed(unanswered))
                if stop_on_error and outcome[0] != "ok":
                    self.close()
                    return results
        return results


if __name__ == "__main__":  # one module object: the classes a message unpickles are this module's own
    from nanoverl_core.reward.pool import _Rewards
    sys.exit(serve(_Rewards))
