"""RL math as pure functions: masked reductions, KL, losses, core advantage estimators, groups.

Every function documents the shape and meaning of each tensor; numbers agree with verl's
`verl/trainer/ppo/core_algos.py` on valid positions except where docs/verl-differences.md lists a difference.
`vanilla` is the default policy loss (`actor.policy_loss`) as registered: what a backend's tests pass to
`Actor.update`.
"""

from .advantages import (compute_gae_advantage_return, compute_reinforce_plus_plus_outcome_advantage, gae,
                         reinforce_plus_plus)
from .chunked_head import logprobs_from_hidden
from .groups import Groups, filter_uniform_groups, first_groups, uniform_groups
from .kl import AdaptiveKLController, FixedKLController, apply_kl_penalty, kl_penalty, make_kl_controller
from .losses import (LOSS_AGG_MODES, PolicyLossInputs, agg_loss, compute_actor_loss, compute_entropy_loss,
                     compute_kl_loss, compute_policy_loss_gspo, compute_policy_loss_vanilla, compute_value_loss,
                     loss_totals, token_mean_share, vanilla)
from .policy_losses import (compute_policy_loss_cispo, compute_policy_loss_clip_cov, compute_policy_loss_dppo,
                            compute_policy_loss_dro, compute_policy_loss_geo_mean, compute_policy_loss_gpg,
                            compute_policy_loss_kl_cov, compute_policy_loss_sapo)
from .rollout_correction import (RolloutCorrection, compute_rollout_correction, rollout_mismatch_metrics,
                                 truncated_sampling_warning)
from .utils import (entropy_from_logits, logprobs_from_logits, masked_mean, masked_sum, masked_var, masked_whiten,
                    sum_pi_squared_from_logits)

__all__ = [
    "AdaptiveKLController", "FixedKLController", "Groups", "LOSS_AGG_MODES", "PolicyLossInputs", "agg_loss",
    "apply_kl_penalty", "compute_actor_loss", "compute_entropy_loss", "compute_gae_advantage_return",
    "compute_kl_loss", "compute_policy_loss_cispo", "compute_policy_loss_clip_cov", "compute_policy_loss_dppo",
    "compute_policy_loss_dro", "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg", "compute_policy_loss_gspo", "compute_policy_loss_kl_cov", "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_outcome_advantage", "compute_rollout_correction", "compute_value_loss",
    "entropy_from_logits", "RolloutCorrection", "rollout_mismatch_metrics", "truncated_sampling_warning",
    "filter_uniform_groups", "first_groups", "gae", "kl_penalty", "logprobs_from_hidden", "logprobs_from_logits",
    "loss_totals",
    "make_kl_controller", "masked_mean", "masked_sum", "masked_var", "masked_whiten", "reinforce_plus_plus",
    "sum_pi_squared_from_logits", "token_mean_share", "uniform_groups", "vanilla",
]
