"""Nothing survives a test case or a row, the uids are never given again while a key of theirs lives,
`sandbox = "rlimits"` keeps the programs to their own folder, and the sandbox works wherever the checkout, the
interpreter and the temporary folder are."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SUM_ROW, kinds, score

from nanoverl_code.jail.kernel import fresh_uids
from nanoverl_code.sandbox import interpreter, run_tests
from nanoverl_code.settings import CodeSettings

ROOT = os.getuid() == 0
STATE = r"""
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
KEY, found = 0x4E56, []
for kind, get, create in (("shm", lambda f: libc.shmget(KEY, 4096, f), 0o1600),
                          ("msg", lambda f: libc.msgget(KEY, f), 0o1600),
                          ("sem", lambda f: libc.semget(KEY, 1, f), 0o1600)):
    if get(0o600) != -1:
        found.append(kind)
    get(create)                                          # left behind for the next test case
if libc.mq_open(b"/nanoverl", os.O_RDWR) != -1:
    found.append("mqueue")
libc.mq_open(b"/nanoverl", os.O_RDWR | os.O_CREAT, 0o600, None)
paths = ("/tmp/state", "/dev/shm/state2", os.path.expanduser("~/state3"))
found += [path for path in paths if os.path.exists(path)]
for path in paths:
    open(path, "w").write("x")
child = os.fork()
if child == 0:
    os._exit(0)
os.waitpid(child, 0)
if (os.getpid(), child) != (2, 3):                       # the PID counter starts again
    found.append(f"pids {os.getpid()} {child}")
for _ in range(20):
    if os.fork() == 0:
        os._exit(0)
snmp = open("/proc/net/snmp").read().split("\n")
ip = dict(zip(snmp[0].split()[1:], snmp[1].split()[1:]))
if ip["OutNoRoutes"] != "0":                             # a counter of the network namespace
    found.append("OutNoRoutes " + ip["OutNoRoutes"])
for _ in range(5):
    try:
        socket_ = __import__("socket").socket(2, 2)
        socket_.sendto(b"x", ("10.1.2.3", 9))
    except OSError:
        pass
if os.fork() == 0:                                       # a daemon holding all of it
    os.setsid()
    time.sleep(30)
    os._exit(0)
print("fresh" if not found else found)
"""


@pytest.mark.usefixtures("no_leftovers")
def test_each_test_case_and_each_row_starts_from_nothing_the_last_one_left():
    """IPC objects (System V, POSIX message queues), files in /tmp, /dev/shm and home, the PID counter, the
    network namespace's counters and a daemon holding them: a test case sees none of the previous one's, nor a
    row of the previous row's."""
    row = {"ground_truth": {"inputs": ["", "", ""], "outputs": ["fresh"] * 3}}
    for _ in range(2):
        result = score(STATE, row, processes=30)
        assert kinds(result) == ["pass"] * 3, [o.stdout for o in result[2]]


@pytest.mark.usefixtures("no_leftovers")
def test_threads_subprocesses_and_multiprocessing_work_under_the_filter():
    """What the seccomp filter keeps: a program may use threads, subprocess and multiprocessing (its
    semaphores in /dev/shm, which is its own /tmp)."""
    program = """
import multiprocessing, subprocess, threading
if __name__ == "__main__":
    out = []
    t = threading.Thread(target=lambda: out.append(1))
    t.start(); t.join()
    out.append(int(subprocess.run(["/bin/echo", "2"], capture_output=True, text=True).stdout))
    with multiprocessing.Pool(2) as pool:
        out += pool.map(abs, [-3, -4])
    print(sum(out) - 5)
"""
    assert kinds(score(program, processes=16, wall_s=10)) == ["pass"]


