"""Where environment calls run: worker processes that hold episodes, or the trainer process (no torch here).

An episode's environment object has state, so each episode lives in one worker for its whole life:
`EnvironmentPool` is a `nanoverl_core.processes.WorkerPool` of `environment.workers` processes (fresh
interpreters that die with the trainer) that deals new episodes out to them in turn, and runs a round of
calls (every episode's start, or its step for this turn, or its close) on all of them at once, each
worker its episodes' calls in order. A call past `environment.timeout_s` gets its worker killed; a
worker that dies (a segfault, `os._exit`, the kernel's OOM killer) is charged to the call it was
running; either way the episodes it held are lost ("lost": their worker was restarted) and a fresh
worker takes later episodes. So a hanging or crashing environment costs episodes, never the run.

`InProcess` runs the same rounds in the trainer process (`environment.workers = 0`, and environments
that a worker cannot import: registered in code as a closure): a time limit by SIGALRM in the main
thread, no crash isolation.

Both return, per call, ("ok", value) or (kind, message) with kind "raised", "timeout", "crash" or "lost".
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from typing import Any

from ..errors import EpisodeError
from ..processes import Worker, WorkerPool, serve
from .source import EnvironmentSource


class Episodes:
    """Environment objects by episode key, and the three calls on them (in whichever process holds them)."""

    def __init__(self, make_env, settings):
        self.make_env, self.settings, self.envs = make_env, settings, {}

    def call(self, key: int, op: str, arg: Any) -> tuple[str, Any]:
        try:
            if op == "start":
                self.envs[key] = self.make_env(arg, **({"settings": self.settings} if self.settings is not None else {}))
                return "ok", None
            env = self.envs.get(key)
            if env is None:
                return "lost", "the episode's environment is gone (it failed to start)"
            if op == "step":
                return "ok", env.step(arg)
            self.envs.pop(key)
            close = getattr(env, "close", None)
            return "ok", close() if close is not None else None
        except Exception as exc:
            return "raised", f"raised {type(exc).__name__}: {exc}"


# ---- in the trainer process ------------------------------------------------------------------------------
class _Expired(BaseException):
    pass


@contextmanager
def _time_limit(seconds: float):
    """Raise _Expired in the main thread after `seconds` (SIGALRM; 0 or another thread: no limit)."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(_signum, _frame):
        raise _Expired

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class InProcess:
    def __init__(self, make_env, settings, timeout_s: float):
        self.episodes, self.timeout_s = Episodes(make_env, settings), timeout_s

    def run(self, calls: list[tuple[int, str, Any]]) -> dict[int, tuple[str, Any]]:
        out = {}
        for key, op, arg in calls:
            try:
                with _time_limit(self.timeout_s):
                    out[key] = self.episodes.call(key, op, arg)
            except _Expired:
                out[key] = ("timeout", f"timed out after environment.timeout_s={self.timeout_s:g}s")
        return out

    def close(self) -> None:
        self.episodes.envs.clear()


# ---- in worker processes ---------------------------------------------------------------------------------
def _episodes(init: tuple[EnvironmentSource, Any]):
    """In a worker: the episodes of the environment that init's (source, settings) names; a call is
    (key, op, arg)."""
    source, settings = init
    episodes = Episodes(source.load(), settings)
    return lambda call: (episodes.call(*call), False)


class EnvironmentPool(WorkerPool):
    """`size` worker processes holding episodes; `run` runs one round of calls (see the module docstring)."""

    def __init__(self, source: EnvironmentSource, settings, size: int, timeout_s: float):
        super().__init__("nanoverl_core.env.pool", (source, settings), size, section="environment",
                         what=source.ref or source.label, error=EpisodeError)
        self.timeout_s = timeout_s
        self.home: dict[int, Worker] = {}
        """The worker holding each live episode."""
        self.turn = 0

    def run(self, calls: list[tuple[int, str, Any]]) -> dict[int, tuple[str, Any]]:
        self.start()  # replaces the workers retired in the last round; their episodes are gone
        self.home = {key: worker for key, worker in self.home.items() if worker in self.workers}
        results: dict[int, tuple[str, Any]] = {}
        batches: dict[Worker, list] = {}
        for key, op, arg in calls:
            if op == "start":                               # deal new episodes out in turn
                self.home[key] = self.workers[self.turn % len(self.workers)]
                self.turn += 1
            worker = self.home.get(key)
            if worker is None:
                results[key] = ("lost", "its worker process was restarted (another episode's crash or timeout)")
                continue
            batches.setdefault(worker, []).append((key, op, arg))
            if op == "close":
                self.home.pop(key)
        for worker, batch in batches.items():
            if not self.send(worker, batch):
                results.update((key, ("lost", "its worker process died between turns")) for key, _, _ in batch)
        expired = f"timed out after environment.timeout_s={self.timeout_s:g}s"
        while self.busy():  # a worker that crashed or timed out costs its running call and its other episodes
            for key, outcome, unanswered in self.wait(self.timeout_s, expired):
                results[key] = outcome
                results.update((other, ("lost", f"its worker process was restarted after another episode's "
                                                f"{outcome[0]}")) for other, _, _ in unanswered)
        return results

    def close(self) -> None:
        super().close()
        self.home.clear()


def environment_calls(cfg, make_env, source: EnvironmentSource):
    """Where `cfg`'s ([environment]) environments run: `cfg.workers` worker processes loading `source`
    (a registered "module:attr", or environment.file), or this process (workers = 0, or a registered object
    a worker cannot import: a warning says so)."""
    if cfg.workers and source.importable:
        return EnvironmentPool(source, cfg.settings, cfg.workers, cfg.timeout_s)
    if cfg.workers:
        print(f"warning: environment {source.label!r} cannot be imported by a worker process (registered as an "
              "object, not a \"module:attr\" string); it runs in the trainer process, without crash isolation",
              file=sys.stderr)
    return InProcess(make_env, cfg.settings, cfg.timeout_s)


if __name__ == "__main__":  # one module object: the classes a message unpickles are this module's own
    from nanoverl_core.env.pool import _episodes
    sys.exit(serve(_episodes))
