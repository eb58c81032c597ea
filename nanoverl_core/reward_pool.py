"""Calling reward functions, and the pool of worker processes that calls them (no torch here).

A reward call gets one response and returns a float or a dict with "score". Two call styles:

    nanoverl   fn(prompt, response, sample[, settings=...])
    verl       fn(data_source, solution_str, ground_truth, extra_info)  -- recognised by a parameter
               named `solution_str`; ground_truth is the row's reward_model.ground_truth, extra_info its
               extra_info, so a verl `compute_score` file runs unchanged.

`call_checked` makes the call and checks what came back; every failure is a `CallError` with a kind:
"raised", "invalid" (not a finite number), "memory" (MemoryError), and, from the pool, "timeout" and
"crash" (the worker process died: a segfault, `os._exit`, the kernel's OOM killer).

`RewardPool` runs calls in `size` worker processes, each a fresh interpreter (`python -m
nanoverl_core.reward_pool`, so it never inherits the trainer's torch threads, CUDA state or an
unguarded `__main__`), talking over a socket with `multiprocessing.connection`. Each worker runs one
call at a time, so the parent knows which row each worker is on: a call past `timeout_s` gets its
worker killed (SIGKILL) and replaced, and a worker that dies is charged to exactly the row it was
running; the rows queued behind it go to the other workers. `concurrent.futures.ProcessPoolExecutor`
cannot do either: a dead worker breaks the whole pool and fails every pending future, and a hung
call cannot be killed alone. A worker's address space can be capped (`memory_limit_mb`, RLIMIT_AS),
so a leaking reward fails with MemoryError (or dies) instead of swapping the machine.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import numbers
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import attrs

from .builtins.rewards import GROUND_TRUTH_KEYS
from .errors import ConfigError, RewardError

START_TIMEOUT_S = 120.0
"""How long a worker may take to import the reward before the pool gives up."""


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


class CallError(Exception):
    """One failed reward call: kind is raised / invalid / memory / timeout / crash."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message


def importable_ref(fn: Callable) -> str:
    """"module:qualname" of a function another process can import, or "" (a closure, __main__'s)."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname:
        return ""
    return f"{module}:{qualname}"


def load_function(spec: ComponentSpec, registry=None) -> Callable:
    """The reward function of `spec`: the file is imported, a ref imported, else the name is resolved."""
    if spec.ref and not spec.file:
        module, _, qualname = spec.ref.partition(":")
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        return obj
    if not spec.file:
        if registry is None:
            from .plugins import load_registry
            registry = load_registry()
        return registry.get("reward", spec.name, key="reward.name")
    path = Path(spec.file)
    if not path.is_file():
        raise ConfigError(f"reward.file = {spec.file!r} does not exist; fix the path or use reward.name")
    module_spec = importlib.util.spec_from_file_location(f"nanoverl_reward_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        raise RewardError(f"reward.file {path} failed to import ({type(exc).__name__}: {exc})") from None
    fn = getattr(module, spec.function, None)
    if not callable(fn):
        raise ConfigError(f"reward.function = {spec.function!r} is not a function in {path}; "
                          "set reward.function to the function's name")
    return fn


def call_style(fn: Callable) -> str:
    """"batched" (fn.batched = True: lists in, a list out), "verl" (has `solution_str`), or "nanoverl"."""
    if getattr(fn, "batched", False):
        return "batched"
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return "nanoverl"
    return "verl" if "solution_str" in params else "nanoverl"


def verl_ground_truth(sample: dict) -> Any:
    """The row's ground truth as verl passes it (reward_model.ground_truth, not turned into a string)."""
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
            kwargs = {"data_source": data_source, "solution_str": response, "ground_truth": verl_ground_truth(sample)}
            params = inspect.signature(fn).parameters
            if "extra_info" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
                kwargs["extra_info"] = dict(sample.get("extra_info") or {})
            out = fn(**kwargs)
        elif spec.settings is not None:
            out = fn(prompt, response, sample, settings=spec.settings)
        else:
            out = fn(prompt, response, sample)
    except CallError:
        raise
    except MemoryError:
        raise CallError("memory", "ran out of memory (MemoryError)") from None
    except RewardError as exc:
        raise CallError("raised", str(exc)) from None
    except BaseException as exc:  # SystemExit from a reward is its error too; KeyboardInterrupt is ignored here
        raise CallError("raised", f"raised {type(exc).__name__}: {exc}") from None
    return check_result(out, allow_bool=style == "verl")


