"""Where environment calls run: worker processes that hold episodes, or the trainer process (no torch here).

An episode's environment object has state, so each episode lives in one worker for its whole life:
`EnvironmentPool` starts `environment.workers` processes (nanoverl_core.processes: fresh interpreters
that die with the trainer), deals new episodes out to them in turn, and runs a round of calls (every
episode's start, or its step for this turn, or its close) on all of them at once, each worker its
episodes' calls in order. A call past `environment.timeout_s` gets its worker killed; a worker that
dies (a segfault, `os._exit`, the kernel's OOM killer) is charged to the call it was running; either
way the episodes it held are lost ("lost": their worker was restarted) and a fresh worker takes
later episodes. So a hanging or crashing environment costs episodes, never the run.

`InProcess` runs the same rounds in the trainer process (`environment.workers = 0`, and environments
that a worker cannot import: registered in code as a closure): a time limit by SIGALRM in the main
thread, no crash isolation.

Both return, per call, ("ok", value) or (kind, message) with kind "raised", "timeout", "crash" or "lost".
"""

from __future__ import annotations

import signal
import sys
import threading
import time
import weakref
from collections import deque
from contextlib import contextmanager
from multiprocessing.connection import Connection, wait
from typing import Any

from ..processes import death, guard, kill, spawn
from ..reward.calls import import_ref

START_TIMEOUT_S = 120.0
"""How long a worker may take to import the environment before the run stops."""


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
def worker_main(fd: int, parent: int) -> int:
    """Load the environment named by the first message, then answer lists of (key, op, arg) calls."""
    guard(parent)
    conn = Connection(fd)
    try:
        ref, settings = conn.recv()
        episodes = Episodes(import_ref(ref), settings)
    except BaseException as exc:
        conn.send(("init_error", f"{type(exc).__name__}: {exc}"))
        return 1
    conn.send(("ready", None))
    try:
        while (calls := conn.recv()) is not None:
            for key, op, arg in calls:
                conn.send((key, *episodes.call(key, op, arg)))
    except (EOFError, OSError):                        # the trainer closed the pool or exited
        pass
    return 0


class _Worker:
    def __init__(self, ref: str, settings):
        self.proc, self.conn = spawn("nanoverl_core.env.pool")
        self.conn.send((ref, settings))
        self.ready = False
        self.started = time.monotonic()
        self.episodes: set[int] = set()
        """The episodes this worker holds."""
        self.queue: deque[int] = deque()
        """Keys of the calls sent and not answered yet; the first is the one it is running."""
        self.since = 0.0

    def kill(self) -> None:
        kill(self.proc, self.conn)


