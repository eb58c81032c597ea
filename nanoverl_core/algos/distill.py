"""On-policy distillation: the student samples, a frozen teacher scores every sampled token, and the
per-token reverse KL between them is the signal (Agarwal et al. 2024, "On-Policy Distillation of Language
Models"; Thinking Machines 2025, "On-Policy Distillation"; TRL's DistillationTrainer, Tinker's cookbook).

Each sampled token y_t of the student pi gets the advantage

    A_t = coef * (log teacher(y_t | y_<t) - log pi_old(y_t | y_<t))

the negative of the one-sample (k1) estimate of KL(pi || teacher) at that position, with no discounting
(each token is credited with its own term only, as Thinking Machines' recipe does). The policy loss then
pushes up the tokens the teacher likes more than the student does. Optionally a task estimator's
advantages are added, weighted (`[algorithm.distill]`: coef, task_estimator, task_weight).

The teacher's log-probs are a pass of the step (`teacher_log_probs`, [teacher]); pi_old's are the old-log-prob
pass (the estimator asks for it: `requires_old_log_probs`). A teacher equal to the student gives A = 0.

GKD (Agarwal et al. 2024; TRL's `GKDTrainer.generalized_jsd_loss`): with [algorithm.distill] top_k > 0 the
teacher's pass also keeps its top_k most likely tokens per position and their log-probs, and with gkd_coef > 0
the actor's loss adds gkd_coef times the generalized JSD between teacher and student over those tokens, each
renormalized over them (`generalized_jsd`, `add_gkd_loss`).
"""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING, Any

import attrs
import torch

from ..config import settings_or_defaults
from ..errors import ConfigError
from .distill_settings import DistillSettings

if TYPE_CHECKING:
    from ..batch import RLBatch
    from ..config import AlgorithmConfig, Config
    from .losses import PolicyLossInputs


def compute_distillation_advantage(old_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor,
                                   response_mask: torch.Tensor, coef: float = 1.0) -> torch.Tensor:
    """(B, R) coef * (teacher_log_probs - old_log_probs) on the tokens that count, 0 elsewhere.

    old_log_probs:     (B, R) log pi_old of each sampled response token (the student that sampled it)
    teacher_log_probs: (B, R) log teacher of the same tokens, at the same positions
    response_mask:     (B, R) 1 on tokens that count (the batch's loss_mask)
    """
    return coef * (teacher_log_probs - old_log_probs) * response_mask


def generalized_jsd(student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor, beta: float = 0.5
                    ) -> torch.Tensor:
    """(...) the generalized JSD between teacher and student per position, over the last dim (..., K).

    student_log_probs: (..., K) log pi of K tokens at each position (grad flows here)
    teacher_log_probs: (..., K) log teacher of the same tokens
    Each side is renormalized over the K tokens (log_softmax over the last dim: the K log-probs of the full
    vocabulary, or any logits of them); with K the whole vocabulary, this is TRL's `generalized_jsd_loss` per
    token. With s, t the renormalized student and teacher: beta = 0 is KL(t || s), beta = 1 is KL(s || t), and
    in between, with the mixture m = beta t + (1 - beta) s (TRL's), beta KL(t || m) + (1 - beta) KL(s || m).
    Equal distributions give 0, and a zero gradient.
    """
    s, t = student_log_probs.log_softmax(-1), teacher_log_probs.log_softmax(-1)
    if beta == 0:
        return (t.exp() * (t - s)).sum(-1)
    if beta == 1:
        return (s.exp() * (s - t)).sum(-1)
    m = torch.logsumexp(torch.stack([s + math.log1p(-beta), t + math.log(beta)]), dim=0)
    return beta * (t.exp() * (t - m)).sum(-1) + (1 - beta) * (s.exp() * (s - m)).sum(-1)


def gkd_settings(config: "Config") -> DistillSettings | None:
    """[algorithm.distill] when its gkd_coef > 0 (the actor's loss adds the GKD term), else None."""
    settings = settings_or_defaults(config.algorithm.settings, DistillSettings)
    return settings if settings.gkd_coef > 0 else None


def add_gkd_loss(loss: torch.Tensor, metrics: dict[str, Any], student_top_k: torch.Tensor,
                 teacher_top_k: torch.Tensor, inputs: "PolicyLossInputs", settings: DistillSettings
                 ) -> tuple[torch.Tensor, dict[str, Any]]:
    """The actor's loss and metrics with gkd_coef * GKD added: `generalized_jsd` (B, R) of the student's and
    teacher's (B, R, K) log-probs of the teacher's top-k tokens, aggregated over the loss_mask as the policy
    loss is (`inputs.aggregate`: actor.loss_agg_mode, the mini-batch's normalisers). Metrics: actor/gkd_loss,
    and actor/loss, the total."""
    gkd = inputs.aggregate(generalized_jsd(student_top_k, teacher_top_k, settings.gkd_beta))
    loss = loss + settings.gkd_coef * gkd
    return loss, {**metrics, "actor/gkd_loss": gkd.detach(), "actor/loss": loss.detach()}


@attrs.frozen
class Distill:
    """The `distill` estimator, `task` its task estimator (None: distillation alone); registered unbound,
    `bind` resolves the task estimator the config names."""

    task: Any = None

    requires_teacher = True
    requires_old_log_probs = True

    def __call__(self, batch: "RLBatch", config: "AlgorithmConfig") -> tuple[torch.Tensor, torch.Tensor]:
        s = settings_or_defaults(config.settings, DistillSettings)
        mask = batch["loss_mask"]
        advantages = compute_distillation_advantage(batch["old_log_probs"], batch["teacher_log_probs"], mask, s.coef)
        if self.task is None:
            return advantages, advantages
        task_config = copy.copy(config)
        task_config.settings = None                   # the task estimator runs with its own defaults
        task_advantages, returns = self.task(batch, task_config)
        return advantages + s.task_weight * task_advantages * mask, returns  # a critic learns the task's returns

    def bind(self, config: Any, registry: Any) -> "Distill":
        """The estimator for `config`: [algorithm.distill] task_estimator resolved from the registry (the
        trainer calls this once, when it resolves its plugins)."""
        name = settings_or_defaults(config.algorithm.settings, DistillSettings).task_estimator
        if name == "distill":
            raise ConfigError("algorithm.distill.task_estimator = \"distill\": it names the estimator of the task "
                              "reward; name another (e.g. \"grpo\") or leave it empty")
        task = registry.get("advantage_estimator", name, key="algorithm.distill.task_estimator") if name else None
        check = getattr(task, "check_config", None)
        if check is not None:
            check(config)
        return Distill(task)

    def __getattr__(self, name: str) -> Any:
        """What the task estimator asks of the step (a critic, a greedy baseline, sum pi^2) it still asks."""
        if name.startswith("requires_") and self.task is not None:
            return getattr(self.task, name)
        raise AttributeError(name)


distill = Distill()