def test_a_uid_that_holds_a_kernel_key_is_not_given_again():
    """The kernel keeps a uid's keyrings after all its processes are gone (programs cannot add keys: seccomp;
    this test adds one from outside): a launcher whose pid would derive that uid takes the next free one. It
    leaves the uid's (cleared) keyrings in the kernel, as any key does."""
    if not ROOT:
        pytest.skip("as another user the programs run as one's own uid")
    pid = 2**22 - 7
    uid = fresh_uids(pid)[0]
    libc = ctypes.CDLL(None, use_errno=True)
    child = os.fork()
    if child == 0:
        os.setresuid(uid, uid, uid)
        ok = libc.syscall(248, b"user", b"nanoverl-test", b"x", 1, -4) > 0       # add_key to the user keyring
        os._exit(0 if ok else 1)
    assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0
    try:
        assert uid in {int(line.split(":")[0]) for line in Path("/proc/key-users").read_text().splitlines()}
        again = fresh_uids(pid)
        assert uid not in again and uid + 1 not in again and again[0] != uid - 1
    finally:
        child = os.fork()
        if child == 0:
            os.setresuid(uid, uid, uid)
            libc.syscall(250, 7, -4)                                             # KEYCTL_CLEAR
            os._exit(0)
        os.waitpid(child, 0)


# ---- sandbox = "rlimits" ------------------------------------------------------------------------------------
RLIMITS = dict(sandbox="rlimits", python="/usr/bin/python3")
"""As root the programs run as a fresh uid, which cannot read an interpreter in root's home: the system one."""
needs_system_python = pytest.mark.skipif(not (ROOT and os.path.exists("/usr/bin/python3")),
                                         reason="rlimits mode's tests run as root with /usr/bin/python3")


@needs_system_python
@pytest.mark.usefixtures("no_leftovers")
def test_rlimits_mode_keeps_the_program_to_its_own_folder(tmp_path):
    marker = f"nanoverl-rlimits-{os.getpid()}"
    targets = [f"/tmp/{marker}", f"/var/tmp/{marker}", f"/dev/shm/{marker}", str(tmp_path / marker),
               os.path.expanduser(f"~/{marker}")]
    program = f"""
import os
out = []
for path in {targets!r}:
    try:
        open(path, "w").write("x")
        out.append("WROTE")
    except OSError as e:
        out.append(type(e).__name__)
for path in ("/etc/passwd", {str(tmp_path)!r}, "/root", "/home"):
    try:
        out.append(str(len(open(path).read()) if os.path.isfile(path) else len(os.listdir(path))))
    except OSError as e:
        out.append(type(e).__name__)
open("mine.txt", "w").write("ok")                       # its own folder is writable
out.append(open("mine.txt").read())
print(out)
"""
    result = score(program, **RLIMITS)
    out = result[2][0].stdout.decode()
    assert "WROTE" not in out and out.count("PermissionError") == len(targets) + 4 and "'ok'" in out, out
    assert not any(os.path.exists(t) for t in targets)


@needs_system_python
@pytest.mark.usefixtures("no_leftovers")
def test_rlimits_mode_has_no_sockets_ipc_or_signals_outside():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    program = f"""
import ctypes, os, signal, socket
libc = ctypes.CDLL(None, use_errno=True)
out = []
for attempt in (lambda: socket.create_connection(("127.0.0.1", {listener.getsockname()[1]}), timeout=1),
                lambda: socket.socket(socket.AF_UNIX).connect("\\0anything"),
                lambda: os.kill({os.getpid()}, signal.SIGKILL), lambda: os.kill(1, signal.SIGKILL)):
    try:
        attempt()
        out.append("DONE")
    except OSError as e:
        out.append(type(e).__name__)
out += [str(libc.shmget(0, 4096, 0o1600)), str(libc.msgget(0, 0o1600)), str(libc.semget(0, 1, 0o1600))]
print(out)
"""
    result = score(program, **RLIMITS)
    listener.close()
    assert result[2][0].stdout.decode().strip() == str(["PermissionError"] * 4 + ["-1"] * 3), result[2]


@needs_system_python
@pytest.mark.usefixtures("no_leftovers")
def test_rlimits_mode_kills_what_the_program_left_running():
    program = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    os.execv('/bin/sleep', ['sleep', '987.654'])\nprint(5)"
    assert kinds(score(program, **RLIMITS)) == ["pass"]  # the no_leftovers fixture finds no sleep


