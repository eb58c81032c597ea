"""What the advantage estimators may read beyond the scores: each reward component's own score and weight
(gdpo), and the policy's sum of pi^2 per token from the actor (optimal_token_baseline). The estimators
themselves are in nanoverl-grpo (plugins/nanoverl-grpo/tests)."""

import pytest
import torch

from conftest import EXAMPLES

REINFORCE = str(EXAMPLES / "debug_reinforce.toml")
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
        inputs, width = actor.forward_pass.module_inputs(batch)
        probs = torch.softmax(actor.module(**inputs).logits[:, -width - 1:-1].float() / 0.7, dim=-1)
    want = torch.nn.functional.pad((probs ** 2).sum(-1), (0, 4 - width)) * batch["response_mask"]
    torch.testing.assert_close(sum_sq, want, rtol=0, atol=1e-6)
    assert (sum_sq[batch["response_mask"] == 1] >= log_probs.exp()[batch["response_mask"] == 1] ** 2 - 1e-6).all()


def test_an_estimator_that_asks_for_sum_pi_squared_gets_it_and_can_refuse_a_config(tmp_path):
    """A code-registered estimator with requires_sum_pi_squared sees old_log_probs and sum_pi_squared
    every step, though the debug config's one on-policy update would skip the old log-prob pass; its
    check_config runs before anything loads."""
    from nanoverl_core import ConfigError, load_config, load_registry
    from nanoverl_core.trainer.trainer import Trainer

    seen = []

    def needs_pi(batch, config):
        seen.append((batch["old_log_probs"].clone(), batch["sum_pi_squared"].clone(), batch["loss_mask"].clone()))
        adv = batch["token_level_rewards"] * 0
        return adv, adv

    def refuse_big_batches(config):
        if config.data.batch_size > 4:
            raise ConfigError("needs_pi: data.batch_size must be at most 4")

    needs_pi.requires_sum_pi_squared = True
    needs_pi.check_config = refuse_big_batches
    registry = load_registry()
    registry.add("advantage_estimator", "needs_pi", needs_pi, "somebody")
    overrides = [f"trainer.output_dir={tmp_path}", "tracking.trackers=[jsonl]", "algorithm.advantage_estimator=needs_pi",
                 "trainer.total_steps=1", "trainer.val_every=0", "trainer.save_every=0", "trainer.progress=none"]
    with pytest.raises(ConfigError, match="batch_size must be at most 4"):
        Trainer(load_config(REINFORCE, overrides, registry=registry), registry)
    cfg = load_config(REINFORCE, [*overrides, "data.batch_size=4", "rollout.n=2"], registry=registry)
    trainer = Trainer(cfg, registry)
    assert trainer.plan.on_policy and trainer.plan.old_log_probs == "pass_with_sum_pi_squared"
    trainer.fit()
    ((log_probs, sum_sq, mask),) = seen
    valid = mask == 1
    assert log_probs.shape == sum_sq.shape == mask.shape == (8, 4) and (log_probs[valid] < 0).all()
    assert (sum_sq[valid] >= log_probs.exp()[valid] ** 2 - 1e-6).all() and (sum_sq[valid] <= 1 + 1e-6).all()
    assert (sum_sq[~valid] == 0).all()


def test_an_estimator_that_asks_for_a_greedy_baseline_gets_one_scored_greedy_answer_per_prompt(tmp_path):
    """requires_greedy_baseline (ReMax): after step 4 the rollout gets one greedy request per distinct
    prompt, [reward] scores the answers, and every row of a group carries its prompt's score as
    reward_baselines (B,); the stage runs under a forked RNG, so the training samples stay those of a run
    without it."""
    from nanoverl_core import load_config, load_registry
    from nanoverl_core.rollout import decode_responses
    from nanoverl_core.trainer.trainer import Trainer

    def char_sum(prompt, response, sample):     # differs between prompts (char_match: 0 for the untrained model)
        return float(sum(map(ord, prompt + response)) % 11)

    def run(out, greedy_baseline: bool):
        seen, calls = [], []

        def zero(batch, config):
            seen.append(batch)
            adv = batch["token_level_rewards"] * 0
            return adv, adv

        if greedy_baseline:
            zero.requires_greedy_baseline = True
        registry = load_registry()
        registry.add("advantage_estimator", "zero", zero, "somebody")
        registry.add("reward", "char_sum", char_sum, "somebody")
        overrides = [f"trainer.output_dir={out}", "tracking.trackers=[jsonl]", "algorithm.advantage_estimator=zero",
                     "reward.name=char_sum",
                     "trainer.total_steps=2", "trainer.val_every=0", "trainer.save_every=0", "trainer.progress=none",
                     "data.batch_size=4", "rollout.n=3", "rollout.temperature=1.5"]
        trainer = Trainer(load_config(REINFORCE, overrides, registry=registry), registry)
        generate = trainer.rollout.generate

        def recording(batch, params):
            out = generate(batch, params)
            calls.append((batch, params, out))
            return out

        trainer.rollout.generate = recording
        metrics = trainer.fit()
        return seen, calls, metrics, trainer.tokenizer

    seen, calls, metrics, tok = run(tmp_path / "remax", True)
    assert [(len(b), p.greedy) for b, p, _ in calls] == [(12, False), (4, True)] * 2
    for step, batch in enumerate(seen):
        prompts, params, answers = calls[2 * step + 1]
        assert params.max_new_tokens == 4 and prompts["uid"] == list(dict.fromkeys(batch["uid"]))
        assert prompts["prompt_text"] == [batch["prompt_text"][batch["uid"].index(u)] for u in prompts["uid"]]
        texts = decode_responses(tok, answers)
        by_uid = dict(zip(prompts["uid"], map(char_sum, prompts["prompt_text"], texts, prompts["row"])))
        want = torch.tensor([by_uid[u] for u in batch["uid"]])
        torch.testing.assert_close(batch["reward_baselines"], want, rtol=0, atol=1e-6)
        assert len(set(want.tolist())) > 1
    assert metrics["remax/baseline_prompts"] == 4.0 and metrics["remax/baseline_tokens"] > 0
    assert metrics["remax/reward/mean"] == pytest.approx(float(seen[-1]["reward_baselines"][::3].mean()))
    assert metrics["timing/baseline_rollout"] > 0 and metrics["timing/baseline_reward"] > 0
    assert not (tmp_path / "remax" / "reward_errors.jsonl").exists()

    plain, _, plain_metrics, _ = run(tmp_path / "plain", False)
    assert "reward_baselines" not in plain[0] and not any(k.startswith("remax/") for k in plain_metrics)
    for a, b in zip(seen, plain):      # the same training samples, step after step
        assert torch.equal(a["responses"], b["responses"]) and a["prompt_text"] == b["prompt_text"]
