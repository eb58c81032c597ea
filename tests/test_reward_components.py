"""Several rewards with weights ([[reward.components]]) through the real CLI: the score is exactly the
weighted sum, each component is logged as reward/<name>/mean (and its extra keys as reward/<name>/<key>)
in metrics.jsonl (nanoverl-mlflow's tests read them back from a real MLflow store); component mistakes
exit 2 with one line naming the key.
"""

from __future__ import annotations

import json

import pytest
import torch

from conftest import EXAMPLES, assert_user_error, read_metrics, run_cli
from nanoverl_core.builtins.rewards import char_match

REINFORCE = str(EXAMPLES / "debug_reinforce.toml")
LENGTH = "def compute_score(prompt, response, sample):\n    return {'score': len(response) / 4, 'chars': float(len(response))}\n"


def write_config(tmp_path, components: str) -> str:
    path = tmp_path / "weighted.toml"
    path.write_text((EXAMPLES / "debug_reinforce.toml").read_text().replace('[reward]\nname = "char_match"\n', "")
                    + "\n[reward]\nworkers = 2\n" + components)
    return str(path)


def test_two_rewards_with_weights_give_exactly_the_weighted_score_and_log_each_component(tmp_path):
    (tmp_path / "length.py").write_text(LENGTH)
    config = write_config(tmp_path, f'''
[[reward.components]]
name = "char_match"
weight = 0.7

[[reward.components]]
file = "{tmp_path / 'length.py'}"
weight = 0.3
''')
    run_dir = tmp_path / "run"
    proc = run_cli("--config", config, "trainer.total_steps=2", "trainer.save_every=0", "data.val_files=[]",
                   "data.batch_size=4", "rollout.n=2", "trainer.progress=none", "trainer.rollout_samples=-1",
                   "tracking.trackers=[jsonl]", f"trainer.output_dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = read_metrics(run_dir)
    for step, row in enumerate(metrics, start=1):
        rollouts = [json.loads(line) for line in (run_dir / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]
        a = [char_match("", r["response"], {"target": r["prompt"].removesuffix("=")}) for r in rollouts]
        b = [len(r["response"]) / 4 for r in rollouts]
        assert [r["score"] for r in rollouts] == torch.tensor([0.7 * x + 0.3 * y for x, y in zip(a, b)]).tolist()
        assert row["reward/char_match/mean"] == pytest.approx(sum(a) / len(a))
        assert row["reward/length/mean"] == pytest.approx(sum(b) / len(b))
        assert row["reward/length/chars"] == pytest.approx(4 * sum(b) / len(b))
        assert row["reward/mean"] == pytest.approx(0.7 * sum(a) / len(a) + 0.3 * sum(b) / len(b))


@pytest.mark.parametrize("components, overrides, needles", [
    ('[[reward.components]]\nname = "char_match"\nweigth = 0.5\n', [],
     ["'reward.components[0].weigth'", "did you mean 'reward.components[0].weight'"]),
    ('[[reward.components]]\nname = "char_match"\n[[reward.components]]\nname = "char_match"\n', [],
     ["reward.components[1]", "two components are called 'char_match'"]),
    ('name = "char_match"\n[[reward.components]]\nname = "char_match"\n', [],   # both in the file: one would not run
     ["reward.name = 'char_match' is set next to [[reward.components]]"]),
    ('[[reward.components]]\nweight = 1.0\n', [], ["reward.components[0] names no reward"]),
    ('[[reward.components]]\nname = "char_match"\n[[reward.components]]\nname = "exact_matc"\n', [],
     ["reward.components[1].name = 'exact_matc'", "did you mean 'exact_match'"]),
], ids=["typo", "duplicate", "name-too", "empty", "unknown-name"])
def test_component_mistakes_exit_2_naming_the_key(tmp_path, components, overrides, needles):
    proc = run_cli("--config", write_config(tmp_path, components), *overrides, "--dry-run")
    assert_user_error(proc, *needles)


def test_components_on_the_command_line_and_in_the_dry_run(tmp_path):
    proc = run_cli("--config", REINFORCE, "--dry-run",  # its reward.name = "char_match": the override wins, and says so
                   "reward.components=[{name: char_match, weight: 0.7}, {name: exact_match, weight: 0.3}]")
    assert proc.returncode == 0 and "ignoring reward.name = 'char_match'" in proc.stderr, proc.stderr
    assert json.loads(proc.stdout)["config"]["reward"]["name"] == ""
    proc = run_cli("--config", write_config(tmp_path, ""), "--dry-run",
                   "reward.components=[{name: char_match, weight: 0.7}, {name: exact_match, weight: 0.3}]")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["config"]["reward"]["components"] == [
        {"name": "char_match", "file": "", "function": "compute_score", "weight": 0.7},
        {"name": "exact_match", "file": "", "function": "compute_score", "weight": 0.3}]
    assert [p["name"] for p in out["plugins"] if p["kind"] == "reward"] == ["char_match", "exact_match"]
