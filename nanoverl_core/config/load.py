"""Loading: a TOML / YAML / JSON file (or a parsed mapping), dotted overrides, the checks, the settings.

`load_config` reads the file, applies the overrides, takes the component tables out, checks the keys,
structures and validates the core config, then gives each selected component its settings. The plugin
registry comes from the caller (`load_registry()` once per command); without one, the loader discovers it.
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args, get_origin

import attrs
import yaml

from ..errors import ConfigError
from .components import COMPONENTS, component_settings
from ..foreign_keys import check_foreign_keys
from .schema import Config
from .structure import check_keys, check_moved_keys, check_one_source, structure_as, user_fields

if TYPE_CHECKING:
    from ..plugins import Registry


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (), *,
                registry: Registry | None = None, training: bool = True) -> Config:
    """Read a TOML / YAML / JSON config, apply dotted overrides, structure and validate it, and give
    each selected component its settings (`registry`: the installed plugins, `load_registry()`; None
    discovers them, as nanoverl-train does: pass one to load several configs against one discovery).
    `training` false: the config only evaluates (`nanoverl-train eval`), training data may be absent."""
    return config_from_dict(_read_file(Path(path)) if path else {}, overrides, registry=registry, training=training)


def config_from_dict(data: dict[str, Any], overrides: list[str] | tuple[str, ...] = (), *,
                     registry: Registry | None = None, training: bool = True) -> Config:
    """`load_config` of an already parsed mapping (a run's config.json holds one under "config")."""
    if registry is None:
        from ..plugins import load_registry
        registry = load_registry()
    data = json.loads(json.dumps(data))  # a private copy: overrides and table extraction edit it
    for override in overrides:
        apply_override(data, override, registry=registry)
    check_foreign_keys(data, known=lambda path: _field_type(path.split("."), registry) is not None)
    check_moved_keys(data)
    check_one_source(data, overrides)
    _one_file_lists(data)
    _drop_disabled_parts(data, overrides)
    _one_run_length(data, overrides)
    tables = _pop_component_tables(data)
    check_keys(data, Config, root=Config)
    config = structure_as(data, Config).validate(training=training)
    return component_settings(config, registry, tables)


def _one_file_lists(data: dict[str, Any]) -> None:
    """`data.train_files = "a.parquet"` (one string, as verl accepts) is the list ["a.parquet"]."""
    section = data.get("data")
    for key in ("train_files", "val_files"):
        if isinstance(section, dict) and isinstance(section.get(key), str):
            section[key] = [section[key]] if section[key] else []


def _drop_disabled_parts(data: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> None:
    """An override that switches a part off (`critic.enable=false`) wins over the file's keys for that
    part: they are dropped with a warning. Keys the overrides themselves set still conflict."""
    from_overrides = {o.partition("=")[0].strip() for o in overrides}
    for part in ("critic", "reference"):
        node = data.get(part)
        if f"{part}.enable" not in from_overrides or not isinstance(node, dict) or node.get("enable") is not False:
            continue
        ignored = sorted(k for k in node if k != "enable" and f"{part}.{k}" not in from_overrides)
        for key in ignored:
            del node[key]
        if ignored:
            print(f"warning: {part}.enable=false: ignoring {', '.join(f'{part}.{k}' for k in ignored)} "
                  "set in the config file", file=sys.stderr)


def _one_run_length(data: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> None:
    """An override of trainer.total_epochs or trainer.total_steps wins over the file's other one (dropped
    with a warning), so `trainer.total_epochs=2` works on a config file that counts steps."""
    from_overrides = {o.partition("=")[0].strip() for o in overrides}
    node = data.get("trainer")
    for given, other in (("total_epochs", "total_steps"), ("total_steps", "total_epochs")):
        if (isinstance(node, dict) and f"trainer.{given}" in from_overrides and other in node
                and f"trainer.{other}" not in from_overrides):
            print(f"warning: trainer.{given} is overridden: ignoring trainer.{other} = {node.pop(other)!r} "
                  "set in the config file", file=sys.stderr)


def _pop_component_tables(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Take every [<section>.<name>] table that is not a core key of its section out of `data`."""
    tables: dict[str, dict[str, Any]] = {}
    for section in COMPONENTS:
        node = data.get(section)
        if not isinstance(node, dict):
            continue
        core = user_fields(attrs.fields_dict(Config)[section].type)
        for key in [k for k, v in node.items() if isinstance(v, dict) and k not in core]:
            tables.setdefault(section, {})[key] = node.pop(key)
    return tables


def _read_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; check the --config path")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise ConfigError(f"config file {path} line {line} is not UTF-8 (byte {exc.object[exc.start]:#04x}); "
                          "save the file as UTF-8") from None
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text) or {}
        elif path.suffix == ".json":
            data = json.loads(text)
        else:
            raise ConfigError(f"config file {path} must end in .toml, .yaml, .yml or .json")
    except (tomllib.TOMLDecodeError, yaml.YAMLError, json.JSONDecodeError) as exc:
        detail = " ".join(str(exc).split())
        raise ConfigError(f"config file {path} cannot be parsed: {detail}") from None
    except ValueError as exc:  # an integer past Python's int-to-str limit (4300 digits), from any of the parsers
        raise ConfigError(f"config file {path} holds an integer longer than Python reads ({_digits(exc)}); no "
                          "setting takes a number that long: fix the value") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections, got {type(data).__name__}")
    return data


_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _digits(exc: BaseException) -> str:
    """"100000 digits, over the limit of 4300" from the int-to-str ValueError."""
    found = re.findall(r"\d+", str(exc))
    return f"{found[1]} digits, over the limit of {found[0]}" if len(found) >= 2 else " ".join(str(exc).split())[:120]


def _parse_value(text: str) -> Any:
    """An override value: JSON / YAML scalars and lists (`20`, `true`, `[console, jsonl]`), else a string."""
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text


def _unquote(text: str) -> str:
    """A string key's text as written, less one pair of quotes (`run_name="007"` as TOML writes it)."""
    stripped = text.strip()
    if len(stripped) >= 2 and stripped[0] == stripped[-1] and stripped[0] in "\"'":
        parsed = _parse_value(stripped)
        if isinstance(parsed, str):
            return parsed
    return text


def _field_type(parts: list[str], registry: Registry | None) -> Any:
    """The declared type at a dotted path, or None if the path is not in the schema. The second part
    may name a registered component of the section (`tracking.mlflow.run_name`): its settings class."""
    cls: Any = Config
    kind = COMPONENTS.get(parts[0])
    for i, part in enumerate(parts):
        if not (isinstance(cls, type) and attrs.has(cls)):
            return None
        field = attrs.fields_dict(cls).get(part)
        if field is None and i == 1 and registry is not None and part in registry.entries.get(kind, {}):
            cls = registry.settings_class(kind, part)  # [<section>.<name>]: None if it takes no settings
        elif field is None:
            return None
        else:
            cls = field.type
    return cls


def apply_override(data: dict[str, Any], override: str, *, registry: Registry | None = None) -> None:
    """Apply one `section.key=value` override. Values are parsed as YAML scalars or lists, except
    for string keys, which take the text as written (`trainer.output_dir=runs/007`, quotes optional); with `registry`,
    a component's settings are typed too (`tracking.mlflow.run_name=007` stays text)."""
    key, sep, value = override.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {override!r} must look like section.key=value")
    parts = key.strip().split(".")
    ftype = _field_type(parts, registry)
    is_text = ftype is str or (get_origin(ftype) is Literal and all(isinstance(a, str) for a in get_args(ftype)))
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {override!r}: {part} is a value, not a section")
        node = child
    if is_text:
        node[parts[-1]] = _unquote(value)
    elif ftype is float:
        try:
            node[parts[-1]] = float(value)  # YAML would read 1e-3 as a string
        except ValueError:
            node[parts[-1]] = value  # reported as a type error with the key path
    else:
        try:
            parsed = _parse_value(value)
        except ValueError as exc:  # an integer past Python's int-to-str limit (4300 digits)
            raise ConfigError(f"override {key.strip()}: its value is an integer longer than Python reads "
                              f"({_digits(exc)}); no setting takes a number that long: fix the value") from None
        if isinstance(parsed, str) and _FLOAT.fullmatch(parsed.strip()):
            parsed = float(parsed)  # YAML reads 1e-3 as text (an optional float, a component setting)
        node[parts[-1]] = parsed
