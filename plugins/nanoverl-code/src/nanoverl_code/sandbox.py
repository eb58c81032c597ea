"""Running one program against a row's test cases in the sandbox: the parent's side (jail.py is the sandbox's).

    outcomes = run_tests(program, "stdio", [{"stdin": "1 2\\n"}], Limits())

Each call starts `python -I -S -B jail.py` (the launcher) in its own session with an empty environment and
no inherited file descriptors, hands it the spec on stdin (the program, the inputs, for assert tests the
test code; never the expected stdout or return values, which stay here) and reads one JSON line per test
case back. A launcher that runs past the whole row's deadline is killed with its process group; the
namespace's init dies with it (PR_SET_PDEATHSIG) and the kernel kills the rest of the namespace.

isolation "namespaces" (the default) needs unshare(2) of mount, PID, network, IPC and UTS namespaces: as
root directly, as another user through a user namespace. `probe` says whether that works here.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import attrs

JAIL = Path(__file__).with_name("jail.py")
KINDS = ("compile_error", "wrong_answer", "runtime_error", "timeout", "memory", "output_limit", "sandbox_refusal")
"""How a test case can fail (docs/code.md says what each means)."""
START_S = 10.0
"""What a launch may take beyond its test cases' wall-clock limits (interpreter starts, the mounts)."""


@attrs.frozen
class Limits:
    """What one execution (one program run against one test case) may use."""

    cpu_s: float = 2.0
    memory_mb: int = 512
    wall_s: float = 5.0
    max_output_bytes: int = 1 << 20
    processes: int = 16
    file_size_mb: int = 16
    open_files: int = 64
    disk_mb: int = 32


@attrs.frozen
class Outcome:
    """One test case: kind "ok" (ran to the end: the caller compares stdout or the reply) or a failure kind."""

    kind: str
    detail: str = ""
    seconds: float = 0.0
    stdout: bytes = b""
    reply: dict | None = None
    stderr: str = ""


@functools.lru_cache(maxsize=8)
def interpreter(python: str = "") -> tuple[str, tuple[str, ...]]:
    """(the interpreter the programs run on, the folders it needs read-only in the sandbox). "" is the base
    installation of the Python running this (a venv's packages stay outside); a path is that interpreter,
    asked once for its prefixes."""
    if not python:
        return os.path.realpath(sys.executable), tuple(sorted({sys.base_prefix, sys.base_exec_prefix}))
    probe = subprocess.run([python, "-I", "-c", "import json, sys; print(json.dumps([sys.prefix, sys.exec_prefix, "
                            "sys.base_prefix, sys.base_exec_prefix]))"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        raise ValueError(f"python = {python!r} does not run ({probe.stderr.strip()[-200:]})")
    prefixes = {os.path.realpath(p) for p in json.loads(probe.stdout)} | set(json.loads(probe.stdout))
    return os.path.abspath(python), tuple(sorted(prefixes))


def run_tests(program: str, mode: str, tests: list[dict[str, Any]], limits: Limits = Limits(),
              isolation: str = "namespaces", python: str = "", setup: str = "", entry: str = "",
              fn_name: str = "") -> list[Outcome]:
    """The outcome of each test case. mode "stdio": tests are {"stdin": text}; "call": {"args": [...]} with
    `fn_name` (a function of the program, or a method of its class Solution); "assert": {"code": test code}
    run by the checker after `setup` (trusted code: imports, a HumanEval prompt), then `check(<entry>)` when
    `entry` is given."""
    if not tests:
        return []
    exe, binds = interpreter(python)
    root = tempfile.mkdtemp(prefix="nanoverl-code-")
    spec = {"isolation": isolation, "python": exe, "binds": list(binds), "root": root, "parent": os.getpid(),
            "mode": mode, "program": program, "tests": tests, "setup": setup, "entry": entry, "fn_name": fn_name,
            "limits": attrs.asdict(limits)}
    deadline = len(tests) * (limits.wall_s + 0.5) + START_S
    launcher = os.path.realpath(sys.executable)
    proc = subprocess.Popen([launcher, "-I", "-S", "-B", str(JAIL)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={}, cwd=root, close_fds=True, start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(json.dumps(spec).encode(), timeout=deadline)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc.pid)
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:
            _kill_group(proc.pid)
            proc.wait()
        shutil.rmtree(root, ignore_errors=True)
    outcomes: dict[int, Outcome] = {}
    for line in out.decode(errors="replace").splitlines():
        try:
            row = json.loads(line)
            outcomes[int(row["i"])] = Outcome(row["kind"], row.get("detail", ""), row.get("seconds", 0.0),
                                              base64.b64decode(row.get("stdout", "")), row.get("reply"),
                                              row.get("stderr", ""))
        except (ValueError, KeyError, TypeError):
            continue
    reason = err.decode(errors="replace").strip().splitlines()[-1:] or [f"the launcher exited {proc.returncode}"]
    missing = Outcome("timeout", f"the row ran past {deadline:g} s") if timed_out else \
        Outcome("sandbox_refusal", reason[0])
    return [outcomes.get(i, missing) for i in range(len(tests))]


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@functools.lru_cache(maxsize=8)
def probe(isolation: str = "namespaces", python: str = "") -> str:
    """"" if a trivial program runs in this sandbox here, else why not (one line)."""
    try:
        outcome = run_tests("print(6 * 7)", "stdio", [{"stdin": ""}], Limits(), isolation, python)[0]
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return str(exc)
    if outcome.kind == "ok" and outcome.stdout == b"42\n":
        return ""
    return outcome.detail or f"{outcome.kind}: {outcome.stderr.strip()[-200:]}"
