"""[tracking.tensorboard]: where and how often the tensorboard tracker writes (no torch or tensorboard import:
checking a config stays fast)."""

import attrs

from nanoverl_core.config import at_least, folder


@attrs.define
class TensorBoardSettings:
    log_dir: str = attrs.field(default="", validator=folder)
    """The folder of the event files; empty: ``<trainer.output_dir>/tensorboard``. Point ``tensorboard
    --logdir`` at it, or at a folder above several runs' to compare them."""
    flush_secs: int = attrs.field(default=10, validator=at_least(0))
    """Write buffered events to disk at least this often, in seconds (0: after every step). Checkpoints and
    the end of the run always flush."""
    max_sample_rows: int = attrs.field(default=16, validator=at_least(0))
    """Rows of each sample table (rollouts, validation) written as a text summary, a markdown table per
    step under ``samples/<name>`` (0: none)."""
