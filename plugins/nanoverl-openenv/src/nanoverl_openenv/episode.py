"""The environment `openenv`: each nanoverl episode is one OpenEnv episode, reset when it starts and stepped
once per model turn, through OpenEnv's own API, unchanged.

    in-process (env)     Environment class() -> reset(**row[reset_key]) -> step(Action) ... -> close()
    server (url, app)    GenericEnvClient WebSocket session -> reset -> step ... -> close (the state on the server)

Each answer goes through `mapping.Mapping`: OpenEnv's observation (in its wire format in both modes) becomes the
text or chat message the model reads, its reward and done the EnvStep's. The reset observation is not
appended: the model's prompt is the data row's (`check_prompt` checks that it holds the reset observation).

Faults are failures of the episode, never a hang: an environment that raises (in-process, or on the server,
whose error message comes back), a server that does not answer within `message_timeout_s`, a WebSocket that
drops mid-episode, a server that refuses the session (at capacity) all raise here, and nanoverl ends the
episode under environment.on_error. A session whose WebSocket is gone is never silently reopened: OpenEnv's
client would open a fresh session, a new environment that was never reset, so `EpisodeClient` refuses.
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import Any

from nanoverl_core.config import settings_or_defaults
from nanoverl_core.env import EnvStep, Turn
from nanoverl_core.errors import one_line
from openenv.core.client_types import StepResult
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.serialization import serialize_observation
from openenv.core.generic_client import GenericEnvClient
from starlette.applications import Starlette
from websockets.protocol import State

from .mapping import Mapping, mapping_for, step_types
from .refs import load_ref
from .server import get_json, started_url
from .settings import OpenEnvSettings

CHECK_TIMEOUT_S = 10.0
"""Each request of a server's /health and /schema when the config loads."""


class LocalEpisode:
    """In-process: the environment object itself."""

    def __init__(self, env_cls: type, action_cls: type, mapping: Mapping, reset: dict[str, Any]):
        self.env, self.action_cls, self.mapping = env_cls(), action_cls, mapping
        self.first = serialize_observation(self.env.reset(**reset))

    def step(self, turn: Turn) -> EnvStep:
        action = self.mapping.action(turn.text)
        if isinstance(action, dict):
            action = self.action_cls.model_validate(action)
        return self.mapping.answer(serialize_observation(self.env.step(action)))

    def close(self) -> None:
        self.env.close()


class EpisodeClient(GenericEnvClient):
    """OpenEnv's GenericEnvClient held to the one session it opened: once its WebSocket is closed (the server
    went away, or a reply timed out and the client dropped the socket), every call raises."""

    async def _ensure_connected(self) -> None:
        if self._ws is None or self._ws.state is not State.OPEN:
            raise ConnectionError("the episode's WebSocket session is closed (the server went away, or a reply "
                                  "timed out), and the episode's state was in it")
        await super()._ensure_connected()


class ServerEpisode:
    """A WebSocket session on an OpenEnv server: the environment and its state live on the server."""

    def __init__(self, url: str, settings: OpenEnvSettings, reset: dict[str, Any]):
        self.url = url
        self.client = EpisodeClient(base_url=url, connect_timeout_s=settings.connect_timeout_s,
                                    message_timeout_s=settings.message_timeout_s).sync()
        try:
            self._call("connect", self.client.connect)
            self.mapping = self._call("schema", served_mapping, settings, url)
            self.first = wire(self._call("reset", self.client.reset, **reset))
        except BaseException:
            self.client.close()
            raise

    def _call(self, what: str, method, *args, **kwargs):
        """`method(...)`; what it raises (the server's error message, a timeout, a dropped or refused
        WebSocket) as one RuntimeError naming the server and the call."""
        try:
            return method(*args, **kwargs)
        except Exception as exc:
            detail = one_line(exc)
            if "CAPACITY_REACHED" in detail:
                detail += ("; the server holds max_concurrent_envs sessions at once: raise it in the app's "
                           "create_app(...) to cover the episodes a worker holds (data.batch_size x rollout.n / "
                           "environment.workers)")
            raise RuntimeError(f"OpenEnv server {self.url}, {what}: {detail}") from None

    def step(self, turn: Turn) -> EnvStep:
        result = self._call(f"turn {turn.index}", self.client.step, self.mapping.action(turn.text))
        return self.mapping.answer(wire(result))

    def close(self) -> None:
        self.client.close()


def wire(result: StepResult) -> dict[str, Any]:
    """A client's StepResult in OpenEnv's wire format, as serialize_observation gives it in-process."""
    return {"observation": result.observation, "reward": result.reward, "done": result.done}


