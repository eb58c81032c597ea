"""Running one program against a row's test cases in the sandbox: the parent's side (jail/ is the sandbox's).

    outcomes = run_tests(program, "stdio", [{"stdin": "1 2\\n"}], Limits())

Each call starts `python -I -S jail/__main__.py` (the launcher) in its own session with an empty environment and
no inherited file descriptors, hands it the spec on stdin (the program, the inputs, for assert tests the
test code; never the expected stdout or return values, which stay here; the program's boot script, the
seccomp filter, the cgroup folders) and reads one JSON line per test case back, parsed as untrusted data. A
launcher that runs past the whole row's deadline is killed with its process group; the namespace's init dies
with it (PR_SET_PDEATHSIG) and the kernel kills the rest of the namespace.

isolation "namespaces" (the default) needs unshare(2) of mount, PID, network, IPC and UTS namespaces: as
root directly, as another user through a user namespace. limits "execution" (the default) needs cgroups
(cgroups.py). `probe` says whether both work here.
"""

from __future__ import annotations

import base64
import contextlib
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

from . import cgroups
from .jail import kernel, wire
from .seccomp import SandboxUnavailable, program_filter

JAIL = Path(__file__).with_name("jail") / "__main__.py"
KINDS = ("compile_error", "wrong_answer", "runtime_error", "timeout", "memory", "output_limit", "sandbox_refusal")
"""How a test case can fail (docs/code.md says what each means)."""
START_S = 10.0
"""What a launch may take beyond its test cases' wall-clock limits (interpreter starts, the mounts)."""
MAX_LINE = 8 << 20
"""The longest outcome line read from the launcher (a stdout of max_output_bytes, base64, and its fields)."""


@attrs.frozen
class Limits:
    """What one execution (one program run against one test case) may use, all its processes together."""

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
    """One test case: kind "ok" (ran to the end: the caller compares stdout or the reply) or a failure kind.
    `reply` is the call's reply as JSON data, None when it is not a well-formed JSON object."""

    kind: str
    detail: str = ""
    seconds: float = 0.0
    stdout: bytes = b""
    reply: dict | None = None
    stderr: str = ""
    cpu_s: float | None = None
    """CPU seconds the execution used: every process of its cgroup, or (limits_per = "process") the program's
    own process."""


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


@functools.lru_cache(maxsize=1)
def boot() -> str:
    return wire.boot_source()


@functools.lru_cache(maxsize=4)
def hierarchy(delegated: str = "") -> cgroups.Hierarchy:
    return cgroups.find(delegated)


def run_tests(program: str, mode: str, tests: list[dict[str, Any]], limits: Limits = Limits(),
              isolation: str = "namespaces", python: str = "", setup: str = "", entry: str = "",
              fn_name: str = "", names: list[str] | tuple[str, ...] = (), accounting: str = "execution",
              cgroup: str = "") -> list[Outcome]:
    """The outcome of each test case. mode "stdio": tests are {"stdin": text}; "call": {"args": [...]} with
    `fn_name` (a function of the program, or a method of its class Solution); "assert": {"code": test code}
    run by the checker after `setup` (trusted code: imports, a HumanEval prompt), then `check(<entry>)` when
    `entry` is given; the program supplies the names the test code reads that nothing else binds, the entry
    point and `names` (jail/checker.py: program_names). accounting "execution": CPU time, memory and processes of all the execution's processes
    together in a cgroup (`cgroup`: a delegated cgroup v2 folder, "" automatic); "process": rlimits only."""
    if not tests:
        return []
    exe, binds = interpreter(python)
    root = tempfile.mkdtemp(prefix="nanoverl-code-", dir=_launch_folder(isolation))
    spec = {"isolation": isolation, "python": exe, "binds": list(binds), "root": root, "parent": os.getpid(),
            "mode": mode, "program": program, "tests": tests, "setup": setup, "entry": entry, "fn_name": fn_name,
            "names": list(names),
            "limits": attrs.asdict(limits), "boot": boot(), "seccomp": program_filter(isolation).hex()}
    deadline = len(tests) * (limits.wall_s + 0.5) + START_S
    with (hierarchy(cgroup).launch() if accounting == "execution" else contextlib.nullcontext()) as folders:
        spec["cgroup"] = folders
        try:
            out, err, code, timed_out = _launch(exe, spec, deadline)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    outcomes = _outcomes(out)
    reason = err.decode(errors="replace").strip().splitlines()[-1:] or [f"the launcher exited {code}"]
    missing = Outcome("timeout", f"the row ran past {deadline:g} s") if timed_out else \
        Outcome("sandbox_refusal", reason[0][:300])
    return [outcomes.get(i, missing) for i in range(len(tests))]


