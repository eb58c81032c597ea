"""Where the executions' cgroups go, on the reward's side (the jail makes one cgroup per test case inside).

    hierarchy = find("")                      # or SandboxUnavailable: the reason and the fix, one line
    with hierarchy.launch() as cgroup:        # {"version": 1 or 2, "parents": [[folder, [controllers]], ...]}
        ...                                   # one launcher (one row); its folders are removed after

cgroup v1 (one hierarchy per controller): the memory, pids and cpuacct controllers, each under this process's
own cgroup of that hierarchy; root only. cgroup v2 (one hierarchy): the memory and pids controllers (CPU time
is in every cgroup's cpu.stat), under `<the cgroup2 mount>/nanoverl-code` as root, or under a cgroup delegated
to the user (`[reward.code] cgroup`), whose subtree_control must allow memory and pids. A hybrid machine (v1
controllers and an empty cgroup2 mount) uses v1.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Iterator

import attrs

from .seccomp import SandboxUnavailable

V1_CONTROLLERS = ("memory", "pids", "cpuacct")
V2_CONTROLLERS = ("memory", "pids")
PREFIX = "nanoverl-code-"
_names = itertools.count()
_swept: set[str] = set()
_lock = threading.Lock()


@attrs.frozen
class Hierarchy:
    """The folders under which one launch's folder is made, with the controllers each one carries."""

    version: int
    bases: tuple[tuple[str, tuple[str, ...]], ...]

    @contextlib.contextmanager
    def launch(self) -> Iterator[dict]:
        """One folder per base for one launcher (one row), removed with what is left in it afterwards."""
        name = f"{PREFIX}{os.getpid()}-{next(_names)}"
        made: list[str] = []
        try:
            for base, _ in self.bases:
                _sweep(base)
                path = os.path.join(base, name)
                os.mkdir(path, 0o700)
                made.append(path)
                if self.version == 2:
                    _write(path, "cgroup.subtree_control", " ".join(f"+{c}" for c in V2_CONTROLLERS))
            yield {"version": self.version, "parents": [[os.path.join(base, name), list(controllers)]
                                                        for base, controllers in self.bases]}
        finally:
            for path in made:
                _remove_tree(path)


def _write(folder: str, name: str, text: str) -> None:
    with open(os.path.join(folder, name), "w") as f:
        f.write(text)


def _remove_tree(path: str) -> None:
    """A launch's folder and its test cases' folders (empty once their processes are gone)."""
    for _ in range(200):
        try:
            for entry in os.scandir(path):
                if entry.is_dir(follow_symlinks=False):
                    try:
                        os.rmdir(entry.path)
                    except OSError:
                        pass
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.005)


def _sweep(base: str) -> None:
    """Once per base and process: the folders of launchers whose reward process died without removing them."""
    with _lock:
        if base in _swept:
            return
        _swept.add(base)
    try:
        entries = [e.name for e in os.scandir(base) if e.name.startswith(PREFIX) and e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for name in entries:
        try:
            pid = int(name[len(PREFIX):].split("-")[0])
        except ValueError:
            continue
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            _remove_tree(os.path.join(base, name))
        except PermissionError:
            pass


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount point, root within the hierarchy, fstype, super options) of every cgroup mount."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
                point = fields[4].replace("\\040", " ")
                found.append((point, fields[3], rest[0], set(rest[2].split(","))))
    return found


def _own() -> dict[str, str]:
    """This process's cgroup path in each hierarchy, by controller ("" for cgroup v2)."""
    own = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                own[controller] = path
    return own


def _inside(point: str, root: str, path: str) -> str:
    relative = os.path.relpath(path, root) if root != "/" else path.lstrip("/")
    return os.path.normpath(os.path.join(point, relative)) if relative != "." else point


def _controllers(folder: str) -> set[str]:
    try:
        with open(os.path.join(folder, "cgroup.controllers")) as f:
            return set(f.read().split())
    except OSError:
        return set()


def _enable(folder: str) -> None:
    """memory and pids for the sub-cgroups of `folder` (its subtree_control)."""
    with open(os.path.join(folder, "cgroup.subtree_control")) as f:
        enabled = set(f.read().split())
    missing = [c for c in V2_CONTROLLERS if c not in enabled]
    if missing:
        _write(folder, "cgroup.subtree_control", " ".join(f"+{c}" for c in missing))


