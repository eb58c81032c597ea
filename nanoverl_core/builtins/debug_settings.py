"""[worker.debug], [rollout.debug] and [environment.copy_turns]: the built-ins' settings (no torch import:
checking a config stays fast)."""

import attrs

from ..config import Number, OutOfDomain, at_least

HEADS = 4
"""Attention heads of the debug model's blocks."""

_count = at_least(1)


ALPHABET = "0123456789=+-*/:,.? "
"""The debug tokenizer's characters; ids 0 and 1 are padding and end-of-sequence."""
TOKENIZER_VOCAB = len(ALPHABET) + 2


def _covers_the_tokenizer(instance, attribute, value: int) -> None:
    if 0 < value < TOKENIZER_VOCAB:
        raise OutOfDomain(attribute.name, f"{value} is smaller than the debug tokenizer's {TOKENIZER_VOCAB} tokens; "
                                          f"use 0 (its size) or at least {TOKENIZER_VOCAB}")


@attrs.define
class DebugModelSettings:
    vocab_size: int = attrs.field(default=0, validator=attrs.validators.and_(at_least(0), _covers_the_tokenizer))
    """Vocabulary size (0: the size of its character tokenizer, which a larger value must cover)."""
    hidden_size: int = attrs.field(default=64, validator=Number(low=1, multiple=HEADS))
    """Hidden size of its tiny transformer (a multiple of its 4 heads: each head takes hidden_size / 4)."""
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
