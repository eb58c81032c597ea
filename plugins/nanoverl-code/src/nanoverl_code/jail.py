"""The sandbox's own processes: run as `python -I -S -B jail.py` by sandbox.py, stdlib only.

One launch scores one program against the tests of one row. Reading a spec (JSON) from stdin, it:

    launcher  unshare(2): new mount, PID, network, IPC and UTS namespaces (and a user namespace when not
              root); forks the namespace's init; dies with the reward worker (PR_SET_PDEATHSIG)
    init      PID 1 of the new PID namespace: builds a read-only root (tmpfs with read-only binds of /usr,
              /lib*, /bin, the interpreter's prefix, a few /etc files, /dev/null & co, a fresh /proc) and
              pivots into it; then per test case: a fresh tmpfs /work, the program's process (and, for
              assert tests, the checker's), a wall-clock deadline, the output limit, and at the end
              kill(-1, SIGKILL) of everything else in the namespace. Each test's outcome is one JSON line
              on stdout. When init exits the kernel kills whatever is left in the namespace.
    program   a fresh interpreter (execve: nothing of init's memory, no inherited fds but 0-5, a clean
              environment), in its own session, under rlimits, as an unprivileged uid with no capabilities
              and no_new_privs, running BOOT: it reads the program from fd 3 and runs it; for call and
              assert tests it then answers calls of its functions on fds 4/5 with plain data.
    checker   (assert tests) a fork of init before any program runs, unprivileged, non-dumpable (the
              program cannot read or trace it): it runs the row's test code with every function of the
              program replaced by a proxy that calls it in the program's process, values crossing as
              plain data (`encode`/`decode`). Only the checker and init hold the tests and the verdict pipe.

With "isolation": "rlimits" there are no namespaces: the same processes on the host, under rlimits, in
a fresh host directory, as a fresh uid when root (see docs/code.md for what that does not stop).

Exit statuses of BOOT that init reads: 97 the program does not compile, 98 MemoryError, 96 exec failed.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import resource
import select
import shutil
import signal
import struct
import sys
import tempfile
import time

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 36, 38
SYSCALLS = {"x86_64": {"pivot_root": 155, "capset": 126, "keyctl": 250},
            "aarch64": {"pivot_root": 41, "capset": 91, "keyctl": 219}}
EXIT_COMPILE, EXIT_MEMORY, EXIT_EXEC = 97, 98, 96
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives")
DEVICES = ("null", "zero", "full", "random", "urandom")
WORKS = ("/work", "/sandbox", "/box")
"""Where the execution's tmpfs goes: the first of these that no mounted folder of the host is under or above."""

