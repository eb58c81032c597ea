"""Where an agent comes from: a registered name, a file and function, or a program (no torch here).

    [agent]                          [agent]                           [agent]
    name = "verifiers"               file = "my_agent.py"              command = ["python", "my_agent.py"]
                                     function = "solve"

`AgentSource` says which, in a form an agent worker process can load on its own (agents/runner.py sends
it to every worker): a registered function's "module:attr", a file with its function's name, or the
command line of a program started once per episode.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable

import attrs

from ..errors import ConfigError
from ..plugins import functions_in_file, import_ref


@attrs.frozen
class AgentSource:
    name: str = ""
    ref: str = ""
    file: str = ""
    function: str = ""
    command: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """How messages name it: the registered name, `file:function`, or the program."""
        return self.name or (f"{self.file}:{self.function}" if self.file else " ".join(self.command))

    @classmethod
    def from_config(cls, cfg) -> "AgentSource":
        """The file- or command-based source of [agent]."""
        return cls(file=cfg.file, function=cfg.function, command=tuple(cfg.command))

    def check(self) -> None:
        """A command whose program cannot be found is one ConfigError (the file's function: `load`)."""
        if self.command and shutil.which(self.command[0]) is None:
            raise ConfigError(f"agent.command: the program {self.command[0]!r} is not found (not a file, not on "
                              "PATH); fix agent.command")

    def load(self) -> Callable | None:
        """The agent function (None for a command): the file's function, or the registered ref's object."""
        if self.command:
            return None
        if not self.file:
            return import_ref(self.ref)
        return functions_in_file(self.file, "agent.file", (self.function,), "agent.function")[self.function]
