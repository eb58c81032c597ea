"""Settings of the `code` reward, written as [reward.code].

Kept apart from the reward, so checking a config stays fast. Choosing the namespace sandbox on a machine
where it cannot be made is a config error here (a trivial program is run once per process to find out),
so a run that could not isolate its programs stops before anything starts.
"""

from __future__ import annotations

from typing import Literal

import attrs

from nanoverl_core.config import above, at_least, between

from .sandbox import Limits, hierarchy, probe
from .seccomp import SandboxUnavailable, program_filter


def _dotted_path(_instance, attribute, value: str) -> None:
    if value and any(not part for part in value.split(".")):
        raise ValueError(f"'{attribute.name}' = {value!r} is not a dotted path of row fields "
                         "(e.g. reward_model.ground_truth); leave it empty for the usual fields")


def _sandbox_works(instance, _attribute, value: str) -> None:
    if _accounting_reason(instance):
        return  # the `limits_per` key says why
    try:
        program_filter(value)
    except SandboxUnavailable as exc:
        raise ValueError(f"the sandbox needs seccomp: {exc}") from None
    reason = probe(value, instance.python, instance.limits_per, instance.cgroup)
    if reason and value == "namespaces":
        raise ValueError(f"the namespace sandbox cannot be made on this machine ({reason}); set "
                         "[reward.code] sandbox = \"rlimits\" to run programs with rlimits and Landlock only (no "
                         "network, PID or mount namespaces: docs/code.md)")
    if reason:
        raise ValueError(f"programs do not run in the sandbox here ({reason}); set [reward.code] python to an "
                         "interpreter that an unprivileged user can run (e.g. /usr/bin/python3)")


def _accounting_reason(instance) -> str:
    if instance.limits_per != "execution":
        return ""
    try:
        hierarchy(instance.cgroup)
    except SandboxUnavailable as exc:
        return str(exc)
    return ""


def _enforceable(instance, _attribute, value: str) -> None:
    reason = _accounting_reason(instance)
    if reason:
        raise ValueError(f"CPU time, memory and processes cannot be limited per execution here: {reason}")


