"""The programs' seccomp filter, compiled by libseccomp (the library systemd, Docker and Firefox use) into
classic BPF here, in the reward's process; the jail only loads the bytes (jail.kernel.install_seccomp).

    bpf = program_filter("namespaces")      # bytes, 8 an instruction; SandboxUnavailable without libseccomp

Every system call is allowed but these, which fail with EPERM (the program sees PermissionError):

    kernel objects that outlive a process   add_key, keyctl, request_key (a key stays in the kernel under the
                                            uid after the execution ends)
    namespaces and mounts                   unshare, setns, clone with a CLONE_NEW* flag, clone3 (ENOSYS, so
                                            the C library falls back to clone, whose flags are checked), mount
                                            and the new mount API, pivot_root, chroot
    the kernel's larger attack surface      bpf, perf_event_open, userfaultfd, io_uring_*, ptrace,
                                            process_vm_readv/writev, pidfd_getfd, kexec_*, *_module, reboot,
                                            swapon/off, acct, quotactl, syslog, name_to_handle_at,
                                            open_by_handle_at, iopl, ioperm, the clocks' setters

and, where there are no namespaces (sandbox = "rlimits"), socket() with any address family, shmget, msgget,
semget and mq_open (EACCES): no network, no abstract unix socket of the host, no IPC object that would outlive
the execution there; socketpair() and pipes still work. A system call of another ABI (x32,
i386 on x86_64) kills the process. Names this libseccomp or kernel does not know are skipped.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os

ALLOW, KILL_PROCESS = 0x7FFF0000, 0x80000000
CMP_MASKED_EQ = 7
ATTR_ACT_BADARCH = 1
NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x00000080)
"""CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME."""
DENIED = (
    "add_key", "keyctl", "request_key",
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr",
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "ptrace",
    "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kexec_load", "kexec_file_load", "init_module",
    "finit_module", "delete_module", "reboot", "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog",
    "name_to_handle_at", "open_by_handle_at", "iopl", "ioperm", "settimeofday", "clock_settime", "clock_adjtime",
    "adjtimex", "lookup_dcookie", "vhangup", "uselib", "nfsservctl",
)

RLIMITS_DENIED = ("socket", "shmget", "msgget", "semget", "mq_open")
"""Where there are no namespaces: the network and abstract unix sockets of the host, and System V and POSIX
message queue IPC objects, which would outlive the execution on the host."""


class SandboxUnavailable(RuntimeError):
    """What the sandbox needs is not on this machine (the message says what and how to get it)."""


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


@functools.lru_cache(maxsize=1)
def _libseccomp() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError:
        raise SandboxUnavailable("libseccomp is not installed (Debian/Ubuntu: apt-get install libseccomp2; Fedora: "
                                 "dnf install libseccomp)") from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_ArgCmp)]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    return lib


def _errno(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


@functools.lru_cache(maxsize=4)
def program_filter(isolation: str) -> bytes:
    """The filter for the programs of one isolation mode ("namespaces" or "rlimits"), as BPF bytes."""
    lib = _libseccomp()
    ctx = lib.seccomp_init(ALLOW)
    if not ctx:
        raise SandboxUnavailable("libseccomp could not make a filter")
    try:
        lib.seccomp_attr_set(ctx, ATTR_ACT_BADARCH, KILL_PROCESS)
        def rule(name: str, action: int, *compare: _ArgCmp) -> None:
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number < 0:
                return  # unknown to this libseccomp or architecture
            args = (_ArgCmp * len(compare))(*compare) if compare else None
            ret = lib.seccomp_rule_add_array(ctx, action, number, len(compare), args)
            if ret < 0:
                raise SandboxUnavailable(f"libseccomp refused the rule for {name}: {os.strerror(-ret)}")

        for name in DENIED:
            rule(name, _errno(errno.EPERM))
        rule("clone3", _errno(errno.ENOSYS))
        for flag in NAMESPACE_FLAGS:
            rule("clone", _errno(errno.EPERM), _ArgCmp(0, CMP_MASKED_EQ, flag, flag))
        if isolation == "rlimits":
            for name in RLIMITS_DENIED:
                rule(name, _errno(errno.EACCES))
        fd = os.memfd_create("nanoverl-seccomp")
        try:
            ret = lib.seccomp_export_bpf(ctx, fd)
            if ret < 0:
                raise SandboxUnavailable(f"libseccomp could not export the filter: {os.strerror(-ret)}")
            return os.pread(fd, os.fstat(fd).st_size, 0)
        finally:
            os.close(fd)
    finally:
        lib.seccomp_release(ctx)