# ---- plain data across the process boundary ------------------------------------------------------------------
# JSON, with tags for what JSON lacks: {"__tuple__": [...]}, {"__set__": [...]}, {"__frozenset__": [...]},
# {"__bytes__": "hex"}, {"__complex__": [re, im]}, {"__dict__": [[k, v], ...]} (a dict whose keys are not all
# strings, or one that looks like a tag). Floats keep nan/inf (Python's JSON). Anything else does not cross.
TAGS = ("__tuple__", "__set__", "__frozenset__", "__bytes__", "__complex__", "__dict__")
CODEC = r'''
class Uncarried(TypeError):
    pass

def encode(v, depth=0):
    if depth > 100:
        raise Uncarried("nested too deeply")
    t = type(v)
    if v is None or t in (bool, int, float, str):
        return v
    if t is list:
        return [encode(x, depth + 1) for x in v]
    if t is tuple:
        return {"__tuple__": [encode(x, depth + 1) for x in v]}
    if t in (set, frozenset):
        items = [encode(x, depth + 1) for x in v]
        return {"__set__" if t is set else "__frozenset__": items}
    if t is bytes:
        return {"__bytes__": v.hex()}
    if t is complex:
        return {"__complex__": [v.real, v.imag]}
    if t is dict:
        if all(type(k) is str for k in v) and not (len(v) == 1 and next(iter(v)) in TAGS):
            return {k: encode(x, depth + 1) for k, x in v.items()}
        return {"__dict__": [[encode(k, depth + 1), encode(x, depth + 1)] for k, x in v.items()]}
    raise Uncarried(f"a value of type {t.__name__} is not plain data")

def decode(v):
    if isinstance(v, list):
        return [decode(x) for x in v]
    if isinstance(v, dict):
        if len(v) == 1:
            (tag, x), = v.items()
            if tag == "__tuple__":
                return tuple(decode(y) for y in x)
            if tag == "__set__":
                return {decode(y) for y in x}
            if tag == "__frozenset__":
                return frozenset(decode(y) for y in x)
            if tag == "__bytes__":
                return bytes.fromhex(x)
            if tag == "__complex__":
                return complex(float(x[0]), float(x[1]))
            if tag == "__dict__":
                return {decode(k): decode(y) for k, y in x}
        return {k: decode(x) for k, x in v.items()}
    if v is None or type(v) in (bool, int, float, str):
        return v
    raise Uncarried(f"not plain data: {type(v).__name__}")

def send(fd, obj):
    data = json.dumps(obj).encode()
    data = len(data).to_bytes(4, "big") + data
    while data:
        data = data[os.write(fd, data):]

def recv(fd, limit):
    head = b""
    while len(head) < 4:
        chunk = os.read(fd, 4 - len(head))
        if not chunk:
            return None
        head += chunk
    size = int.from_bytes(head, "big")
    if size > limit:
        raise Uncarried(f"a message of {size} bytes is over the output limit")
    body = b""
    while len(body) < size:
        chunk = os.read(fd, min(1 << 20, size - len(body)))
        if not chunk:
            return None
        body += chunk
    return json.loads(body)
'''
exec(CODEC)

BOOT = r'''
import json, os, sys
TAGS = %r
''' % (TAGS,) + CODEC + r'''
def _load():
    src = b""
    while True:
        chunk = os.read(3, 1 << 16)
        if not chunk:
            break
        src += chunk
    os.close(3)
    try:
        return compile(src, "solution.py", "exec")
    except MemoryError:
        os._exit(98)
    except BaseException as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
        os._exit(97)

def _serve(module, limit):
    names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("__")]
    send(5, {"names": names})
    while True:
        request = recv(4, limit)
        if request is None:
            return
        try:
            owner, _, attr = request["name"].rpartition(".")
            if not owner and not hasattr(module, attr) and hasattr(module, "Solution"):
                owner = "Solution"  # LeetCode style, as verl's prime_code: a method of class Solution
            fn = getattr(getattr(module, owner)(), attr) if owner else getattr(module, attr)
            value = fn(*decode(request["args"]), **decode(request.get("kwargs", {})))
        except MemoryError:
            os._exit(98)
        except Exception as e:
            reply = {"raised": [type(e).__name__, str(e)[:300]]}
        else:
            try:
                reply = {"value": encode(value)}
            except Uncarried as e:
                reply = {"uncarried": str(e)}
        send(5, reply)

_mode, _limit = sys.argv[1], int(sys.argv[2])
_code = _load()
import types
_module = types.ModuleType("__main__" if _mode == "stdio" else "solution")
sys.modules[_module.__name__] = _module
try:
    exec(_code, _module.__dict__)
except MemoryError:
    os._exit(98)
if _mode != "stdio":
    _serve(_module, _limit)
'''


