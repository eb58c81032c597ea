"""What [agent.verifiers] env_id names, and building that environment once per process.

    env_id = "gsm8k"                  an installed verifiers environment, loaded by verifiers' own loader:
                                      `verifiers.load_environment("gsm8k", **env_args)` imports the module
                                      "gsm8k" (dashes become underscores, an "owner/" prefix is dropped: what
                                      `prime env install owner/gsm8k` or `vf-install gsm8k` installs) and calls
                                      its `load_environment(**env_args)`
    env_id = "my_envs.arith:build"    a function in an importable module, called with env_args
    env_id = "envs/arith.py:build"    a function in a Python file (its code runs, as agent.file's does)

The same string loads in the trainer (the config check, the data source) and in every agent worker. Each
process builds an environment once per (env_id, env_args) and runs all its episodes on it, as `vf-eval` runs
a whole evaluation on one environment object.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.util
import inspect
import json
import logging
import pkgutil
import signal
import zlib
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

from nanoverl_core.errors import one_line
from nanoverl_core.plugins import exec_file


def split_ref(env_id: str) -> tuple[str, str] | None:
    """("module" or "path.py", "function") of a "module:function" env_id; None for an environment id."""
    where, colon, name = env_id.rpartition(":")
    return (where, name) if colon and where and name else None


@cache
def loader(env_id: str) -> Callable[..., Any]:
    """The function that builds the environment env_id names (its module imported), or a ValueError saying
    what is wrong with env_id."""
    ref = split_ref(env_id)
    if ref is None:
        from verifiers.utils.env_utils import env_module_name

        module = _module(env_module_name(env_id), env_id)
        name = "load_environment"
    else:
        module, name = _module(ref[0], env_id), ref[1]
    fn = getattr(module, name, None)
    if not callable(fn):
        defined = sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_"))
        close = difflib.get_close_matches(name, defined, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"its functions: {', '.join(defined[:12]) or 'none'}"
        raise ValueError(f"{module.__name__} has no function {name!r} ({hint})")
    return fn


def _module(where: str, env_id: str):
    if where.endswith(".py"):
        path = Path(where).resolve()
        if not path.is_file():
            raise ValueError(f"{where} does not exist")
        name = f"nanoverl_verifiers_env_{path.stem}_{zlib.crc32(str(path).encode()):08x}"
        try:                                             # registered: pickling and dataclasses resolve names in it
            return exec_file(path, name, register=True)
        except Exception as exc:
            raise ValueError(f"{where} does not import ({one_line(exc)})") from None
    try:
        found = importlib.util.find_spec(where)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise ValueError(_not_installed(where, env_id))
    try:
        return importlib.import_module(where)
    except Exception as exc:                            # the environment module's own error
        raise ValueError(f"module {where!r} does not import ({one_line(exc)})") from None


def _not_installed(module: str, env_id: str) -> str:
    if split_ref(env_id) is not None:
        return f"no module {module!r} to import (not on the Python path)"
    modules = sorted({m.name for m in pkgutil.iter_modules() if not m.name.startswith("_")})
    close = difflib.get_close_matches(module, modules, n=1, cutoff=0.75)
    hint = f"did you mean {close[0].replace('_', '-')!r}? " if close else ""
    return (f"no verifiers environment {env_id!r}: no module {module!r} is installed; {hint}install the "
            f"environment (`prime env install <owner>/{env_id}`, or `pip install` its package), or name a "
            "\"module:function\" or \"path/to/file.py:function\" that returns one")


def check_args(fn: Callable[..., Any], env_args: dict[str, Any]) -> None:
    """env_args bind to fn's parameters, or a ValueError naming the one that does not (and the close match)."""
    sig = inspect.signature(fn)
    params = sig.parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    names = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    label = f"{fn.__module__}.{fn.__qualname__}"
    for key in env_args:
        if key not in names and not takes_any:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(f"{label} takes no argument {key!r}; {hint}(it takes: {', '.join(names) or 'none'})")
    try:
        sig.bind(**env_args)
    except TypeError as exc:                            # a required argument left out
        raise ValueError(f"{label}: {exc}") from None


@contextlib.contextmanager
def own_signal_handlers() -> Iterator[None]:
    """Keep this process's SIGINT and SIGTERM handlers: a verifiers Environment installs its own when it is
    built (teardown, then exit), which would replace the trainer's and the agent workers'."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            if handler is not None:
                signal.signal(s, handler)


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    logger = logging.getLogger(name)
    disabled, logger.disabled = logger.disabled, True
    try:
        yield
    finally:
        logger.disabled = disabled


_BUILT: dict[str, Any] = {}


def environment(env_id: str, env_args: dict[str, Any]):
    """The verifiers Environment env_id and env_args build, built once per process (in its main thread: verifiers
    installs signal handlers there); a ValueError when it cannot run here (see `check_environment`)."""
    key = json.dumps([env_id, env_args], sort_keys=True, default=str)
    if key not in _BUILT:
        fn = loader(env_id)
        check_args(fn, env_args)
        import datasets

        datasets.disable_progress_bars()                 # the environment's dataset.map calls, in the trainer's log
        with own_signal_handlers():
            if split_ref(env_id) is None:
                import verifiers

                with _quiet("verifiers.legacy.utils.env_utils"):     # its failure is ours to report, once
                    env = verifiers.load_environment(env_id, **env_args)   # verifiers' own loader, as vf-eval's
            else:
                env = fn(**env_args)
        check_environment(env, env_id)
        _BUILT[key] = env
    return _BUILT[key]


def check_environment(env: Any, env_id: str) -> None:
    """A verifiers Environment that one rollout per agent can run: chat messages, and a rubric scoring each
    rollout on its own (a group reward function needs all of a prompt's rollouts at once)."""
    import verifiers

    if not isinstance(env, verifiers.Environment):
        raise ValueError(f"{env_id} returned {type(env).__name__}, not a verifiers Environment")
    if env.message_type != "chat":
        raise ValueError(f"{env_id} is a {env.message_type!r}-format environment; the agent runs chat "
                         "environments (message_type 'chat', verifiers' default)")
    if env.requires_group_rollouts:
        raise ValueError(f"{env_id}'s rubric has group reward functions (taking completions, states, answers, ...), "
                         "which score all rollouts of a prompt together; nanoverl runs one rollout per agent and "
                         "scores each on its own: write them per rollout (completion, state, answer, ...)")
