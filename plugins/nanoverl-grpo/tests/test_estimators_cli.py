"""gdpo, gpg, optimal_token_baseline and remax through `nanoverl-train` in a subprocess, as a user runs them:
listed with a description, their settings in --dry-run, a bad setting or a config gdpo cannot serve exits 2
with one line, and each trains two steps by name on the debug backends (remax with its greedy baseline
rollout and that rollout's metrics)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nanoverl_core.testing import assert_user_error

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "configs"
REINFORCE = str(EXAMPLES / "debug_reinforce.toml")
NEW_ESTIMATORS = ["gdpo", "gpg", "optimal_token_baseline", "remax"]
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


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "nanoverl_core.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)




def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


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
    assert_user_error(bad, "config key 'algorithm.gdpo.epsilon'", "-1.0 is not a finite number > 0")
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




def test_remax_trains_with_a_greedy_baseline_per_prompt_and_refuses_multi_turn(tmp_path):
    proc = run_cli("--config", REINFORCE, "algorithm.advantage_estimator=remax", *SHORT,
                   "trainer.rollout_samples=-1", f"trainer.output_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(tmp_path)
    assert len(rows) == 2 and all(math.isfinite(r["actor/pg_loss"]) for r in rows)
    for r in rows:      # 4 prompts, one greedy answer each, at most rollout.max_new_tokens = 4 tokens
        assert r["remax/baseline_prompts"] == 4 and 4 <= r["remax/baseline_tokens"] <= 16
        assert 0 <= r["remax/reward/mean"] <= 1 and r["timing/baseline_rollout"] > 0
        assert r["timing/baseline_reward"] >= 0 and r["rollout/response_length/mean"] > 0
    # the baseline's answers are not training samples: the rollout dump holds the 16 sampled rows only
    assert len((tmp_path / "rollouts" / "step_2.jsonl").read_text().splitlines()) == 16
    bad = run_cli("--config", REINFORCE, "--dry-run", "algorithm.advantage_estimator=remax",
                  "environment.name=copy_turns")
    assert_user_error(bad, "'remax' needs a greedy single-turn baseline", "environment.name = 'copy_turns'")