# ---- the worker process ------------------------------------------------------------------------------
def _watch_parent(parent: int) -> None:
    """End this worker when the trainer is gone (it may be stuck in a reward and never read again)."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def worker_main(fd: int, parent: int) -> int:
    """Serve the trainer until it closes the connection (a trainer that is gone ends the worker quietly)."""
    try:
        return _serve(fd, parent)
    except (EOFError, OSError):  # BrokenPipe / ConnectionReset: the trainer closed the pool or exited
        return 0


def _serve(fd: int, parent: int) -> int:
    """Load the rewards named by the first message, then answer (key, component, call args) items."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; it closes the pool
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the trainer, even mid-call
        except (OSError, AttributeError):
            pass
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    conn = Connection(fd)
    specs, memory_limit_mb = conn.recv()
    try:
        if memory_limit_mb:
            import resource
            limit = memory_limit_mb * 2**20
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        fns = [load_function(spec) for spec in specs]
        styles = [call_style(fn) for fn in fns]
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
                result = ("ok", *call_checked(fns[c], styles[c], specs[c], *args))
            except CallError as exc:
                result = (exc.kind, exc.message, None)
            except MemoryError:
                result = ("memory", "ran out of memory (MemoryError)", None)
            conn.send((key, *result))
            if result[0] == "memory":  # the heap may hold the leak: let the parent start a fresh worker
                return 0


# ---- the pool (in the trainer) ---------------------------------------------------------------------------
class _Worker:
    def __init__(self, specs: list[ComponentSpec], memory_limit_mb: int):
        parent_sock, child_sock = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)}
        self.proc = subprocess.Popen([sys.executable, "-m", "nanoverl_core.reward_pool", str(child_sock.fileno()),
                                      str(os.getpid())], pass_fds=[child_sock.fileno()], env=env,
                                     stdin=subprocess.DEVNULL)
        child_sock.close()
        self.conn = Connection(parent_sock.detach())
        self.conn.send((specs, memory_limit_mb))
        self.ready = False
        self.started = time.monotonic()
        self.queue: deque = deque()
        """Keys sent to this worker and not answered yet; the first is the call it is running."""
        self.chunk: dict[Any, tuple] = {}
        """The calls of the chunk it was sent, by key."""
        self.since = 0.0
        """When its current call started (its previous answer, or when the chunk was sent)."""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.conn.close()

    def death(self) -> str:
        code = self.proc.wait()
        if code < 0:
            try:
                return f"the reward's worker process was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"the reward's worker process was killed by signal {-code}"
        return f"the reward's worker process exited with status {code} (os._exit or a crash in the reward)"


class RewardPool:
    """`size` worker processes; `run` scores a list of calls and returns their outcomes by key."""

    def __init__(self, specs: list[ComponentSpec], size: int, timeout_s: float = 0.0, memory_limit_mb: int = 0):
        self.specs, self.size, self.timeout_s, self.memory_limit_mb = specs, size, timeout_s, memory_limit_mb
        self.workers: list[_Worker] = []
        weakref.finalize(self, _kill_all, self.workers)  # a pool never closed still leaves no process behind

    def _fill(self) -> None:
        while len(self.workers) < self.size:
            self.workers.append(_Worker(self.specs, self.memory_limit_mb))

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

    def run(self, calls: list[tuple[Any, int, tuple]], stop_on_error: bool = False) -> dict[Any, tuple]:
        """Outcomes {key: ("ok", score, extra) | (kind, message, None)} of (key, component, args) calls.
        `stop_on_error`: return at the first failure (the other workers are killed)."""
        pending, results = deque(calls), {}
        chunk_size = max(1, min(64, len(calls) // (4 * self.size)))
        while pending or any(w.queue for w in self.workers):
            self._fill()  # replaces the workers retired in the last round
            now = time.monotonic()
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
            deadlines = [w.since + self.timeout_s - now for w in self.workers if w.queue and self.timeout_s]
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
                if w.ready and w.queue and self.timeout_s and now - w.since > self.timeout_s:
                    key = w.queue[0]
                    results[key] = ("timeout", f"timed out after reward.timeout_s={self.timeout_s:g}s", None)
                    self._requeue(w, pending, skip=key)
                    self._retire(w)
                    if stop_on_error:
                        self.close()
                        return results
        return results

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
    from nanoverl_core.reward_pool import worker_main as _main
    sys.exit(_main(int(sys.argv[1]), int(sys.argv[2])))
