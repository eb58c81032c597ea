"""[environment.openenv]: where the OpenEnv environment runs and how turns and observations map, checked when
the config loads (so `--dry-run` too): a bad reference, a class that is not an OpenEnv Environment, an
Action or Observation the default mapping does not fit, a server that does not answer. Each is one
`error:` line naming the key (nanoverl's config loader prefixes the ValueError raised here with it)."""

from __future__ import annotations

from typing import Any

import attrs

from nanoverl_core import ConfigError
from nanoverl_core.config import above


def _where(instance: Any, attribute: attrs.Attribute, value: str) -> None:
    """env, url, app: exactly one is set; the one that is must load (and a server must answer)."""
    chosen = [name for name in ("env", "url", "app") if getattr(instance, name)]
    if len(chosen) != 1:
        said = f"{' and '.join(chosen)} are both set" if chosen else "none is set"
        raise ValueError(f"set exactly one of environment.openenv.env (an Environment class, run in-process), "
                         f"url (a running OpenEnv server) or app (an OpenEnv app served for the run); {said}")
    if value:
        from .episode import check_settings            # imports openenv (and the environment) only when needed
        from .mapping import SettingError
        try:
            check_settings(instance)
        except SettingError as exc:                    # a mistake of `action` or `observation`: name that key
            raise ConfigError(f"config key 'environment.openenv.{exc.setting}': {exc}; fix the value in the config "
                              "or override") from None


@attrs.frozen
class OpenEnvSettings:
    env: str = attrs.field(default="", validator=_where)
    """In-process: the OpenEnv Environment class, "module:Class" or "path/to/file.py:Class" (the file's code
    runs, as environment.file's). Each episode builds one with no arguments, as OpenEnv's server does, and
    calls its reset and step in the environment worker that holds the episode."""
    url: str = attrs.field(default="", validator=_where)
    """Or the base URL of a running OpenEnv server ("http://127.0.0.1:8000"): each episode is one WebSocket
    session on it (OpenEnv's GenericEnvClient), the episode's state on the server."""
    app: str = attrs.field(default="", validator=_where)
    """Or an OpenEnv server app, what `create_app(...)` returns ("module:app" or "path/to/app.py:app"): each
    environment worker serves it with uvicorn on 127.0.0.1 on a free port, holds its episodes as sessions on
    it, and stops it when the worker ends; a server that died is started again for the next episode."""
    action: str = ""
    """How a model turn becomes the Action: "" puts the turn's text into the Action's one text field; or a
    function "module:func" / "path/to/file.py:func", func(text) -> the Action's fields as a dict (or an Action)."""
    observation: str = ""
    """What the model reads after a step: "" the Observation's one text field; the name of a field (its value as
    text); or a function "module:func" / "path/to/file.py:func", func(fields: dict) -> text or chat messages."""
    role: str = "user"
    """Text an observation gives is appended as a chat message of this role (through the chat template); ""
    appends the text as it is."""
    reset_key: str = "reset"
    """The data row's field that holds reset's keyword arguments (a dict: seed, and whatever the environment's
    reset takes); a row without it resets with none. The model's prompt is the row's prompt either way."""
    check_prompt: bool = False
    """Fail an episode whose row's "prompt" does not contain the reset observation's text (what the model would
    read): a guard for rows written from reset observations (docs/openenv.md)."""
    connect_timeout_s: float = attrs.field(default=10.0, validator=above(0))
    """Seconds to open an episode's WebSocket session, and to read the server's /schema in a worker."""
    message_timeout_s: float = attrs.field(default=20.0, validator=above(0))
    """Seconds a server may take to answer one reset or step; past it the episode fails. Keep it below
    environment.timeout_s, so a slow server fails its episode and not the worker holding others."""
    start_timeout_s: float = attrs.field(default=60.0, validator=above(0))
    """app: seconds the started server may take to answer its /health."""
