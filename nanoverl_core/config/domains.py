"""Value domains, declared at the field: `lr: float = attrs.field(default=1e-5, validator=at_least(0))`.

A domain is an attrs validator that also describes itself (`domain.describe()`: "a finite number >= 0"), so
the one declaration is the check and the error line ("config key 'actor.lr': nan is not a finite
number >= 0"), and tests can read it back (`domain_of`). Every number is finite unless its domain says otherwise
(NaN and inf are never a learning rate). `structure.structure_as` runs the validators of every section,
nested table and list entry after structuring, and reports the first failure as one ConfigError naming
the key; a plugin's settings class gets the same by declaring its fields with these.

Cross-field rules (a batch size that divides another, a key that needs another) stay in rules.py.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import attrs


class OutOfDomain(ValueError):
    """A value outside its key's domain: "'lr' = nan is not a finite number >= 0" where the key is not
    known (a settings object built in code); the config loader names the full key and shows `.detail`."""

    def __init__(self, name: str, detail: str):
        super().__init__(f"{name!r} = {detail}")
        self.detail = detail


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


@attrs.frozen
class Number:
    """An int or float key's domain: finite, and within [low, high] (each bound optional, open or closed).

    With `optional`, None is allowed too (a key whose absence means "off"); with `multiple`, only the
    multiples of it (a hidden size its head count divides)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    optional: bool = False
    multiple: int | None = None

    def contains(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.multiple and value % self.multiple:
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def __call__(self, instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value is None and self.optional:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not self.contains(value):
            kind = "an integer" if attribute.type in (int, "int", int | None, "int | None") else "a finite number"
            raise OutOfDomain(attribute.name, f"{value!r} is not {self.describe(kind)}")

    def describe(self, kind: str = "a finite number") -> str:
        """"a finite number in [0, 1)", "an integer >= 1", ..."""
        if self.low is not None and self.high is not None:
            bounds = f" in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}{')' if self.high_open else ']'}"
        elif self.low is not None:
            bounds = f" {'>' if self.low_open else '>='} {_num(self.low)}"
        elif self.high is not None:
            bounds = f" {'<' if self.high_open else '<='} {_num(self.high)}"
        else:
            bounds = ""
        multiple = f", a multiple of {self.multiple}" if self.multiple else ""
        return kind + bounds + multiple + (" (or unset)" if self.optional else "")

    __str__ = describe


def finite(*, optional: bool = False) -> Number:
    """Any finite number."""
    return Number(optional=optional)


def at_least(low: float, *, optional: bool = False) -> Number:
    """A finite number >= low (at_least(0): not negative; at_least(1) on an int: a count)."""
    return Number(low=low, optional=optional)


def above(low: float, *, optional: bool = False) -> Number:
    """A finite number > low (above(0): positive)."""
    return Number(low=low, low_open=True, optional=optional)


def between(low: float, high: float, *, low_open: bool = False, high_open: bool = False,
            optional: bool = False) -> Number:
    """A finite number in the interval from low to high; each end closed unless said open."""
    return Number(low=low, high=high, low_open=low_open, high_open=high_open, optional=optional)


@attrs.frozen
class NotBelow:
    """A relation declared at the field: this number is at least another field's of the same settings (an
    upper bound not below its lower bound). `check_fields` runs it once every field is set."""

    other: str

    def __call__(self, instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        low = getattr(instance, self.other, None)
        if isinstance(value, (int, float)) and isinstance(low, (int, float)) and value < low:
            raise OutOfDomain(attribute.name, f"{value!r} is below {self.other} = {low!r}; an upper bound is at "
                                              f"least its lower bound")


def not_below(other: str) -> NotBelow:
    """The field's value is >= the field `other`'s (upper_bound >= lower_bound)."""
    return NotBelow(other)


def domain_of(field: attrs.Attribute) -> Number | None:
    """The Number domain declared on a field (also inside attrs' and_), or None."""
    stack = [field.validator]
    while stack:
        validator = stack.pop()
        if isinstance(validator, Number):
            return validator
        stack.extend(getattr(validator, "_validators", ()))
    return None


@attrs.frozen
class PathKind:
    """A path key's kind: "python_file" (a `.py` module), "folder" (a directory, made if missing),
    "data_file" (a .jsonl / .json / .parquet file; a list of them), or "model" (a Hugging Face model
    folder, holding config.json, or a .gguf file). Checked where the path exists: an existing path of
    the wrong kind (a data file as a reward module, a file as the output folder) is the error here. A missing path is the reading component's to report,
    when it reads it (a run's config.json may name a reward file that has since moved, and `export`
    still reads that config)."""

    kind: str

    def __call__(self, instance: Any, attribute: attrs.Attribute, value: str | list[str]) -> None:
        for one in value if isinstance(value, list) else [value]:
            path = Path(one).expanduser() if one else None
            if path is not None and _exists(path):
                self.check(attribute.name, one, path)
            elif path is not None and self.kind == "folder":  # made when missing: it must be makeable
                problem = unwritable(path)
                if problem:
                    raise OutOfDomain(attribute.name, f"{one!r} cannot be created: {problem}; name a folder you "
                                                      "can write to")

    def check(self, name: str, value: str, path: Path) -> None:
        what = "a folder" if path.is_dir() else f"a {path.suffix or 'suffix-less'} file"
        if self.kind == "folder" and not path.is_dir():
            raise OutOfDomain(name, f"{value!r} is a file, not a folder")
        if self.kind == "python_file" and (not path.is_file() or path.suffix != ".py"):
            raise OutOfDomain(name, f"{value!r} is {what}, not a Python module (.py)")
        if self.kind == "data_file" and (not path.is_file() or path.suffix not in DATA_SUFFIXES):
            raise OutOfDomain(name, f"{value!r} is {what}, not a data file ({' / '.join(DATA_SUFFIXES)}"
                                    f"{'; name the files in it' if path.is_dir() else ''})")
        if self.kind == "teacher" and teacher_folder(path) is not None:
            return                                      # a nanoverl checkpoint or run directory, a LoRA adapter
        if self.kind in ("model", "teacher") and (path.suffix != ".gguf" if path.is_file()
                                                  else not (path / "config.json").is_file()):
            detail = "holds no config.json" if path.is_dir() else f"is {what}"
            also = ", a nanoverl checkpoint, a run directory or a LoRA adapter" if self.kind == "teacher" else ""
            raise OutOfDomain(name, f"{value!r} {detail}: not a Hugging Face model folder or a .gguf file{also}")


def unwritable(path: Path, want: str = "folder") -> str | None:
    """Why the OS would refuse to create `path` (`want`: "folder" or "file"), or None: a name longer than the
    file system takes, an existing entry of the other kind, or a parent that is a regular file. Checked
    before the work starts, so that a command fails before it has run, not after (eval's --samples,
    export's OUT_DIR, trainer.output_dir)."""
    path = Path(path).expanduser()
    longest = max((len(part.encode()) for part in path.parts), default=0)
    if longest > 255 or len(str(path).encode()) >= 4096:
        return f"a name in it is {longest} bytes long, over the 255 a file system takes" if longest > 255 else \
            f"the path is {len(str(path).encode())} bytes long, over the 4096 the OS takes"
    if _exists(path):
        if want == "file" and path.is_dir():
            return "it is a folder, not a file"
        if want == "folder" and not path.is_dir():
            return "it is a file, not a folder"
        return None
    parent = path.parent
    while not _exists(parent) and parent != parent.parent:
        parent = parent.parent
    if _exists(parent) and not parent.is_dir():
        return f"{parent} is a file, not a folder"
    return None


def _exists(path: Path) -> bool:
    """path.exists(), False for a name the OS refuses (too long, say): what is not there is the reader's to report."""
    try:
        return path.exists()
    except OSError:
        return False


DATA_SUFFIXES = (".jsonl", ".json", ".parquet")
"""What `data.train_files` / `val_files` read (nanoverl_core.data)."""

python_file = PathKind("python_file")
"""A `.py` module that defines a function (reward.file)."""
folder = PathKind("folder")
"""A directory, created when missing (trainer.output_dir)."""
data_files = PathKind("data_file")
"""A list of data files (data.train_files, data.val_files)."""
model_source = PathKind("model")
"""A model folder with config.json, or a .gguf file (model.path)."""
teacher_source = PathKind("teacher")
"""A model source, a nanoverl checkpoint (state.json) or run directory (checkpoints/), or a peft LoRA adapter
folder (adapter_config.json) (teacher.path)."""


def teacher_folder(path: Path) -> Literal["checkpoint", "adapter"] | None:
    """What a teacher.path folder is when it is not a model folder: a nanoverl checkpoint (state.json) or run
    directory (checkpoints/), or a peft LoRA adapter (adapter_config.json); None for anything else."""
    path = Path(path).expanduser()
    if (path / "state.json").is_file() or (path / "checkpoints").is_dir():
        return "checkpoint"
    return "adapter" if (path / "adapter_config.json").is_file() else None
