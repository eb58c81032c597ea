"""A whole verl command line or TRL `GRPOConfig(...)` as nanoverl settings: `nanoverl-train translate`.

    parse_foreign(text)            -> ("verl" | "TRL", {key: value})  (a command line, or the Python of the call)
    translate(whose, values, known) -> Translation(settings, unmapped, assumed)
    as_overrides / as_toml         the settings as the command line or a config file writes them

Every key goes through the one table, nanoverl_core.foreign_keys.FOREIGN_KEYS (and its value translations);
a key nanoverl has under the same name carries over as it is.
"""

from __future__ import annotations

import ast
import re
import shlex
from collections.abc import Callable
from typing import Any, NamedTuple

import yaml

from .errors import ConfigError
from .foreign_keys import FOREIGN_KEYS, TRL_DEFAULTS, VERL_ONLY_SECTIONS, Untranslatable, shown_value, translate_key


class Expression(str):
    """A GRPOConfig argument that is not a literal (`learning_rate=lr`): its source text, which has no value here."""


class Translation(NamedTuple):
    settings: dict[str, Any]
    """nanoverl key -> value, in the order the foreign keys came."""
    unmapped: list[tuple[str, str]]
    """(the foreign `key=value`, why it has no nanoverl setting)."""
    assumed: list[str]
    """TRL defaults the translation assumed for fields the config left out (where nanoverl's differ)."""


def parse_foreign(text: str) -> tuple[str, dict[str, Any]]:
    """("verl" or "TRL", {key: value}) of a verl command line (`python3 -m verl.trainer.main_ppo key=value
    ...`, Hydra's +/++/~ prefixes, shell line continuations) or a TRL `GRPOConfig(...)` call (Python keyword
    arguments; an argument that is not a literal is an Expression, its source text)."""
    call = re.search(r"GRPOConfig\s*\(", text)
    if call:
        start, node = call.start(), None
        for close in re.finditer(r"\)", text[start:]):  # the first ")" after which the text parses closes the call
            try:
                node = ast.parse(text[start:start + close.end()], mode="eval").body
                break
            except SyntaxError:
                continue
        if node is None:
            raise ConfigError("the GRPOConfig(...) call does not parse as Python; pass the call as written")
        values = {}
        for kw in node.keywords:
            if kw.arg is None:
                raise ConfigError("GRPOConfig(**kwargs): write the keyword arguments out, each name=value")
            try:
                values[kw.arg] = ast.literal_eval(kw.value)
            except ValueError:
                values[kw.arg] = Expression(ast.unparse(kw.value))
        return "TRL", values
    values = {}
    for word in shlex.split(text.replace("\\\n", " "), comments=True):
        key, sep, value = word.partition("=")
        key = key.lstrip("+~")
        if not sep or not re.fullmatch(r"[A-Za-z_][\w.]*", key):
            continue  # python3, -m, the module, a flag
        try:
            values[key] = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError:
            values[key] = value
        if isinstance(values[key], str) and re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+", values[key]):
            values[key] = float(values[key])  # YAML reads 1e-6 as text
    return "verl", values


def translate(whose: str, values: dict[str, Any], known: Callable[[str], bool]) -> Translation:
    """nanoverl's settings for a foreign command's or config's `values` (`known(path)`: a nanoverl key, which
    carries over as it is). For a TRL config, TRL's defaults where nanoverl's differ (TRL_DEFAULTS: its loss,
    its advantage normalisation) are translated too, and listed in `assumed`."""
    given, assumed = dict(values), []
    if whose == "TRL":
        for key in ("loss_type", "scale_rewards"):
            if key not in given:
                given[key] = TRL_DEFAULTS[key]
                assumed.append(f"{key}={shown_value(TRL_DEFAULTS[key])}")
    settings: dict[str, Any] = {}
    unmapped: list[tuple[str, str]] = []
    for key, value in given.items():
        if isinstance(value, Expression):
            unmapped.append((f"{key}={value}", "not a literal value: write the value it has"))
        elif key in FOREIGN_KEYS:
            try:
                settings.update(translate_key(key, value, given))
            except Untranslatable as exc:
                unmapped.append((f"{key}={shown_value(value)}", str(exc)))
            except (TypeError, ValueError):
                why = FOREIGN_KEYS[key].note or "see docs/from-verl-and-trl.md"
                unmapped.append((f"{key}={shown_value(value)}", f"not a value nanoverl reads ({why})"))
        elif known(key):
            settings[key] = value
        elif key.split(".", 1)[0] in VERL_ONLY_SECTIONS or whose == "TRL":
            unmapped.append((f"{key}={shown_value(value)}", "nanoverl has no key for it"))
        else:
            unmapped.append((f"{key}={shown_value(value)}",
                             "not a key of verl's that nanoverl maps, nor a nanoverl key"))
    return Translation(settings, unmapped, assumed)


def as_overrides(settings: dict[str, Any]) -> list[str]:
    """`key=value` overrides, as the command line takes them: one shell word each (in double quotes where the
    value holds a space or a quote, so `$HOME` in a path still expands)."""
    words = [f"{key}={shown_value(value)}" for key, value in settings.items()]
    return ['"' + w.replace("\\", "\\\\").replace('"', '\\"') + '"' if re.search(r"[\s'\"]", w) else w
            for w in words]


def as_toml(settings: dict[str, Any]) -> str:
    """The settings as a TOML config: one table per section (a component's settings in [section.name])."""
    tables: dict[str, dict[str, Any]] = {}
    for key, value in settings.items():
        table, _, name = key.rpartition(".")
        tables.setdefault(table, {})[name] = value
    return "\n\n".join(f"[{table}]\n" + "\n".join(f"{name} = {_toml(v)}" for name, v in items.items())
                       for table, items in tables.items()) + "\n"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
