"""reward.on_error = "drop", and failure kinds of a batched reward's own: a failed row leaves the loss (no
token in the loss_mask), goes to a group of its own, so the other rows' group statistics are those of the group
without it; each kind is counted as reward/errors/<kind>; a batched reward gets its RewardContext."""

from __future__ import annotations

import json

import torch

from nanoverl_core.algos.groups import Groups
from nanoverl_core.batch import derive_loss_mask
from nanoverl_core.config import RewardConfig
from nanoverl_core.plugins import Registry
from nanoverl_core.reward import ByteTokenizer, RewardScorer, as_responses

BATCHED = '''
import json
from nanoverl_core.reward import CallError


def judge_like(prompts, responses, rows, context=None):
    """Fails a row whose response is "bad" with a kind of its own; records the context it got."""
    with open(rows[0]["note"], "w") as f:
        json.dump({"phase": context.phase, "step": context.step, "run_dir": context.run_dir,
                   "uids": list(context.uids), "indices": list(context.indices)}, f)
    return [CallError("judge_timeout", "no reply") if r == "bad" else float(len(r)) for r in responses]


judge_like.batched = True
judge_like.error_kinds = ("judge_timeout", "judge_http")
'''


def grpo_like(scores: torch.Tensor, uids: list) -> torch.Tensor:
    """(score - group mean) / (group std + 1e-6), the group-relative advantage (0 for a group of one)."""
    groups = Groups(uids)
    return (scores - groups.mean(scores)[groups.index]) / (groups.std(scores)[groups.index] + 1e-6)


def scored(tmp_path, texts: list[str], uids: list[str], on_error: str = "drop", workers: int = 0):
    from nanoverl_core.batch import RLBatch

    (tmp_path / "batched.py").write_text(BATCHED)
    n = len(texts)
    rows = [{"target": "x", "note": str(tmp_path / "context.json")} for _ in range(n)]
    batch = RLBatch({"x": torch.zeros(n)}, {"row": rows, "prompt_text": ["p"] * n, "index": list(range(10, 10 + n)),
                                           "data_source": ["d"] * n, "uid": uids})
    scorer = RewardScorer(RewardConfig(name="", file=str(tmp_path / "batched.py"), function="judge_like",
                                       on_error=on_error, workers=workers), Registry(), run_dir=tmp_path / "run")
    batch = as_responses(batch, texts)
    out, metrics = scorer.score_batch(batch, ByteTokenizer(), 7)
    scorer.close()
    batch.update(out)
    return batch, metrics


def test_a_dropped_row_leaves_the_loss_and_its_group(tmp_path):
    texts = ["aa", "bad", "aaaa", "a", "aaa", "aa"]
    uids = ["g1", "g1", "g1", "g1", "g2", "g2"]
    batch, metrics = scored(tmp_path, texts, uids)
    assert batch["reward_dropped"].tolist() == [False, True, False, False, False, False]
    assert batch["uid"] == ["g1", "g1/dropped/1", "g1", "g1", "g2", "g2"]
    mask = derive_loss_mask(batch, mask_truncated=False)
    assert mask[1].sum() == 0 and all(mask[i].sum() > 0 for i in (0, 2, 3, 4, 5))
    advantages = grpo_like(batch["score"], batch["uid"])
    without = grpo_like(torch.tensor([2.0, 4.0, 1.0]), ["g1"] * 3)     # the group as if the row never was
    assert torch.allclose(advantages[[0, 2, 3]], without)
    assert metrics["reward/dropped"] == 1 and metrics["reward/errors"] == 1
    assert metrics["reward/errors/judge_timeout"] == 1 and metrics["reward/errors/judge_http"] == 0
    assert abs(metrics["reward/mean"] - (2 + 4 + 1 + 3 + 2) / 5) < 1e-6      # the dropped row is not a 0 in it
    failure = json.loads((tmp_path / "run" / "reward_errors.jsonl").read_text())
    assert failure["kind"] == "judge_timeout" and failure["index"] == 11


def test_a_batched_reward_gets_its_context_in_a_worker_too(tmp_path):
    scored(tmp_path, ["a", "b"], ["u", "u"], on_error="zero", workers=1)
    context = json.loads((tmp_path / "context.json").read_text())
    assert context == {"phase": "train", "step": 7, "run_dir": str(tmp_path / "run"), "uids": ["u", "u"],
                       "indices": [10, 11]}


def test_zero_keeps_the_row_and_its_group(tmp_path):
    batch, metrics = scored(tmp_path, ["aa", "bad"], ["g", "g"], on_error="zero")
    assert "reward_dropped" not in batch and batch["uid"] == ["g", "g"]
    assert batch["score"].tolist() == [2.0, 0.0] and metrics["reward/errors/judge_timeout"] == 1
