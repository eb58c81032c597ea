"""What the hostile tests share: scoring a program with tight limits, and the host checked after every test
(`no_leftovers`): no process of an execution alive, no System V IPC object, kernel key or cgroup folder of an
execution left on the host, and this process's pid, cwd and environment as they were."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from nanoverl_code.rewards import score_row
from nanoverl_code.sandbox import hierarchy
from nanoverl_code.settings import CodeSettings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

TIGHT = dict(cpu_s=1.0, wall_s=3.0, memory_mb=256, processes=12, max_output_bytes=1 << 20)
SUM_ROW = {"reward_model": {"ground_truth": json.dumps({"inputs": ["2 3\n"], "outputs": ["5\n"]})}}
"""A stdin/stdout row in verl's prime_code layout: the answer is 5."""
ADD_ROW = {"test_list": ["assert add(2, 3) == 5", "assert add(20, 11) == 31337"]}
"""An assert row (MBPP layout); the second expected value is one no honest program computes."""
MARK = "987.654"
"""The argument of the `sleep` a daemon leaves behind; the leftover scan looks for it."""


def score(program: str, row: dict = SUM_ROW, **settings) -> tuple[dict, list, list]:
    return score_row(program, row, CodeSettings(code_from="response", score="fraction", **{**TIGHT, **settings}))


def kinds(result: tuple[dict, list, list]) -> list[str]:
    """Each test case's verdict: "pass" or its failure kind."""
    return result[1]


def leftovers() -> list[str]:
    """Processes of a sandbox still alive: a uid of the executions' range (root) or the daemons' marker."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
        if uid >= 1_000_000 or MARK in cmdline or "jail/__main__.py" in cmdline:
            found.append(f"{entry.name} uid={uid} {cmdline[:80]}")
    return found


def host_objects() -> dict[str, list[str]]:
    """What an execution could leave on the host: System V IPC objects, kernel keys of the executions' uids,
    and the cgroup folders of this process's launches."""
    found = {}
    for kind in ("shm", "msg", "sem"):
        try:
            found[kind] = sorted(Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:])
        except OSError:
            found[kind] = []
    try:
        found["keys"] = [uid for uid in (int(line.split(":")[0]) for line in
                                         Path("/proc/key-users").read_text().splitlines()) if uid >= 1_000_000]
    except OSError:
        found["keys"] = []
    try:
        bases = [base for base, _ in hierarchy("").bases]
    except Exception:
        bases = []
    found["cgroups"] = sorted(str(p) for base in bases for p in Path(base).glob(f"nanoverl-code-{os.getpid()}-*"))
    return found


@pytest.fixture
def no_leftovers():
    def environment():
        return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    pid, cwd, env, objects = os.getpid(), os.getcwd(), environment(), host_objects()
    yield
    deadline = time.monotonic() + 5
    while leftovers() and time.monotonic() < deadline:  # a launcher killed at the deadline is being reaped
        time.sleep(0.1)
    assert leftovers() == []
    assert host_objects() == objects
    assert (os.getpid(), os.getcwd(), environment()) == (pid, cwd, env)
