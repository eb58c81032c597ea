"""What a setting names in code: "module:attr" (an importable module) or "path/to/file.py:attr" (a file, as
environment.file; it runs the file's code). The same string loads in the trainer, where the settings are
checked, and again in each environment worker and in the server the plugin starts."""

from __future__ import annotations

import difflib
import importlib
import zlib
from functools import cache
from pathlib import Path
from typing import Any

from nanoverl_core.errors import one_line
from nanoverl_core.plugins import exec_file


@cache
def load_ref(ref: str) -> Any:
    """The object `ref` names, or a ValueError saying what is wrong with it (the caller names the key)."""
    where, _, name = ref.rpartition(":")
    if not where or not name:
        raise ValueError(f"{ref!r} is not \"module:name\" or \"path/to/file.py:name\"")
    module = _module(where)
    obj: Any = module
    for part in name.split("."):
        if not hasattr(obj, part):
            defined = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, defined, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"it defines: {', '.join(sorted(defined)[:12]) or 'nothing'}"
            raise ValueError(f"{where} has no {name!r}; {hint}")
        obj = getattr(obj, part)
    return obj


def _module(where: str):
    if not where.endswith(".py"):
        try:
            return importlib.import_module(where)
        except Exception as exc:                # ModuleNotFoundError, or the module's own error
            raise ValueError(f"module {where!r} does not import ({one_line(exc)})") from None
    path = Path(where).resolve()
    if not path.is_file():
        raise ValueError(f"{where} does not exist")
    name = f"nanoverl_openenv_{path.stem}_{zlib.crc32(str(path).encode()):08x}"
    try:                                        # registered: pydantic resolves its models' names in it
        return exec_file(path, name, register=True)
    except Exception as exc:
        raise ValueError(f"{where} does not import ({one_line(exc)})") from None
