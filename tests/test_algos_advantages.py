"""Pinned numbers for GAE and REINFORCE++ (core estimators) and their batch adapters."""

import pytest
import torch

from nanoverl_core.algos import (compute_gae_advantage_return, compute_reinforce_plus_plus_outcome_advantage, gae,
                                 reinforce_plus_plus)
from nanoverl_core.batch import RLBatch
from nanoverl_core.config import AlgorithmConfig


def close(actual, expected, tol=1e-6):
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float32),
                               torch.as_tensor(expected, dtype=torch.float32), rtol=0, atol=tol)


# ---- GAE ----------------------------------------------------------------------------------------------
# Row 0: three valid tokens, then padding whose reward 5 and value 9 must be ignored.
# Row 1: the same tokens with a masked position *inside* (reward 7, value 100 ignored).
REWARDS = torch.tensor([[0.0, 0.0, 1.0, 5.0], [0.0, 7.0, 0.0, 1.0]])
VALUES = torch.tensor([[1.0, 2.0, 3.0, 9.0], [1.0, 100.0, 2.0, 3.0]])
MASK = torch.tensor([[1.0, 1, 1, 0], [1, 0, 1, 1]])


def test_gae_hand_computed_with_trailing_and_inner_padding():
    # gamma = lam = 0.5 (gamma * lam = 0.25), backwards over valid tokens, V = 0 after the last:
    #   last:   delta = 1 + 0 - 3 = -2                      A = -2
    #   middle: delta = 0 + 0.5 * 3 - 2 = -0.5              A = -0.5 + 0.25 * -2 = -1
    #   first:  delta = 0 + 0.5 * 2 - 1 = 0                 A = 0 + 0.25 * -1 = -0.25
    # returns = A + V = 0.75, 1, 1. The inner masked position is invisible to the recursion.
    adv, ret = compute_gae_advantage_return(REWARDS, VALUES, MASK, gamma=0.5, lam=0.5)
    close(adv, [[-0.25, -1.0, -2.0, 0.0], [-0.25, 0.0, -1.0, -2.0]])
    close(ret, [[0.75, 1.0, 1.0, 0.0], [0.75, 0.0, 1.0, 1.0]])


def test_gae_with_gamma_lam_one_is_return_to_go_minus_value():
    # return-to-go is 1 at every valid token; advantages = 1 - V = 0, -1, -2
    adv, ret = compute_gae_advantage_return(REWARDS, VALUES, MASK, gamma=1.0, lam=1.0)
    close(adv, [[0.0, -1.0, -2.0, 0.0], [0.0, 0.0, -1.0, -2.0]])
    close(ret, [[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 1.0, 1.0]])


def test_gae_lam_zero_is_one_step_td_error():
    # lam = 0, gamma = 1: A_t = r_t + V(next valid) - V_t -> row 0: 0 + 2 - 1, 0 + 3 - 2, 1 - 3
    adv, _ = compute_gae_advantage_return(REWARDS, VALUES, MASK, gamma=1.0, lam=0.0)
    close(adv[0], [1.0, 1.0, -2.0, 0.0])


def _batch(**tensors):
    return RLBatch.from_dict(tensors, non_tensors={"uid": [f"p{i}" for i in range(len(tensors["loss_mask"]))]})


def test_gae_adapter_whitens_only_when_asked():
    batch = _batch(token_level_rewards=REWARDS, values=VALUES, loss_mask=MASK)
    adv, ret = gae(batch, AlgorithmConfig(gamma=0.5, lam=0.5))
    close(adv, [[-0.25, -1.0, -2.0, 0.0], [-0.25, 0.0, -1.0, -2.0]])
    # whitened over the 6 valid advantages (-0.25, -1, -2 twice): mean -13/12, unbiased std 0.785281
    # -> (A + 13/12) / 0.785281 = 1.061191, 0.106119, -1.167310; returns stay unwhitened
    adv_w, ret_w = gae(batch, AlgorithmConfig(gamma=0.5, lam=0.5, whiten_advantages=True))
    close(adv_w, [[1.061191, 0.106119, -1.167310, 0.0], [1.061191, 0.0, 0.106119, -1.167310]])
    close(ret_w, ret)
    assert gae.requires_critic is True


# ---- REINFORCE++ -------------------------------------------------------------------------------------
def test_reinforce_plus_plus_discounted_returns_whitened_over_valid_tokens():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 3.0], [0.0, 2.0, 0.0, 4.0]])
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0]])
    # gamma 0.5: row 0 G = 0.25, 0.5, 1 ; row 1 G = 1, 2 (padding rewards 3, 4 ignored)
    # valid G: 0.25, 0.5, 1, 1, 2 -> mean 0.95, unbiased var 1.8 / 4 = 0.45, std 0.670820
    adv, ret = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.5)
    close(ret, [[0.25, 0.5, 1.0, 0.0], [1.0, 2.0, 0.0, 0.0]])
    close(adv, [[-1.043498, -0.670820, 0.074536, 0.0], [0.074536, 1.565248, 0.0, 0.0]])
    batch = _batch(token_level_rewards=rewards, loss_mask=mask)
    adv_b, ret_b = reinforce_plus_plus(batch, AlgorithmConfig(gamma=0.5))
    close(adv_b, adv)
    close(ret_b, ret)


def test_reinforce_plus_plus_skips_inner_padding():
    # mask [1, 0, 1, 1], gamma 0.5: G3 = 2, G2 = 0 + 0.5 * 2 = 1, (masked, reward 5 ignored), G0 = 1 + 0.5 * 1
    # (verl restarts the sum at a masked position and would give G0 = 1.)
    rewards = torch.tensor([[1.0, 5.0, 0.0, 2.0], [0.0, 0.0, 0.0, 1.0]])
    mask = torch.tensor([[1.0, 0, 1, 1], [1, 1, 1, 1]])
    _, ret = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.5)
    close(ret[0], [1.5, 0.0, 1.0, 2.0])


def test_reinforce_plus_plus_and_whitened_gae_give_zeros_where_fewer_than_two_tokens_count():
    """A step whose every episode failed before its first token (environment.on_error = "zero") has no token
    to learn from: zero advantages, where verl's whitening raises (masked_var needs two valid elements)."""
    for mask in (torch.tensor([[1.0, 0.0]]), torch.zeros(2, 3)):
        adv, _ = compute_reinforce_plus_plus_outcome_advantage(torch.ones(mask.shape), mask, gamma=1.0)
        assert torch.equal(adv, torch.zeros(mask.shape))
        batch = RLBatch({"token_level_rewards": torch.ones(mask.shape), "values": torch.zeros(mask.shape),
                         "loss_mask": mask})
        adv, _ = gae(batch, AlgorithmConfig(whiten_advantages=True))
        assert torch.equal(adv, torch.zeros(mask.shape))
