"""User-facing errors.

Every mistake a user can make (a bad config key, an unknown plugin name, a missing file, a malformed
data row) raises a subclass of `UserError`. The CLI turns any `UserError` into exit status 2 and one
line on stderr that starts with `error:`; anything else escaping the CLI is a bug.
"""


def one_line(exc: BaseException, limit: int = 300) -> str:
    """`Type: message` of an exception on one line, cut to `limit` characters: how error lines quote the
    exception behind them."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:limit]


class UserError(Exception):
    """A mistake the user can fix: the message says what is wrong, where, and how to fix it."""


class ConfigError(UserError):
    """A config file or override is malformed, names an unknown key, or has a wrong type or value."""


class PluginError(UserError):
    """A plugin failed to import, two plugins claim one name, or a requested name is not registered."""


class DataError(UserError):
    """A data file is missing, empty, or has a malformed row."""


class RewardError(UserError):
    """A reward function raised, timed out, or returned something that is not a finite score."""


class EpisodeError(UserError):
    """An environment raised, timed out, returned something that is not an `EnvStep`, or its answer
    cannot be rendered (environment.on_error = "raise")."""


class RolloutError(UserError):
    """A rollout engine failed, and failed again after a restart from the actor's weights: the run stops
    (the trainer adds which checkpoint a rerun resumes from)."""


class NonFiniteError(UserError):
    """A loss or gradient was NaN/inf; the optimizer did not step (often a learning rate that is too high)."""


class CheckpointError(UserError):
    """A checkpoint is missing, incomplete, or cannot be written."""


class CheckpointMismatch(ValueError):
    """Checkpoint files that do not fit the model or optimizer they are loaded into (raised by a worker's
    `load`, reported by the trainer as a CheckpointError naming the checkpoint)."""


def removed(old: str, instead: str, version: str = "0.4.0") -> PluginError:
    """The one-line error for a plugin-API name that was deprecated and is gone since `version`: what to
    write instead (CHANGELOG.md, "Removed"). nanoverl-train prints it as one `error:` line, exit 2."""
    return PluginError(f"{old} was removed in nanoverl {version}: {instead} (CHANGELOG.md)")


class NanoverlDeprecation(FutureWarning):
    """A plugin uses a name that was renamed (CHANGELOG.md): it keeps working until the next minor version.
    nanoverl-train prints it as one `warning:` line."""
