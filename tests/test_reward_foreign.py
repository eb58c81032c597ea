"""Scorer files written for verl or TRL run unchanged from reward.file.

verl's per-dataset scorers take `(solution_str, ground_truth, ...)` and no data_source / extra_info: they
get only the names their signature takes. A TRL reward function `(prompts, completions, **kwargs) ->
list[float]` is called once per batch with the rows' prompts as written, the completions (chat messages
for a chat prompt) and every other dataset column as a list. Both in the scorer and in a real CLI run.
"""

from __future__ import annotations

import json

import pytest
import torch

from conftest import EXAMPLES, assert_user_error, read_metrics, run_cli
from nanoverl_core.testing import score_texts

# The shape of verl's per-dataset scorers (utils/reward_score/<dataset>.py): no data_source, no extra_info,
# keyword-only tuning knobs with defaults. Written for this test.
VERL_DATASET_SCORER = '''
def compute_score(solution_str, ground_truth, method="strict", format_score=0.0, score=1.0):
    if method != "strict":
        raise ValueError(method)
    answer = solution_str.rsplit("####", 1)[-1].strip() if "####" in solution_str else None
    if answer is None:
        return 0.0
    return score if answer == ground_truth else format_score + 0.25
'''

TRL_REWARD = '''
def reward_len_and_answer(prompts, completions, target, **kwargs):
    """TRL's contract: lists in, one float (or None) per completion out; the prompt column comes as prompts."""
    assert "prompt" not in kwargs and len(kwargs["data_source"]) == len(prompts), sorted(kwargs)
    out = []
    for prompt, completion, truth, source in zip(prompts, completions, target, kwargs["data_source"]):
        text = completion[0]["content"] if isinstance(completion, list) else completion
        if source == "skip":
            out.append(None)
        else:
            out.append(float(text.strip() == truth) + (0.5 if isinstance(prompt, list) else 0.0))
    return out
'''


def _scorer(tmp_path, source: str, **overrides):
    from nanoverl_core.config import RewardConfig
    from nanoverl_core.plugins import Registry
    from nanoverl_core.reward import RewardScorer

    reward = tmp_path / "r.py"
    reward.write_text(source)
    return RewardScorer(RewardConfig(file=str(reward), **overrides), Registry(), run_dir=tmp_path / "run")


def _batch(rows: list[dict]):
    from nanoverl_core.batch import RLBatch
    n = len(rows)
    return RLBatch({"x": torch.zeros(n)}, {"row": rows, "prompt_text": ["p"] * n, "index": list(range(n)),
                                           "data_source": [r.get("data_source", "d") for r in rows]})


@pytest.mark.parametrize("workers", [0, 2])
def test_a_verl_dataset_scorer_without_data_source_or_extra_info_runs_unchanged(tmp_path, workers):
    rows = [{"prompt": "q", "reward_model": {"ground_truth": "72"}, "extra_info": {"i": i}} for i in range(4)]
    texts = ["so #### 72", "#### 71", "no answer", "#### 72 "]
    scorer = _scorer(tmp_path, VERL_DATASET_SCORER, workers=workers)
    assert scorer.styles == ["verl"]
    scores, metrics = score_texts(scorer, _batch(rows), texts)
    scorer.close()
    assert scores.tolist() == [1.0, 0.25, 0.0, 1.0] and metrics["reward/errors"] == 0


def test_a_verl_scorer_that_requires_an_unknown_argument_is_a_config_error(tmp_path):
    from nanoverl_core.errors import ConfigError

    with pytest.raises(ConfigError, match="requires tokenizer.*data_source, solution_str, ground_truth, extra_info"):
        _scorer(tmp_path, "def compute_score(solution_str, ground_truth, tokenizer):\n    return 0.0\n")


def test_a_verl_scorer_with_kwargs_gets_every_verl_argument(tmp_path):
    source = ('def compute_score(solution_str, **kw):\n'
              '    assert sorted(kw) == ["data_source", "extra_info", "ground_truth"], kw\n'
              '    return float(kw["extra_info"]["i"] + (kw["data_source"] == "d"))\n')
    scorer = _scorer(tmp_path, source, workers=0)
    scores, _ = score_texts(scorer, _batch([{"target": "1", "extra_info": {"i": 2}}]), ["x"])
    assert scores.tolist() == [3.0]


