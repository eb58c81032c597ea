"""The kernel's side of the jail: namespaces, mounts, capabilities, seccomp, Landlock, cgroups, uids. Standard
library only (ctypes for the system calls Python 3.11 lacks).

    build_root(spec)        the programs' read-only root (init, once per row)
    Accounting(...)         one test case's cgroup: join, CPU seconds, OOM kills, kill, remove
    install_seccomp(bpf)    load the filter that seccomp.py compiled
    confine(read, write)    Landlock, where there are no namespaces
    fresh_uids()            the program's and the checker's uids
"""

from __future__ import annotations

import ctypes
import os
import platform
import signal
import struct
import time

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 22, 36, 38
SECCOMP_MODE_FILTER = 2
SYSCALLS = {"x86_64": {"pivot_root": 155, "capset": 126, "landlock_create_ruleset": 444, "landlock_add_rule": 445,
                       "landlock_restrict_self": 446},
            "aarch64": {"pivot_root": 41, "capset": 91, "landlock_create_ruleset": 444, "landlock_add_rule": 445,
                        "landlock_restrict_self": 446}}
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives")
DEVICES = ("null", "zero", "full", "random", "urandom")
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


def unshare(flags: int) -> None:
    _check(libc.unshare(flags), "unshare")


def prctl(option: int, value: int, arg: object = 0) -> None:
    _check(libc.prctl(option, ctypes.c_ulong(value), arg, 0, 0), f"prctl({option})")


def drop_capabilities() -> None:
    """capset(2) to no capabilities at all (a process that keeps its uid keeps them otherwise)."""
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(libc.syscall(NUMBERS["capset"], header, data), "capset")


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_seccomp(bpf: bytes) -> None:
    """Load a seccomp filter (classic BPF, 8 bytes an instruction, compiled by libseccomp in sandbox.py)."""
    buffer = ctypes.create_string_buffer(bpf, len(bpf))
    program = _SockFprog(len(bpf) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(program))


