"""gdpo, gpg and optimal_token_baseline (nanoverl-grpo) through the command line, and what they need of the
core: each reward component's own score in the batch, the actor's sum of pi^2. Their numbers are pinned in
plugins/nanoverl-grpo/tests (hand-computed, and against verl 0.9.1's recorded answers)."""

import json
import math

import pytest
import torch

from conftest import EXAMPLES, assert_user_error, read_metrics, run_cli

NEW_ESTIMATORS = ["gdpo", "gpg", "optimal_token_baseline"]
REINFORCE = str(EXAMPLES / "debug_reinforce.toml")
SHORT = ["trainer.total_steps=2", "trainer.val_every=0", "trainer.save_every=0", "data.batch_size=4", "rollout.n=4",
         "trainer.progress=none"]
TWO_REWARDS = '''
[reward]
workers = 0

[[reward.components]]
name = "char_match"
weight = 1.0

[[reward.components]]
name = "exact_match"
weight = 0.5
'''


def two_rewards(tmp_path) -> str:
    path = tmp_path / "two_rewards.toml"
    path.write_text((EXAMPLES / "debug_reinforce.toml").read_text().replace('[reward]\nname = "char_match"\n', "")
                    + TWO_REWARDS)
    return str(path)


def test_plugins_lists_every_new_estimator_with_a_description():
    proc = run_cli("plugins", "--json")
    assert proc.returncode == 0, proc.stderr
    grpo = next(p for p in json.loads(proc.stdout) if p["dist"] == "nanoverl-grpo")
    assert set(NEW_ESTIMATORS) <= set(grpo["names"]["advantage_estimator"])
    for name in NEW_ESTIMATORS:
        assert len(grpo["descriptions"]["advantage_estimator"][name]) > 20, name


def test_dry_run_shows_the_settings_and_a_bad_one_exits_2_with_one_line(tmp_path):
    proc = run_cli("--config", REINFORCE, "--dry-run", "algorithm.advantage_estimator=optimal_token_baseline",
                   "algorithm.optimal_token_baseline.handle_zero_tail=false")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["config"]["algorithm"]["optimal_token_baseline"] == \
        {"handle_zero_tail": False, "epsilon": 1e-8}
    proc = run_cli("--config", REINFORCE, "--dry-run", "algorithm.advantage_estimator=gdpo")
    assert json.loads(proc.stdout)["config"]["algorithm"]["gdpo"] == {"norm_by_std": True, "epsilon": 1e-6}
    bad = run_cli("--config", REINFORCE, "--dry-run", "algorithm.advantage_estimator=gdpo", "algorithm.gdpo.epsilon=-1")
    assert_user_error(bad, "config key 'algorithm.gdpo.epsilon'", "must be > 0")
    bad = run_cli("--config", REINFORCE, "--dry-run", "algorithm.advantage_estimator=gpg", "algorithm.gpg.alpha=1")
    assert_user_error(bad, "takes no settings")
    # gdpo over components would drop what the overlong penalty adds to the score: refused before anything loads
    bad = run_cli("--config", two_rewards(tmp_path), "--dry-run", "algorithm.advantage_estimator=gdpo",
                  "reward.overlong_buffer_len=2")
    assert_user_error(bad, "'gdpo' normalises each [[reward.components]] score", "reward.overlong_buffer_len")


def test_gdpo_trains_on_two_reward_components(tmp_path):
    proc = run_cli("--config", two_rewards(tmp_path), "algorithm.advantage_estimator=gdpo", *SHORT,
                   f"trainer.output_dir={tmp_path / 'run'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(tmp_path / "run")
    assert len(rows) == 2 and all(math.isfinite(r["actor/pg_loss"]) for r in rows)
    assert {"reward/char_match/mean", "reward/exact_match/mean"} <= set(rows[-1])
    assert abs(rows[-1]["advantages/mean"]) < 1e-5  # whitened over the batch's tokens


@pytest.mark.parametrize("name", ["gpg", "optimal_token_baseline"])
def test_gpg_and_the_optimal_token_baseline_train_by_name(tmp_path, name):
    # debug_reinforce makes one on-policy update per step, which skips the old log-prob pass; the
    # token baseline still gets old_log_probs and sum_pi_squared from the actor
    proc = run_cli("--config", REINFORCE, f"algorithm.advantage_estimator={name}", *SHORT,
                   f"trainer.output_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(tmp_path)
    assert len(rows) == 2 and all(math.isfinite(r["actor/pg_loss"]) for r in rows)


def test_the_reward_stage_hands_each_components_score_and_weight_on(tmp_path):
    from nanoverl_core import load_config, load_registry
    from nanoverl_core.batch import RLBatch
    from nanoverl_core.builtins.debug import CharTokenizer
    from nanoverl_core.builtins.rewards import char_match
    from nanoverl_core.reward import RewardScorer
    from nanoverl_core.rollout import responses_to_batch

    tok, registry = CharTokenizer(), load_registry()
    cfg = load_config(two_rewards(tmp_path), [], registry=registry)
    responses = ["123", "466"]
    batch = responses_to_batch([tok.encode(r, add_special_tokens=False) + [tok.eos_token_id] for r in responses],
                               eos_token_id=[tok.eos_token_id], pad_token_id=0, max_new_tokens=4)
    rows = [{"target": "123"}, {"target": "456"}]
    batch.update(RLBatch(non_tensors={"prompt_text": ["123=", "456="], "row": rows, "index": [0, 1]}))
    out, _ = RewardScorer(cfg.reward, registry).score_batch(batch, tok)
    match = [char_match("", r, row) for r, row in zip(responses, rows)]   # 1 and 2/3
    exact = [1.0, 0.0]
    torch.testing.assert_close(out["component_scores"], torch.tensor([match, exact]).T)
    torch.testing.assert_close(out["component_weights"], torch.tensor([[1.0, 0.5], [1.0, 0.5]]))
    torch.testing.assert_close(out["score"], torch.tensor(match) + 0.5 * torch.tensor(exact))


def test_the_actor_gives_log_probs_and_the_sum_of_squared_probabilities_in_one_pass():
    from nanoverl_core import load_config, load_registry
    from nanoverl_core.testing import prompt_batch

    registry = load_registry()
    cfg = load_config(REINFORCE, ["rollout.temperature=0.7", "actor.micro_batch_size=2"], registry=registry)
    workers = registry.get("worker", "debug")(cfg)
    actor = workers.actor
    batch = prompt_batch(workers.tokenizer, ["12=", "9876=", "5="])
    batch["responses"] = torch.randint(3, 12, (3, 4), generator=torch.Generator().manual_seed(0))
    batch["response_mask"] = (torch.arange(4)[None] < torch.tensor([4, 2, 1])[:, None]).float()
    log_probs, sum_sq = actor.compute_log_probs_and_sum_pi_squared(batch)
    torch.testing.assert_close(log_probs, actor.compute_log_probs(batch), rtol=0, atol=1e-6)
    with torch.no_grad():                                 # by hand: the module's logits at temperature 0.7
        inputs, width = actor.module_inputs(batch)
        probs = torch.softmax(actor.module(**inputs).logits[:, -width - 1:-1].float() / 0.7, dim=-1)
    want = torch.nn.functional.pad((probs ** 2).sum(-1), (0, 4 - width)) * batch["response_mask"]
    torch.testing.assert_close(sum_sq, want, rtol=0, atol=1e-6)
    assert (sum_sq[batch["response_mask"] == 1] >= log_probs.exp()[batch["response_mask"] == 1] ** 2 - 1e-6).all()
