"""The jail's processes, from the launcher to the program (see the package's docstring for the tree).

One launch scores one program against the test cases of one row; the spec (JSON on stdin) comes from
sandbox.run_tests; each test case's outcome is one JSON line on stdout.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import resource
import select
import signal
import struct
import sys
import time

from .checker import check
from .kernel import (CLONE_NEWCGROUP, CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUSER,
                     CLONE_NEWUTS, DEVICES, MNT_DETACH, MS_NODEV, MS_NOEXEC, MS_NOSUID, PR_SET_CHILD_SUBREAPER,
                     PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG, SYSTEM_DIRS, SYSTEM_FILES, Accounting,
                     bind_read_only, build_root, confine, drop_capabilities, fresh_uids, install_seccomp, libc,
                     mount, prctl, under_tmp, unshare)
from .wire import EXIT_COMPILE, EXIT_EXEC, EXIT_MEMORY, frame, frame_bytes, message, send

POLL_S = 0.02
"""How often a test case reads its cgroup's CPU time and OOM kills while the program runs."""
CASE_SLACK_S = 5.0
"""What init waits for a test case beyond its wall-clock limit before it kills the case's process."""
REPORT = struct.Struct("<id")
"""What the reaper reports when the program ends: its wait status and its own CPU seconds (wait4)."""


def outcome(kind: str, detail: str, start: float, stderr: bytes = b"", cpu: float | None = None) -> dict:
    return {"kind": kind, "detail": detail[:300], "seconds": round(time.monotonic() - start, 4),
            "cpu_s": None if cpu is None else round(cpu, 4), "stderr": stderr[-1000:].decode(errors="replace")}


