"""Hand-computed numbers for the unbiased pass@k estimator and DAPO's overlong handling (soft length
penalty, truncated responses masked out of the loss: the rollout reports `truncated`, the trainer's
loss-mask stage narrows `loss_mask`, `response_mask` stays as sampled), and both through the real CLI."""

from __future__ import annotations

import pytest
import torch

from conftest import EXAMPLES, read_metrics, run_cli
from nanoverl_core.batch import RLBatch
from nanoverl_core.builtins.debug import CharTokenizer
from nanoverl_core.config import RewardConfig
from nanoverl_core.plugins import load_registry
from nanoverl_core.reward import RewardScorer, overlong_penalty
from nanoverl_core.rollout import responses_to_batch
from nanoverl_core.batch import derive_loss_mask as loss_mask
from nanoverl_core.trainer.validation import pass_at_k, pass_ks

REINFORCE = str(EXAMPLES / "debug_reinforce.toml")


def test_pass_at_k_is_the_combinatorial_estimator():
    assert [pass_at_k(5, 0, k) for k in range(1, 6)] == [0.0] * 5                     # nothing passed
    assert [pass_at_k(5, 5, k) for k in range(1, 6)] == [1.0] * 5                     # everything passed
    assert [pass_at_k(4, c, 4) for c in range(5)] == [0.0, 1.0, 1.0, 1.0, 1.0]         # k = n: any pass
    assert [pass_at_k(8, c, 1) for c in range(9)] == pytest.approx([c / 8 for c in range(9)])  # k = 1: the mean
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)                             # 1 - C(3,2) / C(5,2)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)                              # 1 - C(3,2) / C(4,2)
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)                          # 1 - C(7,5) / C(10,5)
    assert pass_at_k(10, 8, 5) == 1.0                                                  # n - c < k
    for bad in [(4, 5, 1), (4, 1, 0), (4, 1, 5)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)
    assert [pass_ks(n) for n in (1, 2, 4, 6, 8)] == [[1], [1, 2], [1, 2, 4], [1, 2, 4, 6], [1, 2, 4, 8]]


def test_overlong_penalty_is_dapos_soft_punishment():
    lengths = torch.tensor([3, 6, 7, 8, 10])
    # max_len 10, buffer 4: free up to 6 tokens, then -1/4 per token, -1 at 10
    assert overlong_penalty(lengths, 10, 4, 1.0).tolist() == [0.0, 0.0, -0.25, -0.5, -1.0]
    assert overlong_penalty(lengths, 10, 4, 0.5).tolist() == [0.0, 0.0, -0.125, -0.25, -0.5]
    assert overlong_penalty(torch.tensor([4]), 4, 2, 1.0).tolist() == [-1.0]            # verl's own test case


def _batch(tokens: list[list[int]], eos: list[int], max_new_tokens: int = 4) -> RLBatch:
    """The rollout's output for `tokens` (responses_to_batch, as every rollout builds it), with prompt rows."""
    n = len(tokens)
    batch = responses_to_batch(tokens, eos_token_id=eos, pad_token_id=0, max_new_tokens=max_new_tokens)
    batch.update(RLBatch(non_tensors={"prompt_text": ["1="] * n, "row": [{"target": "22"}] * n,
                                      "index": list(range(n)), "data_source": ["d"] * n}))
    return batch


def test_the_rollout_reports_truncated_rows_from_its_own_stop_ids():
    tok = CharTokenizer()
    two, eos = tok.vocab["2"], tok.eos_token_id
    # lengths 2 (EOS), 3 (EOS), 4 without EOS (cut), 4 ending in EOS (finished on the last token), 6 cut at 4
    rows = [[two, eos], [two, two, eos], [two] * 4, [two, two, two, eos], [two] * 6]
    assert _batch(rows, [eos])["truncated"].tolist() == [False, False, True, False, True]
    assert _batch(rows, [eos, two])["truncated"].tolist() == [False] * 5      # a second stop id (<|im_end|>)
    ids = torch.tensor([[two, eos, 0, 0, 0, 0], [two, two, eos, 0, 0, 0], [two] * 4 + [0, 0],
                        [two, two, two, eos, 0, 0], [two] * 6])
    tensor = responses_to_batch(ids, eos_token_id=eos, pad_token_id=0, max_new_tokens=4)   # the tensor path
    assert tensor["truncated"].tolist() == [False, False, True, False, True]
    assert torch.equal(tensor["response_mask"], _batch(rows, [eos])["response_mask"])


