"""Worker processes that never outlive the trainer, and the pool of them that rewards and environments use
(no torch here).

A worker is a fresh interpreter running `python -m <module> FD PARENT_PID`, so it never inherits the
trainer's torch threads, CUDA state or an unguarded `__main__`; it talks to the trainer over a socket
with `multiprocessing.connection`. `guard` makes it die with the trainer, even in the middle of a call
that never returns.

`WorkerPool` is the mechanism both wings share (reward/pool.py: stateless calls on any free worker;
env/pool.py: episodes pinned to the worker that holds them): it starts the workers and waits for them
(one message when one cannot start), caps each worker's address space (`memory_limit_mb`, RLIMIT_AS, so
a leaking call fails with MemoryError instead of swapping the machine), and runs the calls each worker
is sent one at a time, in order, so it knows which call each worker is on: a call past its time limit
gets its worker killed (SIGKILL), a worker that dies (a segfault, `os._exit`, the kernel's OOM killer)
is charged to exactly the call it was running, and either way the wing gets back the calls that worker
had not answered; a fresh worker takes its place. `concurrent.futures.ProcessPoolExecutor` cannot do
either: a dead worker breaks the whole pool and fails every pending future, and a hung call cannot be
killed alone.

The wire: the first message is (memory_limit_mb, init), answered ("ready", None) or ("init_error",
why); then lists of calls, each a tuple whose first item is its key, answered one (key, answer, spent)
message per call; None ends the worker.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

START_TIMEOUT_S = 120.0
"""How long a worker may take to start (import what it calls) before the run stops."""


def spawn(module: str) -> tuple[subprocess.Popen, Connection]:
    """Start `python -m module FD PID` with this process's import path; returns (process, connection)."""
    parent_sock, child_sock = socket.socketpair()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)}
    proc = subprocess.Popen([sys.executable, "-m", module, str(child_sock.fileno()), str(os.getpid())],
                            pass_fds=[child_sock.fileno()], env=env, stdin=subprocess.DEVNULL)
    child_sock.close()
    return proc, Connection(parent_sock.detach())


def kill(proc: subprocess.Popen, conn: Connection) -> None:
    """SIGKILL a worker (if it still runs), reap it, and close its connection."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    conn.close()


def _watch_parent(parent: int) -> None:
    """End this worker when the trainer is gone (it may be stuck in a call and never read again)."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def guard(parent: int) -> None:
    """In a worker: leave Ctrl-C to the trainer, and die with it (PR_SET_PDEATHSIG where Linux has it, and a
    thread that watches the parent's pid)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; it closes the pool
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the trainer, even mid-call
        except (OSError, AttributeError):
            pass
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()


def death(proc: subprocess.Popen, what: str) -> str:
    """Why a worker process ended, for an error message ("the reward's worker process was killed by SIGSEGV")."""
    code = proc.wait()
    if code < 0:
        try:
            return f"{what} was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"{what} was killed by signal {-code}"
    return f"{what} exited with status {code} (os._exit or a crash)"


def resident_mib() -> float | None:
    """This process's resident memory now, in MiB (Linux /proc/self/statm; None where there is none)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return None


