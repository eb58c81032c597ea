"""[algorithm.batch_mean_baseline]: the estimator's own settings, validated by nanoverl like its core keys."""

import attrs

from nanoverl_core.config import between


@attrs.define
class BatchBaselineSettings:
    group_weight: float = attrs.field(default=0.0, validator=between(0, 1))
    """w in [0, 1]: 0 is the leave-one-out batch mean, 1 RLOO's leave-one-out group mean."""
