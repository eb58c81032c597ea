"""[algorithm.distill]: the on-policy distillation estimator's settings (no torch import: checking a config
stays fast)."""

import attrs

from ..config import finite


@attrs.define
class DistillSettings:
    coef: float = attrs.field(default=1.0, validator=finite())
    """Weight of the distillation term: each sampled token's advantage gets coef * (log teacher - log student)."""
    task_estimator: str = ""
    """A registered estimator whose advantages of the task reward ([reward]) are added, times task_weight
    (e.g. "grpo"; it runs with its default settings); "" (default): distillation alone, [reward] is only logged."""
    task_weight: float = attrs.field(default=1.0, validator=finite())
    """Weight of task_estimator's advantages."""