@needs_system_python
def test_rlimits_mode_limits_the_execution_as_a_whole():
    spinner = "import os, signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nfor _ in range(3):\n" \
              "    if os.fork() == 0:\n        break\nwhile True:\n    pass\n"
    result = score(spinner, cpu_s=1.0, wall_s=20, **RLIMITS)
    assert kinds(result) == ["timeout"] and result[2][0].cpu_s <= 1.3
    memfds = "import os\nfds = [os.memfd_create('x') for _ in range(10)]\nfor fd in fds:\n" \
             "    for _ in range(15):\n        os.write(fd, b'x' * (1 << 20))\nprint(5)"
    assert kinds(score(memfds, memory_mb=64, file_size_mb=32, wall_s=10, **RLIMITS)) == ["memory"]


# ---- where the sandbox lives ----------------------------------------------------------------------------------
def _venv(path: Path) -> str:
    """A venv of the base interpreter at `path`, without pip (fast): its python."""
    subprocess.run([interpreter("")[0], "-m", "venv", "--without-pip", str(path)], check=True, capture_output=True)
    return str(path / "bin" / "python")


def _mounted(path: Path):
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(path)], check=True)
    return path


PLACES = ["under /tmp", "a path with spaces", "under a mount point", "itself a mount point", "under /home",
          "under /work"]


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.usefixtures("no_leftovers")
def test_a_venv_interpreter_anywhere_runs_programs(tmp_path, place):
    """`[reward.code] python` a venv's interpreter (its folders bound read-only), wherever the venv is: the
    program runs, sees its own sys.prefix, and has a writable /tmp of its own."""
    mounts = []
    if place in ("under a mount point", "itself a mount point", "under /home", "under /work") and not ROOT:
        pytest.skip("mounts, /home and /work need root")
    if place == "under /work" and not os.path.isdir("/work"):
        pytest.skip("no /work on this machine")
    if place == "under /tmp":
        folder = tmp_path / "venv"
    elif place == "a path with spaces":
        folder = tmp_path / "with spaces in it" / "the venv"
    elif place == "under a mount point":
        mounts.append(_mounted(tmp_path / "mnt"))
        folder = mounts[-1] / "venv"
    elif place == "itself a mount point":
        mounts.append(_mounted(tmp_path / "venv"))
        folder = mounts[-1]
    else:
        folder = Path(f"/{place.split('/')[1]}/nanoverl-test-{os.getpid()}/venv")
    try:
        python = _venv(folder)
        row = {"ground_truth": {"inputs": [""], "outputs": [f"{folder}\nok"]}}
        program = "import sys\nopen('/tmp/f', 'w').write('ok')\nprint(sys.prefix)\nprint(open('/tmp/f').read())"
        result = score(program, row, python=python)
        assert kinds(result) == ["pass"], result[2]
    finally:
        for mount in mounts:
            subprocess.run(["umount", "-l", str(mount)], check=False)
        if place in ("under /home", "under /work"):
            shutil.rmtree(folder.parent, ignore_errors=True)


