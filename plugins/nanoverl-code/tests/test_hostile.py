"""The hostile catalogue: real programs that attack the sandbox, the grader, the host and the parent.

Each one must end as a scored failure of its row with its kind, leave no process running (the `no_leftovers`
fixture scans /proc after every test), change nothing outside its execution's directory, and leave this
process (the parent) as it was. The limits are tight so that the bombs stay small on a shared machine.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from nanoverl_code.rewards import score_row
from nanoverl_code.sandbox import run_tests
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


def score(program: str, row: dict = SUM_ROW, **limits) -> tuple[dict, list]:
    settings = CodeSettings(code_from="response", score="fraction", **{**TIGHT, **limits})
    return score_row(program, row, settings)


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
        if uid >= 1_000_000 or MARK in cmdline or "nanoverl_code/jail.py" in cmdline:
            found.append(f"{entry.name} uid={uid} {cmdline[:80]}")
    return found


@pytest.fixture(autouse=True)
def no_leftovers():
    def environment():
        return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    pid, cwd, env = os.getpid(), os.getcwd(), environment()
    yield
    deadline = time.monotonic() + 5
    while leftovers() and time.monotonic() < deadline:  # a launcher killed at the deadline is being reaped
        time.sleep(0.1)
    assert leftovers() == []
    assert (os.getpid(), os.getcwd(), environment()) == (pid, cwd, env)


# ---- the network ------------------------------------------------------------------------------------------
def test_a_tcp_connection_to_a_listener_on_loopback_fails():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    program = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint(5)"
    result = score(program)
    with pytest.raises(socket.timeout):
        listener.accept()
    listener.close()
    assert result[0]["score"] == 0.0 and kinds(result) == ["runtime_error"]
    assert "Network is unreachable" in result[2][0].stderr


# ---- resources ----------------------------------------------------------------------------------------------
def test_a_fork_bomb_is_held_by_the_process_limit_and_killed_at_the_deadline():
    program = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    start = time.monotonic()
    result = score(program, wall_s=1.5)
    assert kinds(result) == ["timeout"] and time.monotonic() - start < 10


def test_a_memory_bomb_fails_with_memory():
    result = score("x = []\nwhile True:\n    x.append(bytearray(10**7))")
    assert kinds(result) == ["memory"] and result[0]["memory"] == 1.0


def test_an_infinite_loop_is_a_timeout():
    result = score("while True:\n    pass")
    assert kinds(result) == ["timeout"] and result[0]["timeout"] == 1.0


def test_a_sleeping_program_is_a_timeout_at_the_wall_clock_limit():
    start = time.monotonic()
    result = score("import time\ntime.sleep(60)", wall_s=1.0)
    assert kinds(result) == ["timeout"] and time.monotonic() - start < 5


def test_100_mb_of_stdout_is_an_output_limit():
    program = "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 2**20)\nprint(5)"
    result = score(program)
    assert kinds(result) == ["output_limit"] and result[0]["output_limit"] == 1.0


def test_a_segfault_through_ctypes_is_a_runtime_error():
    result = score("import ctypes\nctypes.string_at(0)\nprint(5)")
    assert kinds(result) == ["runtime_error"] and "SIGSEGV" in result[2][0].detail


# ---- files --------------------------------------------------------------------------------------------------
def test_writes_outside_the_working_directory_fail_and_change_nothing(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("{}\n")
    before = sorted(p.name for p in run_dir.iterdir()), (run_dir / "metrics.jsonl").read_text()
    targets = [run_dir / "hacked", run_dir / "metrics.jsonl", Path.home() / f"hacked-{os.getpid()}",
               Path("/etc") / f"hacked-{os.getpid()}", Path("/usr/lib") / f"hacked-{os.getpid()}",
               Path("/proc/sys/kernel/hostname")]
    program = f"""
import os
results = []
for path in {[str(t) for t in targets]!r}:
    try:
        with open(path, "a") as f:
            f.write("pwned")
        results.append("WROTE " + path)
    except OSError as e:
        results.append(type(e).__name__)
open("mine.txt", "w").write("ok")             # its own /work is writable
print(results)
"""
    result = score(program)
    assert kinds(result) == ["wrong_answer"]
    assert "WROTE" not in result[2][0].stdout.decode()
    assert (sorted(p.name for p in run_dir.iterdir()), (run_dir / "metrics.jsonl").read_text()) == before
    assert not any(t.exists() for t in targets[2:5])
    assert socket.gethostname() != "sandbox"


def test_the_expected_output_and_the_hosts_files_are_invisible(tmp_path):
    secret_file = tmp_path / "expected.txt"
    secret_file.write_text("5\n")
    program = f"""
import os
seen = []
for path in [{str(secret_file)!r}, {str(tmp_path)!r}, "/root", "/home", "/tmp", "/proc/1/root{tmp_path}"]:
    try:
        seen.append(open(path).read() if os.path.isfile(path) else sorted(os.listdir(path)))
    except OSError as e:
        seen.append(type(e).__name__)
print(seen)
"""
    result = score(program)
    out = result[2][0].stdout.decode()
    assert kinds(result) == ["wrong_answer"] and "expected.txt" not in out and "'5" not in out, out


def test_another_executions_files_and_processes_are_invisible():
    writer = "import time\nopen('secret-of-the-first.txt', 'w').write('s3cr3t')\ntime.sleep(2)\nprint(5)"
    reader = """
import os, time
time.sleep(0.7)
found = []
for top in ["/work", "/tmp", "/proc"]:
    for root, dirs, files in os.walk(top):
        if root.startswith("/proc/") and root.count("/") > 3:
            dirs[:] = []
        found += [f for f in files if "secret" in f]
