"""Plugin discovery and the registries.

Plugins are modules named by entry points in the group ``nanoverl``. Each is loaded on its own, so
one that fails to import is reported by name instead of breaking every command. The core's
built-ins are registered through the same hooks, under the distribution name ``nanoverl``.

One ``Registry`` holds a table per kind (rollout, worker, advantage_estimator, reward, tracker,
policy_loss, environment, data_source), records which distribution provided each name (and its description and settings
class), resolves ``"module:attr"`` strings only when a name is selected, and raises one
``PluginError`` format for duplicates and unknown names. ``import_ref`` is the core's one ``"module:attr"``
resolver: the registry's, and the reward and environment worker processes' (reward/ and env/ import it
from here; this module imports neither).
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import attrs
import pluggy

from . import hookspecs
from .errors import PluginError, one_line
from .foreign_keys import foreign_name_hint
from .hookspecs import HOOKS, PROJECT

KINDS = tuple(HOOKS.values())
CORE_DIST = "nanoverl"

# Names provided by first-party plugins, so an unknown name can say what to install.
FIRST_PARTY: dict[tuple[str, str], str] = {
    ("worker", "hf"): "hf", ("rollout", "hf"): "hf", ("reward", "gsm8k"): "hf", ("reward", "reward_model"): "hf",
    ("worker", "fsdp"): "fsdp", ("rollout", "vllm"): "vllm", ("tracker", "mlflow"): "mlflow",
    ("reward", "math_verify"): "math",
    ("tracker", "tensorboard"): "tensorboard", ("tracker", "wandb"): "wandb",
    ("data_source", "reasoning_gym"): "reasoning-gym", ("reward", "reasoning_gym"): "reasoning-gym",
    **{("advantage_estimator", n): "grpo"
       for n in ("grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline", "opo", "grpo_passk")},
}


def install_hint(extra: str) -> str:
    """The pip command that installs a first-party extra ("hf", "lora", "mlflow", ...) from the index and,
    when nanoverl runs from a source checkout (its plugins/ folder beside the core), the editable install
    of the checkout's folder, which works without the index and installs the code being run."""
    index = f'pip install "nanoverl[{extra}]"'
    root = Path(__file__).resolve().parents[1]
    if not (root / "pyproject.toml").is_file() or not (root / "plugins").is_dir():
        return index
    plugin, _, extras = {"lora": "nanoverl-hf[lora]"}.get(extra, f"nanoverl-{extra}").partition("[")
    if not (root / "plugins" / plugin).is_dir():
        return index
    local = _shown(root / "plugins" / plugin) + (f"[{extras}" if extras else "")
    return f'{index}, or from this checkout: pip install -e "{local}"'


def close_name(name: str, names: list[str]) -> str | None:
    """The registered name `name` is most likely a typo of, or None: one of similar spelling (difflib ratio
    >= 0.75: 'char_matc', 'gpso'), or one that begins with it or it begins with (four characters or more:
    'grpo' and 'grpo_passk'). Short names that share letters but not meaning ('ppo' and 'opo', 'dr_grpo'
    and 'dro') are not suggested."""
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
    if close:
        return close[0]
    prefixed = [n for n in names if min(len(n), len(name)) >= 4 and (n.startswith(name) or name.startswith(n))]
    return prefixed[0] if len(prefixed) == 1 else None


def _shown(path: Path) -> str:
    """`path` relative to the working directory when it is inside it, else absolute."""
    try:
        return str(path.relative_to(Path.cwd().resolve())) or "."
    except ValueError:
        return str(path)


def import_ref(ref: str) -> Any:
    """The object a "module:qualname" string names (a bare "module": the module): how the registry resolves a
    lazy registration and loads the built-in plugin, and how a worker process (a reward's, an environment's)
    imports a registered object; the string comes from the code, never from a config value. Raises
    ImportError or AttributeError; callers name the ref."""
    module, _, qualname = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in filter(None, qualname.split(".")):
        obj = getattr(obj, part)
    return obj


