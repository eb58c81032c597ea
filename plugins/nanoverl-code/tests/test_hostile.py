"""The hostile catalogue: real programs that attack the sandbox, the grader, the host and the parent.

Each one must end as a scored failure of its row with its kind, leave no process running, no IPC object, key
or cgroup on the host (the `no_leftovers` fixture, conftest.py), change nothing outside its execution's
directory, and leave this process (the parent) as it was. The limits are tight so that the bombs stay small
on a shared machine. The verdict's own rules are in test_checker.py; what survives a test case, rlimits mode
and where the sandbox may live, in test_isolation.py.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest
from conftest import ADD_ROW, MARK, SUM_ROW, kinds, score

from nanoverl_code.sandbox import run_tests

pytestmark = pytest.mark.usefixtures("no_leftovers")


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
    assert "Network is unreachable" in result[2][0].stderr  # a network namespace with a loopback that is down


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


# ---- limits for the execution as a whole: CPU time, memory, processes -----------------------------------------
SPINNER = """
import os, signal
signal.signal(signal.SIGXCPU, signal.SIG_IGN)
for _ in range({children}):
    if os.fork() == 0:
        break
while True:
    pass
"""


@pytest.mark.parametrize("children", [0, 4], ids=["one process", "five processes"])
def test_cpu_time_is_summed_over_every_process_and_sigxcpu_cannot_be_ignored(children):
    """RLIMIT_CPU is per process and its first signal can be ignored: the cgroup's CPU time, summed over every
    process the program forks, ends the execution at cpu_s."""
    result = score(SPINNER.format(children=children), cpu_s=1.0, wall_s=20)
    outcome = result[2][0]
    assert kinds(result) == ["timeout"] and "CPU limit" in outcome.detail
    assert 1.0 <= outcome.cpu_s <= 1.3, outcome


MEMORY_HOLDERS = {
    "System V shared memory": """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
for _ in range(12):                      # 192 MiB, one 16 MiB segment mapped at a time
    sid = libc.shmget(0, ctypes.c_size_t(16 << 20), 0o1600)
    addr = libc.shmat(sid, None, 0)
    ctypes.memset(addr, 1, 16 << 20)
    libc.shmdt(ctypes.c_void_p(addr))
print(5)""",
    "memfds": """
import os
fds = [os.memfd_create("x") for _ in range(10)]
for fd in fds:                           # 150 MiB in memfds
    for _ in range(15):
        os.write(fd, b"x" * (1 << 20))
print(5)""",
    "files in its tmpfs": """
for i in range(10):
    with open(f"/tmp/big{i}", "wb") as f:
        for _ in range(15):
            f.write(b"x" * (1 << 20))
print(5)""",
    "POSIX shared memory (/dev/shm)": """
import mmap, os
for i in range(10):
    fd = os.open(f"/dev/shm/seg{i}", os.O_CREAT | os.O_RDWR)
    os.ftruncate(fd, 15 << 20)
    with mmap.mmap(fd, 15 << 20) as m:
        m.write(b"x" * (15 << 20))
print(5)""",
    "forked children": """
import os, time
held = b"x" * (20 << 20)
for _ in range(4):                       # five processes of 20 MiB each, each under the address-space limit
    if os.fork() == 0:
        held = b"y" * (20 << 20)
        time.sleep(5)
        os._exit(0)
time.sleep(5)
print(5)""",
}


@pytest.mark.parametrize("program", MEMORY_HOLDERS.values(), ids=MEMORY_HOLDERS.keys())
def test_memory_of_every_kind_counts_against_one_budget(program):
    """memory_mb = 64 for the execution: memory outside any process's address space (shared segments, memfds,
    tmpfs files) and memory spread over processes count together; the execution fails with `memory`."""
    result = score(program, memory_mb=64, disk_mb=256, file_size_mb=32, wall_s=10)
    assert kinds(result) == ["memory"], result[2]


def test_the_process_limit_counts_every_process_of_the_execution_wherever_it_went():
    program = """
import os, time
started = 0
for _ in range(40):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.setsid()                      # its own session: still the execution's
        time.sleep(3)
        os._exit(0)
    started += 1
print(started)
"""
    result = score(program, processes=12)
    assert kinds(result) == ["wrong_answer"] and int(result[2][0].stdout) == 11  # and the program itself


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
    assert "before the tests ended" in result[2][0].detail
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


def test_the_checker_is_out_of_the_programs_reach():
    """The checker holds the tests and the verdict; it is forked before the test case's PID namespace exists,
    so the program sees only itself and its reaper, and a kill of every pid it can name reaches nothing else."""
    program = """
import os, signal
def add(a, b):
    seen = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    for pid in list(range(1, 200)) + [-1]:
        if pid not in (1, os.getpid()):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return a + b if seen == [1, os.getpid()] else 0
