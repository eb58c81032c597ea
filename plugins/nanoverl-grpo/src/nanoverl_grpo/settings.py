"""Settings of the group estimators, written as [algorithm.grpo] or [algorithm.grpo_passk].

Kept apart from the estimators (no torch import), so checking a config stays fast.
"""

import attrs


@attrs.define
class GroupNormSettings:
    norm_by_std: bool = True
    """Divide by the group's std (verl: algorithm.norm_adv_by_std_in_grpo); false gives Dr. GRPO's advantage."""
    epsilon: float = attrs.field(default=1e-6, validator=attrs.validators.gt(0))
    """Added to the group's std before dividing."""
