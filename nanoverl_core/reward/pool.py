"""The pool of worker processes that calls reward functions (no torch here).

`RewardPool` runs calls in `size` worker processes, each a fresh interpreter (`python -m
nanoverl_core.reward.pool`, started by nanoverl_core.processes, so it never inherits the trainer's
torch threads, CUDA state or an unguarded `__main__`), talking over a socket with
`multiprocessing.connection`. Each worker runs one
call at a time, so the parent knows which row each worker is on: a call past `timeout_s` gets its
worker killed (SIGKILL) and replaced, and a worker that dies is charged to exactly the row it was
running; the rows queued behind it go to the other workers. `concurrent.futures.ProcessPoolExecutor`
cannot do either: a dead worker breaks the whole pool and fails every pending future, and a hung
call cannot be killed alone. A worker's address space can be capped (`memory_limit_mb`, RLIMIT_AS),
so a leaking reward fails with MemoryError (or dies) instead of swapping the machine.
"""

from __future__ import annotations

import subprocess
import sys
import time
import weakref
from collections import deque
from multiprocessing.connection import Connection, wait
from typing import Any


from ..errors import RewardError
from ..processes import death, guard, kill, spawn
from .calls import BATCHED_STYLES, CallError, ComponentSpec, call_batched, call_checked, call_style, load_function

START_TIMEOUT_S = 120.0
"""How long a worker may take to import the reward before the pool gives up."""


# ---- the worker process ------------------------------------------------------------------------------
def worker_main(fd: int, parent: int) -> int:
    """Serve the trainer until it closes the connection (a trainer that is gone ends the worker quietly)."""
    try:
        return _serve(fd, parent)
    except (EOFError, OSError):  # BrokenPipe / ConnectionReset: the trainer closed the pool or exited
        return 0


def _serve(fd: int, parent: int) -> int:
    """Load the rewards named by the first message, then answer (key, component, call args) items."""
    guard(parent)
    conn = Connection(fd)
    specs, memory_limit_mb, prompt_key = conn.recv()
    try:
        if memory_limit_mb:
            import resource
            limit = memory_limit_mb * 2**20
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        # Only a file or a ref can be loaded here; a reward registered in code without one (a closure) is
        # called in the trainer (RewardScorer.in_trainer), never here.
        fns = [load_function(spec) if spec.file or spec.ref else None for spec in specs]
        styles = [call_style(fn) if fn is not None else "" for fn in fns]
    except BaseException as exc:
        conn.send(("init_error", f"{type(exc).__name__}: {exc}"))
        return 1
    conn.send(("ready", None))
    while True:
        try:
            chunk = conn.recv()
        except (EOFError, OSError):
            return 0
        if chunk is None:
            return 0
        for key, c, args in chunk:
            try:
                if styles[c] in BATCHED_STYLES:  # args: the batch's calls; the outcome: one per row
                    result = ("ok", call_batched(fns[c], styles[c], specs[c], args, prompt_key), None)
                else:
                    result = ("ok", *call_checked(fns[c], styles[c], specs[c], *args))
            except CallError as exc:
                result = (exc.kind, exc.message, None)
            except MemoryError:
                result = ("memory", "ran out of memory (MemoryError)", None)
            conn.send((key, *result))
            rows = result[1] if result[0] == "ok" and styles[c] in BATCHED_STYLES else [result]
            if any(row[0] == "memory" for row in rows):  # the heap may hold the leak: start a fresh worker
                return 0


# ---- the pool (in the trainer) ---------------------------------------------------------------------------
class _Worker:
    def __init__(self, specs: list[ComponentSpec], memory_limit_mb: int, prompt_key: str):
        self.proc, self.conn = spawn("nanoverl_core.reward.pool")
        self.conn.send((specs, memory_limit_mb, prompt_key))
        self.ready = False
        self.started = time.monotonic()
        self.queue: deque = deque()
        """Keys sent to this worker and not answered yet; the first is the call it is running."""
        self.chunk: dict[Any, tuple] = {}
        """The calls of the chunk it was sent, by key."""
        self.since = 0.0
        """When its current call started (its previous answer, or when the chunk was sent)."""

    def kill(self) -> None:
        kill(self.proc, self.conn)

    def death(self) -> str:
        return death(self.proc, "the reward's worker process")