# Landlock (rlimits mode): the access rights of ABI 1-5, the TCP rights of ABI 4, the scopes of ABI 6
LANDLOCK_READ = (1 << 0) | (1 << 2) | (1 << 3)  # execute, read file, read dir
LANDLOCK_FS_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 without Landlock."""
    if "landlock_create_ruleset" not in NUMBERS:
        return 0
    version = libc.syscall(NUMBERS["landlock_create_ruleset"], None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(0, version)


def confine(readable: list[str], writable: list[str]) -> int:
    """Landlock on this process and what it starts: read and execute beneath `readable`, everything beneath
    `writable`, nothing else of the filesystem; with ABI >= 4 no TCP bind or connect; with ABI >= 6 no signal
    to a process outside and no abstract unix socket of the host. Returns the ABI used."""
    abi = landlock_abi()
    if abi < 1:
        raise OSError("Landlock is not available in this kernel")
    handled_fs = LANDLOCK_FS_ABI[min(abi, 5)]
    attr = struct.pack("=QQQ", handled_fs, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    fd = libc.syscall(NUMBERS["landlock_create_ruleset"], attr[:size], ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        _check(-1, "landlock_create_ruleset")
    try:
        for paths, access in ((readable, LANDLOCK_READ), (writable, handled_fs)):
            for path in paths:
                try:
                    target = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue
                is_dir = os.path.isdir(path)
                rule = struct.pack("=Qi", access if is_dir else access & ~(1 << 3) & _FILE_RIGHTS, target)
                ret = libc.syscall(NUMBERS["landlock_add_rule"], fd, 1, rule, 0)
                os.close(target)
                _check(0 if ret == 0 else -1, f"landlock_add_rule {path}")
        _check(libc.syscall(NUMBERS["landlock_restrict_self"], fd, 0), "landlock_restrict_self")
    finally:
        os.close(fd)
    return abi


_FILE_RIGHTS = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 14) | (1 << 15)
"""The rights Landlock accepts on a file (not a folder): execute, write, read, truncate, ioctl."""


# ---- the root -------------------------------------------------------------------------------------------------
def _bind_flags(source: str) -> int:
    """The flags a read-only bind of `source` must keep (a user namespace may not clear locked ones)."""
    f = os.statvfs(source).f_flag
    flags = MS_RDONLY | MS_NOSUID | MS_NODEV
    for st, ms in ((os.ST_NOEXEC, MS_NOEXEC), (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME),
                   (os.ST_RELATIME, MS_RELATIME)):
        if f & st:
            flags |= ms
    return flags


def bind_read_only(source: str, target: str) -> None:
    mount(source, target, None, MS_BIND | MS_REC)
    mount(None, target, None, MS_REMOUNT | MS_BIND | _bind_flags(target))


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
    bind_read_only(path, target)


def under_tmp(path: str) -> bool:
    return path == "/tmp" or path.startswith("/tmp/")


def build_root(spec: dict) -> None:
    """The programs' filesystem: a tmpfs root with read-only binds, then pivot_root into it. /tmp is an empty
    folder here (each test case mounts its own tmpfs on it); /proc is this PID namespace's."""
    root = spec["root"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=0755")
    for path in (*SYSTEM_DIRS, *spec["binds"], *SYSTEM_FILES):
        if path in SYSTEM_DIRS or not any(path.startswith(d + "/") for d in SYSTEM_DIRS):
            _replicate(path, root)
    os.makedirs(root + "/tmp", exist_ok=True)
    os.makedirs(root + "/dev", exist_ok=True)
    mount("tmpfs", root + "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755")
    for name in DEVICES:
        open(f"{root}/dev/{name}", "w").close()
        mount(f"/dev/{name}", f"{root}/dev/{name}", None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2"), ("shm", "/tmp")):
        os.symlink(target, f"{root}/dev/{name}")
    mount(None, root + "/dev", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC)
    os.makedirs(root + "/proc", exist_ok=True)
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.makedirs(root + "/.old", exist_ok=True)
    _check(libc.syscall(NUMBERS["pivot_root"], root.encode(), (root + "/.old").encode()), "pivot_root")
    os.chdir("/")
    _check(libc.umount2(b"/.old", MNT_DETACH), "umount /.old")
    os.rmdir("/.old")
    mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    libc.sethostname(b"sandbox", 7)


# ---- the cgroup of one test case -----------------------------------------------------------------------------
class Accounting:
    """One test case's cgroup (one folder per cgroup v1 hierarchy): the program's process joins it before it
    runs anything, so everything it starts is in it, and CPU time, memory of every kind (anonymous, shared,
    memfd, tmpfs, the kernel's) and processes count for the execution as a whole."""

    def __init__(self, version: int, parents: list[tuple[int, list[str]]], name: str, limits: dict):
        self.version, self.name, self.dirs = version, name, []
        self.parents = parents
        memory, processes = int(limits["memory_mb"]) << 20, int(limits["processes"])
        self.cpu_fd = self.oom_fd = self.failcnt_fd = self.procs_dir = None
        for parent, controllers in parents:
            os.mkdir(name, 0o700, dir_fd=parent)
            folder = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=parent)
            self.dirs.append(folder)
            if version == 2:
                self._write(folder, "memory.max", memory)
                self._write(folder, "memory.swap.max", 0, optional=True)
                self._write(folder, "memory.oom.group", 1)
                self._write(folder, "pids.max", processes)
                self.cpu_fd = os.open("cpu.stat", os.O_RDONLY, dir_fd=folder)
                self.oom_fd = os.open("memory.events", os.O_RDONLY, dir_fd=folder)
                self.procs_dir = folder
                continue
            if "memory" in controllers:
                self._write(folder, "memory.limit_in_bytes", memory)
                self._write(folder, "memory.memsw.limit_in_bytes", memory, optional=True)  # no swap past it
                self._write(folder, "memory.swappiness", 0, optional=True)
                self.oom_fd = os.open("memory.oom_control", os.O_RDONLY, dir_fd=folder)
                self.failcnt_fd = os.open("memory.failcnt", os.O_RDONLY, dir_fd=folder)
            if "pids" in controllers:
                self._write(folder, "pids.max", processes)
                self.procs_dir = folder
            if "cpuacct" in controllers:
                self.cpu_fd = os.open("cpuacct.usage", os.O_RDONLY, dir_fd=folder)

    @staticmethod
    def _write(folder: int, name: str, value: int, optional: bool = False) -> None:
        try:
            fd = os.open(name, os.O_WRONLY, dir_fd=folder)
        except FileNotFoundError:
            if optional:
                return
            raise
        try:
            os.write(fd, str(value).encode())
        finally:
            os.close(fd)

    def join(self) -> None:
        """Move the calling process into the cgroup (in every hierarchy)."""
        for folder in self.dirs:
            self._write(folder, "cgroup.procs", 0)

    def _read(self, fd: int) -> str:
        return os.pread(fd, 4096, 0).decode()

    def cpu_seconds(self) -> float:
        """CPU time of every process that was ever in the cgroup, user and system."""
        text = self._read(self.cpu_fd)
        if self.version == 1:
            return int(text) / 1e9
        fields = dict(line.split() for line in text.splitlines() if line.strip())
        return int(fields["usage_usec"]) / 1e6

    def oom_kills(self) -> int:
        """Processes the kernel killed for the cgroup's memory limit."""
        fields = dict(line.split() for line in self._read(self.oom_fd).splitlines() if line.strip())
        return int(fields.get("oom_kill", 0))

    def hit_limit(self) -> bool:
        """The cgroup's memory reached its limit at least once (an allocation or a tmpfs write failed)."""
        if self.version == 2:
            fields = dict(line.split() for line in self._read(self.oom_fd).splitlines() if line.strip())
            return int(fields.get("max", 0)) > 0
        return int(self._read(self.failcnt_fd) or 0) > 0

    def processes(self) -> list[int]:
        fd = os.open("cgroup.procs", os.O_RDONLY, dir_fd=self.procs_dir)
        try:
            return [int(p) for p in os.read(fd, 1 << 20).split()]
        finally:
            os.close(fd)

    def kill(self) -> None:
        """Every process in the cgroup killed (rlimits mode; in namespaces the PID namespace does it)."""
        if self.version == 2:
            try:
                self._write(self.procs_dir, "cgroup.kill", 1)
            except OSError:
                pass
        for _ in range(1000):
            pids = self.processes()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.001)

    def remove(self) -> None:
        for fd in (self.cpu_fd, self.oom_fd, self.failcnt_fd, *self.dirs):
            if fd is not None:
                os.close(fd)
        for parent, _ in self.parents:
            for _ in range(500):  # a process killed a moment ago may still be leaving the cgroup
                try:
                    os.rmdir(self.name, dir_fd=parent)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.002)


def fresh_uids(pid: int | None = None) -> tuple[int, int]:
    """(the program's uid, the checker's): as root, two uids no account and no other process has (derived
    from this launcher's pid, unique while it runs) and that hold no kernel key (the kernel keeps a uid's
    keyrings after its processes are gone); not root, one's own."""
    pid = os.getpid() if pid is None else pid
    if os.getuid() != 0:
        return os.getuid(), os.getuid()
    taken = set()
    try:
        with open("/proc/key-users") as f:
            taken = {int(line.split(":")[0]) for line in f if line.strip()}
    except OSError:
        pass
    for k in range(512):
        uid = 1_000_000 + 2 * pid + k * (2 << 22)
        if uid not in taken and uid + 1 not in taken and uid + 1 < 2**32 - 1:
            return uid, uid + 1
    raise RuntimeError("no free uid for the execution")