# ---- system calls ----------------------------------------------------------------------------------------------
libc = ctypes.CDLL(None, use_errno=True)
NUMBERS = SYSCALLS.get(platform.machine(), {})


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = (lambda s: s.encode() if s is not None else None)
    _check(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {source} on {target}")


def prctl(option: int, value: int) -> None:
    _check(libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl({option})")


def drop_capabilities() -> None:
    """capset(2) to no capabilities at all (a process that keeps its uid keeps them otherwise)."""
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(libc.syscall(NUMBERS["capset"], header, data), "capset")


def _bind_flags(source: str) -> int:
    """The flags a read-only bind of `source` must keep (a user namespace may not clear locked ones)."""
    f = os.statvfs(source).f_flag
    flags = MS_RDONLY | MS_NOSUID | MS_NODEV
    for st, ms in ((os.ST_NOEXEC, MS_NOEXEC), (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME),
                   (os.ST_RELATIME, MS_RELATIME)):
        if f & st:
            flags |= ms
    return flags


def _replicate(path: str, root: str) -> None:
    """`path` of the host, read-only at the same place under `root` (a symlink as a symlink)."""
    target = root + path
    if os.path.islink(path):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.lexists(target):
            os.symlink(os.readlink(path), target)
        return
    if not os.path.exists(path) or os.path.exists(target) and os.path.ismount(target):
        return
    if os.path.isdir(path):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "w").close()
    mount(path, target, None, MS_BIND | MS_REC)
    mount(None, target, None, MS_REMOUNT | MS_BIND | _bind_flags(path))


def build_root(spec: dict) -> None:
    """The program's filesystem: a tmpfs root with read-only binds, then pivot_root into it."""
    root = spec["root"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=0755")
    for path in (*SYSTEM_DIRS, *spec["binds"], *SYSTEM_FILES):
        if path in SYSTEM_DIRS or not any(path.startswith(d + "/") for d in SYSTEM_DIRS):
            _replicate(path, root)
    os.makedirs(root + "/dev", exist_ok=True)
    mount("tmpfs", root + "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755")
    for name in DEVICES:
        open(f"{root}/dev/{name}", "w").close()
        mount(f"/dev/{name}", f"{root}/dev/{name}", None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{root}/dev/{name}")
    mount(None, root + "/dev", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC)
    os.makedirs(root + "/proc", exist_ok=True)
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.makedirs(root + spec["work"], exist_ok=True)
    os.symlink(spec["work"], root + "/tmp")
    os.makedirs(root + "/.old", exist_ok=True)
    _check(libc.syscall(NUMBERS["pivot_root"], root.encode(), (root + "/.old").encode()), "pivot_root")
    os.chdir("/")
    _check(libc.umount2(b"/.old", MNT_DETACH), "umount /.old")
    os.rmdir("/.old")
    mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    libc.sethostname(b"sandbox", 7)


# ---- the launcher and init -----------------------------------------------------------------------------------
def launch(spec: dict) -> int:
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != spec["parent"]:
        return 1
    uid, gid = os.getuid(), os.getgid()
    spec["uid"] = 1_000_000 + os.getpid() if uid == 0 else uid
    """Root: a uid no account and no other process has (this launcher's pid is unique while it runs), so
    RLIMIT_NPROC counts this execution alone and no other process can be signalled. Not root: one's own
    uid, inside a user namespace of this execution's own."""
    if spec["isolation"] == "rlimits":
        return Init(spec).run()
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | (CLONE_NEWUSER if uid else 0)
    _check(libc.unshare(flags), "unshare")
    if uid:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            code = Init(spec).run()
        except BaseException as exc:
            print(f"sandbox: {exc}", file=sys.stderr, flush=True)
            code = 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 3


class Init:
    """PID 1 of the namespaces (or, with rlimits only, the launcher itself): runs the tests one by one."""

    def __init__(self, spec: dict):
        self.spec, self.limits = spec, spec["limits"]
        self.uid = spec["uid"]
        self.namespaces = spec["isolation"] == "namespaces"
        self.root = os.getuid() == 0
        self.out = os.dup(1)
        self.max_bytes = int(self.limits["max_output_bytes"])
        self.work = spec["work"] = next(w for w in WORKS if not any(
            b == w or b.startswith(w + "/") or w.startswith(b + "/") for b in spec["binds"]))

    def run(self) -> int:
        prctl(PR_SET_DUMPABLE, 0)
        if self.namespaces:
            if os.getpid() != 1:
                raise RuntimeError("the PID namespace was not made")
            build_root(self.spec)
        else:
            prctl(PR_SET_CHILD_SUBREAPER, 1)
            os.chmod(self.spec["root"], 0o711)  # the work folders inside: reachable by the execution's uid only
        fd = os.open("/dev/null", os.O_RDWR)
        os.dup2(fd, 0)
        os.dup2(fd, 1)
        os.close(fd)
        for i, test in enumerate(self.spec["tests"]):
            result = self.run_test(test)
            os.write(self.out, (json.dumps({"i": i, **result}) + "\n").encode())
        return 0

    # ---- one test case ----
    def fresh_workdir(self) -> None:
        if self.namespaces:
            if os.path.ismount(self.work):
                _check(libc.umount2(self.work.encode(), MNT_DETACH), "umount the old work folder")
            mount("tmpfs", self.work, "tmpfs", MS_NOSUID | MS_NODEV,
                  f"size={int(self.limits['disk_mb'])}m,nr_inodes=10000,mode=0700,uid={self.uid},gid={self.uid}")
        else:
            self.work = tempfile.mkdtemp(prefix="work-", dir=self.spec["root"])
            if self.root:
                os.chown(self.work, self.uid, self.uid)

    def run_test(self, test: dict) -> dict:
        mode = self.spec["mode"]
        self.fresh_workdir()
        program = _memfd(self.spec["program"].encode())
        stdin = _memfd(test.get("stdin", "").encode())
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        if mode == "call":  # the one request, readable at once: init never blocks on a program that does not read
            req_r, req_w = _memfd(_message({"name": self.spec["fn_name"], "args": test["args"]})), None
        else:
            req_r, req_w = os.pipe()
        rsp_r, rsp_w = os.pipe()
        start = time.monotonic()
        a = self.spawn_program({0: stdin, 1: out_w, 2: err_w, 3: program, 4: req_r, 5: rsp_w})
        checker = verdict_r = None
        if mode == "assert":
            verdict_r, verdict_w = os.pipe()
            checker = self.spawn_checker(test, req_w, rsp_r, verdict_w)
            os.close(verdict_w)
        for fd in (program, stdin, out_w, err_w, req_r, rsp_w):
            os.close(fd)
        if mode == "stdio":
            os.close(req_w)
            req_w = None
        try:
            return self.watch(mode, a, checker, out_r, err_r, rsp_r if mode == "call" else None, verdict_r, start)
        finally:
            for fd in (out_r, err_r, rsp_r, verdict_r, req_w):
                if fd is not None:
                    os.close(fd)
            self.kill_all([a, checker])
            if not self.namespaces:
                shutil.rmtree(self.work, ignore_errors=True)

    def watch(self, mode: str, a: int, checker: int | None, out_r: int, err_r: int, rsp_r: int | None,
              verdict_r: int | None, start: float) -> dict:
        """Read the program's output until the test ends: the program exits (stdio, call), the checker
        exits (assert), the deadline passes or the output grows past the limit."""
        deadline = start + float(self.limits["wall_s"])
        streams = {out_r: bytearray(), err_r: bytearray()}
        data = {fd: bytearray() for fd in (rsp_r, verdict_r) if fd is not None}
        end = os.pidfd_open(checker if mode == "assert" else a)
        a_fd = os.pidfd_open(a)
        a_status = None
        try:
            open_fds = [*streams, *data, end] + ([a_fd] if mode == "assert" else [])
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return self.result("timeout", f"over the wall-clock limit of {self.limits['wall_s']} s", start)
                ready, _, _ = select.select(open_fds, [], [], left)
                for fd in ready:
                    if fd == end:
                        open_fds.remove(fd)
                    elif fd == a_fd:
                        open_fds.remove(fd)
                        a_status = os.wait4(a, 0)
                    else:
                        chunk = os.read(fd, 1 << 16)
                        if not chunk:
                            open_fds.remove(fd)
                        buffer = streams.get(fd, data.get(fd))
                        buffer += chunk
                        if sum(len(b) for b in (*streams.values(), *data.values())) > self.max_bytes:
                            return self.result("output_limit", f"over {self.max_bytes} bytes of output", start)
                if end not in open_fds:
                    break
            for fd in (*streams, *data):  # what is already in the pipes
                os.set_blocking(fd, False)
                try:
                    while (chunk := os.read(fd, 1 << 16)) and len(streams.get(fd, data.get(fd))) <= self.max_bytes:
                        streams.get(fd, data.get(fd)).extend(chunk)
                except BlockingIOError:
                    pass
        finally:
            os.close(end)
            os.close(a_fd)
        stdout, stderr = bytes(streams[out_r]), bytes(streams[err_r])
        if mode == "assert":
            verdict = _frame(bytes(data[verdict_r]))
            if verdict is None:
                return self.result("runtime_error", "the checker died (the program killed it)", start, stderr)
            if verdict["kind"] != "gone":
                return self.result(verdict["kind"], verdict.get("detail", ""), start, stderr)
            if a_status is None:  # its real status if it has exited, else killed now
                try:
                    os.kill(a, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                a_status = os.wait4(a, 0)
            return self.exit_kind(a_status, start, stderr, gone=True)
        a_status = os.wait4(a, 0)
        kind = self.exit_kind(a_status, start, stderr)
        if kind["kind"] != "ok":
            return kind
        if mode == "stdio":
            import base64
            return {**kind, "stdout": base64.b64encode(stdout).decode()}
        reply = _frame(bytes(data[rsp_r]), skip=1)
        if reply is None:
            return self.result("runtime_error", "the program exited before it answered the call", start, stderr)
        return {**kind, "reply": reply}

    def exit_kind(self, status, start: float, stderr: bytes, gone: bool = False) -> dict:
        """The kind of a finished program process from its wait status and CPU time."""
        if status is None:
            return self.result("runtime_error", "the program's process went away", start, stderr)
        _, code, usage = status
        cpu = usage.ru_utime + usage.ru_stime
        if os.WIFSIGNALED(code):
            sig = os.WTERMSIG(code)
            if sig == signal.SIGXCPU or sig == signal.SIGKILL and cpu >= float(self.limits["cpu_s"]) - 0.05:
                return self.result("timeout", f"over the CPU limit of {self.limits['cpu_s']} s", start, stderr)
            return self.result("runtime_error", f"killed by {signal.Signals(sig).name}", start, stderr)
        code = os.WEXITSTATUS(code)
        tail = stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        if code == EXIT_COMPILE:
            return self.result("compile_error", tail[0], start, stderr)
        if code == EXIT_MEMORY or tail[0].startswith("MemoryError"):
            return self.result("memory", f"over the memory limit of {self.limits['memory_mb']} MiB", start, stderr)
        if code == EXIT_EXEC:
            return self.result("sandbox_refusal", tail[0] or "the interpreter could not be started", start, stderr)
        if code != 0:
            return self.result("runtime_error", f"exit status {code}: {tail[0]}", start, stderr)
        if gone:
            return self.result("runtime_error", "the program exited before the tests ran", start, stderr)
        return self.result("ok", "", start, stderr)

    @staticmethod
    def result(kind: str, detail: str, start: float, stderr: bytes = b"") -> dict:
        return {"kind": kind, "detail": detail[:300], "seconds": round(time.monotonic() - start, 4),
                "stderr": stderr[-1000:].decode(errors="replace")}

    # ---- processes ----
    def limit_and_drop(self, processes: int) -> None:
        """In a child before it runs anything else: its own session, rlimits, an unprivileged identity."""
        os.setsid()
        lim = self.limits
        for which, value in ((resource.RLIMIT_CPU, int(lim["cpu_s"] + 0.999)),
                             (resource.RLIMIT_AS, int(lim["memory_mb"]) << 20),
                             (resource.RLIMIT_NPROC, processes),
                             (resource.RLIMIT_FSIZE, int(lim["file_size_mb"]) << 20),
                             (resource.RLIMIT_NOFILE, int(lim["open_files"])),
                             (resource.RLIMIT_CORE, 0)):
            hard = value + 1 if which == resource.RLIMIT_CPU else value
            inherited = resource.getrlimit(which)[1]  # e.g. reward.memory_limit_mb on the worker: never above it
            if inherited != resource.RLIM_INFINITY:
                value, hard = min(value, inherited), min(hard, inherited)
            resource.setrlimit(which, (value, hard))
        if "keyctl" in NUMBERS:
            libc.syscall(NUMBERS["keyctl"], 1, None)  # KEYCTL_JOIN_SESSION_KEYRING: a fresh, empty session keyring
        if self.root:
            os.setgroups([])
            os.setresgid(self.uid, self.uid, self.uid)
            os.setresuid(self.uid, self.uid, self.uid)
        elif self.namespaces:
            drop_capabilities()
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        prctl(PR_SET_DUMPABLE, 0)

    def spawn_program(self, fds: dict[int, int]) -> int:
        pid = os.fork()
        if pid:
            return pid
        try:
            high = {target: _fcntl_dup(fd) for target, fd in fds.items()}
            for target, fd in high.items():
                os.dup2(fd, target)
            os.closerange(len(fds), 1 << 16)
            self.limit_and_drop(int(self.limits["processes"]))
            os.chdir(self.work)
            env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": self.work, "TMPDIR": self.work,
                   "LC_ALL": "C.UTF-8"}
            python = self.spec["python"]
            os.execve(python, [python, "-I", "-B", "-c", BOOT, self.spec["mode"], str(self.max_bytes)], env)
        except BaseException as exc:
            try:
                os.write(2, f"cannot start {self.spec['python']}: {exc}".encode())
            except OSError:
                pass
        os._exit(EXIT_EXEC)

    def spawn_checker(self, test: dict, req_w: int, rsp_r: int, verdict_w: int) -> int:
        pid = os.fork()
        if pid:
            return pid
        code = 0
        try:
            req, rsp, verdict = _fcntl_dup(req_w), _fcntl_dup(rsp_r), _fcntl_dup(verdict_w)
            keep = {req, rsp, verdict}
            null = os.open("/dev/null", os.O_RDWR)
            for target in (0, 1, 2):
                os.dup2(null, target)
            for fd in range(3, 1 << 10):
                if fd not in keep:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            self.limit_and_drop(1)
            os.chdir("/")
            send(verdict, check(self.spec, test, req, rsp, self.max_bytes))
        except BaseException:
            code = 1
        os._exit(code)

    def kill_all(self, pids: list[int | None]) -> None:
        """Every process of this test gone: the whole PID namespace but init, or (rlimits only) the process
        groups and, as root, every process of the execution's uid."""
        if self.namespaces:
            assert os.getpid() == 1  # kill(-1) outside a PID namespace would reach the whole machine
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                pass
        else:
            for pid in pids:
                if pid:
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
            if self.root:
                killer = os.fork()
                if killer == 0:
                    try:
                        os.setresuid(self.uid, self.uid, self.uid)
                        os.kill(-1, signal.SIGKILL)  # as the execution's uid: only its processes
                    except BaseException:
                        pass
                    os._exit(0)
        # Reap: in a PID namespace everything is dead now; with rlimits only, a process that left its
        # group (and, not root, its uid's kill) may live on: stop waiting for it after a moment.
        until = time.monotonic() + (3600 if self.namespaces else 0.2)
        while time.monotonic() < until:
            try:
                pid, _ = os.waitpid(-1, 0 if self.namespaces else os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.01)


def check(spec: dict, test: dict, req: int, rsp: int, limit: int) -> dict:
    """The checker: the row's test code against proxies of the program's functions; the verdict as a dict."""
    import builtins

    class Gone(BaseException):
        """The program's process is gone (or answered nonsense): init reads its exit status."""

    class Raised:
        pass

    try:
        hello = recv(rsp, limit)
    except Exception:
        hello = None
    if not isinstance(hello, dict) or not isinstance(hello.get("names"), list):
        return {"kind": "gone"}

    def proxy(name: str):
        def call(*args, **kwargs):
            try:
                request = {"name": name, "args": encode(list(args)), "kwargs": encode(kwargs)}
            except Uncarried as exc:
                raise Carry(str(exc)) from None
            try:
                send(req, request)
                reply = recv(rsp, limit)
            except (OSError, ValueError, Uncarried):
                reply = None
            if not isinstance(reply, dict):
                raise Gone()
            if "value" in reply:
                try:
                    return decode(reply["value"])
                except Exception:
                    raise Gone() from None
            if "raised" in reply:
                kind, message = (str(x) for x in reply["raised"][:2])
                cls = getattr(builtins, kind, None)
                cls = cls if isinstance(cls, type) and issubclass(cls, Exception) else RuntimeError
                exc = cls(message)
                exc.from_program = kind
                raise exc
            raise Wrong(f"{name} returned {reply.get('uncarried', 'no value')}")
        call.__name__ = name
        return call

    class Carry(BaseException):
        pass

    class Wrong(BaseException):
        pass

    scope: dict = {"__name__": "__test__"}
    entry = spec.get("entry") or ""
    try:
        exec(compile(spec.get("setup") or "", "setup.py", "exec"), scope)
        for name in hello["names"]:
            if isinstance(name, str) and (name == entry or name not in scope):
                scope[name] = proxy(name)
        if entry and entry not in scope:
            scope[entry] = proxy(entry)
        exec(compile(test["code"], "test.py", "exec"), scope)
        if entry:
            scope["check"](scope[entry])
    except Gone:
        return {"kind": "gone"}
    except Carry as exc:
        return {"kind": "sandbox_refusal", "detail": f"the test passes a value the sandbox cannot carry: {exc}"}
    except Wrong as exc:
        return {"kind": "wrong_answer", "detail": str(exc)}
    except AssertionError as exc:
        return {"kind": "wrong_answer", "detail": f"AssertionError: {exc}"}
    except BaseException as exc:
        origin = getattr(exc, "from_program", None)
        if origin == "MemoryError":
            return {"kind": "memory", "detail": "MemoryError in the program"}
        if origin:
            return {"kind": "runtime_error", "detail": f"the program raised {origin}: {exc}"}
        return {"kind": "wrong_answer", "detail": f"{type(exc).__name__}: {exc}"}
    return {"kind": "ok"}


def _memfd(data: bytes) -> int:
    fd = os.memfd_create("nanoverl-code")
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _message(obj) -> bytes:
    data = json.dumps(obj).encode()
    return len(data).to_bytes(4, "big") + data


def _fcntl_dup(fd: int) -> int:
    import fcntl
    return fcntl.fcntl(fd, fcntl.F_DUPFD, 100)


def _frame(data: bytes, skip: int = 0) -> dict | None:
    """The message after `skip` messages in a buffer of length-prefixed JSON messages, or None."""
    try:
        for _ in range(skip + 1):
            size = struct.unpack(">I", data[:4])[0]
            body, data = data[4:4 + size], data[4 + size:]
            if len(body) < size:
                return None
        value = json.loads(body)
        return value if isinstance(value, dict) else None
    except (struct.error, ValueError, RecursionError):
        return None


def main() -> int:
    spec = json.loads(sys.stdin.buffer.read())
    try:
        return launch(spec)
    except BaseException as exc:
        print(f"sandbox: {exc}", file=sys.stderr, flush=True)
        return 3


if __name__ == "__main__":
    sys.exit(main())
