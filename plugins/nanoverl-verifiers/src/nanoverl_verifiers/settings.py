"""[agent.verifiers] and [data.verifiers]: attrs classes, a default and a docstring per field.

env_id and env_args are checked when the config loads (so `--dry-run` too): the environment's module imports
and its loader takes env_args by name; each failure is one `error:` line naming the key (nanoverl's config
loader prefixes the ValueError raised here with it). Building the environment (its dataset, a value its
loader refuses) is checked by `check_config` before any model loads (nanoverl_verifiers.loading)."""

from __future__ import annotations

from typing import Any

import attrs

from nanoverl_core.config import at_least


def _env_id(_instance: Any, _attribute: attrs.Attribute, value: str) -> None:
    if not value:
        raise ValueError('is empty: name a verifiers environment, its id as `vf-eval` takes it ("gsm8k"), or a '
                         '"module:function" or "path/to/file.py:function" that returns one')
    from .loading import loader                         # imports verifiers and the environment's module
    loader(value)


def _env_args(instance: Any, _attribute: attrs.Attribute, value: dict[str, Any]) -> None:
    from .loading import check_args, loader
    try:
        fn = loader(instance.env_id)
    except ValueError:                                  # reported under env_id, which is checked first
        return
    check_args(fn, value)


@attrs.frozen
class VerifiersSettings:
    env_id: str = attrs.field(default="", validator=_env_id)
    """The environment: an installed verifiers environment's id ("gsm8k": the module verifiers'
    `load_environment` imports, dashes as underscores, an "owner/" prefix dropped), or a function that builds
    one, "module:function" or "path/to/file.py:function" (the file's code runs, as agent.file's)."""
    env_args: dict[str, Any] = attrs.field(factory=dict, validator=_env_args)
    """Keyword arguments of the environment's `load_environment` (or of the function): `vf-eval -a '{...}'`'s."""
    sampling_args: dict[str, Any] = attrs.Factory(dict)
    """Merged over the environment's own `sampling_args` for every model call, as verifiers' `generate` merges
    them (max_tokens, stop, extra_body, ...). The run's sampling is used whatever a call asks (rollout.temperature,
    top_p: a call asking for others is counted in episode/sampling_overridden), and each call's max_tokens is
    capped by what is left of the row's rollout.max_new_tokens."""


@attrs.frozen
class VerifiersDataSettings:
    train_examples: int = attrs.field(default=-1, validator=at_least(-1))
    """Training rows: the first N rows of the environment's `dataset` (verifiers' `get_dataset(n)`); -1 all."""
    val_examples: int = attrs.field(default=-1, validator=at_least(-1))
    """Validation rows: the first N rows of its `eval_dataset` (`get_eval_dataset(n)`); -1 all, 0 none. An
    environment without an eval_dataset has no validation rows (verifiers would fall back to its training rows)."""
