"""[algorithm.batch_mean_baseline]: the estimator's own settings, validated by nanoverl like its core keys."""

import attrs


@attrs.define
class BatchBaselineSettings:
    group_weight: float = attrs.field(default=0.0, validator=[attrs.validators.ge(0), attrs.validators.le(1)])
    """w in [0, 1]: 0 is the leave-one-out batch mean, 1 RLOO's leave-one-out group mean."""