def _launch_folder(isolation: str) -> str | None:
    """Where a launch's folder goes: the temporary folder, except that with rlimits as root the programs run
    as a fresh uid on the host, which needs every folder above theirs to be searchable by others: then the
    first of the temporary folder, /tmp, /var/tmp and /dev/shm that is."""
    if isolation != "rlimits" or os.getuid() != 0:
        return None
    for folder in (tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"):
        path, searchable = os.path.realpath(folder), True
        while searchable and path != "/":
            searchable = os.path.isdir(path) and bool(os.stat(path).st_mode & 0o001)
            path = os.path.dirname(path)
        if searchable:
            return folder
    raise SandboxUnavailable("with sandbox = \"rlimits\" as root, the programs' folders need a temporary folder "
                             "that others can search (TMPDIR, /tmp, /var/tmp, /dev/shm); none is")


def _launch(python: str, spec: dict, deadline: float) -> tuple[bytes, bytes, int | None, bool]:
    """The launcher, on the programs' own interpreter (the checker runs the tests on it too)."""
    # not -B: the jail's own bytecode is cached like any module's
    proc = subprocess.Popen([python, "-I", "-S", str(JAIL)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={}, cwd=spec["root"], close_fds=True, start_new_session=True)
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
    return out, err, proc.returncode, timed_out


def _outcomes(out: bytes) -> dict[int, Outcome]:
    """The launcher's lines: init writes them, but their fields carry what the program wrote; anything that
    does not parse is skipped (that test case then counts as the launcher's failure)."""
    outcomes: dict[int, Outcome] = {}
    for line in out.splitlines():
        try:
            if len(line) > MAX_LINE:
                continue
            row = json.loads(line)
            reply = None
            if row.get("reply") is not None:
                reply = _json_object(base64.b64decode(row["reply"]))
            cpu = row.get("cpu_s")
            outcomes[int(row["i"])] = Outcome(str(row["kind"]), str(row.get("detail", "")),
                                              float(row.get("seconds", 0.0)), base64.b64decode(row.get("stdout", "")),
                                              reply, str(row.get("stderr", "")), None if cpu is None else float(cpu))
        except Exception:  # malformed, too deep (RecursionError), not base64: not an outcome
            continue
    return outcomes


def _json_object(data: bytes) -> dict | None:
    try:
        value = json.loads(data)
    except Exception:
        return None
    return value if isinstance(value, dict) else None


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@functools.lru_cache(maxsize=16)
def probe(isolation: str = "namespaces", python: str = "", accounting: str = "execution", cgroup: str = "") -> str:
    """"" if a trivial program runs in this sandbox here, else why not (one line)."""
    try:
        if accounting == "execution":
            hierarchy(cgroup)
        if isolation == "rlimits" and kernel.landlock_abi() < (1 if os.getuid() == 0 else 6):
            return ("the kernel has no Landlock (Linux 5.13 or later with landlock in its LSM list), which confines "
                    "the programs' files where there are no namespaces" if os.getuid() == 0 else
                    "as a user other than root, the programs would run as your uid: keeping their signals from your "
                    f"other processes (the trainer) needs Landlock ABI 6 (Linux 6.12), and this kernel has "
                    f"{kernel.landlock_abi()}")
        outcome = run_tests("print(6 * 7)", "stdio", [{"stdin": ""}], Limits(), isolation, python,
                            accounting=accounting, cgroup=cgroup)[0]
    except (SandboxUnavailable, OSError, ValueError, subprocess.SubprocessError) as exc:
        return str(exc)
    if outcome.kind == "ok" and outcome.stdout == b"42\n":
        return ""
    return outcome.detail or f"{outcome.kind}: {outcome.stderr.strip()[-200:]}"