def test_score_batch_applies_the_penalty_and_the_loss_mask_drops_truncated_rows_keeping_their_scores():
    tok = CharTokenizer()
    two, eos = tok.vocab["2"], tok.eos_token_id
    batch = _batch([[two, eos], [two, two, eos], [two, two, two, two], [two, two, two, eos]], [eos])
    sampled = batch["response_mask"].clone()
    cfg = RewardConfig(name="exact_match", workers=0, overlong_buffer_len=2, overlong_penalty_factor=1.0)
    out, metrics = RewardScorer(cfg, load_registry(), max_new_tokens=4).score_batch(batch, tok)
    assert out["response_text"] == ["2", "22", "2222", "222"]
    # exact_match: 0, 1, 0, 0; penalty over the last 2 of 4 tokens: 0, -0.5, -1, -1 (length, as verl)
    assert out["score"].tolist() == [0.0, 0.5, -1.0, -1.0] and metrics["reward/overlong_penalty/mean"] == -0.625
    assert "response_mask" not in out and "loss_mask" not in out           # the reward stage changes no mask
    assert out["token_level_scores"][2].tolist() == [0.0, 0.0, 0.0, -1.0]  # still there for group baselines
    batch.update(out)
    assert loss_mask(batch, True).tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]]
    assert torch.equal(loss_mask(batch, False), sampled) and torch.equal(batch["response_mask"], sampled)
    batch["model_mask"] = torch.tensor([[1.0, 0, 0, 0], [0, 1, 1, 0], [1, 1, 1, 1], [1, 0, 1, 1]])  # a rollout's own
    assert loss_mask(batch, True).tolist() == [[1, 0, 0, 0], [0, 1, 1, 0], [0, 0, 0, 0], [1, 0, 1, 1]]
    assert torch.equal(loss_mask(batch, False), batch["model_mask"])
    plain, metrics = RewardScorer(RewardConfig(name="exact_match", workers=0), load_registry(),
                                  max_new_tokens=4).score_batch(batch, tok)
    assert plain["score"].tolist() == [0.0, 1.0, 0.0, 0.0] and "reward/overlong_penalty/mean" not in metrics


def test_overlong_handling_and_pass_at_k_through_the_cli(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli("--config", REINFORCE, "trainer.total_steps=2", "trainer.val_every=2", "trainer.save_every=0",
                   "data.batch_size=4", "rollout.n=2", "rollout.val_n=4", "rollout.val_temperature=1.0",
                   "trainer.progress=none", "tracking.trackers=[jsonl]", "reward.overlong_buffer_len=2",
                   "algorithm.mask_truncated=true", "reward.pass_threshold=0.3", f"trainer.output_dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, last = read_metrics(run_dir)
    assert 0 <= first["rollout/truncated_frac"] <= 1 and first["reward/overlong_penalty/mean"] <= 0
    assert 0 <= last["val/reward/pass@1"] <= last["val/reward/pass@2"] <= last["val/reward/pass@4"] <= 1
    # 32 validation prompts x 4 samples: pass@4 is a share of prompts, pass@1 a share of samples
    assert last["val/reward/pass@4"] * 32 == pytest.approx(round(last["val/reward/pass@4"] * 32))
    assert last["val/reward/pass@1"] * 128 == pytest.approx(round(last["val/reward/pass@1"] * 128))
    assert last["val/reward/errors"] == 0


def test_overlong_settings_are_checked():
    proc = run_cli("--config", REINFORCE, "reward.overlong_buffer_len=9", "--dry-run")  # max_new_tokens = 4
    assert proc.returncode == 2 and "reward.overlong_buffer_len = 9 must not exceed rollout.max_new_tokens = 4" \
        in proc.stderr
