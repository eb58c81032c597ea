"""A model turn as an OpenEnv Action, and an OpenEnv observation as nanoverl's EnvStep: the same mapping
in-process and through a server, since both sides see the observation in OpenEnv's wire format
(`serialize_observation`: {"observation": fields, "reward": r, "done": d}).

    turn text --(settings.action)--> Action fields {"message": text}
    {"observation": {...}, "reward": r, "done": d} --(settings.observation, role)--> EnvStep(text or messages, r, d)

By default the text goes into the Action's one text field and the model reads the Observation's one text
field; both are found in the JSON schemas OpenEnv publishes (`model_json_schema()`, a server's /schema), so
a settings check can tell at config load whether the defaults fit.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any

import attrs

from nanoverl_core.env import EnvStep

from .refs import load_ref

class SettingError(ValueError):
    """A mistake in the setting `setting` ("action", "observation") of [environment.openenv]."""

    def __init__(self, setting: str, message: str):
        super().__init__(message)
        self.setting = setting


BASE_FIELDS = ("metadata", "reward", "done")
"""Fields of every OpenEnv Action / Observation (openenv.core.env_server.types), never the text."""


def text_fields(schema: dict[str, Any]) -> list[str]:
    """The fields of a pydantic JSON schema that take text (a string, or a string or null)."""
    def is_text(prop: dict[str, Any]) -> bool:
        return prop.get("type") == "string" or any(p.get("type") == "string" for p in prop.get("anyOf", ()))
    return [name for name, prop in schema.get("properties", {}).items() if name not in BASE_FIELDS and is_text(prop)]


def the_text_field(schema: dict[str, Any], what: str, setting: str) -> str:
    """The one text field of an Action or Observation schema, or a ValueError naming the setting that picks it."""
    texts = text_fields(schema)
    required = [n for n in schema.get("required", []) if n not in texts]
    if len(texts) == 1 and (what == "observation" or not required):
        return texts[0]
    fields = ", ".join(n for n in schema.get("properties", {}) if n not in BASE_FIELDS) or "none"
    found = (f"{len(texts)} text fields" if texts else "no text field") + (
        f" and required {', '.join(required)}" if required and len(texts) == 1 else "")
    where = "the turn's text has no one field to go into" if what == "action" else "no one field is what the model reads"
    raise ValueError(f"its {what} {schema.get('title', '')} has {found} (its fields: {fields}), so {where}; set "
                     f"environment.openenv.{setting}")


def step_types(env_cls: type) -> tuple[type | None, type | None]:
    """(Action class, Observation class) of an OpenEnv Environment subclass: from `step`'s type hints, else
    from the `Environment[Action, Observation, State]` it subclasses; None where neither says."""
    from openenv.core.env_server.interfaces import Environment

    try:
        hints = typing.get_type_hints(env_cls.step)
    except Exception:                           # an annotation that does not resolve: the bases may say
        hints = {}
    action, observation = hints.get("action"), hints.get("return")
    for klass in env_cls.__mro__:
        for base in vars(klass).get("__orig_bases__", ()):
            if typing.get_origin(base) is Environment:
                params = typing.get_args(base)
                action, observation = action or params[0], observation or params[1]
    return (action if isinstance(action, type) else None), (observation if isinstance(observation, type) else None)


@attrs.frozen
class Mapping:
    """How turns become actions and observations become answers (see the module docstring)."""

    action_field: str = ""
    action_fn: Callable[[str], Any] | None = None
    observation_field: str = ""
    observation_fn: Callable[[dict[str, Any]], Any] | None = None
    role: str = "user"

    def action(self, text: str) -> dict[str, Any] | Any:
        """The Action for a model turn: {field: text}, or what the user's function returns (a dict of the
        Action's fields, or an Action)."""
        return self.action_fn(text) if self.action_fn else {self.action_field: text}

    def text(self, fields: dict[str, Any]) -> str | list[dict[str, Any]]:
        """What the model reads of an observation's fields: text, or chat messages from the user's function."""
        if self.observation_fn:
            return self.observation_fn(fields)
        value = fields.get(self.observation_field)
        return "" if value is None else str(value)

    def answer(self, payload: dict[str, Any]) -> EnvStep:
        """nanoverl's EnvStep for an observation in OpenEnv's wire format."""
        shown = self.text(payload.get("observation") or {})
        if isinstance(shown, str) and self.role:
            shown = [{"role": self.role, "content": shown}]
        reward = payload.get("reward")
        return EnvStep(observation=shown, reward=0.0 if reward is None else float(reward),
                       done=bool(payload.get("done")))


def mapping_for(settings, action_schema: dict[str, Any], observation_schema: dict[str, Any]) -> Mapping:
    """The Mapping `settings` ([environment.openenv]) asks for, checked against the schemas: a ValueError
    (naming the setting) when the default needs a text field the Action or Observation lacks."""
    if settings.action:
        action = {"action_fn": _function(settings.action, "action")}
    else:
        action = {"action_field": the_text_field(action_schema, "action", "action")}
    fields = observation_schema.get("properties", {})
    if ":" in settings.observation:
        observation = {"observation_fn": _function(settings.observation, "observation")}
    elif settings.observation in fields:
        observation = {"observation_field": settings.observation}
    elif settings.observation:
        listed = ", ".join(n for n in fields if n not in BASE_FIELDS)
        raise SettingError("observation", f"its observation has no field {settings.observation!r} (its fields: "
                                          f"{listed}); name one of them, or a \"module:function\"")
    else:
        observation = {"observation_field": the_text_field(observation_schema, "observation", "observation")}
    return Mapping(**action, **observation, role=settings.role)


def _function(ref: str, setting: str) -> Callable:
    try:
        fn = load_ref(ref)
    except ValueError as exc:
        raise SettingError(setting, str(exc)) from None
    if not callable(fn):
        raise SettingError(setting, f"{ref!r} is not a function")
    return fn
