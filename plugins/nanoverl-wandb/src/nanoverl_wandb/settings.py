"""[tracking.wandb]: which W&B project and run the wandb tracker logs to (no wandb import: checking a config
stays fast)."""

import attrs

from nanoverl_core.config import at_least

MODES = ("", "offline", "online", "disabled")


@attrs.define
class WandbSettings:
    project: str = ""
    """The W&B project; empty: $WANDB_PROJECT if set, else "nanoverl"."""
    entity: str = ""
    """The W&B team or user; empty: $WANDB_ENTITY if set, else your default entity."""
    name: str = ""
    """The W&B run's display name; empty: the run directory's name."""
    group: str = ""
    """Group runs in the UI (e.g. the seeds of one recipe); empty: none."""
    tags: list[str] = attrs.Factory(list)
    """Tags on the W&B run."""
    mode: str = attrs.field(default="", validator=attrs.validators.in_(MODES))
    """"offline" (files in the run directory, `wandb sync` uploads them later), "online" (needs `wandb login`)
    or "disabled"; empty: $WANDB_MODE if set, else "offline"."""
    max_sample_rows: int = attrs.field(default=16, validator=at_least(0))
    """Rows of each sample table (rollouts, validation) logged as a wandb.Table ``samples/<name>`` at its
    step (0: none)."""