print(found, sorted(p for p in os.listdir("/proc") if p.isdigit()))
"""
    results = {}
    first = threading.Thread(target=lambda: results.setdefault("writer", score(writer)))
    first.start()
    results["reader"] = score(reader)
    first.join()
    out = results["reader"][2][0].stdout.decode()
    assert "secret-of-the-first" not in out and kinds(results["writer"]) == ["pass"], out
    assert kinds(results["reader"]) == ["wrong_answer"]


def test_a_secret_in_the_parents_environment_does_not_reach_the_program(monkeypatch):
    monkeypatch.setenv("NANOVERL_TEST_SECRET", "hunter2-" + str(os.getpid()))
    program = """
import os
print(dict(os.environ))
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            print(open(f"/proc/{pid}/environ", "rb").read())
        except OSError as e:
            print(pid, type(e).__name__)
"""
    result = score(program)
    assert kinds(result) == ["wrong_answer"] and b"hunter2" not in result[2][0].stdout


# ---- signals and processes ----------------------------------------------------------------------------------
def test_kill_of_the_parent_its_group_and_pid_minus_1_reaches_nothing_outside():
    me = os.getpid()
    program = f"""
import os, signal
for target in ({me}, os.getppid(), -{os.getpgid(0)}, 1):
    try:
        os.kill(target, signal.SIGKILL)
    except OSError as e:
        print(target, type(e).__name__)
os.kill(-1, signal.SIGKILL)
print(5)
"""
    result = score(program)
    assert kinds(result) == ["runtime_error"]  # kill(-1) reaches no one but itself: ESRCH, or its own death
    assert "ProcessLookupError" in result[2][0].detail or "SIGKILL" in result[2][0].detail


def test_a_daemon_that_outlives_its_execution_is_killed():
    program = f"""
import os
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sleep", ["sleep", "{MARK}"])
    os._exit(0)
print(4)
"""
    result = score(program)
    assert kinds(result) == ["wrong_answer"]  # the fixture checks that no sleep is left


# ---- faking a pass --------------------------------------------------------------------------------------------
def test_os_exit_0_before_the_tests_run_fails():
    program = "import os\nos._exit(0)\ndef add(a, b):\n    return a + b"
    result = score(program, ADD_ROW)
    assert kinds(result) == ["runtime_error", "runtime_error"] and result[0]["score"] == 0.0
    assert "before the tests ran" in result[2][0].detail
    assert kinds(score("import os\nos._exit(0)\nprint(5)")) == ["wrong_answer"]  # stdin/stdout: nothing printed


@pytest.mark.parametrize("patch", [
    "import builtins\nbuiltins.AssertionError = type('AssertionError', (Exception,), {})",
    "import sys, os\nsys.exit = lambda *a: None\nos._exit = lambda *a: None",
    "import builtins\nbuiltins.isinstance = lambda *a: True\nbuiltins.print = lambda *a, **k: None",
    "import sys\nsys.settrace(lambda *a: None)\nimport atexit\natexit.register(lambda: print('ALL TESTS PASSED'))",
    "def check(candidate):\n    return True",
])
def test_overriding_assert_sys_exit_or_builtins_does_not_fake_a_pass(patch):
    program = f"""{patch}
class Anything:
    def __eq__(self, other):
        return True
    __ne__ = lambda self, other: False
def add(a, b):
    return a + b if (a, b) == (2, 3) else Anything()
"""
    result = score(program, ADD_ROW)
    first, second = kinds(result)   # a patch may break the program's own half of the calls: then both fail
    assert first in ("pass", "runtime_error") and second in ("wrong_answer", "runtime_error"), result[2]
    assert result[0]["score"] <= 0.5


def test_the_expected_value_of_an_assert_test_is_not_in_the_programs_reach():
    """The checker holds `31337`; the program scans every process' memory, cmdline and environment for it."""
    program = """
import os, re
def add(a, b):
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        for part in ("cmdline", "environ", "mem"):
            try:
                with open(f"/proc/{pid}/{part}", "rb") as f:
                    data = f.read(1 << 20)
            except OSError:
                continue
            if b"31337" in data:
                return 31337
    return a + b
"""
    result = score(program, ADD_ROW)
    assert kinds(result) == ["pass", "wrong_answer"]


def test_killing_the_checker_fails_the_test():
    program = """
import os, signal
def add(a, b):
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) not in (1, os.getpid()):
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
    return a + b
"""
    result = score(program, ADD_ROW)
    assert result[0]["score"] == 0.0 and set(kinds(result)) <= {"runtime_error"}


def test_printing_what_a_harness_would_print_is_not_a_pass():
    for marker in ('{"kind": "ok"}', "\x00\x00\x00\x0e{\"kind\": \"ok\"}", "PASSED"):
        result = score(f"print({marker!r})\ndef add(a, b):\n    return 0", ADD_ROW)
        assert kinds(result) == ["wrong_answer", "wrong_answer"]


# ---- the host is untouched by many executions at once -------------------------------------------------------
def test_the_sandbox_runs_in_parallel_and_leaves_no_temporary_folders(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    out = []
    threads = [threading.Thread(target=lambda: out.append(run_tests("print(int(input()) * 2)", "stdio",
                                                                    [{"stdin": str(i)} for i in range(3)])))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [[o.stdout for o in outcomes] for outcomes in out] == [[b"0\n", b"2\n", b"4\n"]] * 4
    assert list(tmp_path.iterdir()) == []
