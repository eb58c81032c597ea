"""[worker.debug], [rollout.debug] and [environment.copy_turns]: the built-ins' settings (no torch import:
checking a config stays fast)."""

import attrs

from ..config import at_least

_count = at_least(1)


@attrs.define
class DebugModelSettings:
    vocab_size: int = attrs.field(default=0, validator=at_least(0))
    """Vocabulary size (0: the size of its character tokenizer)."""
    hidden_size: int = attrs.field(default=64, validator=_count)
    """Hidden size of its tiny transformer (a multiple of its 4 heads)."""
    num_layers: int = attrs.field(default=2, validator=_count)
    """Number of transformer blocks."""


@attrs.define
class DebugRolloutSettings:
    log_probs: bool = False
    """Return rollout_log_probs (each sampled token's log-prob under the distribution it was drawn
    from), as vLLM does, so rollout correction and its metrics run on the debug backends."""


@attrs.define
class CopyTurnsSettings:
    chars_per_turn: int = attrs.field(default=2, validator=at_least(0))
    """Characters of the target the model answers per turn (the last turn may take fewer); 0: the whole
    target every turn, `repeats` turns."""
    repeats: int = attrs.field(default=2, validator=_count)
    """Turns of an episode with chars_per_turn = 0."""
    separator: str = "="
    """The environment's answer after each turn (text in the tokenizer's alphabet)."""
