"""Group-relative advantage estimators: GRPO and relatives.

Every estimator scores a response by one number, score_i = sum over t of token_level_rewards[i, t]
(the reward sits on the last valid token, minus any in-reward KL), compares it with the other
responses sampled from the same prompt (rows sharing a `uid`, in any order), and broadcasts the
resulting scalar advantage over the response's tokens that count (the batch's `loss_mask`). Outputs are (B, R), zero on padding,
and returns = advantages (there is no critic), as in verl's `core_algos.py`. Three differ: gdpo does this
for each of several rewards ([[reward.components]]) on its own before combining them,
optimal_token_baseline compares reward-to-go position by position (its returns are the reward-to-go), and
remax compares the reward-to-go with the score of a greedy response to the same prompt (not the group).

Shared conventions (pinned by tests/test_estimators.py):
  * a group of one has baseline 0 (and std 1 for GRPO): its advantage is its own score (GRPO:
    score / (1 + epsilon)); grpo_passk refuses it;
  * a group whose scores are all exactly equal has advantage exactly 0 (no signal; dividing a
    rounding error of the mean by epsilon cannot turn it into a spurious advantage);
  * std is the unbiased (n - 1) sample standard deviation of the group's scores.

Shapes: B = rows, R = response length, G = groups.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

import torch

from nanoverl_core.algos import Groups, masked_whiten
from nanoverl_core.config import settings_or_defaults
from nanoverl_core.errors import ConfigError

from .settings import GroupNormSettings, OptimalTokenBaselineSettings

if TYPE_CHECKING:
    from nanoverl_core import RLBatch
    from nanoverl_core.config import AlgorithmConfig, Config

Tensors = tuple[torch.Tensor, torch.Tensor]


def _setup(token_level_rewards: torch.Tensor, uids: Sequence[Hashable]) -> tuple[torch.Tensor, Groups]:
    if len(uids) != token_level_rewards.shape[0]:
        raise ValueError(f"{token_level_rewards.shape[0]} rows but {len(uids)} uids; every row needs a uid")
    return token_level_rewards.sum(dim=-1), Groups(uids, token_level_rewards.device)


def _centered(scores: torch.Tensor, baseline: torch.Tensor, groups: Groups) -> torch.Tensor:
    """scores - baseline (both (B,)), exactly 0 for rows of an all-equal group."""
    return torch.where(groups.all_equal(scores), torch.zeros_like(scores), scores - baseline)


def _broadcast(advantage: torch.Tensor, response_mask: torch.Tensor) -> Tensors:
    """(B,) -> (B, R) on valid tokens, 0 on padding; returns = advantages."""
    adv = advantage.unsqueeze(-1) * response_mask
    return adv, adv


def _reward_to_go(token_level_rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """G[i, t] = sum over t' >= t of token_level_rewards[i, t'] * mask[i, t'], (B, R) (no discount)."""
    return (token_level_rewards * mask).flip(-1).cumsum(-1).flip(-1)


# ---- estimators over tensors ------------------------------------------------------------------------
@torch.no_grad()
def compute_remax_advantages(token_level_rewards: torch.Tensor, reward_baselines: torch.Tensor,
                             response_mask: torch.Tensor) -> Tensors:
    """ReMax: returns[i, t] = sum over t' >= t of token_level_rewards[i, t'] * response_mask[i, t'] (the
    reward-to-go), advantages = returns - reward_baselines[i] on the masked tokens (verl's
    compute_remax_outcome_advantage). token_level_rewards, response_mask (B, R); reward_baselines (B,),
    the score of a greedy response to row i's prompt. Outputs (B, R); on padding after the last valid token
    both are 0 (returns of a masked token inside a response keep the reward-to-go, as in verl)."""
    returns = _reward_to_go(token_level_rewards, response_mask)
    return returns - reward_baselines.unsqueeze(-1) * response_mask, returns


@torch.no_grad()
def compute_grpo_advantages(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                            uids: Sequence[Hashable], *, epsilon: float = 1e-6, norm_by_std: bool = True) -> Tensors:
    """GRPO (https://arxiv.org/abs/2402.03300), verl `compute_grpo_outcome_advantage`.

    token_level_rewards: (B, R); response_mask: (B, R); uids: B group ids.
    A_i = (score_i - mean_g) / (std_g + epsilon), or score_i - mean_g when norm_by_std is False
    (Dr. GRPO, https://arxiv.org/abs/2503.20783). Group of one: mean 0, std 1, so
    A = score / (1 + epsilon) (or score). All-equal group: A = 0.
    """
    scores, groups = _setup(token_level_rewards, uids)
    alone = groups.singleton()
    mean = torch.where(alone, torch.zeros_like(scores), groups.mean(scores)[groups.index])
    std = torch.where(alone, torch.ones_like(scores), groups.std(scores)[groups.index])
    advantage = _centered(scores, mean, groups)
    if norm_by_std:
        advantage = advantage / (std + epsilon)
    return _broadcast(advantage, response_mask)


@torch.no_grad()
def compute_rloo_advantages(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                            uids: Sequence[Hashable]) -> Tensors:
    """RLOO (https://arxiv.org/abs/2402.14740), verl `compute_rloo_outcome_advantage`.

    A_i = score_i - mean of the *other* scores of the group = (score_i - mean_g) * n / (n - 1).
    Group of one: baseline 0, A = score (as verl's `rloo`; its `rloo_vectorized` gives 0 instead).
    All-equal group: A = 0.
    """
    scores, groups = _setup(token_level_rewards, uids)
    n = groups.size[groups.index].to(scores.dtype)  # (B,)
    alone = groups.singleton()
    leave_one_out = torch.where(alone, torch.zeros_like(scores),
                                (n * groups.mean(scores)[groups.index] - scores) / (n - 1).clamp(min=1))
    return _broadcast(_centered(scores, leave_one_out, groups), response_mask)


@torch.no_grad()
def compute_reinforce_plus_plus_baseline_advantages(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                                    uids: Sequence[Hashable]) -> Tensors:
    """REINFORCE++-baseline (https://arxiv.org/abs/2501.03262), verl
    `compute_reinforce_plus_plus_baseline_outcome_advantage`.

    a_i = score_i - mean_g (group of one: mean 0; all-equal group: 0), broadcast over valid tokens,
    then whitened over all valid tokens of the batch (so longer responses weigh more in the
    statistics). Needs at least 2 valid tokens in the batch.
    """
    scores, groups = _setup(token_level_rewards, uids)
    mean = torch.where(groups.singleton(), torch.zeros_like(scores), groups.mean(scores)[groups.index])
    adv, _ = _broadcast(_centered(scores, mean, groups), response_mask)
    adv = masked_whiten(adv, response_mask) * response_mask
    return adv, adv


@torch.no_grad()
def compute_opo_advantages(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                           uids: Sequence[Hashable]) -> Tensors:
    """OPO (https://arxiv.org/abs/2505.23585), verl `compute_opo_outcome_advantage`.

    The baseline is the length-weighted group mean, b_g = sum_i |y_i| score_i / sum_i |y_i| with
    |y_i| the number of valid tokens; A_i = score_i - b_g. Group of one: b = 0, A = score.
    All-equal group: A = 0. A group whose responses are all empty gets b = 0 (verl: NaN).
    """
    scores, groups = _setup(token_level_rewards, uids)
    length = response_mask.sum(dim=-1).to(scores.dtype)  # (B,)
    weighted = groups.sum(length * scores) / groups.sum(length).clamp(min=1)  # (G,)
    baseline = torch.where(groups.singleton(), torch.zeros_like(scores), weighted[groups.index])
    return _broadcast(_centered(scores, baseline, groups), response_mask)


@torch.no_grad()
def compute_grpo_passk_advantages(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                  uids: Sequence[Hashable], *, epsilon: float = 1e-6,
                                  norm_by_std: bool = True) -> Tensors:
    """Pass@k training (https://arxiv.org/abs/2503.19595), verl `compute_grpo_passk_outcome_advantage`.

    Only the best response of each group gets a non-zero advantage, r_max - r_second_max (divided
    by std_g + epsilon when norm_by_std); every other row gets 0. With a tie for the best score
    the advantage is 0 anyway. A group of one has no second-best: ValueError (as verl), so use
    rollout.n >= 2.
    """
    scores, groups = _setup(token_level_rewards, uids)
    advantage = torch.zeros_like(scores)
    for g in range(groups.num):
        rows = (groups.index == g).nonzero().flatten()
        if rows.numel() < 2:
            raise ValueError(f"grpo_passk needs at least 2 responses per prompt; uid {uids[rows[0]]!r} has 1 "
                             "(set rollout.n >= 2)")
        group_scores = scores[rows]
        best, second = torch.topk(group_scores, 2).values
        gap = best - second
        if norm_by_std:
            gap = gap / (group_scores.std() + epsilon)
        advantage[rows[torch.argmax(group_scores)]] = gap  # argmax: first row holding the maximum
    return _broadcast(advantage, response_mask)


@torch.no_grad()
def compute_gdpo_advantages(component_scores: torch.Tensor, weights: Sequence[float], response_mask: torch.Tensor,
                            uids: Sequence[Hashable], *, epsilon: float = 1e-6, norm_by_std: bool = True) -> Tensors:
    """GDPO (https://arxiv.org/abs/2601.05242), verl `compute_gdpo_outcome_advantage`.

    component_scores: (B, K) each row's score from each of K rewards; weights: K numbers;
    response_mask: (B, R); uids: B group ids.
    Each reward is normalised within its group on its own (GRPO's A_k, with its group-of-one and
    all-equal rules), A = sum_k w_k A_k, broadcast over valid tokens and whitened over all valid
    tokens of the batch, so a reward with a large spread cannot drown a small one. Needs at least 2
    valid tokens in the batch. With K = 1 this is GRPO followed by batch whitening.

    Deliberate difference from verl: an all-equal group's A_k is exactly 0 here. verl's float32 group mean
    of equal scores can miss the score by a rounding step, and dividing by std + epsilon turns that into
    an offset on every row of the group (0.056 for five rows of 0.8964447); the batch whitening then
    divides by the batch's std, as small when the other groups are all-equal too, so those rows can come
    out anywhere up to the largest z-score N valid tokens allow, (N - 1) / sqrt(N) (1.2 for that group
    next to eight rows of 0: docs/verl-differences.md). Elsewhere the two agree to float32 rounding.
    """
    if component_scores.shape[1] != len(weights):
        raise ValueError(f"{component_scores.shape[1]} reward components but {len(weights)} weights")
    combined = torch.zeros_like(response_mask, dtype=component_scores.dtype)
    for k, weight in enumerate(weights):
        adv, _ = compute_grpo_advantages(component_scores[:, k:k + 1], response_mask, uids, epsilon=epsilon,
                                         norm_by_std=norm_by_std)
        combined = combined + weight * adv
    adv = masked_whiten(combined, response_mask) * response_mask
    return adv, adv


@torch.no_grad()
def compute_gpg_advantages(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                           uids: Sequence[Hashable]) -> Tensors:
    """GPG (https://arxiv.org/abs/2504.02546), verl `compute_gpg_outcome_advantage`.

    token_level_rewards: (B, R); response_mask: (B, R); uids: B group ids.
    A_i = alpha (score_i - mean_g), alpha = B / (number of rows whose score is not 0), the batch's
    correction for rows that carry no gradient (verl's; 1 when every score is 0). Group of one:
    mean 0, A = alpha score. All-equal group: A = 0. No std division (verl's f_norm is 1).
    """
    scores, groups = _setup(token_level_rewards, uids)
    alpha = len(scores) / max(int(torch.count_nonzero(scores)), 1)
    mean = torch.where(groups.singleton(), torch.zeros_like(scores), groups.mean(scores)[groups.index])
    return _broadcast(alpha * _centered(scores, mean, groups), response_mask)


@torch.no_grad()
def compute_optimal_token_baseline_advantages(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                              uids: Sequence[Hashable], old_log_probs: torch.Tensor,
                                              sum_pi_squared: torch.Tensor,
                                              rollout_is_weights: torch.Tensor | None = None, *,
                                              handle_zero_tail: bool = True, epsilon: float = 1e-8) -> Tensors:
    """Optimal token baseline, verl `compute_optimal_token_baseline_advantage`.

    token_level_rewards, response_mask, old_log_probs, sum_pi_squared (sum over the vocabulary of
    pi(v)^2 at each position, under the policy that gave old_log_probs), rollout_is_weights: (B, R);
    uids: B group ids. Returns (advantages, returns), both (B, R), 0 outside the mask.

    G_t is the reward-to-go. Each position gets its own baseline per group, the mean of G_t over the
    group's rows weighted by W_t = sum_{j <= t} w_j, with w_j = 1 - 2 pi(y_j) + sum pi^2 (times
    rho_j^2 with rollout-correction weights): B_t = sum_i G_t W_t / (sum_i W_t + epsilon) over the
    rows still running at t. A_t = G_t - B_t. Group of one: B = 0, A = G. With handle_zero_tail,
    the single longest row of a group gets B = 0 past the second-longest row's length (no other row
    to compare with there).
    """
    if len(uids) != token_level_rewards.shape[0]:
        raise ValueError(f"{token_level_rewards.shape[0]} rows but {len(uids)} uids; every row needs a uid")
    mask = response_mask.to(token_level_rewards.dtype)
    returns = _reward_to_go(token_level_rewards, mask)                                   # G_t, (B, R)
    w = 1 - 2 * old_log_probs.exp() + sum_pi_squared
    if rollout_is_weights is not None:
        w = w * rollout_is_weights ** 2
    path = (w * mask).cumsum(-1)                                                        # W_t, (B, R)
    groups = Groups(uids, token_level_rewards.device)
    baselines = torch.zeros_like(returns)
    for g in range(groups.num):
        rows = (groups.index == g).nonzero().flatten()
        if rows.numel() < 2:
            continue
        m = mask[rows]
        baseline = (returns[rows] * path[rows] * m).sum(0) / ((path[rows] * m).sum(0) + epsilon)   # (R,)
        baselines[rows] = baseline
        lengths = m.sum(-1)
        longest, second = torch.sort(lengths).values[-2:].long().tolist()[::-1]
        if handle_zero_tail and longest > second and int((lengths == longest).sum()) == 1:
            baselines[rows[lengths.argmax()], second:] = 0.0
    return (returns - baselines) * mask, returns * mask


# ---- adapters: fn(batch, config) -> (advantages, returns) -------------------------------------------
def _inputs(batch: RLBatch) -> tuple[torch.Tensor, torch.Tensor, list]:
    return batch["token_level_rewards"], batch["loss_mask"], batch["uid"]


def _norm(config: AlgorithmConfig) -> GroupNormSettings:
    """[algorithm.<name>] as loaded (defaults for a config built in code)."""
    return settings_or_defaults(config.settings, GroupNormSettings)


def grpo(batch: RLBatch, config: AlgorithmConfig) -> Tensors:
    """GRPO; divides by the group std unless [algorithm.grpo] norm_by_std = false."""
    s = _norm(config)
    return compute_grpo_advantages(*_inputs(batch), epsilon=s.epsilon, norm_by_std=s.norm_by_std)


def dr_grpo(batch: RLBatch, config: AlgorithmConfig) -> Tensors:
    """Dr. GRPO: group mean baseline, never divided by the std."""
    return compute_grpo_advantages(*_inputs(batch), norm_by_std=False)


def rloo(batch: RLBatch, config: AlgorithmConfig) -> Tensors:
    """RLOO: leave-one-out group mean baseline."""
    return compute_rloo_advantages(*_inputs(batch))


def reinforce_plus_plus_baseline(batch: RLBatch, config: AlgorithmConfig) -> Tensors:
    """REINFORCE++-baseline: group mean baseline, then batch whitening."""
    return compute_reinforce_plus_plus_baseline_advantages(*_inputs(batch))


def opo(batch: RLBatch, config: AlgorithmConfig) -> Tensors:
    """OPO: length-weighted group mean baseline."""
    return compute_opo_advantages(*_inputs(batch))


def grpo_passk(batch: RLBatch, config: AlgorithmConfig) -> Tensors:
    """Pass@k: only each group's best response is reinforced ([algorithm.grpo_passk] as for grpo)."""
    s = _norm(config)
    return compute_grpo_passk_advantages(*_inputs(batch), epsilon=s.epsilon, norm_by_std=s.norm_by_std)


def gdpo(batch: RLBatch, config: AlgorithmConfig) -> Tensors:
    """GDPO: each [[reward.components]] reward normalised within its group, then weighted, summed and
    whitened ([algorithm.gdpo] as for grpo). Without components: GRPO on the score, then whitened."""
    s = _norm(config)
    if "component_scores" in batch:
        scores, weights = batch["component_scores"], batch["component_weights"][0].tolist()
    else:
        scores, weights = batch["token_level_rewards"].sum(-1, keepdim=True), [1.0]
    return compute_gdpo_advantages(scores.to(batch["token_level_rewards"].dtype), weights, batch["loss_mask"],
                                   batch["uid"], epsilon=s.epsilon, norm_by_std=s.norm_by_std)


def _check_gdpo(config: Config) -> None:
    """gdpo normalises each component's own score: nothing else may be added to the score."""
    if not config.reward.components:
        return
    extra = [key for key, on in (("reward.overlong_buffer_len", config.reward.overlong_buffer_len),
                                 ("algorithm.use_kl_in_reward", config.algorithm.use_kl_in_reward),
                                 ("environment.name", config.environment.name),
                                 ("environment.file", config.environment.file)) if on]
    if extra:
        raise ConfigError(f"algorithm.advantage_estimator = 'gdpo' normalises each [[reward.components]] score on "
                          f"its own, so it would ignore what {extra[0]} adds to the score; unset {extra[0]}, or "
                          "use grpo on the combined score")


gdpo.check_config = _check_gdpo


def gpg(batch: RLBatch, config: AlgorithmConfig) -> Tensors:
    """GPG: group mean baseline scaled by the batch's share of non-zero scores."""
    return compute_gpg_advantages(*_inputs(batch))


def optimal_token_baseline(batch: RLBatch, config: AlgorithmConfig) -> Tensors:
    """Optimal token baseline: a per-position group baseline weighted by the path variance so far."""
    s = settings_or_defaults(config.settings, OptimalTokenBaselineSettings)
    weights = batch["rollout_is_weights"] if "rollout_is_weights" in batch else None
    return compute_optimal_token_baseline_advantages(*_inputs(batch), batch["old_log_probs"], batch["sum_pi_squared"],
                                                     weights, handle_zero_tail=s.handle_zero_tail, epsilon=s.epsilon)


optimal_token_baseline.requires_sum_pi_squared = True


def remax(batch: RLBatch, config: AlgorithmConfig) -> Tensors:
    """ReMax: reward-to-go minus the score of a greedy response to the same prompt (`reward_baselines`,
    (B,), which the trainer's baseline rollout adds because of ``requires_greedy_baseline``)."""
    rewards = batch["token_level_rewards"]
    return compute_remax_advantages(rewards, batch["reward_baselines"].to(rewards.dtype), batch["loss_mask"])


def _check_remax(config: Config) -> None:
    """The baseline rollout is single-turn: a greedy episode through an environment is not built."""
    env = config.environment
    key, value = ("environment.name", env.name) if env.name else ("environment.file", env.file)
    if value:
        raise ConfigError("algorithm.advantage_estimator = 'remax' needs a greedy single-turn baseline response per "
                          f"prompt, which multi-turn episodes ({key} = {value!r}) do not have; unset {key} or use "
                          "grpo / rloo")


remax.requires_greedy_baseline = True
remax.check_config = _check_remax