def import_file(path: str | Path, key: str, error: type[Exception] = PluginError) -> Any:
    """The module a user's .py file defines, named by the config key `key` (reward.file, environment.file):
    a missing file is a ConfigError, one that raises while it imports is `error`, each naming the key."""
    from .errors import ConfigError

    path = Path(path)
    section = key.partition(".")[0]
    if not path.is_file():
        raise ConfigError(f"{key} = {str(path)!r} does not exist; fix the path or use {section}.name")
    try:
        return exec_file(path, f"nanoverl_{section}_{path.stem}")
    except Exception as exc:
        raise error(f"{key} {path} failed to import ({one_line(exc)}); fix the file") from None


def exec_file(path: str | Path, name: str, *, register: bool = False) -> Any:
    """Run the .py file at `path` as the module `name` and return it; the file's own exception propagates.
    `register` puts the module in sys.modules while and after it runs (pickling, dataclasses and pydantic
    resolve names through it; give each file its own `name` then), and takes it out again if it raises."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        if register:
            sys.modules.pop(name, None)
        raise
    return module


def functions_in_file(path: str | Path, key: str, names: tuple[str, ...], name_key: str) -> dict[str, Any]:
    """`names` from the .py file at `path` (config key `key`), each a function, or one ConfigError naming
    `name_key` with the functions the file does define."""
    import inspect

    from .errors import ConfigError

    module = import_file(path, key, ConfigError)
    found = {name: getattr(module, name, None) for name in names}
    missing = [name for name, fn in found.items() if not callable(fn)]
    if missing:
        defined = sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and v.__module__ == module.__name__)
        raise ConfigError(f"{name_key}: {', '.join(map(repr, missing))} is not a function in {path} (its functions: "
                          f"{', '.join(defined) or 'none'}); fix {name_key}")
    return found


@attrs.define
class Entry:
    kind: str
    name: str
    obj: Any
    """The registered object, or a "module:attr" string imported on first use."""
    provider: str
    """Distribution that registered it."""
    description: str = ""
    settings: Any = None
    """The component's settings class (attrs), a "module:attr" string for it, or None."""


@attrs.define
class PluginInfo:
    dist: str
    version: str
    module: str
    hooks: list[str] = attrs.Factory(list)
    names: dict[str, list[str]] = attrs.Factory(dict)
    descriptions: dict[str, dict[str, str]] = attrs.Factory(dict)
    """kind -> name -> the description it was registered with."""
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


