"""What runs is what the config says, once: a setting another one would override is refused with one line
(reward.name next to reward.file, even the default name given explicitly), and what does run is what
--dry-run, config.json and the trackers show. The reward runtime's documented claims hold: a TRL reward
function runs in a reward worker process, and a verl scorer's ground truth falls back through the row's
ground-truth fields in the documented order.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from conftest import EXAMPLES, ROOT, assert_user_error, read_metrics, run_cli
from nanoverl_core.reward import ByteTokenizer, as_responses
from nanoverl_core.testing import score_texts

REINFORCE = str(EXAMPLES / "debug_reinforce.toml")
REWARD = "def compute_score(data_source, solution_str, ground_truth, extra_info):\n    return 1.0\n"


@pytest.mark.parametrize("name", ["exact_match", "char_match"])
def test_reward_name_next_to_reward_file_is_refused_even_the_default(tmp_path, name):
    """Both in the same place (the overrides here; a file in the next test) cannot both run: one line."""
    reward = tmp_path / "my_reward.py"
    reward.write_text(REWARD)
    proc = run_cli("--config", REINFORCE, f"reward.file={reward}", f"reward.name={name}", "--dry-run")
    assert_user_error(proc, f"reward.name = '{name}' is set next to reward.file", "set one of them")
    config = tmp_path / "both.toml"
    config.write_text(f'[data]\ntrain_files = ["x.jsonl"]\n[reward]\nname = "{name}"\nfile = "{reward}"\n')
    assert_user_error(run_cli("--config", str(config), "--dry-run"), f"reward.name = '{name}' is set next to")
    assert_user_error(run_cli("--config", REINFORCE, "reward.function=score", "--dry-run"),
                      "reward.function = 'score' is set but reward.file is empty")


def test_an_override_of_one_wins_over_the_config_files_other_and_says_so(tmp_path):
    """The issue's case: a config with reward.file and `reward.name=exact_match` on the command line ran the
    file while --dry-run showed exact_match; now exact_match runs, a warning names the dropped key, and
    --dry-run shows what runs. The other way round likewise."""
    reward = tmp_path / "my_reward.py"
    reward.write_text(REWARD)
    config = tmp_path / "c.toml"
    config.write_text((ROOT / "examples" / "configs" / "debug_reinforce.toml").read_text()
                      .replace('name = "char_match"', f'file = "{reward}"\nfunction = "compute_score"'))
    proc = run_cli("--config", str(config), "reward.name=exact_match", "--dry-run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "warning: reward.name is overridden: ignoring reward.file" in proc.stderr
    shown = json.loads(proc.stdout)
    assert (shown["config"]["reward"]["name"], shown["config"]["reward"]["file"]) == ("exact_match", "")
    assert {"kind": "reward", "name": "exact_match", "provider": "nanoverl"} in shown["plugins"]
    proc = run_cli("--config", REINFORCE, f"reward.file={reward}", "--dry-run")
    assert proc.returncode == 0 and "ignoring reward.name = 'char_match'" in proc.stderr, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["config"]["reward"]["name"] == ""


def test_what_runs_is_what_dry_run_and_config_json_show(tmp_path):
    """debug_reinforce.toml names char_match; reward.file replaces it (the file's [reward] name is the
    config's, the file the override's: dropping the name is the override's job) and every record says so."""
    reward = tmp_path / "my_reward.py"
    reward.write_text(REWARD)
    config = tmp_path / "c.toml"
    config.write_text((ROOT / "examples" / "configs" / "debug_reinforce.toml").read_text()
                      .replace('name = "char_match"', f'file = "{reward}"'))
    dry = run_cli("--config", str(config), "--dry-run")
    assert dry.returncode == 0, dry.stderr[-2000:]
    shown = json.loads(dry.stdout)
    assert shown["config"]["reward"]["name"] == "" and shown["config"]["reward"]["file"] == str(reward)
    assert not [p for p in shown["plugins"] if p["kind"] == "reward"]          # no registered reward runs
    run_dir = tmp_path / "run"
    proc = run_cli("--config", str(config), "trainer.total_steps=1", "trainer.val_every=0", "trainer.save_every=0",
                   "trainer.progress=none", "tracking.trackers=[jsonl]", f"trainer.output_dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = json.loads((run_dir / "config.json").read_text())["config"]["reward"]
    assert written["name"] == "" and written["file"] == str(reward)
    assert read_metrics(run_dir)[0]["reward/mean"] == 1.0                      # the file's reward ran


def test_a_config_json_from_before_holds_the_unused_default_name_and_still_loads():
    from nanoverl_core.config import config_from_dict, drop_moved_keys
    from nanoverl_core.plugins import load_registry

    old = {"data": {"train_files": ["t.jsonl"]}, "reward": {"name": "exact_match", "file": str(EXAMPLES / "x.py"),
                                                          "function": "compute_score"}}
    config = config_from_dict(drop_moved_keys(old), registry=load_registry())
    assert config.reward.name == "" and config.reward.file.endswith("x.py")


TRL_PID = '''
import os


def pid_reward(prompts, completions, **kwargs):
    return [{"score": 1.0, "pid": float(os.getpid())} for _ in completions]
'''


def _batch(rows):
    from nanoverl_core.batch import RLBatch
    n = len(rows)
    return RLBatch({"x": torch.zeros(n)}, {"row": rows, "prompt_text": ["p"] * n, "index": list(range(n)),
                                           "data_source": ["d"] * n})


def test_a_trl_reward_function_runs_in_a_reward_worker_not_the_trainer(tmp_path):
    """docs/plugins.md said TRL-style rewards run in the trainer process; they run in the batched rewards'
    worker process (reward.workers > 0), as rewards.md says."""
    from nanoverl_core.config import RewardConfig
    from nanoverl_core.plugins import Registry
    from nanoverl_core.reward import RewardScorer

    reward = tmp_path / "trl_reward.py"
    reward.write_text(TRL_PID)
    scorer = RewardScorer(RewardConfig(file=str(reward), function="pid_reward"), Registry())
    try:
        scores, metrics = score_texts(scorer, _batch([{"target": "1"}] * 3), ["a", "b", "c"])
    finally:
        scorer.close()
    assert scores.tolist() == [1.0] * 3 and metrics["reward/pid"] != float(os.getpid())


VERL_TRUTH = "def compute_score(solution_str, ground_truth):\n    return {'score': 1.0, 'truth': float(ground_truth)}\n"


def test_a_verl_scorers_ground_truth_falls_back_in_the_documented_order(tmp_path):
    """reward_model.ground_truth, then ground_truth, target, answer (docs/rewards.md)."""
    from nanoverl_core.config import RewardConfig
    from nanoverl_core.plugins import Registry
    from nanoverl_core.reward import GROUND_TRUTH_KEYS, RewardScorer

    assert GROUND_TRUTH_KEYS == ("reward_model.ground_truth", "ground_truth", "target", "answer")
    reward = tmp_path / "verl_reward.py"
    reward.write_text(VERL_TRUTH)
    rows = [{"reward_model": {"ground_truth": "1"}, "ground_truth": "2", "target": "3", "answer": "4"},
            {"ground_truth": "2", "target": "3", "answer": "4"}, {"target": "3", "answer": "4"}, {"answer": "4"}]
    scorer = RewardScorer(RewardConfig(file=str(reward), workers=0), Registry())
    scored, _ = scorer.score_batch(as_responses(_batch(rows), ["x"] * 4), ByteTokenizer(), phase="val")
    details = scored["reward_detail"]
    assert [d["reward/truth"] for d in details] == [1.0, 2.0, 3.0, 4.0]
    for doc in ("rewards.md", "plugins.md"):
        assert "`ground_truth`, `target`, `answer`" in (ROOT / "docs" / doc).read_text(), doc
