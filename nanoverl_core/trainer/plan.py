"""The step plan: which passes a training step runs, decided once when the trainer is built.

Which of the optional passes a step needs follows from the config and from what the chosen components
can do, never from the batch: `plan_step` decides it once, `Trainer.train_step` reads it, and
`nanoverl-train --dry-run` prints it (`StagePlan.describe`). During `trainer.critic_warmup` the actor
does not update, so those steps have a plan of their own (`actor_update` false).
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from ..algos.distill_settings import DistillSettings
from ..config import Config, settings_or_defaults
from ..errors import ConfigError


@attrs.frozen
class StagePlan:
    on_policy: bool
    """One optimizer step per batch and no reference: pi_old *is* the policy being updated, so the
    update takes its old log-probs from its own forward pass (detached), and `actor.update` is told so."""
    old_log_probs: Literal["none", "pass", "pass_with_sum_pi_squared", "from_update"]
    """Step 5, pi_old's log-probs. "pass": `actor.compute_log_probs`; "pass_with_sum_pi_squared": the
    actor's `compute_log_probs_and_sum_pi_squared` (an estimator that reads sum pi^2, the optimal token
    baseline); "none": nothing reads them but the on-policy update, which takes them from its own forward;
    "from_update": the rollout-mismatch metrics read them too, and the on-policy update returns them
    (`actor.on_policy_update`): no pass either way."""
    reference: bool
    """Step 6: the reference's log-probs (reference.enable)."""
    teacher: bool
    """Step 6: the teacher's log-probs of the sampled tokens ([teacher], for an estimator that reads them: distill)."""
    critic: bool
    """Step 6's values and step 8's critic update (critic.enable)."""
    rollout_correction: bool
    """Step 6b: importance weights and rejection against the engine's log-probs, before the update, whose
    loss they weight (algorithm.rollout_correction)."""
    mismatch: bool
    """Step 11's rollout_corr/ metrics: the engine's log-probs against pi_old's (the rollout returns them)."""
    greedy_baseline: bool
    """Step 4c: one greedy response per prompt, scored (an estimator that reads `reward_baselines`: ReMax)."""
    actor_update: bool = True
    """Steps 9 and 10; false during trainer.critic_warmup."""
    teacher_top_k: int = 0
    """With the teacher pass: how many of the teacher's most likely tokens per position it keeps too
    ([algorithm.distill] top_k, for the GKD loss: the teacher's `compute_log_probs_and_top_k`); 0: none."""

    def describe(self) -> dict[str, str]:
        """Each stage and how it runs, as --dry-run prints it."""
        return {"old_log_probs": {"none": "from the on-policy update's forward (no pass)",
                                  "from_update": "returned by the on-policy update, from its forward (no pass)",
                                  "pass": "a separate pass before the update",
                                  "pass_with_sum_pi_squared": "a separate pass, with sum pi^2"}[self.old_log_probs],
                "ref_log_probs": "a pass" if self.reference else "off",
                "teacher_log_probs": "off" if not self.teacher else "a pass" if not self.teacher_top_k else
                f"a pass, with the teacher's top-{self.teacher_top_k} tokens per position and their log-probs (GKD)",
                "values": "a pass, and a critic update" if self.critic else "off",
                "rollout_correction": "weights and rejection before the update" if self.rollout_correction else "off",
                "rollout_mismatch": "the engine's log-probs against pi_old, after the update" if self.mismatch
                else "off (the rollout returns no log-probs)",
                "greedy_baseline": "one greedy response per prompt" if self.greedy_baseline else "off",
                "actor_update": "on-policy (one optimizer step)" if self.on_policy else "PPO epochs over mini-batches"}


def plan_step(config: Config, estimator: Any, *, reference: bool, critic: bool, rollout_log_probs: bool,
              actor: Any = None, actor_update: bool = True, teacher: bool = False,
              teacher_actor: Any = None) -> StagePlan:
    """The plan for `config` with the chosen estimator. `actor`: the built actor, whose optional methods
    decide two passes (None, as --dry-run has it: a `TorchActor`'s, which has both); `teacher_actor`: the
    built teacher, which [algorithm.distill] top_k asks for `compute_log_probs_and_top_k` (None: a TorchActor's)."""
    on_policy = (config.actor.ppo_epochs == 1 and not reference
                 and config.actor_mini_batch_size == config.data.batch_size)
    sum_pi_squared = bool(getattr(estimator, "requires_sum_pi_squared", False))
    if sum_pi_squared and actor is not None and not hasattr(actor, "compute_log_probs_and_sum_pi_squared"):
        raise ConfigError(f"algorithm.advantage_estimator = {config.algorithm.advantage_estimator!r} needs the "
                          "policy's sum of pi^2 per token, but worker.name = "
                          f"{config.worker.name!r} has no compute_log_probs_and_sum_pi_squared; use a worker whose "
                          "actor has it (a TorchActor: workers debug, hf, fsdp) or another estimator")
    correction = rollout_log_probs and config.algorithm.rollout_correction.enabled
    returns_log_probs = actor is None or hasattr(actor, "on_policy_update")
    advantages_read_old = bool(getattr(estimator, "requires_old_log_probs", False))  # distill: before the update
    from_update = (on_policy and actor_update and rollout_log_probs and returns_log_probs and not sum_pi_squared
                   and not correction and not advantages_read_old)
    old = ("pass_with_sum_pi_squared" if sum_pi_squared else "from_update" if from_update
           else "pass" if not on_policy or rollout_log_probs or advantages_read_old else "none")
    top_k = settings_or_defaults(config.algorithm.settings, DistillSettings).top_k if teacher else 0
    if top_k and teacher_actor is not None and not hasattr(teacher_actor, "compute_log_probs_and_top_k"):
        raise ConfigError(f"algorithm.distill.top_k = {top_k} needs the teacher's top-k tokens, but worker.name = "
                          f"{config.worker.name!r} builds a teacher without compute_log_probs_and_top_k; use a "
                          "worker whose teacher has it (a TorchActor: workers debug, hf, fsdp) or top_k = 0")
    return StagePlan(on_policy=on_policy, old_log_probs=old, reference=reference, teacher=teacher, critic=critic,
                     rollout_correction=correction, mismatch=rollout_log_probs,
                     greedy_baseline=bool(getattr(estimator, "requires_greedy_baseline", False)),
                     actor_update=actor_update, teacher_top_k=top_k)