class RewardPool:
    """`size` worker processes; `run` scores a list of calls and returns their outcomes by key."""

    def __init__(self, specs: list[ComponentSpec], size: int, timeout_s: float = 0.0, memory_limit_mb: int = 0,
                 prompt_key: str = "prompt"):
        self.specs, self.size, self.timeout_s, self.memory_limit_mb = specs, size, timeout_s, memory_limit_mb
        self.prompt_key = prompt_key
        """The data column TRL-style rewards get as `prompts`."""
        self.workers: list[_Worker] = []
        weakref.finalize(self, _kill_all, self.workers)  # a pool never closed still leaves no process behind

    def _fill(self) -> None:
        while len(self.workers) < self.size:
            self.workers.append(_Worker(self.specs, self.memory_limit_mb, self.prompt_key))

    def _retire(self, worker: _Worker) -> None:
        worker.kill()
        self.workers.remove(worker)

    def _started(self, worker: _Worker) -> None:
        try:
            kind, message = worker.conn.recv()
        except (EOFError, OSError):
            kind, message = "init_error", worker.death()
        if kind != "ready":
            self.close()
            limit = f" (reward.memory_limit_mb = {self.memory_limit_mb})" if self.memory_limit_mb else ""
            raise RewardError(f"a reward worker process failed to start{limit}: {message}; fix the reward's import, "
                              "raise reward.memory_limit_mb, or set reward.workers=0 to score in the trainer")
        worker.ready = True

    def start(self) -> None:
        """Start the workers and wait until each has loaded the rewards (run() also starts them lazily)."""
        self._fill()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all(w.ready for w in self.workers):
            waiting = [w for w in self.workers if not w.ready]
            if not wait([w.conn for w in waiting], timeout=max(0.0, deadline - time.monotonic())):
                self.close()
                raise RewardError(f"a reward worker process did not start within {START_TIMEOUT_S:.0f} s; "
                                  "check the reward's import, or set reward.workers=0")
            for w in waiting:
                if w.conn.poll():
                    self._started(w)

    def run(self, calls: list[tuple[Any, int, tuple]], stop_on_error: bool = False,
            timeout_s: float | None = None) -> dict[Any, tuple]:
        """Outcomes {key: ("ok", score, extra) | (kind, message, None)} of (key, component, args) calls; for a
        batched component, args is the batch's list of calls and the outcome ("ok", [outcome per row], None).
        `stop_on_error`: return at the first failure (the other workers are killed). `timeout_s`: this
        run's limit per call instead of the pool's."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        pending, results = deque(calls), {}
        chunk_size = max(1, min(64, len(calls) // (4 * self.size)))
        while pending or any(w.queue for w in self.workers):
            self._fill()  # replaces the workers retired in the last round
            now = time.monotonic()
            self._dispatch(pending, chunk_size, now)
            deadlines = [w.since + limit - now for w in self.workers if w.queue and limit]
            deadlines += [w.started + START_TIMEOUT_S - now for w in self.workers if not w.ready]
            ready = wait([w.conn for w in self.workers], timeout=max(0.0, min(deadlines)) if deadlines else None)
            for w in [w for w in self.workers if w.conn in ready]:
                if not w.ready:
                    self._started(w)
                    continue
                try:
                    key, *outcome = w.conn.recv()
                except (EOFError, OSError):  # died on the call at the head of its queue
                    if not w.queue:          # an idle worker that went away: just replace it
                        self._retire(w)
                        continue
                    key, outcome = w.queue[0], ("crash", w.death(), None)
                    self._requeue(w, pending, skip=key)
                    self._retire(w)
                else:
                    w.queue.popleft()
                    w.since = time.monotonic()
                    if outcome[0] == "memory":  # the worker exits after a MemoryError; replace it
                        self._requeue(w, pending)
                        self._retire(w)
                results[key] = tuple(outcome)
                if stop_on_error and outcome[0] != "ok":
                    self.close()
                    return results
            now = time.monotonic()
            for w in list(self.workers):
                if not w.ready and now - w.started > START_TIMEOUT_S:
                    self.close()
                    raise RewardError(f"a reward worker process did not start within {START_TIMEOUT_S:.0f} s; "
                                      "check the reward's import, or set reward.workers=0")
                if w.ready and w.queue and limit and now - w.since > limit:
                    key = w.queue[0]
                    message = f"timed out after reward.timeout_s={self.timeout_s:g}s" if timeout_s is None else \
                        f"timed out after {limit:g}s (reward.timeout_s={self.timeout_s:g}s per row)"
                    results[key] = ("timeout", message, None)
                    self._requeue(w, pending, skip=key)
                    self._retire(w)
                    if stop_on_error:
                        self.close()
                        return results
        return results

    def _dispatch(self, pending: deque, chunk_size: int, now: float) -> None:
        """A chunk of the pending calls to every idle worker."""
        for w in list(self.workers):
            if w.ready and not w.queue and pending:
                chunk = [pending.popleft() for _ in range(min(chunk_size, len(pending)))]
                try:
                    w.conn.send(chunk)
                except OSError:  # it went away while idle: give the chunk to another worker
                    pending.extendleft(reversed(chunk))
                    self._retire(w)
                    continue
                w.queue.extend(key for key, _, _ in chunk)
                w.chunk = {key: (key, c, args) for key, c, args in chunk}
                w.since = now

    @staticmethod
    def _requeue(worker: _Worker, pending: deque, skip: Any = None) -> None:
        """Put the calls a retired worker had not answered back at the front of the queue."""
        for key in reversed([k for k in worker.queue if k != skip]):
            pending.appendleft(worker.chunk[key])
        worker.queue.clear()

    def close(self) -> None:
        """Stop every worker (a polite end of input, then SIGKILL for one that does not leave)."""
        for w in self.workers:
            try:
                if w.ready and not w.queue:
                    w.conn.send(None)
            except OSError:
                pass
        deadline = time.monotonic() + 2.0
        for w in self.workers:
            try:
                w.proc.wait(timeout=max(0.0, deadline - time.monotonic()) if not w.queue and w.ready else 0)
            except subprocess.TimeoutExpired:
                pass
            w.kill()
        self.workers.clear()


def _kill_all(workers: list[_Worker]) -> None:
    for w in workers:
        w.kill()


if __name__ == "__main__":  # one module object: the classes a message unpickles are this module's own
    from nanoverl_core.reward.pool import worker_main as _main
    sys.exit(_main(int(sys.argv[1]), int(sys.argv[2])))