def test_a_checkout_in_a_path_with_spaces_under_tmp_runs_the_jail(tmp_path):
    """The launcher runs jail/__main__.py from wherever the plugin is installed or checked out."""
    import nanoverl_code
    checkout = tmp_path / "a checkout" / "src"
    shutil.copytree(Path(nanoverl_code.__file__).parent, checkout / "nanoverl_code")
    code = ("import nanoverl_code, sys; from nanoverl_code.sandbox import run_tests; "
            "assert 'a checkout' in nanoverl_code.__file__; "
            "print(run_tests('print(6 * 7)', 'stdio', [{'stdin': ''}])[0].stdout.decode(), end='')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(checkout)})
    assert proc.returncode == 0 and proc.stdout == "42\n", proc.stderr[-2000:]


@pytest.mark.parametrize("place", ["a path with spaces", "a mount point", "a folder only root can search"])
@pytest.mark.usefixtures("no_leftovers")
def test_the_temporary_folder_anywhere(tmp_path, monkeypatch, place):
    """The launch's own folder goes to TMPDIR: one with spaces, a mount point, or one in a folder others
    cannot search (pytest's own: rlimits mode, whose programs run as another uid, then takes /tmp)."""
    if place == "a mount point" and not ROOT:
        pytest.skip("mounts need root")
    base = Path(f"/tmp/nanoverl-test-{os.getpid()}") if place != "a folder only root can search" else tmp_path
    base.mkdir(mode=0o755, exist_ok=True)
    folder = _mounted(base / "tmp") if place == "a mount point" else base / "temp with spaces"
    folder.mkdir(exist_ok=True)
    monkeypatch.setenv("TMPDIR", str(folder))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    try:
        for settings in ({}, RLIMITS if ROOT and os.path.exists("/usr/bin/python3") else {}):
            assert kinds(score("print(5)", SUM_ROW, **settings)) == ["pass"]
        assert list(folder.iterdir()) == []
    finally:
        if place == "a mount point":
            subprocess.run(["umount", "-l", str(folder)], check=False)
        if base != tmp_path:
            shutil.rmtree(base, ignore_errors=True)


def test_the_interpreter_is_the_base_installation_unless_one_is_named():
    exe, binds = interpreter("")
    assert exe == os.path.realpath(sys.executable) and sys.base_prefix in binds
    exe, binds = interpreter(sys.executable)                  # a venv's python: its packages too
    assert sys.prefix in binds and sys.base_prefix in binds
    row = {"ground_truth": {"inputs": [""], "outputs": [sys.prefix]}}
    program = "```python\nimport sys\nprint(sys.prefix)\n```"
    assert score_row_default(program, row, python=sys.executable) == 1.0
    assert score_row_default(program, row) == float(sys.prefix == sys.base_prefix)


def score_row_default(response: str, row: dict, **settings) -> float:
    from nanoverl_code.rewards import code
    return code("", response, row, CodeSettings(**settings))["score"]



AS_NOBODY = r"""
import json, os, sys
sys.path[:0] = sys.argv[1:]
from nanoverl_code import sandbox
out = {"uid": os.getuid(), "execution": sandbox.probe("namespaces", "", "execution"),
       "namespaces": sandbox.probe("namespaces", "", "process"), "rlimits": sandbox.probe("rlimits", "", "process")}
for isolation in ("namespaces", "rlimits"):
    seen = sandbox.run_tests("import os\nprint(os.getuid(), len([p for p in os.listdir('/proc') if p.isdigit()]))",
                             "stdio", [{"stdin": ""}], isolation=isolation, accounting="process")[0]
    checked = sandbox.run_tests("def add(a, b):\n    return a + b", "assert",
                                [{"code": "assert add(2, 3) == 5"}, {"code": "assert abs(add(1, 1)) == 3"}],
                                isolation=isolation, accounting="process")
    out[isolation + "_run"] = [seen.kind, seen.stdout.decode()] + [o.kind for o in checked]
print(json.dumps(out))
"""


@pytest.mark.skipif(not (ROOT and os.path.exists("/usr/bin/python3") and shutil.which("setpriv")),
                    reason="runs the reward's side as another user: needs root, setpriv and /usr/bin/python3")
def test_as_another_user_the_sandbox_runs_in_a_user_namespace_and_says_what_it_cannot_limit():
    """The reward's side as `nobody`, on the system interpreter: the programs run in a user namespace as one's
    own uid (rlimits mode under Landlock); per-execution limits are refused with the reason and the way out."""
    import attrs
    import nanoverl_code
    paths = [str(Path(nanoverl_code.__file__).parents[1]), str(Path(attrs.__file__).parents[1])]
    for path in paths:  # every folder above must be searchable by others
        if not all(os.stat(p).st_mode & 0o001 for p in [path, *map(str, Path(path).parents)]):
            pytest.skip(f"{path} is not readable by another user")
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c",
                           AS_NOBODY, *paths], capture_output=True, text=True, timeout=120, cwd="/",
                          env={"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["uid"] == 65534 and out["namespaces"] == "" and "limits_per = \"process\"" in out["execution"]
    assert out["namespaces_run"] == ["ok", "65534 2\n", "ok", "wrong_answer"]
    if out["rlimits"] == "":  # Landlock ABI 6 or later
        assert out["rlimits_run"][0] == "ok" and out["rlimits_run"][2:] == ["ok", "wrong_answer"]
    else:
        assert "Landlock ABI 6" in out["rlimits"]
