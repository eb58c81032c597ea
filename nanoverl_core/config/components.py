"""Component settings: the [<section>.<name>] tables of the components a config selects.

A rollout, worker, policy loss, advantage estimator, reward, tracker, environment or data source that registered a settings class
(`register(..., settings=Cls)`) is configured in its own table; `component_settings` structures and
validates it like the core's keys and puts it at `config.<section>.settings`.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from ..errors import ConfigError
from .structure import check_keys, structure_as

if TYPE_CHECKING:
    from ..plugins import Registry

Config = Any
"""A nanoverl_core.config.Config (schema.py imports this module: a type name here, not an import)."""

COMPONENTS: dict[str, str] = {"rollout": "rollout", "worker": "worker", "actor": "policy_loss",
                              "algorithm": "advantage_estimator", "reward": "reward", "tracking": "tracker",
                              "environment": "environment", "agent": "agent", "data": "data_source"}
"""Config section -> the registry kind of the component(s) it selects. A component that registered a
settings class (`register(..., settings=Cls)`) is configured in the table [<section>.<name>]; the
selected one's settings object is `config.<section>.settings` (for trackers, a dict by name)."""


S = TypeVar("S")


def settings_or_defaults(settings: Any, cls: type[S]) -> S:
    """A component's settings as `config.<section>.settings` holds them, or `cls()`, its defaults, where the
    config holds none (None: the component was built by hand, or from a config of before its table) or
    another component's (a test that hands one rollout's config to another)."""
    return settings if isinstance(settings, cls) else cls()


def selected_names(config: Config, section: str) -> list[str]:
    return {"rollout": [config.rollout.name], "worker": [config.worker.name], "actor": [config.actor.policy_loss],
            "algorithm": [config.algorithm.advantage_estimator],
            "reward": [c.name for c in config.reward.components if not c.file] if config.reward.components
            else [] if config.reward.file else [config.reward.name],
            "tracking": list(config.tracking.trackers),
            "environment": [config.environment.name] if config.environment.name else [],
            "agent": [config.agent.name] if config.agent.name else [],
            "data": [config.data.source]}[section]


def _keyed_by_name(config: Config, section: str) -> bool:
    """Sections that select several components hold their settings as a dict by name."""
    return section == "tracking" or (section == "reward" and bool(config.reward.components))


def settings_by_name(config: Config, section: str) -> dict[str, Any]:
    node = getattr(config, section)
    if _keyed_by_name(config, section):
        return dict(node.settings or {})
    names = selected_names(config, section)
    return {names[0]: node.settings} if names else {}


def component_settings(config: Config, registry: Registry,
                       tables: dict[str, dict[str, Any]] | None = None) -> Config:
    """Give every selected component its typed settings, validated like the core's keys.

    `tables` are the [<section>.<name>] tables of the config file and overrides. A component whose
    settings are already set (a loaded config) keeps them unless a table is given. Tables for a
    registered component that is not selected are ignored with a warning (switching `rollout.name`
    by an override must not break on the other rollout's settings); a table naming no registered
    component is an unknown key. Names that are not registered at all are left for
    `resolve_plugins` to report with the close match and the install line.
    """
    tables = tables or {}
    for section, kind in COMPONENTS.items():
        given, node = dict(tables.get(section, {})), getattr(config, section)
        if _keyed_by_name(config, section) and not isinstance(node.settings, dict):
            node.settings = {}
        for name in selected_names(config, section):
            if name not in registry.entries[kind]:
                continue
            cls, table, key = registry.settings_class(kind, name), given.pop(name, None), f"{section}.{name}"
            current = node.settings.get(name) if _keyed_by_name(config, section) else node.settings
            if cls is None and table:
                raise ConfigError(f"[{key}] is set, but the {kind} {name!r} takes no settings; remove that table")
            if cls is None:
                value = None
            elif table is None and isinstance(current, cls):
                value = current
            else:
                check_keys(table or {}, cls, key + ".", root=type(config))
                value = structure_as(table or {}, cls, key + ".")
            if _keyed_by_name(config, section):
                node.settings[name] = value
            else:
                node.settings = value
        for name in given:
            if name in registry.entries[kind]:
                print(f"warning: [{section}.{name}] is ignored: that {kind} is not selected", file=sys.stderr)
                continue
            check_keys({name: given[name]}, attrs.fields_dict(type(config))[section].type, f"{section}.",
                       extra=tuple(f"{section}.{n}" for n in registry.names(kind)), root=type(config))
    return config