class Registry:
    """Every registered name, per kind, with its provider."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, Entry]] = {kind: {} for kind in KINDS}
        self.plugins: list[PluginInfo] = []
        self.excluded: dict[str, str] = {}
        """Installed plugins the plugin variables leave out: distribution -> the variable."""
        self._loaded: dict[tuple[str, str], Any] = {}

    def add(self, kind: str, name: str, obj: Any, provider: str, description: str = "", settings: Any = None) -> None:
        if kind not in self.entries:
            raise PluginError(f"plugin {provider}: unknown kind {kind!r}; kinds are {', '.join(KINDS)}")
        if not isinstance(name, str) or not name:
            raise PluginError(f"plugin {provider} registered a {kind} with an invalid name {name!r}")
        if name in self.entries[kind]:
            other = self.entries[kind][name].provider
            if other == provider:
                raise PluginError(f"{kind} name {name!r} is registered twice by {provider}; this is a bug in {provider}")
            raise PluginError(f"{kind} name {name!r} is registered by both {other} and {provider}; "
                              f"uninstall one, or set NANOVERL_DISABLE_PLUGINS={provider}")
        self.entries[kind][name] = Entry(kind, name, obj, provider, description, settings)

    def names(self, kind: str) -> list[str]:
        return sorted(self.entries[kind])

    def entry(self, kind: str, name: str, key: str | None = None) -> Entry:
        """The entry for a name, or a PluginError listing what exists and what to install."""
        if name in self.entries[kind]:
            return self.entries[kind][name]
        where = f"{key} = {name!r}" if key else f"{kind} {name!r}"
        available = self.names(kind)
        msg = f"{where}: no {kind} of that name is registered; available: {', '.join(available) or 'none'}"
        extra = FIRST_PARTY.get((kind, name))
        foreign = foreign_name_hint(kind, name)
        close = None if foreign else close_name(name, available)
        if foreign:
            msg += f"; {foreign}"
        elif close:
            msg += f"; did you mean {close!r}?"
        dist = f"nanoverl-{extra.partition('[')[0]}" if extra else ""
        variable = self.excluded.get("nanoverl-hf" if extra == "lora" else dist)
        if extra:
            msg += f"; it is provided by nanoverl-{extra}: {install_hint(extra)}"
        if variable:  # installed, but the plugin variables leave it out: that is the fix
            fix = "add it to" if variable.endswith("LOAD_PLUGINS") else "remove it from"
            msg += (f"; here {dist}, which is installed but left out by {variable}={os.environ.get(variable, '')!r}, "
                    f"is what is missing: {fix} {variable}")
        raise PluginError(msg)

    def get(self, kind: str, name: str, key: str | None = None) -> Any:
        """The registered object, importing a "module:attr" string the first time."""
        entry = self.entry(kind, name, key)
        if (kind, name) not in self._loaded:
            self._loaded[(kind, name)] = self._resolve(entry, entry.obj)
        return self._loaded[(kind, name)]

    def settings_class(self, kind: str, name: str) -> type | None:
        """The settings class a component registered (imported on first use), or None."""
        entry = self.entry(kind, name)
        if entry.settings is None:
            return None
        if (kind, name, "settings") not in self._loaded:
            cls = self._resolve(entry, entry.settings)
            if not (isinstance(cls, type) and attrs.has(cls)):
                raise PluginError(f"{kind} {name!r} from {entry.provider} registered settings={entry.settings!r}, "
                                  f"which is not an attrs class; this is a bug in {entry.provider}")
            self._loaded[(kind, name, "settings")] = cls
        return self._loaded[(kind, name, "settings")]

    def _resolve(self, entry: Entry, obj: Any) -> Any:
        """`obj` itself, or what its "module:attr" string names (errors say what to install or fix)."""
        kind, name = entry.kind, entry.name
        if isinstance(obj, str):
            try:
                obj = import_ref(obj)
            except ImportError as exc:
                extra = FIRST_PARTY.get((kind, name))
                fix = install_hint(extra) if extra else f"install what {entry.provider} needs"
                raise PluginError(f"{kind} {name!r} from {entry.provider} cannot be imported ({exc}); "
                                  f"{fix}") from None
            except AttributeError:
                raise PluginError(f"{kind} {name!r} from {entry.provider} points at {obj!r}, "
                                  f"which does not exist; this is a bug in {entry.provider}") from None
            except Exception as exc:  # the module itself raised while importing (SyntaxError, RuntimeError, ...)
                detail = one_line(exc)
                raise PluginError(f"{kind} {name!r} from {entry.provider} failed to import ({detail}); fix or "
                                  f"uninstall {entry.provider}, or set NANOVERL_DISABLE_PLUGINS={entry.provider} "
                                  "and choose another name") from None
        return obj

    def check_imports(self) -> None:
        """Raise for the first plugin that failed to import (training refuses to run half-loaded)."""
        for info in self.plugins:
            if info.error:
                raise PluginError(f"plugin {info.dist} failed to import ({info.error}); fix or uninstall it, "
                                  f"or set NANOVERL_DISABLE_PLUGINS={info.dist}")

    def versions(self) -> dict[str, str]:
        return {p.dist: p.version for p in self.plugins}


def _env_list(name: str) -> set[str] | None:
    value = os.environ.get(name)
    return None if value is None else {v.strip() for v in value.split(",") if v.strip()}


def _check_plugin_variables(only: set[str] | None, blocked: set[str], installed: list[str]) -> None:
    """NANOVERL_LOAD_PLUGINS naming a plugin that is not installed is one line (the run would miss its
    names); NANOVERL_DISABLE_PLUGINS naming one is a warning (there is nothing to block). Both name the
    variable, the entry and the closest installed plugin."""
    for variable, names in (("NANOVERL_LOAD_PLUGINS", only or set()), ("NANOVERL_DISABLE_PLUGINS", blocked)):
        for name in sorted(set(names) - set(installed) - {CORE_DIST}):
            close = difflib.get_close_matches(name, installed, n=1, cutoff=0.6)
            text = (f"{variable} names {name!r}, which is no installed plugin (a distribution name, as "
                    f"`nanoverl-train plugins` lists them: {', '.join(installed) or 'none installed'})"
                    + (f"; did you mean {close[0]!r}?" if close else ""))
            if variable == "NANOVERL_LOAD_PLUGINS":
                raise PluginError(f"{text}; fix the entry or unset {variable}")
            print(f"warning: {text}", file=sys.stderr)


def excluded_plugins() -> dict[str, str]:
    """Installed plugins that NANOVERL_LOAD_PLUGINS or NANOVERL_DISABLE_PLUGINS leaves out: dist -> the variable."""
    only, blocked = _env_list("NANOVERL_LOAD_PLUGINS"), _env_list("NANOVERL_DISABLE_PLUGINS") or set()
    out = {}
    for ep in entry_points(group=PROJECT):
        if ep.name in blocked:
            out[ep.name] = "NANOVERL_DISABLE_PLUGINS"
        elif only is not None and ep.name not in only:
            out[ep.name] = "NANOVERL_LOAD_PLUGINS"
    return out


BUILTINS = "nanoverl_core.builtins.plugin"
"""The core's own plugin module: the debug backends, gae, the built-in losses, rewards and trackers."""