def find(delegated: str = "") -> Hierarchy:
    """The hierarchy the executions' cgroups go in, or SandboxUnavailable saying why not and what to do."""
    try:
        mounts, own = _mounts(), _own()
    except OSError as exc:
        raise SandboxUnavailable(f"cgroups cannot be read here ({exc})") from None
    if delegated:
        return _delegated(delegated, mounts, own)
    v1 = {}
    for point, root, fstype, options in mounts:
        for controller in V1_CONTROLLERS:
            if fstype == "cgroup" and controller in options and controller in own:
                v1[controller] = (point, root)
    if len(v1) == len(V1_CONTROLLERS):
        if os.getuid() != 0:
            raise SandboxUnavailable("cgroup v1 lets only root make cgroups here; run as root or set limits_per = "
                                     "\"process\"")
        bases: dict[str, list[str]] = {}
        for controller, (point, root) in v1.items():
            bases.setdefault(_inside(point, root, own[controller]), []).append(controller)
        for folder in bases:
            if not os.access(folder, os.W_OK):
                raise SandboxUnavailable(f"the cgroup folder {folder} is not writable (a read-only cgroupfs in a "
                                         "container?); set limits_per = \"process\"")
        return Hierarchy(1, tuple((folder, tuple(c)) for folder, c in bases.items()))
    unified = [(point, root) for point, root, fstype, _ in mounts if fstype == "cgroup2"]
    usable = [(point, root) for point, root in unified if set(V2_CONTROLLERS) <= _controllers(point)]
    if not usable:
        missing = "no cgroup2 mount" if not unified else "the memory and pids controllers are not in cgroup v2 here"
        raise SandboxUnavailable(f"CPU time and memory cannot be counted per execution ({missing}); set limits_per = "
                                 "\"process\" for per-process rlimits")
    point, _ = usable[0]
    if os.getuid() != 0:
        raise SandboxUnavailable(f"cgroup v2 at {point}: only root makes cgroups there; set [reward.code] cgroup "
                                 "to a cgroup delegated to you (docs/code.md), or limits_per = \"process\"")
    base = os.path.join(point, PREFIX.rstrip("-"))
    try:
        _enable(point)
        os.makedirs(base, exist_ok=True)
        _enable(base)
    except OSError as exc:
        raise SandboxUnavailable(f"cgroup v2 at {point}: cannot enable memory and pids for sub-cgroups ({exc}; in a "
                                 "container the root cgroup holds processes); set [reward.code] cgroup to a "
                                 "delegated cgroup, or limits_per = \"process\"") from None
    return Hierarchy(2, ((base, V2_CONTROLLERS),))


def _delegated(folder: str, mounts: list, own: dict[str, str]) -> Hierarchy:
    mount = next(((point, root) for point, root, fstype, _ in mounts
                  if fstype == "cgroup2" and (folder + "/").startswith(point.rstrip("/") + "/")), None)
    if mount is None:
        raise SandboxUnavailable(f"[reward.code] cgroup = {folder!r} is not a folder of a cgroup2 mount "
                                 "(a delegated cgroup v2, e.g. under /sys/fs/cgroup)")
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise SandboxUnavailable(f"[reward.code] cgroup = {folder!r} is not a folder you can write")
    parent = os.path.dirname(os.path.normpath(folder))
    if not set(V2_CONTROLLERS) <= _controllers(folder):
        raise SandboxUnavailable(f"[reward.code] cgroup = {folder!r} has no memory and pids controllers: enable "
                                 f"them in {parent}/cgroup.subtree_control (\"+memory +pids\"; {parent} must hold "
                                 "no process itself)")
    if "" in own:  # the kernel moves a process only for who can write cgroup.procs where the two cgroups meet
        meet = os.path.commonpath([_inside(*mount, own[""]), os.path.normpath(folder)])
        if not os.access(os.path.join(meet, "cgroup.procs"), os.W_OK):
            raise SandboxUnavailable(f"[reward.code] cgroup = {folder!r}: this process's cgroup "
                                     f"({_inside(*mount, own[''])}) meets it at {meet}, which is not delegated to "
                                     "you, so the executions cannot be moved into it; run nanoverl in a cgroup "
                                     "inside the same delegated subtree (docs/code.md)")
    try:
        _enable(folder)
    except OSError as exc:
        raise SandboxUnavailable(f"[reward.code] cgroup = {folder!r}: cannot enable memory and pids for its "
                                 f"sub-cgroups ({exc}); it must hold no process and be delegated with them") from None
    return Hierarchy(2, ((folder, V2_CONTROLLERS),))