"""
    result = score(program, ADD_ROW)
    assert kinds(result) == ["pass", "wrong_answer"]


def test_printing_what_a_harness_would_print_is_not_a_pass():
    for marker in ('{"kind": "ok"}', "\x00\x00\x00\x0e{\"kind\": \"ok\"}", "PASSED"):
        result = score(f"print({marker!r})\ndef add(a, b):\n    return 0", ADD_ROW)
        assert kinds(result) == ["wrong_answer", "wrong_answer"]


# ---- the program's replies are untrusted input -----------------------------------------------------------------
HOSTILE_FRAMES = {
    "a length of 4 GiB, then nothing": "os.write(5, b'\\xff\\xff\\xff\\xff')",
    "JSON nested 100,000 deep": "body = b'[' * 100000 + b']' * 100000\nos.write(5, len(body).to_bytes(4, 'big') + body)",
    "bytes that are not UTF-8": "os.write(5, b'\\x00\\x00\\x00\\x04\\xff\\xfe\\xfd\\xfc')",
    "an integer of 100,000 digits": "body = b'{\"value\": ' + b'9' * 100000 + b'}'\nos.write(5, len(body).to_bytes(4, 'big') + body)",
    "a set of lists": "body = b'{\"value\": {\"__set__\": [[1]]}}'\nos.write(5, len(body).to_bytes(4, 'big') + body)",
    "a tag with bad hex": "body = b'{\"value\": {\"__bytes__\": \"zz\"}}'\nos.write(5, len(body).to_bytes(4, 'big') + body)",
    "a list, not an object": "body = b'[1, 2]'\nos.write(5, len(body).to_bytes(4, 'big') + body)",
    "a raised with no list": "body = b'{\"raised\": 7}'\nos.write(5, len(body).to_bytes(4, 'big') + body)",
}


@pytest.mark.parametrize("mode", ["call", "assert"])
@pytest.mark.parametrize("frame", HOSTILE_FRAMES.values(), ids=HOSTILE_FRAMES.keys())
def test_a_malformed_reply_is_the_rows_failure_and_nothing_else(frame, mode):
    """The program writes where the sandbox reads its replies (fd 5), before BOOT's own first frame and then
    as its answer: every such frame is parsed with limits, and the row fails with its kind."""
    call_row = {"ground_truth": {"fn_name": "add", "inputs": [[2, 3]], "outputs": [5]}}
    for when in ("first", "as the reply"):
        program = f"import os\n{frame}\n" if when == "first" else \
            f"import os\ndef add(a, b):\n    {frame.replace(chr(10), chr(10) + '    ')}\n    os._exit(0)\n"
        result = score(program, call_row if mode == "call" else ADD_ROW, wall_s=2)
        assert result[0]["score"] == 0.0 and set(kinds(result)) <= {"runtime_error", "wrong_answer", "timeout"}, \
            (when, result[2])


def test_a_reply_that_arrives_unasked_is_still_only_a_value():
    """The program may answer before it is asked (it can read its request on fd 4 itself): that is its value
    for the call, compared like any other, never a verdict."""
    call_row = {"ground_truth": {"fn_name": "add", "inputs": [[2, 3]], "outputs": [5]}}
    program = ("import os, json\nfor obj in ({'ready': True}, {'value': 6}):\n    body = json.dumps(obj).encode()\n"
               "    os.write(5, len(body).to_bytes(4, 'big') + body)\nos._exit(0)\n")
    assert kinds(score(program, call_row)) == ["wrong_answer"]


@pytest.mark.parametrize("program, kind", [
    ("import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)\nprint(5)", "timeout"),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "runtime_error"),
    ("import os, signal\nfor sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGSEGV):\n    try:\n"
     "        os.kill(os.getppid(), sig)\n    except OSError:\n        pass\nprint(4)", "wrong_answer"),
    ("import os\nos._exit(97)", "compile_error"),
], ids=["stops itself", "kills itself", "signals its reaper", "fakes BOOT's compile status"])
def test_signals_and_exit_statuses_the_program_chooses_fail_its_row(program, kind):
    """A program can pick how it fails (even a kind BOOT reports); it cannot pick a pass."""
    result = score(program, wall_s=2)
    assert kinds(result) == [kind] and result[0]["score"] == 0.0


# ---- the kernel's surface ---------------------------------------------------------------------------------------
SYSCALLS = {
    "add_key (a key outlives the process)": ("libc.syscall(248, b'user', b'nanoverl', b'secret', 6, -4)", "EPERM"),
    "keyctl, the persistent keyring": ("libc.syscall(250, 22, os.getuid(), -4)", "EPERM"),
    "unshare a user namespace": ("libc.unshare(0x10000000)", "EPERM"),
    "unshare a network namespace": ("libc.unshare(0x40000000)", "EPERM"),
    "clone a PID namespace": ("libc.syscall(56, 0x20000000 | 17, 0, 0, 0, 0)", "EPERM"),
    "bpf": ("libc.syscall(321, 0, 0, 0)", "EPERM"),
    "io_uring_setup": ("libc.syscall(425, 1, ctypes.create_string_buffer(120))", "EPERM"),
    "userfaultfd": ("libc.syscall(323, 0)", "EPERM"),
    "perf_event_open": ("libc.syscall(298, ctypes.create_string_buffer(128), 0, -1, -1, 0)", "EPERM"),
    "ptrace of its own child": ("libc.ptrace(16, os.fork() or 1, 0, 0)", "EPERM"),
    "mount a tmpfs": ("libc.mount(b'tmpfs', b'/tmp', b'tmpfs', 0, None)", "EPERM"),
}


@pytest.mark.parametrize("call, error", SYSCALLS.values(), ids=SYSCALLS.keys())
def test_system_calls_outside_the_programs_needs_are_refused(call, error):
    program = f"""
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
ret = {call}
if os.getpid() != 2:
    os._exit(0)                # a forked child, if any
print(ret, errno.errorcode.get(ctypes.get_errno()))
"""
    result = score(program)
    assert result[2][0].stdout.decode().split() == ["-1", error], result[2]


def test_a_system_call_of_another_abi_kills_the_program():
    result = score("import ctypes\nctypes.CDLL(None).syscall(0x40000000 | 39)\nprint(5)")  # x32's getpid
    assert kinds(result) == ["runtime_error"] and "SIGSYS" in result[2][0].detail


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
