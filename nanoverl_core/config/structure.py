"""Structuring: plain data (a parsed file, overrides applied) into the typed classes, strictly.

cattrs with unknown keys forbidden and no silent coercion (1 is not a bool, "3" not an int, a string not
a list); every mistake becomes one `ConfigError` line naming the key path, with the closest valid key
for a typo. The key checks walk any attrs class: the config's sections and a component's settings.
"""

import difflib
import sys
from typing import Any, get_args, get_origin

import attrs
import cattrs
import cattrs.v

from ..errors import ConfigError
from .domains import OutOfDomain

converter = cattrs.Converter(forbid_extra_keys=True)
"""The config's one converter: strict structuring hooks below; `Config.to_dict` unstructures with it."""


# cattrs accepts 1 for a bool and "3" for an int; a config typo should not pass silently.
def _strict(kind: type):
    def structure(value: Any, _: type) -> Any:
        ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not ok:
            raise TypeError(f"expected {kind.__name__}, got {type(value).__name__} {value!r}")
        return value
    return structure


for _kind in (bool, int, float, str):
    converter.register_structure_hook(_kind, _strict(_kind))


# cattrs turns a string into a list of its characters: `train_files = "a.jsonl"` would read ["a", ".", ...].
def _strict_list(value: Any, kind: Any) -> list:
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"expected a list, got {type(value).__name__} {value!r}")
    (item,) = get_args(kind) or (Any,)
    return [converter.structure(v, item) for v in value]


converter.register_structure_hook_func(lambda t: get_origin(t) is list, _strict_list)


def user_fields(cls: type) -> dict[str, attrs.Attribute]:
    """The keys a user may write in a section (component settings live in their own tables)."""
    return {f.name: f for f in attrs.fields(cls) if f.init}


def _known_keys(cls: type, prefix: str = "") -> list[str]:
    keys = []
    for field in user_fields(cls).values():
        path = f"{prefix}{field.name}"
        keys.append(path)
        if attrs.has(field.type if isinstance(field.type, type) else object):
            keys += _known_keys(field.type, path + ".")
    return keys


MOVED_KEYS: dict[str, str] = {
    "tracking.mlflow_uri": "tracking.mlflow.uri",
    "tracking.experiment": "tracking.mlflow.experiment",
    "tracking.run_name": "tracking.mlflow.run_name",
    "rollout.share_prompts": "rollout.hf.share_prompts",
}
"""Keys that moved into the table of the one component that reads them: old path -> new path. A config
that still writes an old key stops with one line naming the new one; there is no silent alias, so each
key keeps one name (and one line of docs/config.md)."""


def _parent(data: dict[str, Any], path: str) -> tuple[dict[str, Any] | None, str]:
    """The mapping that holds a dotted path's last key (None if a parent is missing), and that key."""
    *parents, key = path.split(".")
    for part in parents:
        data = data.get(part) if isinstance(data, dict) else None
    return (data if isinstance(data, dict) else None), key


def check_moved_keys(data: dict[str, Any]) -> None:
    """The first old key of MOVED_KEYS in `data` (a file with its overrides applied), as one ConfigError
    that says where the key lives now, in a file and on the command line. The value is not echoed: a
    store URI may hold a password."""
    for old, new in MOVED_KEYS.items():
        node, key = _parent(data, old)
        if node is not None and key in node:
            table, _, name = new.rpartition(".")
            raise ConfigError(f"{old} moved: write it as [{table}] {name} = ... (as an override: {new}=...)")


def drop_moved_keys(data: dict[str, Any]) -> dict[str, Any]:
    """`data` without the old keys of MOVED_KEYS: for a run's config.json written before they moved
    (it holds every key), read by a command that needs none of them (export builds the policy). A
    config.json from before 0.3.0 also holds reward.name's default next to reward.file (or components),
    where it did not run: dropped too."""
    for old in MOVED_KEYS:
        node, key = _parent(data, old)
        if node is not None:
            node.pop(key, None)
    reward = data.get("reward")
    if isinstance(reward, dict) and (reward.get("file") or reward.get("components")):
        reward.pop("name", None)
    return data


