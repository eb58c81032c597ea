"""[algorithm.distill]: the on-policy distillation estimator's settings (no torch import: checking a config
stays fast)."""

import attrs

from ..config import at_least, between, finite


@attrs.define
class DistillSettings:
    coef: float = attrs.field(default=1.0, validator=finite())
    """Weight of the distillation term: each sampled token's advantage gets coef * (log teacher - log student)."""
    task_estimator: str = ""
    """A registered estimator whose advantages of the task reward ([reward]) are added, times task_weight
    (e.g. "grpo"; it runs with its default settings); "" (default): distillation alone, [reward] is only logged."""
    task_weight: float = attrs.field(default=1.0, validator=finite())
    """Weight of task_estimator's advantages."""
    top_k: int = attrs.field(default=0, validator=at_least(0))
    """How many of the teacher's most likely tokens per response position its pass keeps (batch columns
    teacher_topk_ids, teacher_topk_log_probs), for the GKD loss; 0 (default): none."""
    gkd_coef: float = attrs.field(default=0.0, validator=at_least(0))
    """Weight of the GKD term added to the actor's loss: the generalized JSD between teacher and student over
    the teacher's top_k tokens at each position (needs top_k > 0); 0 (default): off. Pure GKD: coef = 0,
    gkd_coef = 1."""
    gkd_beta: float = attrs.field(default=0.5, validator=between(0, 1))
    """TRL's beta: 0 is KL(teacher || student), 1 is KL(student || teacher), between them the generalized JSD."""

    def __attrs_post_init__(self) -> None:
        if self.gkd_coef > 0 and self.top_k == 0:
            raise ValueError(f"'gkd_coef' = {self.gkd_coef:g} needs the teacher's top-k tokens, but 'top_k' = 0; "
                             "set top_k > 0 (e.g. 64) or gkd_coef = 0")