@attrs.define
class CodeSettings:
    sandbox: Literal["namespaces", "rlimits"] = attrs.field(default="namespaces", validator=_sandbox_works)
    """"namespaces": each test case in new mount, PID, network, IPC and UTS namespaces (a user namespace too
    when not root) with a read-only root, no network, a fresh tmpfs /tmp and an unprivileged uid.
    "rlimits": the same processes on the host, each test case in a fresh folder that Landlock confines the
    program to, no sockets, as a fresh uid when root: no PID or network namespace (docs/code.md); for
    machines where namespaces cannot be made."""
    limits_per: Literal["execution", "process"] = attrs.field(default="execution", validator=_enforceable)
    """"execution": cpu_s, memory_mb and processes count every process of an execution together (a cgroup per
    test case: CPU time summed over its processes, memory of every kind, shared and tmpfs included);
    "process": per-process rlimits only (work spread over forked children, shared memory and memfds escape
    them), for machines without usable cgroups."""
    cgroup: str = ""
    """cgroup v2 only: a cgroup folder delegated to the user running nanoverl, under which each execution's
    cgroup is made (its subtree_control must allow memory and pids); "": automatic (as root)."""
    code_from: Literal["last_block", "response"] = "last_block"
    """Where the program is: "last_block" the last fenced code block (```python, ```py or bare ```; the whole
    response when it has none, as verl's prime_code), "response" the whole response. <think>...</think> is
    removed first either way."""
    score: Literal["all", "fraction"] = "all"
    """"all": 1.0 when every test case passes, else 0.0; "fraction": the fraction of test cases that pass."""
    compare: Literal["lines", "tokens", "exact"] = "lines"
    """stdin/stdout tests: "lines" compares line by line with trailing whitespace and trailing empty lines
    ignored, "tokens" the whitespace-separated tokens, "exact" the bytes."""
    max_tests: int = attrs.field(default=0, validator=at_least(0))
    """Test cases run per row, the first ones (0: all)."""
    ground_truth_key: str = attrs.field(default="", validator=_dotted_path)
    """The row field holding the test cases (dotted path); empty: reward_model.ground_truth, ground_truth, ...
    then the row's own test fields (test + entry_point, test_list)."""
    cpu_s: float = attrs.field(default=2.0, validator=above(0))
    """CPU seconds per execution, all its processes together (over it: timeout)."""
    wall_s: float = attrs.field(default=5.0, validator=above(0))
    """Wall-clock seconds per execution, from the interpreter's start (over it: timeout)."""
    memory_mb: int = attrs.field(default=512, validator=at_least(32))
    """Memory per execution in MiB, all its processes and every kind together: anonymous, shared, memfd, its
    /tmp files (over it: memory); also each process's address space. The interpreter needs about 20."""
    max_output_bytes: int = attrs.field(default=1 << 20, validator=above(0))
    """stdout + stderr (and a returned value) per execution in bytes (over it: output_limit)."""
    processes: int = attrs.field(default=16, validator=at_least(1))
    """Processes and threads an execution may have at once."""
    file_size_mb: int = attrs.field(default=16, validator=at_least(0))
    """Largest file an execution may write, in MiB (RLIMIT_FSIZE)."""
    open_files: int = attrs.field(default=64, validator=at_least(16))
    """Open file descriptors per process (RLIMIT_NOFILE)."""
    disk_mb: int = attrs.field(default=32, validator=at_least(1))
    """Size of the execution's tmpfs /tmp, its working folder (namespaces only; it counts in memory_mb too)."""
    python: str = ""
    """The interpreter programs run on; "": the base installation of the Python running nanoverl (the standard
    library and that installation's own site-packages, not the venv's). A venv's python brings its packages;
    its folders are mounted read-only."""

    @property
    def limits(self) -> Limits:
        return Limits(self.cpu_s, self.memory_mb, self.wall_s, self.max_output_bytes, self.processes,
                      self.file_size_mb, self.open_files, self.disk_mb)


def _task_names(_instance, _attribute, value: list[str]) -> None:
    import difflib

    from .tasks import KINDS
    for i, name in enumerate(value):
        if name not in KINDS:
            close = difflib.get_close_matches(name, list(KINDS), n=1, cutoff=0.0)
            raise ValueError(f"entry {i}, {name!r}, is not a task kind; did you mean {close[0]!r}? (the kinds: "
                             f"{', '.join(KINDS)})")


@attrs.define
class CodeTasksSettings:
    """[data.code_tasks]: the generated programming tasks of the data source `code_tasks` (source.py)."""

    difficulty: int = attrs.field(default=1, validator=between(1, 3))
    """The level of the task kinds drawn: 1 one operation (x * 3 + 1, the first k characters, the largest
    number), 2 a condition or two operations (the sum of the multiples of k, a clamp, a quadratic), 3 a loop
    with state or a rule in several parts (a digit sum, a Caesar shift, fizz); unused when `tasks` is set."""
    tasks: list[str] = attrs.field(factory=list, validator=_task_names)
    """The task kinds drawn, each equally often, whatever their level (e.g. ["affine", "clamp"]); empty: every
    kind of `difficulty` (nanoverl_code/tasks.py: KINDS)."""
    size: int = attrs.field(default=1000, validator=at_least(1))
    """Training rows per epoch (fresh rows every epoch, drawn from (seed, epoch))."""
    seed: int = attrs.field(default=0, validator=between(0, 2**32 - 1))
    """Seed of the training rows."""
    val_size: int = attrs.field(default=100, validator=at_least(0))
    """Validation rows, each a different task (0: no validation); a training row with a validation row's
    question is skipped."""
    val_seed: int = attrs.field(default=1, validator=between(0, 2**32 - 1))
    """Seed of the validation rows (its own stream, whatever seed is)."""
    tests: int = attrs.field(default=5, validator=between(1, 20))
    """Test cases per row (call-based: arguments and the reference solution's return value)."""
    instruction: str = "Reply with the function in one ```python code block."
    """Put after the task's question in the user message ("": the question alone)."""