# ---- the factory and what it needs, cached per process ----------------------------------------------------
def openenv_episode(sample: dict[str, Any], settings: OpenEnvSettings | None = None) -> LocalEpisode | ServerEpisode:
    """The `register_environments` factory: one episode of the OpenEnv environment [environment.openenv] names,
    reset with the keyword arguments of the row's `reset_key` field."""
    settings = settings_or_defaults(settings, OpenEnvSettings)
    reset = reset_kwargs(sample, settings.reset_key)
    if settings.env:
        env_cls, action_cls, mapping = local(settings)
        episode = LocalEpisode(env_cls, action_cls, mapping, reset)
    else:
        episode = ServerEpisode(settings.url or started_url(settings.app, settings.start_timeout_s), settings, reset)
    if settings.check_prompt:
        try:
            check_prompt(episode, sample)
        except BaseException:
            episode.close()
            raise
    return episode


def reset_kwargs(sample: dict[str, Any], key: str) -> dict[str, Any]:
    """The row's reset arguments. None values are dropped: `datasets` gives every row of a file every key any
    row has (None where a row has none), and None is what reset's parameters default to."""
    value = sample.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"the data row's {key!r} must be a dict of reset's keyword arguments, not {value!r} "
                         "(environment.openenv.reset_key)")
    return {name: v for name, v in value.items() if v is not None}


def check_prompt(episode: LocalEpisode | ServerEpisode, sample: dict[str, Any]) -> None:
    shown = episode.mapping.text(episode.first.get("observation") or {})
    text = shown if isinstance(shown, str) else "\n".join(str(m.get("content", "")) for m in shown)
    prompt = sample.get("prompt", "")
    prompt = prompt if isinstance(prompt, str) else "\n".join(str(m.get("content", "")) for m in prompt)
    if text.strip() not in prompt:
        raise ValueError(f"the row's prompt does not contain the reset observation {text.strip()[:200]!r}, so it "
                         "was written for another episode: rewrite the rows from reset, or set "
                         "environment.openenv.check_prompt=false")


@cache
def local(settings: OpenEnvSettings) -> tuple[type, type, Mapping]:
    """(Environment class, Action class, Mapping) of an in-process `env`, or a ValueError saying what is wrong."""
    env_cls = load_ref(settings.env)
    if not (isinstance(env_cls, type) and issubclass(env_cls, Environment)):
        raise ValueError(f"{settings.env!r} is {described(env_cls)}, not an OpenEnv Environment class (a subclass of "
                         "openenv.core.env_server.interfaces.Environment)")
    if inspect.isabstract(env_cls):
        missing = ", ".join(sorted(env_cls.__abstractmethods__))
        raise ValueError(f"{env_cls.__name__} is abstract: it does not define {missing}")
    action_cls, observation_cls = step_types(env_cls)
    if action_cls is None:
        raise ValueError(f"which Action {env_cls.__name__}.step takes is not said: annotate it, step(self, action: "
                         "MyAction) -> MyObservation, or subclass Environment[MyAction, MyObservation, MyState]")
    observation_schema = observation_cls.model_json_schema() if observation_cls else {}
    return env_cls, action_cls, mapping_for(settings, action_cls.model_json_schema(), observation_schema)


@cache
def served_mapping(settings: OpenEnvSettings, url: str) -> Mapping:
    """The Mapping for a server's Action and Observation, from its /schema."""
    schemas = get_json(url, "/schema", settings.connect_timeout_s)
    return mapping_for(settings, schemas.get("action", {}), schemas.get("observation", {}))


def check_settings(settings: OpenEnvSettings) -> None:
    """What OpenEnvSettings' validators check when the config loads (a ValueError, which the config loader names
    the key of): `env` imports, is an OpenEnv Environment and fits the mapping; `url` answers /health and its
    /schema fits; `app` imports and its /schema (asked of the app itself, no server started) fits."""
    if settings.env:
        local(settings)
        return
    if settings.url:
        if not settings.url.startswith(("http://", "https://", "ws://", "wss://")):
            raise ValueError(f"{settings.url!r} is not a server's base URL (http://host:port, or ws://...)")
        try:
            get_json(settings.url, "/health", CHECK_TIMEOUT_S)
            schemas = get_json(settings.url, "/schema", CHECK_TIMEOUT_S)
        except ConnectionError as exc:
            raise ValueError(f"no OpenEnv server answers at {settings.url} ({exc}); start it, or fix the URL") from None
        mapping_for(settings, schemas.get("action", {}), schemas.get("observation", {}))
        return
    app = load_ref(settings.app)
    paths = {route.path for route in app.routes} if isinstance(app, Starlette) else set()
    if not {"/ws", "/schema"} <= paths:
        hint = "; an Environment class is environment.openenv.env" if isinstance(app, type) and \
            issubclass(app, Environment) else ""
        raise ValueError(f"{settings.app!r} is {described(app)}, not an OpenEnv server app (what "
                         f"openenv.core.env_server.create_app returns, with /ws and /schema){hint}")
    from fastapi.testclient import TestClient
    schemas = TestClient(app).get("/schema").json()
    mapping_for(settings, schemas.get("action", {}), schemas.get("observation", {}))


def described(obj: Any) -> str:
    """"the class Name" or "a <type>", for messages."""
    return f"the class {obj.__name__}" if isinstance(obj, type) else f"a {type(obj).__name__}"
