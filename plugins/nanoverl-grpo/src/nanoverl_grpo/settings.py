"""Settings of the group estimators, written as [algorithm.<name>] (grpo, grpo_passk, gdpo, optimal_token_baseline).

Kept apart from the estimators (no torch import), so checking a config stays fast.
"""

import attrs

from nanoverl_core.config import above


@attrs.define
class GroupNormSettings:
    norm_by_std: bool = True
    """Divide by the group's std (verl: algorithm.norm_adv_by_std_in_grpo); false gives Dr. GRPO's advantage."""
    epsilon: float = attrs.field(default=1e-6, validator=above(0))
    """Added to the group's std before dividing."""


@attrs.define
class OptimalTokenBaselineSettings:
    handle_zero_tail: bool = True
    """Give the single longest response of a group baseline 0 past the second-longest one's end (verl's default)."""
    epsilon: float = attrs.field(default=1e-8, validator=above(0))
    """Added to the sum of path weights before dividing."""
