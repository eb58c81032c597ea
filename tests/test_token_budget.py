"""Token-budget micro-batches: rows grouped by length under actor/critic.max_tokens_per_micro_batch
give the same gradients, metrics and log-probs as a fixed row split (the normalisers are the
mini-batch's either way)."""

from __future__ import annotations

import pytest
import torch

from conftest import EXAMPLES, assert_user_error, replay_steps, run_cli
from nanoverl_core import SamplingParams, load_config, load_registry
from nanoverl_core.algos import LOSS_AGG_MODES
from nanoverl_core.algos import vanilla
from nanoverl_core.builtins.debug import make_rollout, make_workers
from nanoverl_core.errors import ConfigError
from nanoverl_core.testing import prompt_batch, with_loss_mask
from nanoverl_core.workers import token_budget_groups

PPO = EXAMPLES / "debug_ppo.toml"
PROMPTS = ["1=", "22=", "333=", "4444=", "5=", "666="]


def test_rows_are_grouped_longest_first_under_the_budget():
    # totals 3+1=4, 5+4=9, 2+2=4, 5+0=5, 1+1=2 -> order 1 (9), 3 (5), 0 (4), 2 (4), 4 (2)
    prompts, responses = [3, 5, 2, 5, 1], [1, 4, 2, 0, 1]
    # budget 10: [1] (9); [3, 0]: 2 x (5 + 1) = 12 > 10 -> [3] alone (5), then [0, 2]: 2 x (3 + 2) = 10, then
    # adding 4: 3 x (3 + 2) = 15 > 10 -> [4]
    assert token_budget_groups(prompts, responses, 10, "k") == [[1], [3], [0, 2], [4]]
    assert token_budget_groups(prompts, responses, 100, "k") == [[1, 3, 0, 2, 4]]
    with pytest.raises(ConfigError, match=r"k = 8 is smaller than the longest row \(9 tokens: prompt 5 \+ response 4\)"):
        token_budget_groups(prompts, responses, 8, "k")


def _setup(mode: str, *limits: str):
    cfg = load_config(PPO, [f"actor.loss_agg_mode={mode}", f"critic.loss_agg_mode={mode}", "data.batch_size=6",
                            "rollout.n=2", "actor.ppo_epochs=2", "actor.entropy_coeff=0.01", "reference.enable=true",
                            "actor.use_kl_loss=true", "actor.mini_batch_size=3", "critic.mini_batch_size=3",
                            "rollout.max_new_tokens=6", *limits], registry=load_registry())
    workers = make_workers(cfg)
    batch = prompt_batch(workers.tokenizer, PROMPTS, n=2)
    torch.manual_seed(0)
    batch.update(make_rollout(cfg, workers).generate(batch, SamplingParams(max_new_tokens=6, temperature=1.0)))
    return cfg, workers, batch


def _run(mode: str, *limits: str, replay: dict | None = None):
    """Log-probs, values, each optimizer step's gradients, the metrics of one actor and critic update, and
    the parameters after each step; `replay` (another _run's parameters) takes each step from those."""
    cfg, workers, batch = _setup(mode, *limits)
    g = torch.Generator().manual_seed(0)
    mask = batch["response_mask"]
    log_probs = workers.actor.compute_log_probs(batch)
    values = workers.critic.compute_values(batch)
    batch["old_log_probs"] = log_probs + 0.3 * torch.randn(mask.shape, generator=g) * mask
    batch["ref_log_probs"] = workers.reference.compute_log_probs(batch)
    batch["advantages"] = torch.randn(mask.shape, generator=g) * mask
    with_loss_mask(batch)                                          # every sampled token counts
    batch["values"], batch["returns"] = values, torch.randn(mask.shape, generator=g) * mask
    grads, params = [], {"actor": [], "critic": []}
    for name, worker in (("actor", workers.actor), ("critic", workers.critic)):
        replay_steps(worker, params[name], replay and replay[name])
        step = worker.clip_and_step

        def recording(nonfinite, worker=worker, step=step):
            grads.append({n: p.grad.clone() for n, p in worker.module.named_parameters() if p.grad is not None})
            return step(nonfinite)
        worker.clip_and_step = recording
    metrics = {**workers.critic.update(batch), **workers.actor.update(batch, vanilla)}
    return log_probs, values, grads, metrics, params


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_a_token_budget_gives_the_fixed_splits_gradients_and_metrics(mode):
    fixed = _run(mode, "actor.micro_batch_size=2", "critic.micro_batch_size=2")
    # each step from the fixed split's weights: the gradients compare step by step (conftest.replay_steps)
    budget = _run(mode, "actor.max_tokens_per_micro_batch=24", "critic.max_tokens_per_micro_batch=20",
                  replay=fixed[4])
    for a, b in zip(fixed[:2], budget[:2]):                     # log-probs and values, rows back in order
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6)
    assert len(fixed[2]) == len(budget[2]) == 2 * 2 + 2          # actor: 2 epochs x 2 mini-batches; critic: 2
    for a, b in zip(fixed[2], budget[2]):
        for name in a:
            torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=1e-6)
    assert fixed[3].keys() == budget[3].keys()
    for key in fixed[3]:
        assert budget[3][key] == pytest.approx(fixed[3][key], rel=1e-5, abs=1e-6), key


def test_the_budget_really_groups_rows_by_length():
    cfg, workers, batch = _setup("token-mean", "actor.max_tokens_per_micro_batch=24")
    groups = workers.actor.micro_batches(batch)
    assert sorted(r for g in groups for r in g) == list(range(len(batch))) and len(groups) > 1
    lengths = (batch["prompt_mask"].sum(-1) + batch["response_mask"].sum(-1)).tolist()
    for group in groups:
        width = max(batch["prompt_mask"][group].sum(-1)) + max(batch["response_mask"][group].sum(-1))
        assert len(group) * int(width) <= 24
    assert lengths[groups[0][0]] == max(lengths)                  # longest first


def test_a_budget_smaller_than_a_row_exits_2_naming_the_key_and_the_row(tmp_path):
    proc = run_cli("--config", str(PPO), "trainer.progress=none", "actor.max_tokens_per_micro_batch=3",
                   f"trainer.output_dir={tmp_path}")
    assert_user_error(proc, "actor.max_tokens_per_micro_batch = 3 is smaller than the longest row", "raise it to at least")
    proc = run_cli("--config", str(PPO), "--dry-run", "actor.max_tokens_per_micro_batch=30", "actor.micro_batch_size=4")
    assert_user_error(proc, "actor.micro_batch_size and actor.max_tokens_per_micro_batch are both set")