def check_one_source(data: dict[str, Any], overrides: list[str] | tuple[str, ...] = ()) -> None:
    """What runs is named once: reward.name next to reward.file or [[reward.components]] (the file would
    win silently) is one ConfigError when the config file (or the overrides) sets both. Given by an override
    next to the file's other one, the override wins and the file's key is dropped with a warning, as for
    trainer.total_steps / total_epochs: `reward.file=x.py` on a config that names a reward runs the file,
    `reward.name=exact_match` on a config with a reward file runs exact_match. reward.function without
    reward.file is an error too. `data` is the file with the overrides applied; a loaded config cannot tell
    an explicit default name from none (RewardConfig empties the default name next to a file)."""
    node = data.get("reward")
    if not isinstance(node, dict):
        return
    from_overrides = {o.partition("=")[0].strip() for o in overrides}
    other = next((k for k in ("file", "components") if node.get(k)), None)
    if node.get("name") and other:
        if "reward.name" in from_overrides and f"reward.{other}" not in from_overrides:
            dropped = [k for k in (other, "function") if k in node and f"reward.{k}" not in from_overrides]
            print(f"warning: reward.name is overridden: ignoring {', '.join(f'reward.{k} = {node.pop(k)!r}' for k in dropped)} "
                  "set in the config file", file=sys.stderr)
        elif f"reward.{other}" in from_overrides and "reward.name" not in from_overrides:
            print(f"warning: reward.{other} is overridden: ignoring reward.name = {node.pop('name')!r} set in the "
                  "config file", file=sys.stderr)
        else:
            shown = "[[reward.components]]" if other == "components" else f"reward.file = {node['file']!r}"
            raise ConfigError(f"reward.name = {node['name']!r} is set next to {shown}, which names the reward "
                              f"instead; set one of them (the {'components' if other == 'components' else 'file'}, "
                              f"or reward.name with reward.{other} removed)")
    if node.get("function", "compute_score") != "compute_score" and not node.get("file") and not node.get("components"):
        raise ConfigError(f"reward.function = {node['function']!r} is set but reward.file is empty, and the function "
                          "is looked up in that file; set reward.file or remove reward.function")


def check_keys(data: dict[str, Any], cls: type, prefix: str = "", extra: tuple[str, ...] = (), *,
               root: type) -> None:
    """Unknown keys, reported with their full path and the closest known key (`extra`: more valid paths;
    `root`: the whole config class, whose keys are the hint when none of this section's is close)."""
    fields = user_fields(cls)
    for key, value in data.items():
        path = f"{prefix}{key}"
        if key not in fields:
            known = [f"{prefix}{name}" for name in fields] + list(extra)
            close = difflib.get_close_matches(path, known, n=1, cutoff=0.6) or \
                difflib.get_close_matches(path, [*_known_keys(root), *extra], n=1, cutoff=0.6) or \
                difflib.get_close_matches(path, known, n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys here: {', '.join(known)}"
            raise ConfigError(f"unknown config key {path!r}{hint}")
        ftype = fields[key].type
        if isinstance(ftype, type) and attrs.has(ftype):
            if not isinstance(value, dict):
                raise ConfigError(f"config key {path!r} is a section; write it as a table of keys, not {value!r}")
            check_keys(value, ftype, path + ".", root=root)
        (item,) = get_args(ftype) if get_origin(ftype) is list else (None,)
        if isinstance(item, type) and attrs.has(item) and isinstance(value, list):  # [[reward.components]]
            for i, entry in enumerate(value):
                if isinstance(entry, dict):
                    check_keys(entry, item, f"{path}[{i}].", root=root)


def check_fields(obj: Any, prefix: str = "") -> None:
    """Run the field validators of an attrs instance and of the attrs instances it holds (sections, list
    entries); the first failure is a ConfigError naming its key path."""
    for field in attrs.fields(type(obj)):
        value = getattr(obj, field.name)
        if field.validator is not None:
            try:
                field.validator(obj, field, value)
            except (ValueError, TypeError) as exc:  # attrs' own validators put the message first in args
                message = exc.detail if isinstance(exc, OutOfDomain) else exc.args[0] if exc.args else exc
                raise ConfigError(f"config key {prefix + field.name!r}: {message}; fix the value in the config "
                                  "or override") from None
        if attrs.has(type(value)):
            check_fields(value, f"{prefix}{field.name}.")
        elif isinstance(value, list):
            for i, entry in enumerate(value):
                if attrs.has(type(entry)):
                    check_fields(entry, f"{prefix}{field.name}[{i}].")


def _leaf_message(exc: BaseException, kind: Any) -> str:
    """A validator's own message (attrs names the field and the bound), else cattrs' default."""
    if isinstance(exc, ValueError) and str(exc):
        return str(exc)
    return cattrs.v.format_exception(exc, kind)


def structure_as(data: dict[str, Any], cls: type, prefix: str = "") -> Any:
    """cattrs structuring with the first error as one line: 'config key <path>: <what is wrong>'.
    Field validators (the domains of domains.py, or any attrs validator) run after, in every section,
    nested table and list entry, each failure reported by its full key."""
    try:
        with attrs.validators.disabled():
            obj = converter.structure(data, cls)
        check_fields(obj, prefix)
        return obj
    except ConfigError:
        raise
    except Exception as exc:  # cattrs wraps every leaf error in a ClassValidationError
        for message in cattrs.transform_error(exc, path="$", format_exception=_leaf_message):
            text, _, where = message.partition(" @ ")
            where = prefix + where.removeprefix("$.").replace("$", "")
            raise ConfigError(f"config key {where.rstrip('.')!r}: {text}; fix the value in the config "
                              "or override") from None
        raise ConfigError(f"config section {prefix.rstrip('.') or 'root'}: {exc}") from None