def launch(spec: dict) -> int:
    """The launcher: on the host, then (namespaces) unshare and fork the row's init."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != spec["parent"]:
        return 1
    uid, gid = os.getuid(), os.getgid()
    spec["uids"] = fresh_uids()
    parents = [(os.open(path, os.O_RDONLY | os.O_DIRECTORY), controllers)
               for path, controllers in (spec.get("cgroup") or {}).get("parents", [])]
    if spec["isolation"] == "rlimits":
        return Init(spec, parents).run()
    unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | (CLONE_NEWUSER if uid else 0))
    if uid:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            code = Init(spec, parents).run()
        except BaseException as exc:
            print(f"sandbox: {exc}", file=sys.stderr, flush=True)
            code = 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 3


class Init:
    """PID 1 of the row's namespaces (or, with rlimits only, the launcher itself): builds the root once, then
    runs the test cases one by one, each in a process of its own (Case), and writes their outcomes."""

    def __init__(self, spec: dict, parents: list[tuple[int, list[str]]]):
        self.spec, self.parents = spec, parents
        self.namespaces = spec["isolation"] == "namespaces"

    def run(self) -> int:
        prctl(PR_SET_DUMPABLE, 0)
        if self.namespaces:
            if os.getpid() != 1:
                raise RuntimeError("the PID namespace was not made")
            build_root(self.spec)
        else:
            prctl(PR_SET_CHILD_SUBREAPER, 1)
            os.chmod(self.spec["root"], 0o711)  # the work folders inside: reachable by the execution's uid only
        out = os.dup(1)
        fd = os.open("/dev/null", os.O_RDWR)
        os.dup2(fd, 0)
        os.dup2(fd, 1)
        os.close(fd)
        for i, test in enumerate(self.spec["tests"]):
            result = self.run_case(i, test, out)
            os.write(out, (json.dumps({"i": i, **result}) + "\n").encode())
        return 0

    def run_case(self, i: int, test: dict, out: int) -> dict:
        """The outcome of one test case, as its own process reports it; nothing the program wrote reaches init."""
        read, write = os.pipe()
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(read)
                os.close(out)
                prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
                os.write(write, json.dumps(Case(self.spec, self.parents, i, test).run()).encode())
            except BaseException as exc:
                try:
                    os.write(2, f"sandbox: test case {i}: {exc}\n".encode())
                except OSError:
                    pass
                code = 3
            os._exit(code)
        os.close(write)
        data, deadline = b"", start + float(self.spec["limits"]["wall_s"]) + CASE_SLACK_S
        try:
            while (left := deadline - time.monotonic()) > 0:
                if not select.select([read], [], [], left)[0]:
                    continue
                chunk = os.read(read, 1 << 20)
                if not chunk:
                    break
                data += chunk
            else:
                os.kill(pid, signal.SIGKILL)  # its reaper dies with it (PR_SET_PDEATHSIG), and the namespace
        finally:
            os.close(read)
            os.waitpid(pid, 0)
        try:
            return json.loads(data)
        except ValueError:
            return outcome("sandbox_refusal", "the test case's process failed (its error is on stderr)", start)


class Case:
    """One test case, in a process of its own: its namespaces, /tmp, cgroup, checker and reaper; the watch."""

    def __init__(self, spec: dict, parents: list[tuple[int, list[str]]], index: int, test: dict):
        self.spec, self.test = spec, test
        self.limits, self.mode = spec["limits"], spec["mode"]
        self.namespaces = spec["isolation"] == "namespaces"
        self.root = os.getuid() == 0
        self.uid, self.checker_uid = spec["uids"]
        self.max_bytes = int(self.limits["max_output_bytes"])
        version = (spec.get("cgroup") or {}).get("version")
        self.cgroup = Accounting(version, parents, f"t{index}", self.limits) if parents else None
        self.cpu = None  # the program's own CPU seconds, from the reaper (without a cgroup)

    def run(self) -> dict:
        if self.namespaces:
            unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS)
            self.fresh_tmp()
            self.work = "/tmp"
        else:
            import tempfile  # with rlimits only: the launcher's imports stay few
            prctl(PR_SET_CHILD_SUBREAPER, 1)  # what the program left running comes back here to be reaped
            self.work = tempfile.mkdtemp(prefix="work-", dir=self.spec["root"])
            if self.root:
                os.chown(self.work, self.uid, self.uid)
        try:
            return self.run_test()
        finally:
            if self.cgroup is not None:
                self.cgroup.remove()
            if self.namespaces:
                libc.umount2(b"/tmp", MNT_DETACH)
            else:
                import shutil
                shutil.rmtree(self.work, ignore_errors=True)

    def fresh_tmp(self) -> None:
        """An empty tmpfs on /tmp (`disk_mb`), owned by the program's uid: its cwd, home and temporary folder
        (/dev/shm points to it). The interpreter's folders under the host's /tmp (a venv there) are bound again
        inside it, read-only."""
        keep = [(path, os.open(path, os.O_PATH)) for path in self.spec["binds"] if under_tmp(path)
                and os.path.exists(path)]
        mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
              f"size={int(self.limits['disk_mb'])}m,nr_inodes=10000,mode=0700,uid={self.uid},gid={self.uid}")
        for path, fd in keep:
            os.makedirs(path, exist_ok=True)
            bind_read_only(f"/proc/self/fd/{fd}", path)
            os.close(fd)

    def result(self, kind: str, detail: str, start: float, stderr: bytes = b"") -> dict:
        cpu = self.cgroup.cpu_seconds() if self.cgroup is not None else self.cpu
        return outcome(kind, detail, start, stderr, cpu)

    # ---- the test case ----
    def run_test(self) -> dict:
        mode = self.mode
        program = _memfd(self.spec["program"].encode())
        stdin = _memfd(self.test.get("stdin", "").encode())
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        report_r, report_w = os.pipe()
        if mode == "call":  # the one request, readable at once: nobody blocks on a program that does not read
            req_r, req_w = _memfd(message({"name": self.spec["fn_name"], "args": self.test["args"]})), None
        else:
            req_r, req_w = os.pipe()
        rsp_r, rsp_w = os.pipe()
        checker = verdict_r = None
        if mode == "assert":
            verdict_r, verdict_w = os.pipe()
            checker = self.spawn_checker(req_w, rsp_r, verdict_w)
            os.close(verdict_w)
        if req_w is not None:
            os.close(req_w)
        if self.namespaces:
            unshare(CLONE_NEWPID)  # the reaper, forked next, is its PID 1
        start = time.monotonic()
        reaper = self.spawn_reaper({0: stdin, 1: out_w, 2: err_w, 3: program, 4: req_r, 5: rsp_w}, report_w)
        for fd in (program, stdin, out_w, err_w, req_r, rsp_w, report_w):
            os.close(fd)
        try:
            return self.watch(out_r, err_r, rsp_r if mode == "call" else None, verdict_r, report_r, checker, start)
        finally:
            for fd in (out_r, err_r, rsp_r, verdict_r, report_r):
                if fd is not None:
                    os.close(fd)
            self.end([reaper, checker])

    def end(self, pids: list[int | None]) -> None:
        """Every process of the test case gone and reaped. In namespaces, killing the reaper (PID 1 of the
        program's namespace) kills all of them. With rlimits: the reaper's process group (the program's), the
        cgroup, or as root every process of the execution's uid; this process is their subreaper."""
        for pid in pids:
            if pid:
                for kill in (os.kill, os.killpg):
                    try:
                        kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
        if self.namespaces:
            for pid in pids:
                try:
                    if pid:
                        os.waitpid(pid, 0)
                except ChildProcessError:  # the checker, reaped already for its exit status
                    pass
            return
        if self.cgroup is not None:
            self.cgroup.kill()
        elif self.root:
            killer = os.fork()
            if killer == 0:
                try:
                    os.setresuid(self.uid, self.uid, self.uid)
                    os.kill(-1, signal.SIGKILL)  # as the execution's uid: only its processes
                except BaseException:
                    pass
                os._exit(0)
        everything_killed = self.cgroup is not None or self.root  # else one that left the group may live on
        until = time.monotonic() + (60 if everything_killed else 0.2)
        while time.monotonic() < until:
            try:
                pid, _ = os.waitpid(-1, 0 if everything_killed else os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                time.sleep(0.01)

    def watch(self, out_r: int, err_r: int, rsp_r: int | None, verdict_r: int | None, report_r: int,
              checker: int | None, start: float) -> dict:
        """Read the program's output until the test ends: the program exits (stdio, call), the checker exits
        (assert), the deadline passes, the output grows past its limit, the cgroup's CPU time passes cpu_s or
        the kernel kills one of its processes for memory."""
        deadline = start + float(self.limits["wall_s"])
        buffers = {fd: bytearray() for fd in (out_r, err_r, rsp_r, verdict_r) if fd is not None}
        report = bytearray()
        end = verdict_r if self.mode == "assert" else report_r
        open_fds = [*buffers, report_r]
        while end in open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                return self.result("timeout", f"over the wall-clock limit of {self.limits['wall_s']} s", start)
            ready, _, _ = select.select(open_fds, [], [], min(left, POLL_S) if self.cgroup else left)
            for fd in ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    open_fds.remove(fd)
                elif fd == report_r:
                    report += chunk
                else:
                    buffers[fd] += chunk
                    if sum(map(len, buffers.values())) > self.max_bytes:
                        return self.result("output_limit", f"over {self.max_bytes} bytes of output", start)
            over = self.over_limit(start)
            if over:
                return over
        for fd in buffers:  # what is already in the pipes, up to the limit
            os.set_blocking(fd, False)
            try:
                while len(buffers[fd]) <= self.max_bytes and (chunk := os.read(fd, 1 << 16)):
                    buffers[fd] += chunk
            except BlockingIOError:
                pass
        stderr = bytes(buffers[err_r])
        if self.mode == "assert":
            return self.assert_outcome(bytes(buffers[verdict_r]), report, report_r, checker, start, deadline, stderr)
        kind = self.exit_kind(self.status(report), start, stderr)
        if kind["kind"] != "ok":
            return kind
        if self.mode == "stdio":
            return {**kind, "stdout": base64.b64encode(bytes(buffers[out_r])).decode()}
        reply = frame_bytes(bytes(buffers[rsp_r]), skip=1)
        if reply is None:
            return self.result("runtime_error", "the program exited before it answered the call", start, stderr)
        return {**kind, "reply": base64.b64encode(reply).decode()}

    def over_limit(self, start: float) -> dict | None:
        """A timeout or memory outcome once the cgroup's CPU time or OOM kills say so, else None."""
        if self.cgroup is None:
            return None
        if self.cgroup.oom_kills():
            return self.result("memory", self.memory_detail(), start)
        if self.cgroup.cpu_seconds() >= float(self.limits["cpu_s"]):
            return self.result("timeout", f"over the CPU limit of {self.limits['cpu_s']} s", start)
        return None

    def status(self, report: bytearray) -> int | None:
        """The program's wait status from the reaper's report (its CPU seconds kept), None without one."""
        if len(report) < REPORT.size:
            return None
        status, self.cpu = REPORT.unpack(bytes(report[:REPORT.size]))
        return status

    def assert_outcome(self, verdict_data: bytes, report: bytearray, report_r: int, checker: int, start: float,
                       deadline: float, stderr: bytes) -> dict:
        verdict = frame(verdict_data)
        if verdict is None:
            _, code = os.waitpid(checker, 0)
            if os.WIFSIGNALED(code) and os.WTERMSIG(code) in (signal.SIGXCPU, signal.SIGKILL):
                return self.result("timeout", f"the tests ran over the CPU limit of {self.limits['cpu_s']} s",
                                   start, stderr)
            return self.result("runtime_error", f"the checker ended without a verdict (wait status {code})", start,
                               stderr)
        if verdict.get("kind") != "gone":
            return self.result(str(verdict.get("kind")), str(verdict.get("detail", "")), start, stderr)
        # the program's process ended (or closed its pipes): its wait status tells how
        until = min(deadline, time.monotonic() + 1.0)
        while len(report) < REPORT.size and (left := until - time.monotonic()) > 0:
            if select.select([report_r], [], [], left)[0]:
                chunk = os.read(report_r, REPORT.size)
                if not chunk:
                    break
                report += chunk
        status = self.status(report)
        if status is None:
            return self.result("runtime_error", "the program stopped answering the calls", start, stderr)
        return self.exit_kind(status, start, stderr, gone=True)

    def memory_detail(self) -> str:
        return f"over the memory limit of {self.limits['memory_mb']} MiB"

    def exit_kind(self, status: int | None, start: float, stderr: bytes, gone: bool = False) -> dict:
        """The kind of a finished program from its wait status (and the cgroup's CPU time and memory)."""
        kind = self._exit_kind(status, start, stderr, gone)
        if kind["kind"] == "runtime_error" and self.cgroup is not None and self.cgroup.hit_limit():
            return self.result("memory", self.memory_detail() + f" ({kind['detail']})", start, stderr)
        return kind

    def _exit_kind(self, status: int | None, start: float, stderr: bytes, gone: bool) -> dict:
        if status is None:
            return self.result("runtime_error", "the program's process went away", start, stderr)
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            if self.cgroup is not None and self.cgroup.oom_kills():
                return self.result("memory", self.memory_detail(), start, stderr)
            cpu = self.cgroup.cpu_seconds() if self.cgroup is not None else self.cpu
            over = cpu is not None and cpu >= float(self.limits["cpu_s"]) - 0.05
            if sig == signal.SIGXCPU or sig == signal.SIGKILL and over:
                return self.result("timeout", f"over the CPU limit of {self.limits['cpu_s']} s", start, stderr)
            return self.result("runtime_error", f"killed by {signal.Signals(sig).name}", start, stderr)
        code = os.WEXITSTATUS(status)
        tail = stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        if code == EXIT_COMPILE:
            return self.result("compile_error", tail[0], start, stderr)
        if code == EXIT_MEMORY or tail[0].startswith("MemoryError"):
            return self.result("memory", self.memory_detail(), start, stderr)
        if code == EXIT_EXEC:
            return self.result("sandbox_refusal", tail[0] or "the interpreter could not be started", start, stderr)
        if code != 0:
            return self.result("runtime_error", f"exit status {code}: {tail[0]}", start, stderr)
        if gone:
            return self.result("runtime_error", "the program exited before the tests ended", start, stderr)
        return self.result("ok", "", start, stderr)

    # ---- processes ----
    def limit_and_drop(self, uid: int, processes: int) -> None:
        """In a child before it runs anything else: rlimits, an unprivileged identity, no new privileges."""
        lim = self.limits
        cpu = int(float(lim["cpu_s"]) + 0.999) + (1 if self.cgroup is not None else 0)  # the cgroup decides first
        for which, value in ((resource.RLIMIT_CPU, cpu),
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
        if self.root:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        elif self.namespaces:
            drop_capabilities()
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        prctl(PR_SET_DUMPABLE, 0)

    def spawn_reaper(self, fds: dict[int, int], report_w: int) -> int:
        """PID 1 of the test case's PID namespace (rlimits: a subreaper leading the program's process group):
        forks the program, reports its wait status and CPU time on `report_w` when it ends, and exits, which
        in a PID namespace kills every process left in it."""
        pid = os.fork()
        if pid:
            return pid
        try:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            os.setsid()
            if self.namespaces:
                mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            else:
                prctl(PR_SET_CHILD_SUBREAPER, 1)
            program = self.spawn_program(fds)
            for fd in fds.values():
                os.close(fd)
            while True:
                pid, status, usage = os.wait4(-1, 0)
                if pid == program:
                    os.write(report_w, REPORT.pack(status, usage.ru_utime + usage.ru_stime))
                    break
        except BaseException:
            pass
        os._exit(0)

    def spawn_program(self, fds: dict[int, int]) -> int:
        pid = os.fork()
        if pid:
            return pid
        try:
            if self.cgroup is not None:
                try:
                    self.cgroup.join()
                except OSError as exc:  # on the program's stderr, so that the outcome's detail says it
                    os.write(fds[2], f"cannot join the test case's cgroup: {exc}".encode())
                    os._exit(EXIT_EXEC)
                if self.namespaces:
                    unshare(CLONE_NEWCGROUP)  # its /proc/self/cgroup shows its own cgroup as the root
            high = {target: _high(fd) for target, fd in fds.items()}
            for target, fd in high.items():
                os.dup2(fd, target)
            os.closerange(len(fds), 1 << 16)
            if self.namespaces:
                os.setsid()  # in a PID namespace of its own anyway; with rlimits it stays in the reaper's group
            self.limit_and_drop(self.uid, int(self.limits["processes"]))
            os.chdir(self.work)
            if not self.namespaces:
                confine([*SYSTEM_DIRS, *self.spec["binds"], *SYSTEM_FILES, "/dev", "/proc"],
                        [self.work, *(f"/dev/{d}" for d in DEVICES)])
            if self.spec.get("seccomp"):
                install_seccomp(bytes.fromhex(self.spec["seccomp"]))
            env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": self.work, "TMPDIR": self.work,
                   "LC_ALL": "C.UTF-8"}
            python = self.spec["python"]
            os.execve(python, [python, "-I", "-B", "-c", self.spec["boot"], self.mode, str(self.max_bytes)], env)
        except BaseException as exc:
            try:
                os.write(2, f"cannot start {self.spec['python']}: {exc}".encode())
            except OSError:
                pass
        os._exit(EXIT_EXEC)

    def spawn_checker(self, req_w: int, rsp_r: int, verdict_w: int) -> int:
        """The checker: forked before the test case's PID namespace exists, so the program cannot address it."""
        pid = os.fork()
        if pid:
            return pid
        code = 0
        try:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            os.setsid()
            req, rsp, verdict = _high(req_w), _high(rsp_r), _high(verdict_w)
            null = os.open("/dev/null", os.O_RDWR)
            for target in (0, 1, 2):
                os.dup2(null, target)
            keep = sorted({req, rsp, verdict})
            os.closerange(3, keep[0])
            for low, high in zip(keep, [*keep[1:], 1 << 16]):
                os.closerange(low + 1, high)
            self.limit_and_drop(self.checker_uid, 1)
            os.chdir("/")
            send(verdict, check(self.spec, self.test, req, rsp, self.max_bytes))
        except BaseException:
            code = 1
        os._exit(code)


def _memfd(data: bytes) -> int:
    fd = os.memfd_create("nanoverl-code")
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _high(fd: int) -> int:
    """A duplicate of fd numbered 100 or more (out of the way of the targets 0-5)."""
    return fcntl.fcntl(fd, fcntl.F_DUPFD, 100)


def main() -> int:
    spec = json.loads(sys.stdin.buffer.read())
    try:
        return launch(spec)
    except BaseException as exc:
        print(f"sandbox: {exc}", file=sys.stderr, flush=True)
        return 3
