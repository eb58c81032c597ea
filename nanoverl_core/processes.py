"""Worker processes that never outlive the trainer (no torch here): what the reward pool and the
environment pool (reward/pool.py, env/pool.py) start their workers with.

A worker is a fresh interpreter running `python -m <module> FD PARENT_PID`, so it never inherits the
trainer's torch threads, CUDA state or an unguarded `__main__`; it talks to the trainer over a socket
with `multiprocessing.connection`. `guard` makes it die with the trainer, even in the middle of a call
that never returns.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection


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