def peak_resident_mib(pid: int | str = "self", *, reset: bool = True) -> float | None:
    """A process's peak resident memory (VmHWM) in MiB since it started or since the last reset; `reset`
    starts a new peak from what it holds now (Linux: writing 5 to /proc/PID/clear_refs). None where there
    is no /proc, or the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            peak = next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    if reset:
        try:
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")
        except OSError:  # not ours to reset (another user's, or gone): the peak since it started
            pass
    return peak


def descendants(pid: int | None = None) -> list[int]:
    """Every living process below `pid` (default: this one), from /proc's parent links ([] without /proc)."""
    parents: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])   # the name, in parentheses, may hold spaces
            except (OSError, ValueError, IndexError):
                continue
            parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [os.getpid() if pid is None else pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def release_free_heap() -> None:
    """Hand the heap's free pages back to the OS (glibc's malloc_trim; nothing elsewhere).

    An update's activations are freed when it ends, but glibc keeps most of them in its heap: they are
    freed chunks of a few MiB, under its mmap threshold. The next rollout (and a vLLM engine's KV cache
    filling up in this process) would then sit on top of them. The trainer calls this at each step's end,
    so a step's peak is the larger of its phases, not their sum (the next update faults its pages back in),
    and after validation and after each checkpoint, so neither adds to the next step or the final eval."""
    try:
        import ctypes
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def step_peaks_mib() -> dict[str, float]:
    """The peak resident memory since the last call, of this process and summed over its living descendants
    (reward and environment workers, an inference engine's processes): `perf/peak_rss_mib`,
    `perf/children_peak_rss_mib` (the sum of each one's own peak: at least their peak together), and
    `perf/children` (how many). Each call starts the next peaks."""
    own = peak_resident_mib()
    if own is None:
        return {}
    children = [peak for pid in descendants() if (peak := peak_resident_mib(pid)) is not None]
    return {"perf/peak_rss_mib": own, "perf/children_peak_rss_mib": sum(children), "perf/children": len(children)}


# ---- in a worker process ---------------------------------------------------------------------------------
Handler = Callable[[tuple], tuple[Any, bool]]
"""What a worker runs each call with: call -> (answer, spent); spent asks for a fresh worker after this
answer (a MemoryError: the heap may hold the leak)."""


def serve(make: Callable[[Any], Handler]) -> int:
    """The main of a worker that `spawn` started: build the handler from the first message's init (under the
    memory limit), then answer calls until the trainer closes the connection; returns the exit status."""
    guard(int(sys.argv[2]))
    conn = Connection(int(sys.argv[1]))
    try:
        memory_limit_mb, init = conn.recv()
        try:
            if memory_limit_mb:
                import resource
                resource.setrlimit(resource.RLIMIT_AS, (memory_limit_mb * 2**20,) * 2)
            handle = make(init)
        except BaseException as exc:
            conn.send(("init_error", f"{type(exc).__name__}: {exc}"))
            return 1
        conn.send(("ready", None))
        while (calls := conn.recv()) is not None:
            for call in calls:
                answer, spent = handle(call)
                conn.send((call[0], answer, spent))
                if spent:
                    return 0
    except (EOFError, OSError):  # BrokenPipe / ConnectionReset: the trainer closed the pool or exited
        pass
    return 0


# ---- the pool (in the trainer) ---------------------------------------------------------------------------
class Worker:
    """One worker process and the calls it was sent and has not answered, in order (the first is running)."""

    def __init__(self, module: str, init: Any, memory_limit_mb: int):
        self.proc, self.conn = spawn(module)
        self.conn.send((memory_limit_mb, init))
        self.ready = False
        self.started = time.monotonic()
        self.calls: dict[Any, tuple] = {}
        """Call by key, in the order sent; the first is the one it is running."""
        self.since = 0.0
        """When its running call started (its previous answer, or when the calls were sent)."""

    def kill(self) -> None:
        kill(self.proc, self.conn)


class WorkerPool:
    """`size` workers running `python -m module`, whose main is `serve(make)`; `init` is what `make` gets.

    `section` is the config section (reward, environment) that messages name; `what` names what the
    workers load (a ref, a file), for the start-failure message; `error` is the UserError raised with it.
    A wing builds on `start`, `send`, `wait` and `close` (see reward/pool.py and env/pool.py)."""

    def __init__(self, module: str, init: Any, size: int, *, section: str, what: str, error: type[Exception],
                 memory_limit_mb: int = 0):
        self.module, self.init, self.size, self.memory_limit_mb = module, init, size, memory_limit_mb
        self.section, self.what, self.error = section, what, error
        self.workers: list[Worker] = []
        weakref.finalize(self, _kill_all, self.workers)  # a pool never closed still leaves no process behind

    def failed(self, kind: str, message: str) -> tuple:
        """The outcome of a call whose worker crashed or timed out, in the wing's shape: (kind, message)."""
        return kind, message

    def fill(self) -> None:
        """Start workers (without waiting for them) until there are `size`: the first, or replacements."""
        while len(self.workers) < self.size:
            self.workers.append(Worker(self.module, self.init, self.memory_limit_mb))

    def start(self) -> None:
        """`fill`, then wait until every worker is ready (the one start-failure message if one is not)."""
        self.fill()
        while waiting := [w for w in self.workers if not w.ready]:
            left = min(w.started for w in waiting) + START_TIMEOUT_S - time.monotonic()
            ready = wait([w.conn for w in waiting], timeout=max(0.0, left))
            for w in [w for w in waiting if w.conn in ready]:
                self._started(w)
            self._check_start_times()

    def busy(self) -> bool:
        return any(w.calls for w in self.workers)

    def idle(self) -> list[Worker]:
        """The ready workers with no calls."""
        return [w for w in self.workers if w.ready and not w.calls]

    def send(self, worker: Worker, calls: list[tuple]) -> bool:
        """Give a ready worker `calls` (their first items are their keys) to run in order; False when it had
        gone away (it is retired, and the calls are the caller's again)."""
        try:
            worker.conn.send(calls)
        except OSError:
            self._retire(worker)
            return False
        worker.calls.update((call[0], call) for call in calls)
        worker.since = time.monotonic()
        return True

    def wait(self, timeout_s: float, expired: str) -> list[tuple[Any, tuple, list[tuple]]]:
        """Wait until a call ends or a call runs past `timeout_s` (0: no limit), while starting workers get
        ready; returns (key, outcome, unanswered) per call that ended: its worker's answer, or `failed`'s
        ("crash", why the worker died) or ("timeout", expired). Where the worker was killed (or was spent),
        `unanswered` holds the calls it had not answered, in order, which the wing runs elsewhere or fails."""
        ended = []
        now = time.monotonic()
        watched = [w for w in self.workers if w.calls or not w.ready]
        if not watched:
            return ended
        deadlines = [w.since + timeout_s - now for w in watched if w.calls and timeout_s]
        deadlines += [w.started + START_TIMEOUT_S - now for w in watched if not w.ready]
        ready = wait([w.conn for w in watched], timeout=max(0.0, min(deadlines)) if deadlines else None)
        for w in [w for w in watched if w.conn in ready]:
            if not w.ready:
                self._started(w)
                continue
            try:
                key, answer, spent = w.conn.recv()
            except (EOFError, OSError):  # it died on the call at the head of its queue
                if w.calls:
                    key = next(iter(w.calls))
                    ended.append((key, self.failed("crash", self._death(w)), self._retire(w, key)))
                else:                    # an idle worker that went away: just replace it
                    self._retire(w)
                continue
            del w.calls[key]
            w.since = time.monotonic()
            ended.append((key, answer, self._retire(w) if spent else []))
        self._check_start_times()
        now = time.monotonic()
        for w in [w for w in self.workers if w.ready and w.calls and timeout_s and now - w.since > timeout_s]:
            key = next(iter(w.calls))
            ended.append((key, self.failed("timeout", expired), self._retire(w, key)))
        return ended

    def close(self) -> None:
        """Stop every worker (a polite end of input, then SIGKILL for one that does not leave)."""
        for w in self.workers:
            try:
                if w.ready and not w.calls:
                    w.conn.send(None)
            except OSError:
                pass
        deadline = time.monotonic() + 2.0
        for w in self.workers:
            try:
                w.proc.wait(timeout=max(0.0, deadline - time.monotonic()) if w.ready and not w.calls else 0)
            except subprocess.TimeoutExpired:
                pass
            w.kill()
        self.workers.clear()

    def _retire(self, worker: Worker, skip: Any = None) -> list[tuple]:
        """Kill `worker` and drop it from the pool; returns the calls it had not answered but `skip`."""
        worker.kill()
        self.workers.remove(worker)
        unanswered = [call for key, call in worker.calls.items() if key != skip]
        worker.calls.clear()
        return unanswered

    def _death(self, worker: Worker) -> str:
        return death(worker.proc, f"the {self.section}'s worker process")

    def _started(self, worker: Worker) -> None:
        """Read a starting worker's first answer: ready, or the start failure."""
        try:
            kind, message = worker.conn.recv()
        except (EOFError, OSError):
            kind, message = "init_error", self._death(worker)
        if kind != "ready":
            self._fail(message)
        worker.ready = True

    def _check_start_times(self) -> None:
        if any(not w.ready and time.monotonic() - w.started > START_TIMEOUT_S for w in self.workers):
            self._fail(f"no answer within {START_TIMEOUT_S:.0f} s")

    def _fail(self, why: str) -> None:
        self.close()
        memory = f", raise {self.section}.memory_limit_mb (now {self.memory_limit_mb})" if self.memory_limit_mb else ""
        raise self.error(f"the {self.section}'s worker process failed to start ({self.what}): {why}; fix its "
                         f"import{memory}, or set {self.section}.workers=0 to run it in the trainer")


def _kill_all(workers: list[Worker]) -> None:
    for w in workers:
        w.kill()