def make_plugin_manager() -> tuple[pluggy.PluginManager, list[PluginInfo]]:
    """A plugin manager with the built-ins and every allowed, importable entry-point plugin. The built-ins
    are a plugin like any other, loaded by module name as an entry point is (the plugin manager does not
    import the wings above it)."""
    builtins = import_ref(BUILTINS)
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(hookspecs)
    infos = [PluginInfo(CORE_DIST, _version(CORE_DIST), builtins.__name__)]
    pm.register(builtins, name=CORE_DIST)
    only, blocked = _env_list("NANOVERL_LOAD_PLUGINS"), _env_list("NANOVERL_DISABLE_PLUGINS") or set()
    installed = sorted({ep.name for ep in entry_points(group=PROJECT)})
    _check_plugin_variables(only, blocked, installed)
    seen: set[str] = set()
    for ep in sorted(entry_points(group=PROJECT), key=lambda e: e.name):
        if ep.name in seen or ep.name in blocked or (only is not None and ep.name not in only):
            continue
        seen.add(ep.name)
        info = PluginInfo(ep.name, ep.dist.version if ep.dist else "?", ep.value)
        infos.append(info)
        try:
            module = ep.load()
            pm.register(module, name=ep.name)
        except Exception as exc:  # a broken plugin must not break every command
            info.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"plugin {pm.get_name(exc.plugin)} implements an unknown hook ({exc}); "
                          f"the hooks are {', '.join(HOOKS)}") from None
    return pm, infos


def load_registry() -> Registry:
    """Discover plugins as nanoverl-train does and fill one registry per kind."""
    pm, infos = make_plugin_manager()
    registry = Registry()
    registry.plugins = infos
    registry.excluded = excluded_plugins()
    by_dist = {info.dist: info for info in infos}
    for hook_name, kind in HOOKS.items():
        for impl in getattr(pm.hook, hook_name).get_hookimpls():
            provider = impl.plugin_name
            info = by_dist[provider]
            info.hooks.append(hook_name)

            def register(name: str, obj: Any, *, description: str = "", settings: Any = None,
                         _kind=kind, _by=provider) -> None:
                registry.add(_kind, name, obj, _by, description, settings)
                by_dist[_by].names.setdefault(_kind, []).append(name)
                by_dist[_by].descriptions.setdefault(_kind, {})[name] = description

            impl.function(register=register)
    return registry


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(dist)
    except PackageNotFoundError:
        return "0+unknown"
