"""Where an episode's environment comes from: a registered name, or a file (no torch here).

    [environment]                              [environment]
    name = "calculator"                        file = "my_tools.py"
                                               tools = ["lookup"]      # or: function = "make_env"

`EnvironmentSource` says which, in a form a worker process can load on its own (env/pool.py sends it
to every worker): a registered factory's "module:attr" string, or the file with its factory's name or
its tools' names. A file is imported in the trainer too (the tools' schemas go into the prompts, and a
mistake fails before anything loads), and then in each worker: the same isolation, timeouts and
errors as a registered environment.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from ..plugins import functions_in_file, import_ref


@attrs.frozen
class EnvironmentSource:
    """What builds the environments: `ref` ("module:attr" of a registered factory; "" for one a worker
    cannot import), or `file` with `function` (a factory) or `tools` (functions the model calls as tools)."""

    name: str = ""
    ref: str = ""
    file: str = ""
    function: str = ""
    tools: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """How messages and warnings name it: the registered name, or `file:function` / `file:tool,tool`."""
        return self.name or f"{self.file}:{self.function or ','.join(self.tools)}"

    @property
    def importable(self) -> bool:
        """A worker process can load it (a file always; a registered name through its "module:attr")."""
        return bool(self.file or self.ref)

    @classmethod
    def from_config(cls, cfg) -> "EnvironmentSource":
        """The file-based source of [environment] (`cfg.file` set)."""
        return cls(file=cfg.file, function=cfg.function, tools=tuple(cfg.tools))

    def load(self) -> Callable:
        """The environment factory: the file's function, its tools as a `tool_environment`, or the ref's object."""
        if not self.file:
            return import_ref(self.ref)
        key = "environment.function" if self.function else "environment.tools"
        found = functions_in_file(self.file, "environment.file", (self.function,) if self.function else self.tools, key)
        if self.function:
            return found[self.function]
        from .tools import tool_environment
        return tool_environment(*found.values())