class EnvironmentPool:
    """`size` worker processes holding episodes; `run` runs one round of calls (see the module docstring)."""

    def __init__(self, ref: str, settings, size: int, timeout_s: float):
        self.ref, self.settings, self.size, self.timeout_s = ref, settings, size, timeout_s
        self.workers: list[_Worker] = []
        self.home: dict[int, _Worker] = {}
        """The worker holding each live episode."""
        self.turn = 0
        weakref.finalize(self, _kill_all, self.workers)

    def _fill(self) -> None:
        while len(self.workers) < self.size:
            self.workers.append(_Worker(self.ref, self.settings))
        for worker in self.workers:
            if not worker.ready:
                self._await_start(worker)

    def _await_start(self, worker: _Worker) -> None:
        from ..errors import EpisodeError

        left = START_TIMEOUT_S - (time.monotonic() - worker.started)
        message = None
        if not worker.conn.poll(max(0.0, left)):
            message = f"did not start within {START_TIMEOUT_S:.0f} s"
        else:
            try:
                kind, detail = worker.conn.recv()
                message = None if kind == "ready" else detail
            except (EOFError, OSError):
                message = death(worker.proc, "it")
        if message is not None:
            self.close()
            raise EpisodeError(f"an environment worker process failed to start ({self.ref}): {message}; fix the "
                               "environment's import, or set environment.workers=0 to run it in the trainer")
        worker.ready = True

    def _retire(self, worker: _Worker, results: dict, kind: str, message: str) -> None:
        """Kill `worker`: its running call gets (kind, message), its other calls and episodes are lost."""
        running = worker.queue[0] if worker.queue else None
        for key in worker.queue:
            results[key] = (kind, message) if key == running else \
                ("lost", f"its worker process was restarted after another episode's {kind}")
        for key in worker.episodes:
            self.home.pop(key, None)
        worker.kill()
        self.workers.remove(worker)

    def run(self, calls: list[tuple[int, str, Any]]) -> dict[int, tuple[str, Any]]:
        self._fill()
        results: dict[int, tuple[str, Any]] = {}
        batches: dict[_Worker, list] = {}
        for key, op, arg in calls:
            if op == "start":                               # deal new episodes out in turn
                self.home[key] = self.workers[self.turn % len(self.workers)]
                self.home[key].episodes.add(key)
                self.turn += 1
            worker = self.home.get(key)
            if worker is None:
                results[key] = ("lost", "its worker process was restarted (another episode's crash or timeout)")
                continue
            batches.setdefault(worker, []).append((key, op, arg))
            if op == "close":
                worker.episodes.discard(key)
                self.home.pop(key, None)
        now = time.monotonic()
        for worker, batch in batches.items():
            worker.conn.send(batch)
            worker.queue.extend(key for key, _, _ in batch)
            worker.since = now
        self._collect(results)
        return results

    def _collect(self, results: dict) -> None:
        """Wait for every answer, killing a worker whose call runs past the time limit or that died."""
        while busy := [w for w in self.workers if w.queue]:
            deadlines = [w.since + self.timeout_s - time.monotonic() for w in busy] if self.timeout_s else []
            ready = wait([w.conn for w in busy], timeout=max(0.0, min(deadlines)) if deadlines else None)
            for worker in [w for w in busy if w.conn in ready]:
                try:
                    key, *outcome = worker.conn.recv()
                except (EOFError, OSError):
                    self._retire(worker, results, "crash", death(worker.proc, "its environment's worker process"))
                    continue
                worker.queue.popleft()
                worker.since = time.monotonic()
                results[key] = tuple(outcome)
            for worker in [w for w in busy if w in self.workers and w.queue and self.timeout_s]:
                if time.monotonic() - worker.since > self.timeout_s:
                    self._retire(worker, results, "timeout",
                                 f"timed out after environment.timeout_s={self.timeout_s:g}s")

    def close(self) -> None:
        for worker in self.workers:
            try:
                worker.conn.send(None)
            except OSError:
                pass
            try:
                worker.proc.wait(timeout=2.0)
            except Exception:
                pass
            worker.kill()
        self.workers.clear()
        self.home.clear()


def environment_calls(cfg, make_env, ref: str):
    """Where `cfg`'s ([environment]) environments run: `cfg.workers` worker processes importing `ref`
    ("module:attr"), or this process (workers = 0, or no importable ref: a warning says so)."""
    if cfg.workers and ref:
        return EnvironmentPool(ref, cfg.settings, cfg.workers, cfg.timeout_s)
    if cfg.workers:
        print(f"warning: environment {cfg.name!r} cannot be imported by a worker process (registered as an object, "
              "not a \"module:attr\" string); it runs in the trainer process, without crash isolation",
              file=sys.stderr)
    return InProcess(make_env, cfg.settings, cfg.timeout_s)


def _kill_all(workers: list[_Worker]) -> None:
    for worker in workers:
        worker.kill()


if __name__ == "__main__":  # one module object: the classes a message unpickles are this module's own
    from nanoverl_core.env.pool import worker_main as _main
    sys.exit(_main(int(sys.argv[1]), int(sys.argv[2])))