def test_a_trl_reward_function_is_called_once_per_batch_with_columns_as_lists(tmp_path):
    chat = [{"role": "user", "content": "copy 12"}]
    rows = [{"prompt": "12=", "target": "12"}, {"prompt": chat, "target": "12"}, {"prompt": "7=", "target": "7"},
            {"prompt": "8=", "target": "8", "data_source": "skip"}]
    scorer = _scorer(tmp_path, TRL_REWARD, function="reward_len_and_answer", workers=2)
    assert scorer.styles == ["trl"] and scorer.in_trainer == [False]
    scores, metrics = score_texts(scorer, _batch(rows), ["12", "12", "8", "8"])
    # a chat prompt's completion arrives as [{"role": "assistant", ...}]; None (TRL: not applicable) adds 0
    assert scores.tolist() == [1.0, 1.5, 0.0, 0.0] and metrics["reward/errors"] == 0
    # batched: one call in the batch pool's one worker process; the per-row pool was never started
    assert scorer._pool is None and len(scorer._batch_pool.workers) == 1
    scorer.close()


def test_a_trl_reward_returning_the_wrong_length_is_an_error(tmp_path):
    from nanoverl_core.errors import RewardError

    scorer = _scorer(tmp_path, "def f(prompts, completions, **kw):\n    return [1.0]\n", function="f")
    with pytest.raises(RewardError, match="returned 1 values for 2 rows"):
        score_texts(scorer, _batch([{"prompt": "a", "target": "a"}] * 2), ["a", "b"])


def test_trl_and_verl_scorers_train_from_the_cli(tmp_path):
    """Two real runs on the debug copy task: a TRL function and a verl scorer, each by reward.file."""
    trl = tmp_path / "trl_reward.py"
    trl.write_text("def matches(prompts, completions, target, **kwargs):\n"
                   "    assert isinstance(prompts[0], str) and len(prompts) == len(target)\n"
                   "    return [sum(map(str.__eq__, c, t)) / len(t) for c, t in zip(completions, target)]\n")
    verl = tmp_path / "verl_reward.py"
    verl.write_text("def compute_score(solution_str, ground_truth):\n"
                    "    return sum(map(str.__eq__, solution_str, ground_truth)) / len(ground_truth)\n")
    for file, function in ((trl, "matches"), (verl, "compute_score")):
        run_dir = tmp_path / file.stem
        proc = run_cli("--config", str(EXAMPLES / "debug_reinforce.toml"), "trainer.total_steps=2",
                       "trainer.val_every=2", "trainer.progress=none", "tracking.trackers=[jsonl]",
                       "data.batch_size=4", "rollout.n=2", "trainer.rollout_samples=-1", f"reward.file={file}", f"reward.function={function}",
                       f"trainer.output_dir={run_dir}", timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        metrics = read_metrics(run_dir)
        assert len(metrics) == 2 and all(row["reward/errors"] == 0 for row in metrics)
        assert "val/reward/mean" in metrics[-1]
        rollouts = [json.loads(line) for line in (run_dir / "rollouts" / "step_1.jsonl").read_text().splitlines()]
        assert len(rollouts) == 8
        for r in rollouts:  # the debug task's target is the prompt's digits ("256=" -> "256")
            target = r["prompt"].removesuffix("=")
            assert r["score"] == pytest.approx(sum(map(str.__eq__, r["response"], target)) / 3), r


def test_a_verl_scorer_with_an_unknown_required_argument_exits_2_from_the_cli(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def compute_score(solution_str, ground_truth, tokenizer):\n    return 0.0\n")
    proc = run_cli("--config", str(EXAMPLES / "debug_reinforce.toml"), f"reward.file={bad}", "--dry-run")
    assert_user_error(proc, "requires tokenizer", "data_source, solution_str, ground_truth, extra_info")


def test_a_batched_reward_is_not_called_for_an_empty_share():
    """Under torchrun a rank's share of the rows may be empty (fewer rows than ranks): no call, no rows."""
    from nanoverl_core.reward.calls import ComponentSpec, call_batched

    def never(prompts, completions, **kwargs):
        raise AssertionError("called with no rows")

    assert call_batched(never, "trl", ComponentSpec("never"), [], "prompt") == []
